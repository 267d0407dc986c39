"""The global sample order of a run: which record sits at every position, for any number of ranks.

A pure function of (dataset fingerprint, shard record counts, seed, batch size, block size); every
random choice is a draw of `bert_datagen.datagen.rng`, so any process computes any position alone.

Epoch ``e`` of a dataset of ``T`` records is built in three steps:

1. **Blocks.** Each shard is cut into blocks of ``block_size`` consecutive records (the last one of a
   shard may be shorter); all blocks of all shards are permuted by (seed, fingerprint, epoch). Laid
   end to end they form the epoch's *virtual sequence*, cut again into *chunks* of ``block_size``
   virtual positions: a chunk is a few contiguous record ranges (mostly one), the unit a reader fetches.
2. **Windows.** The virtual sequence is cut into windows of ``batch_size`` chunks
   (``batch_size * block_size`` records). In a full window, chunk slot ``s`` (0 <= s < batch_size)
   feeds position ``s`` of every batch of the window, one record per batch, in a seeded order within
   the chunk; the window's ``block_size`` batches come in a seeded order. So a batch holds records
   of ``batch_size`` different chunks, and a record's place in its batch depends only on its chunk
   slot: rank ``r`` of ``N`` (positions ``[r*B/N, (r+1)*B/N)`` of each batch) needs only the chunks
   of its own slots, 1/N of the bytes, each read in one sequential range, for every N at once.
3. **Tail.** The last, partial window of an epoch is one seeded permutation of its records.

The run's sequence is epoch 0, epoch 1, ... back to back; global batch ``k`` is positions
``[k*B, (k+1)*B)`` of it (a batch may straddle two epochs).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import lru_cache

import numpy as np

from bert_datagen.contract.bounds import INT64_MAX, MAX_SEED, ArgumentError, check_int, max_batches
from bert_datagen.datagen.rng import derive_key, u64_for_keys

ORDER_VERSION = "loader-order-v1"  # in every key the order derives: another value, another order
# The order's name as a run records it (its checkpoints' "input" and RUN files), so that a run
# resumes only on the order it started with.
INPUT_ORDER = "global-order-v1"
DEFAULT_BLOCK_SIZE = 64


@dataclass(frozen=True)
class Placement:
    """Where each asked-for position's record is: epoch, shard (index into the counts), index in the
    shard, and its position in the epoch's virtual sequence (which names the chunk a reader fetches)."""

    epoch: np.ndarray
    shard: np.ndarray
    index: np.ndarray
    virtual: np.ndarray  # position in the epoch's virtual sequence (block order, before the window shuffle)

    def chunk(self, block_size: int) -> np.ndarray:
        return self.virtual // block_size


