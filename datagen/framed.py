"""Framed TFRecords keyed by instance key: how a pool pass becomes record bytes, and a shard its order.

One call chain, downward: ``encode_pool_pass`` plans a pool's pass (``bert_datagen.datagen.instances``), lays out
and masks its instances a block at a time in key order and encodes and frames them
(``bert_datagen.datagen.records``). The result, an ``EncodedRecords`` (one blob plus per-record keys and
lengths), is cut by shard (``bert_datagen.datagen.placement.shard_of_keys``: each shard is a contiguous run of
it) and, once every pass has been built, ``sorted_shard`` merges a shard's pieces by key.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from bert_datagen.datagen.config import DatagenConfig
from bert_datagen.datagen.documents import TokenizedDocument
from bert_datagen.datagen.instances import FlatPool, PoolPlan, masked_rows, plan_pool_pass
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
    """A pool pass's records in key order, each record's NotNext label and masked-token count (same
    order), and the pass's own counters (``PoolPlan.stats``)."""

    records: EncodedRecords
    labels: np.ndarray  # int32
    masked: np.ndarray  # int64
    stats: dict[str, int]


ENCODE_CHUNK_ROWS = 4096


def encode_pool_pass(pool: Sequence[TokenizedDocument] | FlatPool, pass_index: int, config: DatagenConfig,
                     vocab: Vocab) -> PassRecords | None:
    """The records of one pass over ``pool`` (sorted, one document per identity: ``unique_documents``);
    None for a pool without sentences.

    The caller may hand over its only reference to ``pool``: once planned, the pool is let go (the
    plan holds its own copy of the tokens).
    """
    plan = plan_pool_pass(pool, pass_index, config)
    del pool
    if plan is None:
        return None
    records, labels, masked = _encode_plan(plan, config, vocab)
    return PassRecords(records, labels, masked, plan.stats)


def _encode_plan(plan: PoolPlan, config: DatagenConfig, vocab: Vocab) -> tuple[EncodedRecords, np.ndarray, np.ndarray]:
    """A pool pass's records, laid out, masked, encoded and framed in key order, a block at a time.

    Key order makes every shard (a range of keys) a contiguous slice of the result; blocks keep
    every temporary small, and no full-size instance batch ever exists. Also returns each
    record's NotNext label and masked-token count, in the same order.
    """
    order = np.argsort(plan.keys, kind="stable")
    blobs: list[bytes] = []
    lengths: list[np.ndarray] = []
    masked: list[np.ndarray] = []
    for lo in range(0, len(order), ENCODE_CHUNK_ROWS):
        batch = masked_rows(plan, order[lo:lo + ENCODE_CHUNK_ROWS], config, vocab)
        framed, framed_lengths = frame_columns(batch.columns())
        blobs.append(framed)
        lengths.append(framed_lengths)
        weights = batch.masked_lm_weights  # None for dynamic masking: nothing masked yet
        masked.append(np.zeros(len(batch), np.int64) if weights is None else (weights > 0).sum(axis=1))
    if not blobs:
        return EncodedRecords.empty(), np.zeros(0, np.int32), np.zeros(0, np.int64)
    records = EncodedRecords(plan.keys[order], np.concatenate(lengths).astype(np.int64), b"".join(blobs))
    labels = np.zeros(len(order), np.int32) if plan.labels is None else plan.labels[order]  # no NSP: none
    return records, labels, np.concatenate(masked)


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
