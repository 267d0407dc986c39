"""Reading a dataset's shards: a shard's record stream, particular records, and a process pool.

Shards are spread over a process pool, so a check uses every core and constant memory per worker.
"""

from __future__ import annotations

import io
import multiprocessing
import os
import signal
from collections.abc import Callable, Iterator

import numpy as np

from bert_datagen.contract.dataset import Dataset, DatasetError, ShardRef
from bert_datagen.contract.fs import is_remote
from bert_datagen.contract.loading.shard_index import ShardIndexError, ShardOffsets
from bert_datagen.datagen.example_codec import Batch, decode_batch
from bert_datagen.datagen.record_rules import RecordShape
from bert_datagen.datagen.tfrecord import CHUNK_BYTES, RecordError, ShardStream, iter_tfrecords
from bert_datagen.pipelines.beam import fsio


def shard_stream(ref: ShardRef, chunk_bytes: int = CHUNK_BYTES) -> ShardStream:
    """The shard's TFRecord stream, opened through Beam's filesystems (local, gs://)."""
    return ShardStream(ref.path, ref.name, chunk_bytes=chunk_bytes, opener=fsio.open_read)


def pool_start_method(tasks: list) -> str:
    """'fork' for local files (cheap); 'spawn' when a task reads a remote filesystem, because a forked
    child would share the parent's open HTTP connections (the manifest and vocab were read with them)."""
    remote = any(is_remote(getattr(t.ref, "path", "")) for t in tasks)
    return "spawn" if remote else "fork"


def map_shards(fn: Callable, tasks: list, workers: int | None = None) -> list:
    """fn over tasks in order, on a process pool when there is more than one worker and task."""
    workers = workers or os.cpu_count() or 1
    workers = min(workers, len(tasks))
    if workers <= 1:
        return [fn(t) for t in tasks]
    with multiprocessing.get_context(pool_start_method(tasks)).Pool(workers, initializer=_pool_worker_signals) as pool:
        results = list(pool.imap(fn, tasks, chunksize=1))
        # Let the workers end by themselves: leaving the block terminates them (SIGTERM) otherwise.
        pool.close()
        pool.join()
    return results


def _pool_worker_signals() -> None:
    """A forked worker inherits the CLI's SIGINT and SIGTERM handlers, which raise KeyboardInterrupt:
    the pool's terminate() (after an error or an interrupt) then printed "Process ForkPoolWorker-N:"
    with a traceback, and could leave a worker stuck on a lock the interrupt left held, the command
    waiting for it forever. The parent handles an interrupt (and terminates the pool); a worker just
    ends on SIGTERM."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


def read_records(ref: ShardRef, shape: RecordShape, start: int, count: int) -> tuple[Batch, list[str]]:
    """Records [start, start+count) of a shard, decoded; problems met on the way as strings. Through
    the shard's record index when it has one (two ranged reads); else, or when the index or those
    records do not check out, by reading the shard from its start (which reports what is wrong)."""
    indexed = _indexed_payloads(ref, start, count)
    stream_problems: list[tuple[int | None, str]] = []
    if indexed is not None:
        got_idx, got = indexed
    else:
        stream = shard_stream(ref, chunk_bytes=1 << 20)
        got_idx, got = [], []
        for indices, payloads in stream.batches():
            for i, p in zip(indices, payloads, strict=True):
                if start <= i < start + count:
                    got_idx.append(i)
                    got.append(p)
            if indices and indices[-1] >= start + count - 1:
                break
        stream_problems = stream.problems
    if not got:
        empty = {k: np.zeros((0, c), np.float32 if d == "float32" else np.int64)
                 for k, (d, c) in shape.spec().items()}
        return Batch(np.zeros(0, np.int64), empty), [f"{ref.name}: {m}" for _, m in stream_problems]
    batch, problems = decode_batch(got, got_idx, shape)
    msgs = [f"{ref.name}: record {i}: {m}" for i, m in problems] + [f"{ref.name}: {m}" for _, m in stream_problems]
    return batch, msgs


def _indexed_payloads(ref: ShardRef, start: int, count: int) -> tuple[list[int], list[bytes]] | None:
    """(indices, payloads) of records [start, start+count) read through the shard's index: its
    lines of those records (checked), then their bytes, frames and CRCs checked; None when there is no index
    or anything does not check out."""
    if ref.index is None or ref.expected is None:
        return None
    records = ref.expected.records
    stop = min(start + count, records)
    if start >= stop:
        return None
    try:
        # Its blocks of lines, each checked against its digest (the whole index where it has none).
        where = ShardOffsets(ref, records, fsio.BEAM_FS)
        where.learn(np.arange(start, stop))
        [data] = fsio.BEAM_FS.read_ranges(ref.path, [(int(where.offsets[start]), int(where.offsets[stop]))])
        payloads = list(iter_tfrecords(io.BytesIO(data), ref.name))
    except (ShardIndexError, RecordError, OSError):
        return None
    return list(range(start, stop)), payloads


def iter_payloads(ref: ShardRef) -> Iterator[tuple[int, bytes]]:
    stream = shard_stream(ref)
    for indices, payloads in stream.batches():
        yield from zip(indices, payloads, strict=True)


def pick_shard(ds: Dataset, split: str | None, shard: int) -> ShardRef:
    if split is None:
        split = "train" if "train" in ds.splits else ds.splits[0]
    refs = [r for r in ds.shards if r.split == split]
    if not refs:
        known = ", ".join(ds.splits)
        raise DatasetError(f"no shards in split {split!r} (splits: {known})")
    if not 0 <= shard < len(refs):
        raise DatasetError(f"--shard {shard} is out of range: split {refs[0].split!r} has {len(refs)} shards")
    return refs[shard]
