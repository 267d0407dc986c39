"""Fine-tuned runs: restoring the model, and exporting it for transformers or the original TF1 code.

Hugging Face: `BertForSequenceClassification` (classification, regression: num_labels 1),
`BertForQuestionAnswering` (span: `qa_outputs`), `BertForTokenClassification` (tagging), with
`id2label` / `label2id`; the encoder under `bert.*` (QA and token classification have no pooler,
so it is left out). TF1: the encoder's `bert/...` names plus the original fine-tuning head names
(`output_weights` [K, H] / `output_bias`; SQuAD `cls/squad/output_weights` [2, H] /
`cls/squad/output_bias`), `bert_config.json` and `vocab.txt`. Both head layouts are [out, in],
the same as PyTorch's Linear weight, so the head is copied unchanged.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np

from bert_datagen.contract.manifest import MANIFEST_NAME
from bert_datagen.trainer.errors import TrainConfigError
from bert_datagen.trainer.model.config import BertConfig
from bert_datagen.trainer.model.heads import (
    FineTuneModel,
    build_finetune_model,
    finetune_variable_map,
    head_class,
)
from bert_datagen.trainer.runtime import checkpoint as ckpt_lib
from bert_datagen.trainer.runtime.dataset_dir import load_dataset_manifest


def is_finetune_run(path: str | Path) -> bool:
    """Whether `path` (a run or one of its checkpoints) holds a fine-tuned model."""
    try:
        ckpt = ckpt_lib.resolve_checkpoint(path)
    except ckpt_lib.CheckpointError:
        return False
    return "task" in ckpt_lib.load_state(ckpt)


def restore_finetuned(path: str | Path, precision: str = "float32") -> tuple[FineTuneModel, BertConfig, dict, Path]:
    """(model, bert config, task record, checkpoint) of a fine-tuned run's latest checkpoint."""
    from bert_datagen.trainer.interop.restore import dtype_policy

    ckpt = ckpt_lib.resolve_checkpoint(path)
    state = ckpt_lib.load_state(ckpt)
    if "task" not in state:
        raise TrainConfigError(f"{ckpt}: a pre-training checkpoint, not a fine-tuned run")
    bert = BertConfig.from_dict(state["bert_config"])
    task = state["task"]
    model = build_finetune_model(bert, task["type"], len(task["labels"]), seed=0, dtype=dtype_policy(precision))
    ckpt_lib.assign_named_weights(finetune_variable_map(model), ckpt_lib.load_arrays(ckpt, ckpt_lib.MODEL_FILE),
                                  str(ckpt / ckpt_lib.MODEL_FILE))
    return model, bert, {**task, "data": state.get("data")}, ckpt


def task_vocab(task: dict, vocab_path: str | None) -> bytes:
    """The vocab to ship: --vocab, else the run's task dataset's (checked against its manifest)."""
    if vocab_path:
        return Path(vocab_path).read_bytes()
    data = task.get("data")
    manifest_path = Path(data or "") / MANIFEST_NAME
    manifest = load_dataset_manifest(data) if data and manifest_path.is_file() else None
    if manifest is None:
        raise TrainConfigError(f"the run's dataset ({data}) is not available to take its vocab from: pass --vocab FILE")
    entry = manifest.vocab
    content = (Path(data) / entry.path).read_bytes()
    if hashlib.sha256(content).hexdigest() != entry.sha256:
        raise TrainConfigError(f"{Path(data) / entry.path}: does not match the sha256 in {manifest_path}; pass --vocab")
    return content


def hf_task_config(bert: BertConfig, task: dict, pad_token_id: int) -> dict:
    from bert_datagen.trainer.interop.hf_checkpoint import hf_config_from_bert_config

    config = hf_config_from_bert_config(bert.to_dict(), pad_token_id=pad_token_id)
    config.pop("tie_word_embeddings", None)
    head = head_class(task["type"])
    config["architectures"] = [head.hf_architecture]
    if head.hf_problem_type:
        config["problem_type"] = head.hf_problem_type
    labels = head.hf_labels(task["labels"])
    config["id2label"] = {str(i): label for i, label in enumerate(labels)}
    config["label2id"] = {label: i for i, label in enumerate(labels)}
    config["num_labels"] = len(labels)
    return dict(sorted(config.items()))


def hf_task_state(model: FineTuneModel) -> dict[str, np.ndarray]:
    from bert_datagen.trainer.interop.hf_checkpoint import tf1_to_hf
    from bert_datagen.trainer.model.heads import encoder_variable_map

    encoder = {n: np.asarray(v.numpy(), np.float32) for n, v in encoder_variable_map(model).items()}
    if not model.head.reads_pooler:  # nor do the HF architectures of these heads
        encoder = {n: v for n, v in encoder.items() if not n.startswith("bert/pooler/")}
    state = tf1_to_hf(encoder)
    head = model.head.hf_head
    state[f"{head}.weight"] = np.ascontiguousarray(model.head.output_weights.numpy(), np.float32)
    state[f"{head}.bias"] = np.ascontiguousarray(model.head.output_bias.numpy(), np.float32)
    return state


def tf1_task_arrays(model: FineTuneModel) -> dict[str, np.ndarray]:
    return {n: np.asarray(v.numpy(), np.float32) for n, v in finetune_variable_map(model).items()}


def export_finetuned(run: str, fmt: str, out: str, vocab: str | None = None, do_lower_case: bool | None = None,
                     overwrite: bool = False) -> tuple[Path, Path]:
    """Write the export atomically; returns (output directory, checkpoint it came from)."""
    from bert_datagen.trainer.interop.export import (
        TASK_FILE,
        check_export_target,
        vocab_tokens,
        write_export_dir,
    )
    from bert_datagen.trainer.interop.hf_checkpoint import save_safetensors, write_hf_tokenizer
    from bert_datagen.trainer.interop.tf1 import write_tf1_checkpoint

    check_export_target(Path(out), overwrite)  # before any work
    model, bert, task, ckpt = restore_finetuned(run)
    vocab_bytes = task_vocab(task, vocab)
    tokens = vocab_tokens(vocab_bytes, vocab or "the dataset's vocab", bert.vocab_size)
    lower = task.get("do_lower_case", True) if do_lower_case is None else do_lower_case

    def write(tmp: Path) -> None:
        if fmt == "tf1":
            write_tf1_checkpoint(tmp / "bert_model.ckpt", tf1_task_arrays(model))
            (tmp / "bert_config.json").write_text(bert.to_json())
            (tmp / "vocab.txt").write_bytes(vocab_bytes)
            weights, bias = head_class(task["type"]).tf1_names
            (tmp / TASK_FILE).write_text(json.dumps({"type": task["type"], "labels": task["labels"],
                                                     "head": [weights, bias]}, indent=2) + "\n")
        elif fmt == "hf":
            config = hf_task_config(bert, task, tokens.index("[PAD]"))
            (tmp / "config.json").write_text(json.dumps(config, indent=2) + "\n")
            save_safetensors(hf_task_state(model), tmp / "model.safetensors")
            write_hf_tokenizer(tmp, vocab_bytes, bool(lower), int(task.get("max_seq_length") or bert.max_position_embeddings))
        else:
            raise TrainConfigError(f"format {fmt!r} not in ('tf1', 'hf')")

    target = write_export_dir(out, overwrite, write)  # the one atomic-directory implementation of all exports
    return target, ckpt
