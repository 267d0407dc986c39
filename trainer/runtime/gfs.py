"""The trainer's filesystem: buckets (s3://, gs://) through `bert_datagen.contract.buckets`, like every
other layer; other object stores through tf.io.gfile; local paths through the interface's own local
filesystem. The functions below are what the trainer's data code calls instead of tf.io.gfile, so a
dataset in a bucket reads like a local one (TensorFlow has no s3 filesystem, and its gs:// client
knows neither the emulator nor the credentials chain the data side uses)."""

from __future__ import annotations

import posixpath
from typing import BinaryIO

import tensorflow as tf

from bert_datagen.contract.buckets import BUCKETS, is_bucket_path
from bert_datagen.contract.fs import PathFS
from bert_datagen.datagen.tfrecord import iter_tfrecords


class GFileObjects:
    """The object-store primitives of `bert_datagen.contract.fs.ObjectStore` through tf.io.gfile."""

    def open_read(self, path: str) -> BinaryIO:
        return tf.io.gfile.GFile(path, "rb")

    def write(self, path: str, data: bytes) -> None:
        with tf.io.gfile.GFile(path, "wb") as f:
            f.write(data)

    def exists(self, path: str) -> bool:
        return tf.io.gfile.exists(path)

    def rename(self, src: str, dst: str) -> None:
        tf.io.gfile.rename(src, dst, overwrite=True)

    def delete(self, paths: list[str]) -> None:
        for path in paths:
            tf.io.gfile.remove(path)

    def list_prefix(self, prefix: str) -> list[str]:
        if not tf.io.gfile.isdir(prefix):
            return []
        return [posixpath.join(top, name) for top, _, files in tf.io.gfile.walk(prefix) for name in files]

    def glob(self, pattern: str) -> list[str]:
        return tf.io.gfile.glob(pattern)

    def join(self, base: str, *parts: str) -> str:
        return posixpath.join(base, *parts)


GFILE_FS = PathFS(GFileObjects())


def isdir(path: str) -> bool:
    return GFILE_FS.is_dir(path) if is_bucket_path(path) else tf.io.gfile.isdir(path)


def exists(path: str) -> bool:
    return GFILE_FS.exists(path) if is_bucket_path(path) else tf.io.gfile.exists(path)


def glob(pattern: str) -> list[str]:
    return GFILE_FS.glob(pattern) if is_bucket_path(pattern) else tf.io.gfile.glob(pattern)


def size(path: str) -> int:
    """The file's size in bytes (FileNotFoundError or tf.errors.NotFoundError when it is missing)."""
    return BUCKETS.size(path) if is_bucket_path(path) else int(tf.io.gfile.stat(path).length)


def open_read(path: str, mode: str = "rb") -> BinaryIO:
    """A stream of the file; text mode (``"r"``) for local and gfile paths only."""
    return BUCKETS.open_read(path) if is_bucket_path(path) else tf.io.gfile.GFile(path, mode)


def record_dataset(files: list[str], buffer_size: int = 1 << 20) -> tf.data.Dataset:
    """The serialized records of ``files`` in order, as tf.data.TFRecordDataset gives them; files in
    buckets are streamed through `bert_datagen.contract.buckets` (CRC-checked) instead."""
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


def open_text(path: str):  # -> a text stream (io.StringIO or GFile)
    """A text stream of a UTF-8 file (side files: a few MB at most, read whole from a bucket)."""
    if is_bucket_path(path):
        import io

        return io.StringIO(BUCKETS.read_bytes(path).decode("utf-8"))
    return tf.io.gfile.GFile(path, "r")
