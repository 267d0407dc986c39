"""The filesystem seam of the data contract: the few operations the contract needs, and a local one.

Library code in contract/ never picks a filesystem itself: callers pass one. The data side passes
`bert_datagen.pipelines.beam.fsio.BEAM_FS` (every path Beam understands, gs:// included), the trainer a tf.io.gfile one,
tests and local tools `LOCAL_FS`.
"""

from __future__ import annotations

import bz2
import glob
import gzip
import os
import uuid
from typing import Protocol

TMP_MARKER = ".tmp-"


class FileSystem(Protocol):
    def read_bytes(self, path: str) -> bytes:
        """The file's bytes, decompressed when its name ends in .gz or .bz2 (`decompress_by_name`)."""
        ...

    def write_atomic(self, path: str, data: bytes) -> None: ...

    def exists(self, path: str) -> bool: ...

    def listdir(self, directory: str) -> list[str]: ...

    def join(self, base: str, *parts: str) -> str: ...

    def glob(self, pattern: str) -> list[str]:
        """Files matching the pattern, sorted (empty when none)."""
        ...


def decompress_by_name(path: str, raw: bytes) -> bytes:
    """``raw`` decompressed when the name ends in .gz or .bz2; ValueError naming the file if it cannot be."""
    try:
        if path.endswith(".gz"):
            return gzip.decompress(raw)
        if path.endswith(".bz2"):
            return bz2.decompress(raw)
    except (OSError, EOFError, ValueError) as e:
        raise ValueError(f"{path}: cannot decompress: {e}") from e
    return raw


def temp_path_for(path: str) -> str:
    """A temporary sibling of ``path`` carrying our marker (so a cleanup knows it is ours)."""
    directory, name = os.path.split(path) if "://" not in path else path.rsplit("/", 1)
    return f"{directory}/{TMP_MARKER}{uuid.uuid4().hex}-{name}"


class LocalFS:
    """Local paths through the os module; writes go to a temp sibling, then are renamed into place."""

    def read_bytes(self, path: str) -> bytes:
        with open(path, "rb") as f:
            return decompress_by_name(path, f.read())

    def write_atomic(self, path: str, data: bytes) -> None:
        directory = os.path.dirname(path)
        os.makedirs(directory or ".", exist_ok=True)
        tmp = temp_path_for(path)
        try:
            with open(tmp, "wb") as f:
                f.write(data)
            os.replace(tmp, path)  # onto a directory: IsADirectoryError, the directory untouched
        except BaseException:
            if os.path.lexists(tmp):
                os.remove(tmp)
            raise

    def exists(self, path: str) -> bool:
        return os.path.exists(path)

    def listdir(self, directory: str) -> list[str]:
        """Full paths of the entries of a directory, sorted."""
        return [os.path.join(directory, name) for name in sorted(os.listdir(directory))]

    def join(self, base: str, *parts: str) -> str:
        return os.path.join(base, *parts)

    def glob(self, pattern: str) -> list[str]:
        return sorted(p for p in glob.glob(pattern) if os.path.isfile(p))


LOCAL_FS = LocalFS()