@dataclass(frozen=True)
class GlobalOrder:
    """The order of one run. ``counts`` are the records of each shard of the split, in manifest order."""

    counts: tuple[int, ...]
    fingerprint: str
    seed: int
    batch_size: int
    block_size: int = DEFAULT_BLOCK_SIZE
    _blocks: dict = field(default_factory=dict, repr=False, compare=False)
    _windows: dict = field(default_factory=dict, repr=False, compare=False)

    def __post_init__(self) -> None:
        check_order(self.seed, self.batch_size, self.block_size)
        for count in self.counts:
            check_int(count, "a shard's record count")
        check_int(self.total, "the split's record count")
        if self.total < self.batch_size:
            raise ValueError(f"the split has {self.total} records, fewer than one batch of {self.batch_size}")

    @property
    def total(self) -> int:
        return int(sum(self.counts))

    def _key(self, *parts: int | str) -> int:
        return derive_key(self.seed, ORDER_VERSION, self.fingerprint, *parts)

    def blocks(self, epoch: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(shard, first record, virtual start) of every block of the epoch, in permuted order."""
        cached = self._blocks.get(epoch)
        if cached is None:
            if len(self._blocks) > 2:  # a run moves forward: keep the epochs in use only
                self._blocks.clear()
            cached = self._blocks[epoch] = _permuted_blocks(self.counts, self.block_size,
                                                            self._key("blocks", epoch))
        return cached

    def place(self, positions: np.ndarray) -> Placement:
        """The records at these global positions (any order, any epochs)."""
        pos = positions_array(positions)
        epoch, offset = np.divmod(pos, self.total)
        virtual = np.empty_like(pos)
        for e in np.unique(epoch).tolist():
            sel = epoch == e
            virtual[sel] = self._virtual(int(e), offset[sel])
        shard = np.empty_like(pos)
        index = np.empty_like(pos)
        for e in np.unique(epoch).tolist():
            sel = epoch == e
            shard[sel], index[sel] = self.locate(int(e), virtual[sel])
        return Placement(epoch, shard, index, virtual)

    def locate(self, epoch: int, virtual: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(shard, index in shard) of positions of an epoch's virtual sequence."""
        b_shard, b_first, b_start = self.blocks(epoch)
        b = np.searchsorted(b_start, virtual, side="right") - 1
        return b_shard[b], b_first[b] + virtual - b_start[b]

    def _virtual(self, epoch: int, offset: np.ndarray) -> np.ndarray:
        """Virtual-sequence position of each within-epoch offset (the window shuffle)."""
        B, bs = self.batch_size, self.block_size

        def full(w: int, q: np.ndarray) -> np.ndarray:
            batch_in_window, slot = np.divmod(q, B)
            rounds, perms = self._window(epoch, w)
            return slot * bs + perms[slot, rounds[batch_in_window]]

        return self._by_window(offset, full, lambda w, q: self._tail(epoch, w)[q])

    def offsets_of(self, epoch: int, virtual: np.ndarray) -> np.ndarray:
        """The within-epoch offset (position in the epoch) of records at these places of the epoch's
        virtual sequence: the inverse of the window shuffle, so a reader can lay records out in the
        order they will be asked for."""
        B, bs = self.batch_size, self.block_size

        def full(w: int, q: np.ndarray) -> np.ndarray:
            slot, within = np.divmod(q, bs)
            rounds, perms = self._window(epoch, w)
            which_round = np.argsort(perms, axis=1)[slot, within]  # perms[slot, r] == within
            return np.argsort(rounds)[which_round] * B + slot

        return self._by_window(np.asarray(virtual, np.int64), full, lambda w, q: np.argsort(self._tail(epoch, w))[q])

    def _by_window(self, at: np.ndarray, full: Callable[[int, np.ndarray], np.ndarray],
                   tail: Callable[[int, np.ndarray], np.ndarray]) -> np.ndarray:
        """A mapping that keeps records in their window: ``full(w, q)`` or, for the epoch's last,
        partial window, ``tail(w, q)`` maps each place ``q`` in window ``w`` to a place in it."""
        window_len = self.batch_size * self.block_size
        full_windows = self.total // window_len
        window, q = np.divmod(at, window_len)
        out = np.empty_like(at)
        for w in np.unique(window).tolist():
            sel = window == w
            out[sel] = w * window_len + (full if w < full_windows else tail)(w, q[sel])
        return out

    def window_of(self, positions: np.ndarray) -> np.ndarray:
        """The window of each position of the run's sequence, numbered across epochs (a later window
        has a larger number)."""
        window_len = self.batch_size * self.block_size
        epoch, offset = np.divmod(positions, self.total)
        return epoch * (self.total // window_len + 1) + offset // window_len

    def _tail(self, epoch: int, w: int) -> np.ndarray:
        """The shuffle of the epoch's last window (``w``), which is partial: one permutation of it."""
        return permutation(self._key("tail", epoch), self.total - w * self.batch_size * self.block_size)

    def _window(self, epoch: int, w: int) -> tuple[np.ndarray, np.ndarray]:
        """Of full window ``w``: the round each of its batches takes, and each chunk slot's own
        permutation of range(block_size) (slots x block_size); computed once for the window's batches."""
        cached = self._windows.get((epoch, w))
        if cached is None:
            if len(self._windows) > 3:  # a run moves forward: keep the windows in use only
                self._windows.clear()
            B, bs = self.batch_size, self.block_size
            rounds = permutation(self._key("batches", epoch, w), bs)
            chunks = np.arange(w * B, (w + 1) * B, dtype=np.uint64)
            cached = self._windows[(epoch, w)] = (rounds, _chunk_perms(self._key("chunk", epoch), chunks, bs))
        return cached

    def record_ranges(self, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The records at these positions as ``(shard, first, end)`` ranges in file order (each
        shard's runs of consecutive records: one read each), and where each position's record is
        among the ranges' records laid end to end (``rows[i]``: position ``i``'s)."""
        placed = self.place(positions)
        by_file = np.lexsort((placed.index, placed.shard))
        shard, index = placed.shard[by_file], placed.index[by_file]
        run = np.flatnonzero(np.concatenate([[True], (np.diff(shard) != 0) | (np.diff(index) != 1)]))
        length = np.diff(np.append(run, len(shard)))
        ranges = np.stack([shard[run], index[run], index[run] + length], axis=1).reshape(-1, 3)
        rows = np.empty(len(by_file), np.int64)
        rows[by_file] = np.arange(len(by_file))
        return ranges, rows

    def batch_positions(self, step: int, world_size: int = 1, rank: int = 0) -> np.ndarray:
        """Global positions of rank ``rank``'s share of global batch ``step`` (contiguous B/N)."""
        check_world(self.batch_size, world_size, rank)
        check_step(step, self.batch_size)
        share = self.batch_size // world_size
        start = step * self.batch_size + rank * share
        return np.arange(start, start + share, dtype=np.int64)

    def batch(self, step: int, world_size: int = 1, rank: int = 0) -> Placement:
        return self.place(self.batch_positions(step, world_size, rank))


def positions_array(positions: object) -> np.ndarray:
    """``positions`` as int64, refused (ArgumentError) unless they are non-negative integers: a
    float would be truncated and a negative one would name a record of no epoch."""
    pos = np.asarray(positions)
    if pos.size and not (np.issubdtype(pos.dtype, np.integer) and not np.issubdtype(pos.dtype, np.bool_)):
        raise ArgumentError("positions", f"positions must be integers, got an array of {pos.dtype}")
    if pos.size and (pos.min() < 0 or (pos.dtype == np.uint64 and pos.max() > INT64_MAX)):
        raise ArgumentError("positions", f"positions must be in [0, {INT64_MAX}], got one of {pos.min()} .. {pos.max()}")
    return pos.astype(np.int64, copy=False)


def check_order(seed: int, batch_size: int, block_size: int) -> None:
    """ArgumentError (a ValueError) naming the argument unless an order of these can be computed:
    a seed a run can take, a window (``batch_size * block_size`` positions) that fits in int64."""
    check_int(seed, "seed", 0, MAX_SEED)
    check_int(batch_size, "batch_size", 1)
    check_int(block_size, "block_size", 1, INT64_MAX // batch_size,
              f" (a window of batch_size x block_size positions fits in 64 bits at batch size {batch_size})")


def check_step(step: int, batch_size: int) -> int:
    """``step`` when global batch ``step`` is one the order can index (its positions fit in int64);
    else ArgumentError."""
    return check_int(step, "step", 0, max_batches(batch_size) - 1,
                     f" (the positions of a global batch of {batch_size} fit in 64 bits)")


def check_world(batch_size: int, world_size: int, rank: int) -> None:
    check_int(world_size, "world_size", 1)
    check_int(rank, "rank", 0)
    if rank >= world_size:
        raise ValueError(f"rank {rank} is not in a world of {world_size}")
    if batch_size % world_size:
        raise ValueError(f"the global batch size {batch_size} is not a multiple of the world size {world_size}")


def epoch_order(counts: tuple[int, ...], fingerprint: str, seed: int, epoch: int, batch_size: int,
                block_size: int = DEFAULT_BLOCK_SIZE) -> tuple[np.ndarray, np.ndarray]:
    """(shard, index in shard) of every record of an epoch, in the order a run reads them: the whole
    epoch at once, for readers (tf.data) that want a file list rather than positions."""
    order = GlobalOrder(tuple(counts), fingerprint, seed, batch_size, block_size)
    check_int(epoch, "epoch", 0, INT64_MAX // order.total - 1, " (its positions fit in 64 bits)")
    placed = order.place(np.arange(epoch * order.total, (epoch + 1) * order.total, dtype=np.int64))
    return placed.shard, placed.index


@lru_cache(maxsize=4096)
def _perm_cached(key: int, n: int) -> np.ndarray:
    # Sorting by (draw, i) is a permutation from the key alone: no state, any n, vectorized.
    draws = u64_for_keys(np.uint64(key), np.arange(n, dtype=np.uint64))
    out = np.lexsort((np.arange(n), draws))
    out.setflags(write=False)
    return out


def permutation(key: int, n: int) -> np.ndarray:
    """A permutation of range(n), a pure function of ``key`` (a `derive_key` value); read-only."""
    return _perm_cached(key, n)


def _chunk_perms(key: int, chunks: np.ndarray, bs: int) -> np.ndarray:
    """Each chunk's own permutation of range(bs), a row per chunk: sorting by (draw, i) as `permutation` does."""
    keys = u64_for_keys(np.uint64(key), chunks.astype(np.uint64))
    draws = u64_for_keys(keys[:, None], np.arange(bs, dtype=np.uint64)[None, :])
    ties = np.broadcast_to(np.arange(bs), draws.shape)
    return np.lexsort((ties, draws), axis=-1).astype(np.int64)


def _permuted_blocks(counts: tuple[int, ...], block_size: int, key: int
                     ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    counts_a = np.asarray(counts, np.int64)
    per_shard = -(-counts_a // block_size)
    shard = np.repeat(np.arange(len(counts_a)), per_shard)
    first_of_shard = np.concatenate([[0], np.cumsum(per_shard)[:-1]]).astype(np.int64)
    first = (np.arange(len(shard)) - first_of_shard[shard]) * block_size
    length = np.minimum(block_size, counts_a[shard] - first)
    perm = permutation(key, len(shard))
    shard, first, length = shard[perm], first[perm], length[perm]
    start = np.concatenate([[0], np.cumsum(length)[:-1]]).astype(np.int64)
    for a in (shard, first, start):
        a.setflags(write=False)
    return shard, first, start
