"""MLM/NSP loss and accuracy of a model on a dataset split: during a run, of a finished run
(`bert-train eval --run`), and of an external checkpoint (`bert-train eval --init-checkpoint`)."""

from __future__ import annotations

import os
from collections.abc import Callable
from functools import partial

from bert_datagen.trainer.errors import DataError
from bert_datagen.trainer.interop.restore import restore_external_model, restore_model
from bert_datagen.trainer.interop.tf1 import checkpoint_step
from bert_datagen.trainer.model.bert import BertPretrainer
from bert_datagen.trainer.model.config import BertConfig
from bert_datagen.trainer.pretrain.data import (
    check_fits,
    check_split_size,
    check_unchanged,
    eval_batches,
    open_pretraining_data,
)
from bert_datagen.trainer.pretrain.dataset_info import DatasetInfo
from bert_datagen.trainer.pretrain.objective import losses_from_sums
from bert_datagen.trainer.pretrain.step import eval_sums
from bert_datagen.trainer.runtime import checkpoint as ckpt_lib
from bert_datagen.trainer.runtime.inference import compiled_figures


def evaluate_model(eval_step: Callable, info: DatasetInfo, batch_size: int, max_batches: int | None,
                   files: list[str] | None = None) -> dict[str, float]:
    """MLM/NSP loss and accuracy over the first `max_batches` full batches (all when None);
    `eval_step` takes each whole global batch as NumPy arrays (the backend cuts it over its devices)."""
    totals: dict[str, float] = {}
    for index, batch in enumerate(eval_batches(info, batch_size, files)):
        if max_batches and index >= max_batches:
            break
        for k, v in eval_step(batch).items():
            totals[k] = totals.get(k, 0.0) + float(v)
    # The figures are of the dataset the run trains on only if its manifest is still the one read
    # at the start: a replacement retires the old one before any shard changes.
    check_unchanged(info)
    if not totals:
        raise DataError(f"{info.source}: fewer eval records than one batch of {batch_size}")
    result = losses_from_sums(totals)
    result["examples"] = totals["examples"]
    return result


def evaluate_restored(model: BertPretrainer, bert: BertConfig, data: str, batch_size: int = 32,
                      max_batches: int | None = None, split: str = "eval", max_seq_length: int | None = None,
                      max_predictions_per_seq: int | None = None, backend: str = "tensorflow") -> dict[str, float]:
    """MLM/NSP loss and accuracy of an already restored model on a dataset's eval (or train) split."""
    info = open_pretraining_data(data, max_seq_length, max_predictions_per_seq)
    check_fits(info, bert)
    files = info.eval_files if split == "eval" else info.train_files
    if not files:
        raise DataError(f"{data}: the {split} split has no shards")
    check_split_size(info, split, batch_size)
    step = compiled_figures(model, partial(eval_sums, model), backend)
    return evaluate_model(step, info, batch_size, max_batches, files)


def evaluate_run(run: str, data: str, batch_size: int = 32, max_batches: int | None = None,
                 split: str = "eval", max_seq_length: int | None = None,
                 max_predictions_per_seq: int | None = None, precision: str = "float32",
                 backend: str = "tensorflow") -> dict[str, float]:
    """`bert-train eval --run`: the latest checkpoint of RUN on a dataset's eval (or train) split."""
    model, bert, ckpt = restore_model(run, precision)
    result = evaluate_restored(model, bert, data, batch_size, max_batches, split, max_seq_length,
                               max_predictions_per_seq, backend)
    result["checkpoint"] = str(ckpt)
    result["step"] = ckpt_lib.load_state(ckpt)["step"]
    return result


def evaluate_external(path: str | os.PathLike, data: str, bert_config_path: str | os.PathLike | None = None,
                      batch_size: int = 32, max_batches: int | None = None, split: str = "eval",
                      max_seq_length: int | None = None,
                      max_predictions_per_seq: int | None = None, backend: str = "tensorflow") -> dict[str, float]:
    """`bert-train eval --init-checkpoint`: MLM/NSP figures of a TF1 checkpoint or Hugging Face dir."""
    model, bert, report = restore_external_model(path, bert_config_path)
    result = evaluate_restored(model, bert, data, batch_size, max_batches, split, max_seq_length,
                               max_predictions_per_seq, backend)
    result["checkpoint"] = report.source
    result["step"] = checkpoint_step(report)
    result["load_report"] = report.summary()
    return result
