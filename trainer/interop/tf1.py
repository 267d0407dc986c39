"""Google's original TF1 checkpoints: `bert_model.ckpt.{index,data-*}` keyed by the original variable
names, and the `bert_config.json` beside them. Local and gs:// paths alike (through tf.io.gfile).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import tensorflow as tf

from bert_datagen.trainer.errors import CheckpointFormatError
from bert_datagen.trainer.model.config import BertConfig
from bert_datagen.trainer.model.weights import LoadReport, as_float32, check_arrays, is_non_weight


def resolve_tf1_prefix(path: str | os.PathLike) -> str:
    """The checkpoint prefix for `path`: a prefix itself, or a directory holding one checkpoint.

    Goes through tf.io.gfile, so gs:// paths work like local ones.
    """
    path = str(path)
    gfile = tf.io.gfile
    if gfile.isdir(path):
        latest = tf.train.latest_checkpoint(path)
        if latest:
            return latest
        indexes = sorted(os.path.basename(p)[: -len(".index")] for p in gfile.glob(path.rstrip("/") + "/*.index"))
        if len(indexes) == 1:
            return path.rstrip("/") + "/" + indexes[0]
        if not indexes:
            raise CheckpointFormatError(f"{path}: directory holds no TF checkpoint (no *.index file)")
        raise CheckpointFormatError(f"{path}: directory holds several checkpoints ({', '.join(indexes)}); "
                                    "pass the prefix, e.g. DIR/bert_model.ckpt")
    if gfile.exists(path + ".index"):
        return path
    if path.endswith(".index") and gfile.exists(path):
        return path[: -len(".index")]
    raise CheckpointFormatError(f"{path}: no TF checkpoint here (expected {path}.index and its data files)")


def read_tf1_checkpoint(path: str | os.PathLike,
                        expected: Mapping[str, tuple[int, ...]]) -> tuple[dict[str, np.ndarray], LoadReport]:
    """The expected weights of an original-layout checkpoint, as float32 NumPy arrays.

    Shapes are checked from the index before any tensor is read, so a wrong `bert_config.json`
    fails fast with every offending name.
    """
    prefix = resolve_tf1_prefix(path)
    try:
        reader = tf.train.load_checkpoint(prefix)
    except Exception as e:  # TF raises several types for corrupt or truncated files
        raise CheckpointFormatError(f"{prefix}: cannot read TF checkpoint: {e}") from e
    shapes = reader.get_variable_to_shape_map()
    check_arrays(shapes, expected, prefix)
    report = LoadReport(source=prefix, format="tf1")
    for name in sorted(shapes):
        if name in expected:
            continue
        (report.ignored if is_non_weight(name) else report.unexpected).append(name)
    arrays = {name: as_float32(reader.get_tensor(name), name, prefix) for name in expected}
    report.loaded = len(arrays)
    return arrays, report


def write_tf1_checkpoint(prefix: str | os.PathLike, arrays: Mapping[str, np.ndarray]) -> str:
    """Write a TF checkpoint whose variable names are exactly the keys (no object-graph suffixes).

    SaveV2 writes the named tensors as they are, which is what TF1 `Saver` produced for Google's
    checkpoints; a `checkpoint` state file beside it lets `tf.train.latest_checkpoint(DIR)` find it.
    """
    prefix = str(prefix)
    names = sorted(arrays)
    tf.raw_ops.SaveV2(prefix=prefix, tensor_names=names, shape_and_slices=[""] * len(names),
                      tensors=[np.ascontiguousarray(arrays[n], dtype=np.float32) for n in names])
    base = os.path.basename(prefix)
    state = f'model_checkpoint_path: "{base}"\nall_model_checkpoint_paths: "{base}"\n'
    Path(os.path.dirname(prefix) or ".", "checkpoint").write_text(state)
    return prefix


def read_bert_config(path: str, missing_hint: str | None = None) -> dict:
    """A bert_config.json (local or gs://) with the original defaults filled in; only vocab_size is required."""
    if not tf.io.gfile.exists(path):
        raise CheckpointFormatError(missing_hint or f"{path}: no such bert_config.json")
    try:
        with tf.io.gfile.GFile(path, "r") as f:
            data = json.loads(f.read())
        if not isinstance(data, dict):
            raise ValueError("not a JSON object")
        return BertConfig.from_dict(data).to_dict()
    except (tf.errors.OpError, ValueError, TypeError) as e:
        raise CheckpointFormatError(f"{path}: cannot read bert_config.json: {e}") from e


def checkpoint_step(report: LoadReport) -> int | None:
    """`global_step` of a TF1 training checkpoint when it has one (released checkpoints may not)."""
    if report.format != "tf1" or "global_step" not in report.ignored:
        return None
    return int(tf.train.load_checkpoint(report.source).get_tensor("global_step"))
