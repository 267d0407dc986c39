"""Weights into a model, from any source: a run of ours (its latest checkpoint or one checkpoint
directory), an original TF1 checkpoint, or a Hugging Face `BertForPreTraining` directory.

Every source is checked against the model before a weight is assigned: all names, all shapes.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from bert_datagen.trainer.errors import CheckpointFormatError
from bert_datagen.trainer.interop.hf_checkpoint import (
    bert_config_from_hf_config,
    hf_to_tf1,
    is_hf_dir,
    read_hf_config,
    read_hf_state,
)
from bert_datagen.trainer.interop.tf1 import read_bert_config, read_tf1_checkpoint, resolve_tf1_prefix
from bert_datagen.trainer.model.bert import BertPretrainer, build_model, tf1_variable_map
from bert_datagen.trainer.model.config import BertConfig
from bert_datagen.trainer.model.weights import LoadReport, assign_tf1_arrays, model_expected_shapes
from bert_datagen.trainer.runtime import checkpoint as ckpt_lib


def dtype_policy(precision: str) -> str | None:
    """The Keras dtype policy of a `--precision` choice (None: plain float32)."""
    return None if precision == "float32" else precision


# --- runs of ours ----------------------------------------------------------------------------------


def restore_model(path: str | Path, precision: str = "float32") -> tuple[BertPretrainer, BertConfig, Path]:
    """A model with the weights of a run's latest checkpoint (or of a checkpoint directory)."""
    ckpt = ckpt_lib.resolve_checkpoint(path)
    state = ckpt_lib.load_state(ckpt)
    bert = BertConfig.from_dict(state["bert_config"])
    model = build_model(bert, seed=0, dtype=dtype_policy(precision))
    ckpt_lib.assign_named_weights(tf1_variable_map(model), ckpt_lib.load_arrays(ckpt, ckpt_lib.MODEL_FILE),
                                  str(ckpt / ckpt_lib.MODEL_FILE))
    return model, bert, ckpt


def init_weights_from(model: BertPretrainer, path: str) -> Path:
    """Phase 2: start from the weights (not the optimizer or step) of another run or checkpoint."""
    ckpt = ckpt_lib.resolve_checkpoint(path)
    ckpt_lib.assign_named_weights(tf1_variable_map(model), ckpt_lib.load_arrays(ckpt, ckpt_lib.MODEL_FILE),
                                  str(ckpt / ckpt_lib.MODEL_FILE))
    return ckpt


# --- original TF1 checkpoints and Hugging Face directories -----------------------------------------


def checkpoint_format(path: str | os.PathLike) -> str:
    """'hf' for a Hugging Face model directory, 'tf1' for a TF checkpoint prefix or directory."""
    if is_hf_dir(path):
        return "hf"
    resolve_tf1_prefix(path)  # raises a clear error when there is no checkpoint
    return "tf1"


def init_checkpoint_config(path: str | os.PathLike, bert_config_path: str | os.PathLike | None = None) -> dict:
    """The original bert_config dict describing the checkpoint at `path`.

    TF1: `--bert-config`, else bert_config.json beside the checkpoint. Hugging Face: its config.json;
    a `--bert-config` given as well must agree with it on the model's shape.
    """
    given = read_bert_config(str(bert_config_path)) if bert_config_path else None
    if checkpoint_format(path) == "hf":
        hf_config = str(Path(path) / "config.json")
        config = bert_config_from_hf_config(read_hf_config(path), hf_config)
        if given is not None:
            _check_same_shape(given, config, str(bert_config_path), hf_config)
        return config
    if given is not None:
        return given
    beside = os.path.dirname(resolve_tf1_prefix(path)) + "/bert_config.json"
    return read_bert_config(beside, missing_hint=f"{path}: no --bert-config given and no bert_config.json "
                                                  "beside the checkpoint")


def _check_same_shape(a: Mapping, b: Mapping, name_a: str, name_b: str) -> None:
    keys = ("hidden_size", "intermediate_size", "max_position_embeddings", "num_attention_heads",
            "num_hidden_layers", "type_vocab_size", "vocab_size")
    diff = [f"{k}: {a.get(k)} vs {b.get(k)}" for k in keys if a.get(k) != b.get(k)]
    if diff:
        raise CheckpointFormatError(f"{name_a} and {name_b} describe different models: " + "; ".join(diff))


def read_checkpoint_arrays(path: str | os.PathLike,
                           expected: Mapping[str, tuple[int, ...]]) -> tuple[dict[str, np.ndarray], LoadReport]:
    """TF1-named float32 weights from a TF1 checkpoint or a Hugging Face directory."""
    if checkpoint_format(path) == "hf":
        return hf_to_tf1(read_hf_state(path), expected, str(path))
    return read_tf1_checkpoint(path, expected)


def load_init_checkpoint(model: BertPretrainer, path: str | os.PathLike) -> LoadReport:
    """Initialize `model` from an original TF1 checkpoint (prefix or directory) or a Hugging Face dir.

    Every weight of the model must be present with its shape, heads included; optimizer slots and
    `global_step` are ignored. Raises CheckpointMismatchError listing all offending names.
    """
    expected = model_expected_shapes(model)
    arrays, report = read_checkpoint_arrays(path, expected)
    assign_tf1_arrays(model, arrays, report.source)
    return report


def restore_external_model(path: str | os.PathLike, bert_config_path: str | os.PathLike | None = None,
                           dtype: str | None = None) -> tuple[BertPretrainer, BertConfig, LoadReport]:
    """A model built from a TF1 checkpoint's bert_config (or a Hugging Face config) with its weights."""
    bert = BertConfig.from_dict(init_checkpoint_config(path, bert_config_path))
    model = build_model(bert, seed=0, dtype=dtype)
    return model, bert, load_init_checkpoint(model, path)


