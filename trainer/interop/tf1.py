"""Google's original TF1 checkpoints: `bert_model.ckpt.{index,data-*}` keyed by the original variable
names, and the `bert_config.json` beside them. Read and written by `tf_bundle` (no TensorFlow, so the
JAX backend starts from Google's releases too); local paths and buckets (s3://, gs://) alike, through
the project's filesystem seam.
"""

from __future__ import annotations

import codecs
import json
import os
import posixpath
import re
from collections.abc import Mapping

import ml_dtypes
import numpy as np

from bert_datagen.contract.fs import DEFAULT_FS, PathFS, is_remote
from bert_datagen.trainer.errors import CheckpointFormatError
from bert_datagen.trainer.interop.tf_bundle import BundleReader, index_path, write_bundle
from bert_datagen.trainer.model.config import BertConfig
from bert_datagen.trainer.model.weights import LoadReport, as_float32, check_arrays, is_non_weight

STATE_FILE = "checkpoint"  # what tf.train.latest_checkpoint(DIR) reads
_STATE_PATH = re.compile(r'^model_checkpoint_path:\s*"((?:[^"\\]|\\.)*)"\s*$', re.MULTILINE)


def _join(directory: str, name: str) -> str:
    return posixpath.join(directory, name) if is_remote(directory) else os.path.join(directory, name)


def _dirname(path: str) -> str:
    return posixpath.dirname(path) if is_remote(path) else os.path.dirname(path)


def _fs_error(path: str, exc: OSError) -> CheckpointFormatError:
    return CheckpointFormatError(f"{exc.filename or path}: cannot read: {exc.strerror or exc}")


def latest_checkpoint(directory: str, fs: PathFS = DEFAULT_FS) -> str | None:
    """The prefix the directory's `checkpoint` state file names, when its index exists (as
    tf.train.latest_checkpoint); None without a state file."""
    state = _join(directory, STATE_FILE)
    try:
        if not fs.exists(state):
            return None
        with fs.open_read(state) as f:
            found = _STATE_PATH.search(f.read().decode("utf-8", errors="replace"))
    except OSError as e:
        raise _fs_error(state, e) from e
    if found is None:
        return None
    name = codecs.escape_decode(found.group(1).encode("utf-8"))[0].decode("utf-8", errors="replace")
    prefix = name if name.startswith("/") or is_remote(name) else _join(directory, name)
    return prefix if fs.exists(index_path(prefix)) else None


def resolve_tf1_prefix(path: str | os.PathLike, fs: PathFS = DEFAULT_FS) -> str:
    """The checkpoint prefix for `path`: a prefix itself, or a directory holding one checkpoint."""
    path = os.fspath(path)
    try:
        if fs.is_dir(path):
            latest = latest_checkpoint(path, fs)
            if latest:
                return latest
            base = path.rstrip("/")
            indexes = sorted(posixpath.basename(p)[: -len(".index")] for p in fs.glob(base + "/*.index"))
            if len(indexes) == 1:
                return base + "/" + indexes[0]
            if not indexes:
                raise CheckpointFormatError(f"{path}: directory holds no TF checkpoint (no *.index file)")
            raise CheckpointFormatError(f"{path}: directory holds several checkpoints ({', '.join(indexes)}); "
                                        "pass the prefix, e.g. DIR/bert_model.ckpt")
        if fs.exists(index_path(path)):
            return path
        if path.endswith(".index") and fs.exists(path):
            return path[: -len(".index")]
    except OSError as e:  # a bucket we may not read, a scheme we have no filesystem for
        raise _fs_error(path, e) from e
    raise CheckpointFormatError(f"{path}: no TF checkpoint here (expected {path}.index and its data files)")


def _weight(array: np.ndarray, name: str, source: str) -> np.ndarray:
    # bfloat16 is not a NumPy floating type (ml_dtypes): widened here, exactly, before the float32 check.
    if array.dtype == np.dtype(ml_dtypes.bfloat16):
        array = array.astype(np.float32)
    return as_float32(array, name, source)


def read_tf1_checkpoint(path: str | os.PathLike, expected: Mapping[str, tuple[int, ...]],
                        fs: PathFS = DEFAULT_FS) -> tuple[dict[str, np.ndarray], LoadReport]:
    """The expected weights of an original-layout checkpoint, as float32 NumPy arrays.

    Shapes are checked from the index before any tensor is read, so a wrong `bert_config.json`
    fails fast with every offending name; only the expected tensors' bytes are read (a release's
    optimizer slots are not).
    """
    prefix = resolve_tf1_prefix(path, fs)
    reader = BundleReader(prefix, fs)
    shapes = reader.shapes()
    check_arrays(shapes, expected, prefix)
    report = LoadReport(source=prefix, format="tf1")
    for name in sorted(shapes):
        if name in expected:
            continue
        (report.ignored if is_non_weight(name) else report.unexpected).append(name)
    arrays = {name: _weight(array, name, prefix) for name, array in reader.read(list(expected)).items()}
    report.loaded = len(arrays)
    return arrays, report


def write_tf1_checkpoint(prefix: str | os.PathLike, arrays: Mapping[str, np.ndarray],
                         fs: PathFS = DEFAULT_FS) -> str:
    """Write a float32 TF checkpoint whose variable names are exactly the keys, in name order (what
    TF1's `Saver` produced for Google's checkpoints; the bytes `tf.raw_ops.SaveV2` writes); a
    `checkpoint` state file beside it lets `tf.train.latest_checkpoint(DIR)` find it."""
    prefix = os.fspath(prefix)
    write_bundle(prefix, {n: np.asarray(arrays[n], dtype=np.float32) for n in sorted(arrays)}, fs)
    base = os.path.basename(prefix)
    state = f'model_checkpoint_path: "{base}"\nall_model_checkpoint_paths: "{base}"\n'
    fs.write_atomic(_join(_dirname(prefix) or ".", STATE_FILE), state.encode("utf-8"))
    return prefix


def read_bert_config(path: str, missing_hint: str | None = None, fs: PathFS = DEFAULT_FS) -> dict:
    """A bert_config.json (local or in a bucket) with the original defaults filled in; only vocab_size
    is required."""
    try:
        if not fs.exists(path):
            raise CheckpointFormatError(missing_hint or f"{path}: no such bert_config.json")
        with fs.open_read(path) as f:
            raw = f.read()
    except OSError as e:
        raise CheckpointFormatError(f"{path}: cannot read bert_config.json: {e.strerror or e}") from e
    try:
        data = json.loads(raw.decode("utf-8"))
        if not isinstance(data, dict):
            raise ValueError("not a JSON object")
        return BertConfig.from_dict(data).to_dict()
    except (ValueError, TypeError) as e:  # (UnicodeDecodeError and JSONDecodeError are ValueErrors)
        raise CheckpointFormatError(f"{path}: cannot read bert_config.json: {e}") from e


def checkpoint_step(report: LoadReport, fs: PathFS = DEFAULT_FS) -> int | None:
    """`global_step` of a TF1 training checkpoint when it has one (released checkpoints may not)."""
    if report.format != "tf1" or "global_step" not in report.ignored:
        return None
    return int(BundleReader(report.source, fs).tensor("global_step"))
