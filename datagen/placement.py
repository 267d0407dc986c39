"""Where every document and record goes: the placement rules that make a dataset byte-reproducible.

Each rule is a pure function of a content identity (a document's ``doc_id``, an instance's 64-bit
key), the seed and the config, never of a file name, a worker, an arrival order or a bundle. That
is why the bytes are the same whoever runs the pipeline, wherever, with however many workers:

- ``split_of``: train or eval, by a seeded hash of the document's identity;
- ``pool_of``: the NotNext pool of a document, by another seeded hash, onto ``num_pools_for``
  pools, a count fixed by the census of distinct documents; a pool of more than
  ``notnext_pool_tokens`` tokens is cut into runs of that hash (``pool_cuts``, also from the census);
- ``shard_of_keys``: the shard of an instance, ``(key * num_shards) >> 64``, so a shard is a
  contiguous range of the key space and sorting a shard by key is the global shuffle;
- ``shard_counts``: the number of shards, from ``--num-shards`` or from a deterministic estimate of
  the record bytes (``estimated_record_bytes``), known before any instance exists;
- ``identity_census`` and ``fingerprint``: distinct documents and tokens per split, and a sha256
  over the sorted distinct identities (the manifest's input fingerprint).

The random draws themselves come from ``bert_datagen.datagen.rng``; the instance keys from ``bert_datagen.datagen.instances``.
"""

from __future__ import annotations

import bisect
import hashlib
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from bert_datagen.datagen import rng
from bert_datagen.datagen.config import DatagenConfig, check_shard_count

SPLITS = ("train", "eval")
_U64 = 1 << 64


def split_of(doc_id: int, config: DatagenConfig) -> str:
    """'eval' for a seeded-hash fraction ``eval_fraction`` of document identities, else 'train'."""
    if config.eval_fraction <= 0.0:
        return "train"
    key = rng.derive_key(config.random_seed, "eval-split")
    draw = rng.mix64(int(doc_id) ^ key)
    return "eval" if draw < int(config.eval_fraction * _U64) else "train"


