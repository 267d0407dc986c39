"""Framed TFRecords keyed by instance key: how a pool pass becomes record bytes, and a shard its order.

One call chain, downward: ``encode_pool_pass`` plans a pool's pass (``bert_datagen.datagen.instances``), lays out
and masks its instances a block at a time in key order and encodes and frames them
(``bert_datagen.datagen.records``). The result, an ``EncodedRecords`` (one blob plus per-record keys and
lengths), is cut by shard (``bert_datagen.datagen.placement.shard_of_keys``: each shard is a contiguous run of
it) and, once every pass has been built, ``sorted_shard`` merges a shard's pieces by key.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from bert_datagen.datagen.config import DatagenConfig
from bert_datagen.datagen.documents import TokenizedDocument
from bert_datagen.datagen.instances import FlatPool, PoolPlan, masked_rows, plan_pool_pass
from bert_datagen.datagen.placement import shard_of_keys
from bert_datagen.datagen.records import frame_columns

if TYPE_CHECKING:
    from bert_datagen.vocab.vocab_file import Vocab


@dataclass
class EncodedRecords:
    """Framed TFRecords of one task, as one blob (cheap to pickle) with per-record keys and lengths."""

    keys: np.ndarray  # uint64
    lengths: np.ndarray  # int64, framed bytes per record
    blob: bytes | np.ndarray  # framed records back to back; a uint8 view when read from a staging file

    @classmethod
    def empty(cls) -> EncodedRecords:
        return cls(np.zeros(0, np.uint64), np.zeros(0, np.int64), b"")

    def __len__(self) -> int:
        return int(self.keys.shape[0])

    def slice(self, lo: int, hi: int) -> EncodedRecords:
        start = int(self.lengths[:lo].sum())
        size = int(self.lengths[lo:hi].sum())
        return EncodedRecords(self.keys[lo:hi], self.lengths[lo:hi], self.blob[start:start + size])


@dataclass
class PassRecords:
    """Records of a pool pass in key order (all of them, or one shard's run), each record's NotNext
    label and masked-token count (same order), and the pass's own counters (``PoolPlan.stats``)."""

    records: EncodedRecords
    labels: np.ndarray  # int32
    masked: np.ndarray  # int64
    stats: dict[str, int]


ENCODE_CHUNK_ROWS = 4096


def encode_pool_pass(pool: Sequence[TokenizedDocument] | FlatPool, pass_index: int, config: DatagenConfig,
                     vocab: Vocab) -> PassRecords | None:
    """The records of one pass over ``pool`` (sorted, one document per identity: ``unique_documents``);
    None for a pool without sentences. The whole pass at once: ``pass_shard_records`` hands it over a
    shard at a time."""
    plan = plan_pool_pass(pool, pass_index, config)
    del pool
    if plan is None:
        return None
    parts = list(pass_shard_records(plan, config, vocab, 1))
    if not parts:
        return PassRecords(EncodedRecords.empty(), np.zeros(0, np.int32), np.zeros(0, np.int64), plan.stats)
    return parts[0][1]


def pass_shard_records(plan: PoolPlan, config: DatagenConfig, vocab: Vocab, num_shards: int
                       ) -> Iterator[tuple[int, PassRecords]]:
    """A planned pool pass's records, laid out, masked, encoded and framed in key order, a block of
    rows at a time, handed over one shard's run at a time: (shard, its records), shards rising.

    Key order makes every shard (a range of keys) a contiguous run; only the block being encoded
    and the shard being gathered are in memory, never the whole pass's records (a pass of an 8 M
    token pool is about 70 MB of records). The pass's counters ride on the first shard's records.
    """
    order = np.argsort(plan.keys, kind="stable")
    keys = plan.keys[order]
    labels = np.zeros(len(order), np.int32) if plan.labels is None else plan.labels[order]  # no NSP: none
    ends = np.searchsorted(shard_of_keys(keys, num_shards), np.arange(1, num_shards + 1)).tolist()
    gathered = _ShardRun()
    stats = plan.stats
    shard, at = 0, 0
    for lo in range(0, len(order), ENCODE_CHUNK_ROWS):
        hi = min(lo + ENCODE_CHUNK_ROWS, len(order))
        batch = masked_rows(plan, order[lo:hi], config, vocab)
        framed, lengths = frame_columns(batch.columns())
        weights = batch.masked_lm_weights  # None for dynamic masking: nothing masked yet
        masked = np.zeros(len(batch), np.int64) if weights is None else (weights > 0).sum(axis=1)
        offsets = np.concatenate([[0], np.cumsum(lengths)]).tolist()
        view = memoryview(framed)
        while at < hi:
            while ends[shard] <= at:
                shard += 1
            stop = min(hi, ends[shard])
            gathered.add(view[offsets[at - lo]:offsets[stop - lo]], lengths[at - lo:stop - lo], masked[at - lo:stop - lo])
            at = stop
            if stop == ends[shard]:
                first = stop - gathered.rows
                yield shard, gathered.take(keys[first:stop], labels[first:stop], stats)
                stats = {}


class _ShardRun:
    """The pieces of one shard's run of a pass, gathered across encoding blocks."""

    def __init__(self) -> None:
        self._reset()

    def _reset(self) -> None:
        self.blobs: list[bytes] = []
        self.lengths: list[np.ndarray] = []
        self.masked: list[np.ndarray] = []
        self.rows = 0

    def add(self, blob: memoryview, lengths: np.ndarray, masked: np.ndarray) -> None:
        self.blobs.append(bytes(blob))
        self.lengths.append(lengths)
        self.masked.append(masked)
        self.rows += len(lengths)

    def take(self, keys: np.ndarray, labels: np.ndarray, stats: dict[str, int]) -> PassRecords:
        blob = self.blobs[0] if len(self.blobs) == 1 else b"".join(self.blobs)
        records = EncodedRecords(keys, np.concatenate(self.lengths).astype(np.int64), blob)
        masked = np.concatenate(self.masked)
        self._reset()
        return PassRecords(records, labels, masked, stats)


def sorted_shard(parts: list[EncodedRecords], where: str) -> EncodedRecords:
    """A shard's records ordered by key; two records with one key is a bug, so it fails loudly.

    Records are gathered straight from the parts' buffers (one copy: the final join).
    """
    parts = [p for p in parts if len(p)]
    if not parts:
        return EncodedRecords.empty()
    keys = np.concatenate([p.keys for p in parts])
    lengths = np.concatenate([p.lengths for p in parts])
    part_of = np.repeat(np.arange(len(parts)), [len(p) for p in parts])
    starts = np.concatenate([np.cumsum(p.lengths) - p.lengths for p in parts])
    order = np.argsort(keys, kind="stable")
    keys = keys[order]
    if keys.size > 1:
        dup = np.nonzero(keys[1:] == keys[:-1])[0]
        if dup.size:
            raise RuntimeError(f"{where}: two instances share the key {int(keys[dup[0]]):#018x}; "
                               "instance keys must be unique")
    views = [memoryview(p.blob) for p in parts]
    lengths = lengths[order]
    spans = zip(part_of[order].tolist(), starts[order].tolist(), lengths.tolist(), strict=True)
    blob = b"".join([views[i][lo:lo + n] for i, lo, n in spans])
    return EncodedRecords(keys, lengths, blob)
