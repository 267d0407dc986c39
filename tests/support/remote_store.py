"""A fake object store under the scheme fakegcs://, backed by a temp directory (registered with Beam on import)."""

from __future__ import annotations

import os

from apache_beam.io.filesystem import FileMetadata
from apache_beam.io.localfilesystem import LocalFileSystem

SCHEME = "fakegcs"
PREFIX = f"{SCHEME}://"
ROOT: dict[str, str] = {}


class FakeObjectStore(LocalFileSystem):
    """Objects named ``fakegcs://bucket/key`` stored as files under ROOT; no directories. A subclass
    sets its own SCHEME and ROOT to be a second store."""

    SCHEME = SCHEME
    ROOT = ROOT

    @classmethod
    def scheme(cls) -> str:
        return cls.SCHEME

    def _local(self, path: str) -> str:
        prefix = f"{self.SCHEME}://"
        assert path.startswith(prefix), f"not an object path: {path}"
        return os.path.join(self.ROOT["dir"], path[len(prefix):])

    def _remote(self, path: str) -> str:
        return f"{self.SCHEME}://" + os.path.relpath(path, self.ROOT["dir"]).replace(os.sep, "/")

    def join(self, basepath: str, *paths: str) -> str:
        return "/".join([basepath.rstrip("/"), *(p.strip("/") for p in paths)])

    def split(self, path: str) -> tuple[str, str]:
        head, _, tail = path.rstrip("/").rpartition("/")
        return head, tail

    def has_dirs(self) -> bool:
        return False

    def mkdirs(self, path: str) -> None:
        return None

    def _list(self, dir_or_prefix: str):
        root = self._local(dir_or_prefix)
        for dirpath, _, files in os.walk(root if os.path.isdir(root) else os.path.dirname(root)):
            for name in files:
                path = os.path.join(dirpath, name)
                if path.startswith(root):  # object stores list by key prefix, recursively
                    yield FileMetadata(self._remote(path), os.path.getsize(path), os.path.getmtime(path))

    def create(self, path, *args, **kwargs):
        return super().create(self._local(path), *args, **kwargs)

    def open(self, path, *args, **kwargs):
        return super().open(self._local(path), *args, **kwargs)

    def rename(self, sources, destinations) -> None:
        super().rename([self._local(p) for p in sources], [self._local(p) for p in destinations])

    def exists(self, path: str) -> bool:
        return os.path.isfile(self._local(path))  # objects only: a "directory" does not exist

    def size(self, path: str) -> int:
        return super().size(self._local(path))

    def last_updated(self, path: str) -> float:
        return super().last_updated(self._local(path))

    def checksum(self, path: str):
        return super().checksum(self._local(path))

    def metadata(self, path: str) -> FileMetadata:
        meta = super().metadata(self._local(path))
        return FileMetadata(path, meta.size_in_bytes, meta.last_updated_in_seconds)

    def delete(self, paths) -> None:
        super().delete([self._local(p) for p in paths])
