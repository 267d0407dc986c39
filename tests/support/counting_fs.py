"""A filesystem that counts what a reader fetches: the library's own with every request and byte
counted, record bytes apart from index bytes (tests and benchmarks/bench_buckets.py)."""

from __future__ import annotations

from typing import Any

from bert_datagen.contract.fs import DEFAULT_FS, FileSystem


class CountingFS:
    """``DEFAULT_FS`` (or ``fs``) with the bytes and requests of every read counted: ranged reads
    (a bucket serves each range as one request), whole-object reads, the streams of a walk, and
    metadata requests. ``bytes`` are all of them: ``record_bytes`` those of the shards, ``index_bytes``
    those of their ``*.index`` files, the rest the manifest and vocab."""

    def __init__(self, fs: FileSystem = DEFAULT_FS) -> None:
        self.fs = fs
        self.requests = 0
        self.bytes = 0
        self.index_bytes = 0
        self.record_bytes = 0
        self.index_reads: dict[str, int] = {}

    def _count(self, path: str, n: int, requests: int) -> None:
        self.requests += requests
        self.bytes += n
        if path.endswith(".index"):
            self.index_bytes += n
            self.index_reads[path] = self.index_reads.get(path, 0) + 1
        elif ".tfrecord" in path.rsplit("/", 1)[-1]:
            self.record_bytes += n

    def read_ranges(self, path: str, ranges: list[tuple[int, int]]) -> list[bytes]:
        out = self.fs.read_ranges(path, ranges)
        self._count(path, sum(len(p) for p in out), len(ranges))
        return out

    def read_bytes(self, path: str) -> bytes:
        out = self.fs.read_bytes(path)
        self._count(path, len(out), 1)
        return out

    def open_read(self, path: str) -> Any:
        counter, stream = self, self.fs.open_read(path)

        class Counted:  # the walk of a shard without an index: a request per block read
            def read(self, n: int = -1) -> bytes:
                data = stream.read(n)
                counter._count(path, len(data), bool(data))
                return data

            def __enter__(self) -> Counted:
                return self

            def __exit__(self, *exc: object) -> None:
                stream.close()

        return Counted()

    def version(self, path: str) -> str:
        self.requests += 1
        return self.fs.version(path)  # type: ignore[attr-defined]

    def exists(self, path: str) -> bool:
        self.requests += 1
        return self.fs.exists(path)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.fs, name)