def num_pools_for(n_docs: int, config: DatagenConfig) -> int:
    return max(1, n_docs // config.notnext_pool_size)


def pool_of(doc_id: int, num_pools: int, config: DatagenConfig, cuts: Sequence[int] = ()) -> int:
    """The NotNext pool of a document: a seeded hash of its identity mapped onto ``num_pools``, then
    one more for every cut (``pool_cuts``) at or below the hash."""
    key = rng.derive_key(config.random_seed, "notnext-pool")
    h = rng.mix64(int(doc_id) ^ key)
    return ((h * num_pools) >> 64) + bisect.bisect_right(list(cuts), h)


def pool_hashes(doc_ids: np.ndarray, config: DatagenConfig) -> np.ndarray:
    """The hash ``pool_of`` maps onto the pools, for many documents: documents sorted by it fall into
    pools in contiguous runs, whatever the number of pools."""
    key = np.uint64(rng.derive_key(config.random_seed, "notnext-pool"))
    return rng.mix64_array(np.asarray(doc_ids, dtype=np.uint64) ^ key)


def pool_runs(sorted_hashes: np.ndarray, num_pools: int, cuts: Sequence[int] = ()) -> list[tuple[int, int, int]]:
    """``(pool, lo, hi)`` for each pool that documents ``lo:hi`` of a run sorted by ``pool_hashes``
    fall into (``pool_of`` for each of them), in pool order; empty pools left out."""
    sorted_hashes = np.asarray(sorted_hashes, dtype=np.uint64)
    pools = shard_of_keys(sorted_hashes, num_pools)
    if len(cuts):
        pools += np.searchsorted(np.asarray(cuts, dtype=np.uint64), sorted_hashes, side="right")
    total = num_pools + len(cuts)
    bounds = np.searchsorted(pools, np.arange(total + 1))
    return [(p, int(bounds[p]), int(bounds[p + 1])) for p in range(total) if bounds[p + 1] > bounds[p]]


def pool_cuts(doc_ids: np.ndarray, tokens: np.ndarray, num_pools: int, config: DatagenConfig) -> list[int]:
    """The hashes (``pool_hashes``) at which pools of more than ``notnext_pool_tokens`` tokens are cut,
    sorted; from the distinct documents of a split and their token counts (the census's).

    A pool over the bound is cut, in hash order, into runs each closed at the first document that
    brings it to half the bound, with at least two documents (a NotNext partner is another
    document); a last run of one document or under a quarter of the bound stays with the run before
    it (no pool of a few documents). So pools hold at most half the bound plus two documents (the
    bound itself whenever no document is over a quarter of it) and at least a quarter of it. Pools
    within the bound are not cut: a corpus within it keeps the pools it always had.
    """
    limit = config.notnext_pool_tokens
    tokens = np.asarray(tokens, dtype=np.int64)
    if limit is None or int(tokens.sum()) <= limit:
        return []
    hashes = pool_hashes(doc_ids, config)
    base = shard_of_keys(hashes, num_pools)
    over = np.bincount(base, weights=tokens, minlength=num_pools) > limit  # float64: exact below 2**53 tokens
    if not over.any():
        return []
    # Only the documents of pools over the bound are sorted: a corpus of many small pools costs one pass.
    mine = over[base]
    hashes, tokens, base = hashes[mine], tokens[mine], base[mine]
    order = np.argsort(hashes, kind="stable")
    hashes, base = hashes[order], base[order]
    cum = np.concatenate([[0], np.cumsum(tokens[order])])
    half = -(-limit // 2)
    cuts: list[int] = []
    for pool in np.nonzero(over)[0].tolist():
        lo, hi = np.searchsorted(base, [pool, pool + 1]).tolist()
        starts, at = [], lo
        while True:
            at = max(int(np.searchsorted(cum, cum[at] + half, side="left")), at + 2)
            if at >= hi:
                break
            starts.append(at)
        if starts and (hi - starts[-1] < 2 or cum[hi] - cum[starts[-1]] < limit // 4):
            starts.pop()
        cuts.extend(int(hashes[i]) for i in starts)
    return cuts


def shard_of_keys(keys: np.ndarray, num_shards: int) -> np.ndarray:
    """``(key * num_shards) >> 64`` for every uint64 key, exactly, without 128-bit integers."""
    if not 1 <= num_shards < (1 << 32):
        raise ValueError(f"num_shards {num_shards} out of range")
    keys = np.asarray(keys, dtype=np.uint64)
    n = np.uint64(num_shards)
    hi = keys >> np.uint64(32)
    lo = keys & np.uint64(0xFFFFFFFF)
    return ((hi * n + ((lo * n) >> np.uint64(32))) >> np.uint64(32)).astype(np.int64)


def shards_for_bytes(total_bytes: int, target_shard_mb: float, split: str = "train") -> int:
    """Shards of ``total_bytes`` at the target size: ConfigError beyond MAX_SHARDS (a small target on
    much data), before any shard is written."""
    count = max(1, -(-int(total_bytes) // max(1, int(target_shard_mb * 2**20))))
    return check_shard_count(count, split, target_shard_mb)


def estimated_record_bytes(documents: int, tokens: int, config: DatagenConfig) -> int:
    """A deterministic estimate of a split's TFRecord bytes, from its document and token counts.

    The shard count must be known before instances exist (each task cuts its records by shard
    right away, so no stage holds all records): about one instance per ``max_seq_length - 3``
    tokens (at least one per document) per pass, each about 4 bytes per position (ids, mask,
    segments) plus 8 per prediction slot plus framing and feature names.
    """
    if documents <= 0:
        return 0
    s, p = config.max_seq_length, config.max_predictions_per_seq
    instances = config.dupe_factor * max(documents, -(-tokens // (s - 3)))
    return instances * (4 * s + 8 * p + 180)


def shard_counts(config: DatagenConfig, split_bytes: dict[str, int]) -> dict[str, int]:
    """Shards per split: ``--num-shards`` for train; eval (small) is sized by the target shard size."""
    counts = {}
    for split in splits_of(config):
        if split == "train" and config.num_shards is not None:
            counts[split] = config.num_shards
        else:
            counts[split] = shards_for_bytes(split_bytes.get(split, 0), config.target_shard_mb, split)
    return counts


def splits_of(config: DatagenConfig) -> tuple[str, ...]:
    return SPLITS if config.eval_fraction > 0 else ("train",)


def shard_name(split: str, index: int, count: int) -> str:
    return f"{split}/part-{index:05d}-of-{count:05d}.tfrecord"


def fingerprint(doc_ids: Iterable[np.ndarray]) -> str:
    """sha256 over the sorted, distinct 64-bit document content hashes, each 8 bytes big-endian."""
    arrays = [np.asarray(a, dtype=np.uint64) for a in doc_ids]
    ids = np.unique(np.concatenate(arrays)) if arrays else np.zeros(0, dtype=np.uint64)
    return hashlib.sha256(ids.astype(">u8").tobytes()).hexdigest()


def identity_census(element: tuple[int, Iterable[dict[str, np.ndarray]]],
                    config: DatagenConfig | None = None) -> dict[str, Any]:
    """Distinct documents and their tokens per split (they fix the pool and shard counts) and the
    input fingerprint; given ``config``, each split's ``pool_cuts`` too.

    Holds 16 bytes per document in one place: the price of a fingerprint over sorted identities and
    of pool and shard counts that duplicates cannot change. Equal identities are equal content, so
    a duplicate's token count is the same as the first copy's.
    """
    _, parts = element
    per_split: dict[str, list[np.ndarray]] = {}
    for part in parts:
        for split, arrays in part.items():
            per_split.setdefault(split, []).append(np.asarray(arrays, dtype=np.uint64).reshape(2, -1))
    census: dict[str, Any] = {"fingerprint": fingerprint([a[0] for arrays in per_split.values() for a in arrays])}
    for split, arrays in per_split.items():
        both = np.concatenate(arrays, axis=1)
        ids, first = np.unique(both[0], return_index=True)
        tokens = both[1][first]
        census[f"distinct_docs/{split}"] = int(ids.size)
        census[f"distinct_tokens/{split}"] = int(tokens.sum())
        if config is not None:
            census[f"pool_cuts/{split}"] = pool_cuts(ids, tokens, num_pools_for(int(ids.size), config), config)
    return census


def shard_counts_of(census: dict[str, Any], config: DatagenConfig) -> dict[str, int]:
    """Shards per split, from the distinct documents and tokens the census counted."""
    return shard_counts(config, {s: estimated_record_bytes(int(census.get(f"distinct_docs/{s}", 0)),
                                                           int(census.get(f"distinct_tokens/{s}", 0)), config)
                                 for s in splits_of(config)})
