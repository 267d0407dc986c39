"""The filesystem seam of the data contract: the few operations the contract needs, and a local one.

Library code in contract/ never picks a filesystem itself: callers pass one. The data side passes
`pipelines.fsio.BEAM_FS` (every path Beam understands, gs:// included), the trainer a tf.io.gfile one,
tests and local tools `LOCAL_FS`.
"""

from __future__ import annotations

import os
import uuid
from typing import Protocol

TMP_MARKER = ".tmp-"


class FileSystem(Protocol):
    def read_bytes(self, path: str) -> bytes: ...

    def write_atomic(self, path: str, data: bytes) -> None: ...

    def exists(self, path: str) -> bool: ...

    def listdir(self, directory: str) -> list[str]: ...

    def join(self, base: str, *parts: str) -> str: ...


def temp_path_for(path: str) -> str:
    """A temporary sibling of ``path`` carrying our marker (so a cleanup knows it is ours)."""
    directory, name = os.path.split(path) if "://" not in path else path.rsplit("/", 1)
    return f"{directory}/{TMP_MARKER}{uuid.uuid4().hex}-{name}"


class LocalFS:
    """Local paths through the os module; writes go to a temp sibling, then are renamed into place."""

    def read_bytes(self, path: str) -> bytes:
        with open(path, "rb") as f:
            return f.read()

    def write_atomic(self, path: str, data: bytes) -> None:
        directory = os.path.dirname(path)
        os.makedirs(directory or ".", exist_ok=True)
        tmp = temp_path_for(path)
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, path)

    def exists(self, path: str) -> bool:
        return os.path.exists(path)

    def listdir(self, directory: str) -> list[str]:
        """Full paths of the entries of a directory, sorted."""
        return [os.path.join(directory, name) for name in sorted(os.listdir(directory))]

    def join(self, base: str, *parts: str) -> str:
        return os.path.join(base, *parts)


LOCAL_FS = LocalFS()
