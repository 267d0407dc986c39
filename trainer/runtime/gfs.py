"""The trainer's filesystem: buckets (s3://, gs://) through `bert_datagen.contract.buckets`, like every
other layer; local paths through the interface's own local filesystem; other schemes (ram://,
hdfs://) through tf.io.gfile, imported only when such a path is met, so that the JAX backend runs
without TensorFlow. The functions below are what the trainer's data code calls instead of
tf.io.gfile, so a dataset in a bucket reads like a local one (TensorFlow has no s3 filesystem, and
its gs:// client knows neither the emulator nor the credentials chain the data side uses)."""

from __future__ import annotations

import io
import os
import posixpath
import sys
from typing import BinaryIO

from bert_datagen.contract.buckets import BUCKETS, is_bucket_path
from bert_datagen.contract.fs import PathFS, is_remote
from bert_datagen.datagen.tfrecord import iter_tfrecords


def _gfile():
    import tensorflow as tf

    return tf.io.gfile


class GFileObjects:
    """The object-store primitives of `bert_datagen.contract.fs.ObjectStore` through _gfile()."""

    def open_read(self, path: str) -> BinaryIO:
        return _gfile().GFile(path, "rb")

    def write(self, path: str, data: bytes) -> None:
        with _gfile().GFile(path, "wb") as f:
            f.write(data)

    def exists(self, path: str) -> bool:
        return _gfile().exists(path)

    def rename(self, src: str, dst: str) -> None:
        _gfile().rename(src, dst, overwrite=True)

    def delete(self, paths: list[str]) -> None:
        for path in paths:
            _gfile().remove(path)

    def list_prefix(self, prefix: str) -> list[str]:
        if not _gfile().isdir(prefix):
            return []
        return [posixpath.join(top, name) for top, _, files in _gfile().walk(prefix) for name in files]

    def glob(self, pattern: str) -> list[str]:
        return _gfile().glob(pattern)

    def join(self, base: str, *parts: str) -> str:
        return posixpath.join(base, *parts)


GFILE_FS = PathFS(GFileObjects())


def _through_gfile(path: str) -> bool:
    return is_remote(path) and not is_bucket_path(path)


def isdir(path: str) -> bool:
    return _gfile().isdir(path) if _through_gfile(path) else GFILE_FS.is_dir(path)


def exists(path: str) -> bool:
    return _gfile().exists(path) if _through_gfile(path) else GFILE_FS.exists(path)


def glob(pattern: str) -> list[str]:
    return _gfile().glob(pattern) if _through_gfile(pattern) else GFILE_FS.glob(pattern)


def size(path: str) -> int:
    """The file's size in bytes (FileNotFoundError, or tf.errors.NotFoundError for gfile schemes, when
    it is missing)."""
    if is_bucket_path(path):
        return BUCKETS.size(path)
    return int(_gfile().stat(path).length) if _through_gfile(path) else os.stat(path).st_size


def open_read(path: str, mode: str = "rb") -> BinaryIO:
    """A stream of the file; text mode (``"r"``) for local and gfile paths only."""
    if is_bucket_path(path):
        return BUCKETS.open_read(path)
    return _gfile().GFile(path, mode) if _through_gfile(path) else open(path, mode)


def record_dataset(files: list[str], buffer_size: int = 1 << 20):  # -> tf.data.Dataset

    """The serialized records of ``files`` in order, as tf.data.TFRecordDataset gives them; files in
    buckets are streamed through `bert_datagen.contract.buckets` (CRC-checked) instead."""
    import tensorflow as tf

    if not any(is_bucket_path(f) for f in files):
        return tf.data.TFRecordDataset(files, buffer_size=buffer_size, num_parallel_reads=1)

    def records():
        for path in files:
            if is_bucket_path(path):
                with BUCKETS.open_read(path) as stream:
                    yield from iter_tfrecords(stream, path)
            else:
                yield from (r.numpy() for r in tf.data.TFRecordDataset([path], buffer_size=buffer_size))

    return tf.data.Dataset.from_generator(records, output_signature=tf.TensorSpec([], tf.string))


def open_text(path: str):  # -> a text stream (io.StringIO, a file or a GFile)
    """A text stream of a UTF-8 file (side files: a few MB at most, read whole from a bucket)."""
    if is_bucket_path(path):
        return io.StringIO(BUCKETS.read_bytes(path).decode("utf-8"))
    return _gfile().GFile(path, "r") if _through_gfile(path) else open(path, encoding="utf-8")


def read_errors() -> tuple[type[BaseException], ...]:
    """What a read through these functions raises for a missing or unreadable file: OSError, and
    TensorFlow's OpError where a gfile scheme was read (TensorFlow is then imported; a process that
    never imported it cannot have raised one)."""
    tf = sys.modules.get("tensorflow")
    return (OSError,) if tf is None else (OSError, tf.errors.OpError)


def not_found_errors() -> tuple[type[BaseException], ...]:
    """`read_errors` for a missing file only."""
    tf = sys.modules.get("tensorflow")
    return (FileNotFoundError,) if tf is None else (FileNotFoundError, tf.errors.NotFoundError)
