"""The data side's backend of the filesystem interface (bert_datagen.contract.fs): Beam's FileSystems,
so every path Beam understands works (local, gs://, filesystems the tests register with Beam).

`BEAM_FS` is the one filesystem of the pipelines; the functions below are shorthands for it (and for
Beam's pattern matching, which input patterns go through). Writes are atomic: data goes to a marked
temporary sibling first and is renamed into place, so a reader never sees a partly written file under
its final name.
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass
from typing import Any, BinaryIO

from bert_datagen.contract.buckets import BUCKETS, SCHEMES, is_bucket_path
from bert_datagen.contract.fs import (
    LOCAL_FS,
    TMP_MARKER,
    PathFS,
    decompress_by_name,
    is_remote,
    temp_path_for,
)


def _beam_filesystems() -> Any:
    """Beam's FileSystems, imported on first use: reading a dataset (the tools) needs no Beam."""
    from apache_beam.io.filesystems import FileSystems

    return FileSystems


def _has_beam() -> bool:
    try:
        return importlib.util.find_spec("apache_beam") is not None
    except (ImportError, ValueError):  # a blocked or half-removed install
        return False


def _bucket_client_missing(path: str) -> bool:
    """A gs:// path on a machine with Beam's GCS filesystem but without gcsfs (a Dataflow worker given
    only this package's wheel): Beam serves it, as it did before buckets had their own clients."""
    if not path.startswith("gs://"):
        return False
    try:
        return (importlib.util.find_spec(SCHEMES["gs"][0]) is None
                and importlib.util.find_spec("apache_beam.io.gcp.gcsfilesystem") is not None)
    except (ImportError, ValueError):
        return False

__all__ = ["BEAM_FS", "TMP_MARKER", "BeamFS", "BeamObjects", "FileInfo", "InputNotFoundError", "delete",
           "ensure_dir", "exists", "join", "listdir", "match_files", "open_read", "read_bytes", "temp_path_for",
           "write_atomic"]


class InputNotFoundError(FileNotFoundError):
    """A pattern that matched no file."""


@dataclass(frozen=True)
class FileInfo:
    path: str
    size: int


def match_files(patterns: list[str]) -> list[FileInfo]:
    """Every file matched by the patterns, deduplicated and sorted by path.

    Sorting makes the listing independent of the order the patterns or the
    filesystem return them in.
    """
    found: dict[str, int] = {}
    for pattern in patterns:
        if is_bucket_path(pattern) and not _bucket_client_missing(pattern):
            sizes = {p: BUCKETS.size(p) for p in BUCKETS.glob(pattern)}
        else:
            sizes = {m.path: m.size_in_bytes for m in _beam_filesystems().match([pattern])[0].metadata_list
                     if not m.path.endswith("/")}
        if not sizes:
            raise InputNotFoundError(f"{pattern}: no input file matches this pattern")
        found.update(sizes)
    return [FileInfo(path, size) for path, size in sorted(found.items())]


class BeamObjects:
    """The object-store primitives of `bert_datagen.contract.fs.ObjectStore` through Beam's FileSystems."""

    def open_read(self, path: str) -> BinaryIO:
        from apache_beam.io.filesystem import CompressionTypes

        return _beam_filesystems().open(path, compression_type=CompressionTypes.UNCOMPRESSED)

    def write(self, path: str, data: bytes) -> None:
        from apache_beam.io.filesystem import CompressionTypes

        with _beam_filesystems().create(path, mime_type="application/octet-stream",
                                        compression_type=CompressionTypes.UNCOMPRESSED) as f:
            f.write(data)

    def exists(self, path: str) -> bool:
        return _beam_filesystems().exists(path)

    def rename(self, src: str, dst: str) -> None:
        _beam_filesystems().rename([src], [dst])

    def delete(self, paths: list[str]) -> None:
        _beam_filesystems().delete(paths)

    def list_prefix(self, prefix: str) -> list[str]:
        try:
            return [f.path for f in match_files([prefix + "**"])]
        except InputNotFoundError:
            return []

    def glob(self, pattern: str) -> list[str]:
        try:
            return [f.path for f in match_files([pattern])]
        except InputNotFoundError:
            return []

    def join(self, base: str, *parts: str) -> str:
        return _beam_filesystems().join(base, *parts)


class BeamFS(PathFS):
    """The filesystem interface with Beam as the object-store backend; listing and globbing go through
    Beam's matching for local paths too (input patterns mean the same everywhere)."""

    def __init__(self) -> None:
        super().__init__(BeamObjects())

    def store(self, path: str) -> Any:
        return self.remote if _bucket_client_missing(path) else super().store(path)

    def read_bytes(self, path: str) -> bytes:
        # PathFS reads a bucket object through its bucket client, not through `store`: a Dataflow
        # worker without gcsfs failed every spill, pool and fragment read here (No module named
        # 'aiohttp'), while its writes went through Beam (tests/pipelines/test_dataflow_workers.py).
        if _bucket_client_missing(path):
            with self.remote.open_read(path) as f:
                return decompress_by_name(path, f.read())
        return super().read_bytes(path)

    def open_read(self, path: str) -> BinaryIO:
        if not is_remote(path) and not _has_beam():
            return LOCAL_FS.open_read(path)
        return self.store(path).open_read(path)

    def join(self, base: str, *parts: str) -> str:
        if not is_remote(base) and not _has_beam():
            return os.path.join(base, *parts)
        return self.store(base).join(base, *parts)

    def listdir(self, directory: str) -> list[str]:
        """Full paths of the files directly in a directory (as Beam's match lists a local one)."""
        if is_bucket_path(directory) and not _bucket_client_missing(directory):
            prefix = directory.rstrip("/") + "/"
            return [p for p in self.objects_under(directory) if "/" not in p[len(prefix):]]
        if not is_remote(directory) and not _has_beam():
            return [p for p in LOCAL_FS.listdir(directory) if os.path.isfile(p)]
        result = _beam_filesystems().match([self.join(directory, "*")])[0]
        return [m.path for m in result.metadata_list]

    def glob(self, pattern: str) -> list[str]:
        if not is_remote(pattern) and not _has_beam():
            return LOCAL_FS.glob(pattern)
        return self.store(pattern).glob(pattern)


BEAM_FS = BeamFS()

read_bytes = BEAM_FS.read_bytes
open_read = BEAM_FS.open_read  # a binary stream of the file as stored (no decompression)
join = BEAM_FS.join
exists = BEAM_FS.exists
write_atomic = BEAM_FS.write_atomic
ensure_dir = BEAM_FS.makedirs
delete = BEAM_FS.delete
listdir = BEAM_FS.listdir
