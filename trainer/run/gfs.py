"""The data contract's filesystem seam (bert_datagen.contract.fs.FileSystem) through tf.io.gfile (local, gs://)."""

from __future__ import annotations

import os

import tensorflow as tf

from bert_datagen.contract.fs import decompress_by_name, temp_path_for


class GFileFS:
    def read_bytes(self, path: str) -> bytes:
        with tf.io.gfile.GFile(path, "rb") as f:
            return decompress_by_name(path, f.read())

    def write_atomic(self, path: str, data: bytes) -> None:
        tmp = temp_path_for(path)
        tf.io.gfile.makedirs(os.path.dirname(path) or ".")
        with tf.io.gfile.GFile(tmp, "wb") as f:
            f.write(data)
        tf.io.gfile.rename(tmp, path, overwrite=True)

    def exists(self, path: str) -> bool:
        return tf.io.gfile.exists(path)

    def listdir(self, directory: str) -> list[str]:
        return [os.path.join(directory, name.rstrip("/")) for name in sorted(tf.io.gfile.listdir(directory))]

    def join(self, base: str, *parts: str) -> str:
        return os.path.join(base, *parts)

    def glob(self, pattern: str) -> list[str]:
        return sorted(tf.io.gfile.glob(pattern))


GFILE_FS = GFileFS()
