"""The options of `bert-train pretrain` and `eval` that only some data or runs use, checked against
the data and run they meet: a value the data contradicts, or one this run would not use, is refused
before any work (a library caller's unused shuffle buffer is dropped with a warning), so that the
run's record (train_config.json) is what ran. The lengths and --eval-data a manifest contradicts are
checked where the data is opened (`data.refuse_manifest_contradictions`).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable

from bert_datagen.contract.manifest import MANIFEST_NAME
from bert_datagen.trainer.errors import DataError
from bert_datagen.trainer.pretrain.config import TrainConfig
from bert_datagen.trainer.pretrain.dataset_info import DatasetInfo
from bert_datagen.trainer.runtime import gfs
from bert_datagen.trainer.runtime.dataset_dir import load_dataset_manifest


def model_vocab_size(info: DatasetInfo, vocab_size: int | None) -> int | None:
    """The vocab size a named model size gets: the manifest's, or --vocab-size for data without one."""
    if info.vocab_size is not None and vocab_size is not None and vocab_size != info.vocab_size:
        raise DataError(f"--vocab-size {vocab_size} contradicts {info.source}/{MANIFEST_NAME}, whose vocab has "
                        f"{info.vocab_size} tokens (the option is for TFRecord globs without a manifest)")
    return info.vocab_size or vocab_size


def no_eval_split(data: str, eval_data: str | None) -> str | None:
    """Why a run on `data` has nothing to evaluate; None when it has an eval split, or when the data
    cannot be read yet (opening it later says why)."""
    if eval_data:
        return None
    manifest_path = os.path.join(data, MANIFEST_NAME)
    if gfs.isdir(data) and gfs.exists(manifest_path):
        manifest = load_dataset_manifest(data)
        if manifest is None or manifest.splits.get("eval") is not None and manifest.splits["eval"].shards:
            return None
        return f"{manifest_path} has no eval split (`bert-datagen run --eval-fraction` makes one)"
    if not gfs.isdir(data) and not any(gfs.glob(p.strip()) for p in data.split(",")):
        return None  # not data at all: opening it says so
    return f"--data {data} has no manifest and no --eval-data is given, so there is no eval split"


def unused_shuffle_buffer(shuffle_buffer: int | None, reads_through_tf_data: bool) -> str | None:
    """Why a shuffle buffer reaches nothing in this run (it reads the global order); None when none is
    given or the run (started by an earlier version) reads through tf.data, which uses it."""
    if shuffle_buffer is None or reads_through_tf_data:
        return None
    return ("the run reads the global order (its shuffle is a pure function of --seed, with no buffer); only "
            "a run started by an earlier version, which reads through tf.data, uses a buffer")


def as_run(cfg: TrainConfig, reads_through_tf_data: bool, log: Callable[[str], None]) -> TrainConfig:
    """`cfg` as the run records it: without a shuffle buffer it does not use (warned once; the
    command refuses one before this: `bert_datagen.trainer.pretrain.cli`)."""
    reason = unused_shuffle_buffer(cfg.shuffle_buffer, reads_through_tf_data)
    if reason is None:
        return cfg
    log(f"warning: --shuffle-buffer {cfg.shuffle_buffer} has no effect: {reason}")
    return dataclasses.replace(cfg, shuffle_buffer=None)
