"""File access through Beam's FileSystems, so every path Beam understands works (local, gs://).

Writes are atomic: data goes to a temporary sibling first and is renamed into place, so a reader
never sees a partly written file under its final name.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems

from bert_datagen.contract.fs import LOCAL_FS, TMP_MARKER, decompress_by_name, temp_path_for

__all__ = ["BEAM_FS", "TMP_MARKER", "BeamFS", "FileInfo", "InputNotFoundError", "delete", "ensure_dir", "exists",
           "join", "listdir", "match_files", "open_read", "read_bytes", "temp_path_for", "write_atomic"]


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
        results = FileSystems.match([pattern])[0].metadata_list
        files = [m for m in results if not m.path.endswith("/")]
        if not files:
            raise InputNotFoundError(f"{pattern}: no input file matches this pattern")
        for meta in files:
            found[meta.path] = meta.size_in_bytes
    return [FileInfo(path, size) for path, size in sorted(found.items())]


def _open_raw(path: str):
    return FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED)


def read_bytes(path: str) -> bytes:
    """The file's bytes, decompressed when its name ends in .gz or .bz2."""
    with _open_raw(path) as f:
        return decompress_by_name(path, f.read())


def open_read(path: str):
    """A binary stream of the file as stored (no decompression)."""
    return _open_raw(path)


def join(base: str, *parts: str) -> str:
    return FileSystems.join(base, *parts)


def exists(path: str) -> bool:
    return FileSystems.exists(path)


def write_atomic(path: str, data: bytes) -> None:
    """Write ``data`` to ``path``: temp sibling first, then rename over the final name."""
    if "://" not in path:
        if os.path.isdir(path):
            raise IsADirectoryError(21, "is a directory; refusing to replace it with a file", path)
        LOCAL_FS.write_atomic(path, data)  # the one local implementation: temp sibling, os.replace
        return
    tmp = temp_path_for(path)
    # Object stores have no atomic rename: the final name appears only once the data is complete.
    with FileSystems.create(tmp, mime_type="application/octet-stream",
                            compression_type=CompressionTypes.UNCOMPRESSED) as f:
        f.write(data)
    if FileSystems.exists(path):
        FileSystems.delete([path])
    FileSystems.rename([tmp], [path])


def ensure_dir(directory: str) -> None:
    if "://" not in directory:
        os.makedirs(directory or ".", exist_ok=True)


def delete(paths: list[str]) -> None:
    existing = [p for p in paths if FileSystems.exists(p)]
    if existing:
        FileSystems.delete(existing)


def listdir(directory: str) -> list[str]:
    """Full paths of what a directory holds (one level, as Beam's match lists it)."""
    result = FileSystems.match([join(directory, "*")])[0]
    return [m.path for m in result.metadata_list]


class BeamFS:
    """The contract's filesystem seam (bert_datagen.contract.fs.FileSystem) through Beam's FileSystems."""

    def read_bytes(self, path: str) -> bytes:
        return read_bytes(path)

    def write_atomic(self, path: str, data: bytes) -> None:
        write_atomic(path, data)

    def exists(self, path: str) -> bool:
        return exists(path)

    def listdir(self, directory: str) -> list[str]:
        return listdir(directory)

    def join(self, base: str, *parts: str) -> str:
        return join(base, *parts)

    def glob(self, pattern: str) -> list[str]:
        try:
            return [f.path for f in match_files([pattern])]
        except InputNotFoundError:
            return []


BEAM_FS = BeamFS()
