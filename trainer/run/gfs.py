"""The trainer's backend of the filesystem interface (bert_datagen.contract.fs): tf.io.gfile for
object-store paths (gs://); local paths go through the interface's own local filesystem."""

from __future__ import annotations

import posixpath
from typing import BinaryIO

import tensorflow as tf

from bert_datagen.contract.fs import PathFS


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
