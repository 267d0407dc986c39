"""The NumPy batch iterator: rank ``rank`` of ``world_size``'s share of every global batch of the
`GlobalOrder`, as a dict of arrays (every feature of the records; dynamic masking applied).

A rank reads only the chunks its batch positions need (1/N of a full window's bytes), each chunk
as one CRC-checked range read, and of an epoch's last, partial window (one permutation of its
records) just the records at its positions; it keeps the window(s) it is in: memory is bounded by
``batch_size * block_size / world_size`` records a window.
Its state is one number, the next global step, so it resumes at any step and into any world size.
"""

from __future__ import annotations

import numpy as np

from bert_datagen.contract.bounds import max_batches
from bert_datagen.contract.features import TASK
from bert_datagen.contract.fs import is_remote
from bert_datagen.contract.loading.order import (
    DEFAULT_BLOCK_SIZE,
    GlobalOrder,
    check_step,
    check_world,
    positions_array,
)
from bert_datagen.contract.loading.read_ahead import ReadAhead
from bert_datagen.contract.loading.source import Fetched, LoadError, Source
from bert_datagen.contract.loading.stepping import Stepping, check_reader_arguments, local_world
from bert_datagen.datagen.dynamic import mask_records
from bert_datagen.datagen.record_layout import INSTANCE_KEY, WORD_BITS

STATE_VERSION = 1
# Records of a window decoded together: a decode call has a fixed cost, but a store's arrays (a
# megabyte each at 2,048 rows of 128 int32) are then small enough that the allocator reuses their
# memory from store to store; at 4,096 rows an epoch of packed rows took some 10,000 page faults
# anew (benchmarks/bench_loader_kinds.py: 0.05 s of system time in a 0.2 s epoch).
_STORE_ROWS = 2048


def pretraining_order(source: Source, seed: int, batch_size: int, block_size: int, world_size: int = 1,
                      rank: int = 0) -> GlobalOrder:
    """The global order of a pre-training split; LoadError for task data (fine-tuning reads it in its
    own order), a world the batch does not divide, or a split that holds no batch."""
    if source.kind == TASK:
        raise LoadError(f"{source.root} (split {source.split}): a task dataset; read it in fine-tuning's "
                        "order (epochs, length groups) with readers.batches_for or task_batches.TaskBatches")
    try:
        check_world(batch_size, world_size, rank)
        return GlobalOrder(source.counts, source.fingerprint, seed, batch_size, block_size)
    except ValueError as e:
        raise LoadError(f"{source.root} (split {source.split}): {e}") from e


class NumpyBatches(Stepping):
    """Batches ``start, start + stride, ...`` (below ``stop`` when given) of a rank's share.

    ``stride``/``offset`` let DataLoader workers split a rank's batches (worker w of W takes steps
    start + w, start + w + W, ...); plain use leaves them at 1 and 0.

    ``prefetch``: while a window's batches are used, a background thread fetches the rank's share of
    the next window (its bytes, undecoded: memory for one more window share of raw records). The
    default, None, reads ahead where the shards are remote, whose requests wait on the network;
    local shards are read when needed: the OS reads ahead in a file by itself, and the thread would
    only add work on the same cores (its own allocations cost an epoch of pre-training rows some
    25,000 page faults more, 0.1 s of a 0.2 s epoch on one core: benchmarks/bench_loader_kinds.py).
    At each window the dataset is checked to be the one opened (`Source.check_unchanged`).
    """

    def __init__(self, source: Source, *, seed: int, batch_size: int, world_size: int | None = None,
                 rank: int | None = None, block_size: int = DEFAULT_BLOCK_SIZE, start: int = 0,
                 stop: int | None = None, prefetch: bool | None = None) -> None:
        # The arguments first (ArgumentError, naming the argument), then whether the split holds a batch.
        world_size, rank = local_world(world_size, rank)
        check_reader_arguments(seed, batch_size, block_size, world_size, rank, start, stop)
        if prefetch is not None and not isinstance(prefetch, (bool, np.bool_)):  # bool("no") is True
            raise TypeError(f"prefetch must be True, False or None, got {prefetch!r} ({type(prefetch).__name__}): "
                            "None reads ahead where the shards are remote")
        self.order = pretraining_order(source, seed, batch_size, block_size, world_size, rank)
        self.source = source
        self.world_size, self.rank = world_size, rank
        self.step = start
        self.stop = stop
        # The records in the cache by their position in the run's sequence, sorted, and where each
        # one is: (store, row). A store's rows are in position order, so a batch is found with one
        # search and is mostly one run of rows. Chunks are named by code: epoch * chunks + chunk.
        self._per_epoch = -(-self.order.total // block_size)
        self._keys = np.zeros(0, np.int64)
        self._where = np.zeros((0, 2), np.int64)
        self._raw: dict[int, tuple[Fetched, np.ndarray]] = {}  # every store: its bytes and rows
        self._stores: dict[int, dict[str, np.ndarray]] = {}  # the last stores decoded
        self._next_store = 0
        self._oldest_window = -1
        self.prefetch = any(is_remote(s.path) for s in source.shards) if prefetch is None else bool(prefetch)
        self._ahead = ReadAhead("bert-datagen-prefetch")  # keyed by the ranges it fetches

    # ------------------------------------------------------------ iteration

    def batch_at(self, step: int) -> dict[str, np.ndarray]:
        """This rank's share of global batch ``step`` (any step, in any order)."""
        return self.read_positions(self.order.batch_positions(step, self.world_size, self.rank))

    def read_positions(self, positions: np.ndarray) -> dict[str, np.ndarray]:
        """The records at these positions of the run's sequence, as a batch (every feature, masked when
        the data is dynamic). Readers that cut batches their own way (fine-tuning's epochs) call this;
        positions should move forward, as the cache keeps only the windows last asked for."""
        positions = positions_array(positions)
        if not len(positions):
            return self.source.read_ranges([], model_inputs=True)
        at, found = self._find(positions)
        if not found.all():
            self._load(*self._with_window_share(positions[~found]))
            at, found = self._find(positions)
        store, rows = self._where[at, 0], self._where[at, 1]
        needed = np.unique(store).tolist()
        stores = {s: self._decoded(s, len(needed) + 1) for s in needed}
        first = int(rows[0])
        if len(stores) == 1 and (rows == np.arange(first, first + len(rows))).all():
            # The usual case: the share of a batch is one run of rows (a copy, not a view: a caller
            # may change its batch in place, and the cache must not see it).
            features = {k: v[first:first + len(rows)].copy() for k, v in stores[int(store[0])].items()}
        else:
            features = {}
            for name in self.source.spec:
                first_store = stores[int(store[0])][name]
                out = np.empty((len(rows),) + first_store.shape[1:], first_store.dtype)
                for s, arrays in stores.items():
                    sel = store == s
                    out[sel] = arrays[name][rows[sel]]
                features[name] = out
        self._evict(positions)
        if self.source.dynamic:
            features = masked_batch(self.source, self.order.seed, features, positions // self.order.total)
        return features

    # ------------------------------------------------------------ state

    def state_dict(self) -> dict:
        """Where the iterator is: the next global step, and what the order depends on (checked on load)."""
        o = self.order
        return {"version": STATE_VERSION, "fingerprint": o.fingerprint, "seed": o.seed,
                "batch_size": o.batch_size, "block_size": o.block_size, "step": self.step}

    def load_state_dict(self, state: dict) -> None:
        """Continue at ``state["step"]``; any world size and rank (the order does not depend on them)."""
        if state.get("version") != STATE_VERSION:
            raise LoadError(f"loader state of version {state.get('version')!r}; this reader knows {STATE_VERSION}")
        o = self.order
        for name, mine in (("fingerprint", o.fingerprint), ("seed", o.seed), ("batch_size", o.batch_size),
                           ("block_size", o.block_size)):
            if state.get(name) != mine:
                raise LoadError(f"loader state has {name} {state.get(name)!r}, this loader {mine!r}: "
                                "it belongs to another order (dataset, seed or batch size)")
        self.step = check_step(state.get("step"), o.batch_size)

    # ------------------------------------------------------------ reading

    def _find(self, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Each position's place in the cache arrays, and whether it is there."""
        if not len(self._keys):
            return np.zeros(len(positions), np.int64), np.zeros(len(positions), bool)
        at = np.minimum(np.searchsorted(self._keys, positions), len(self._keys) - 1)
        return at, self._keys[at] == positions

    def _with_window_share(self, positions: np.ndarray) -> tuple[list[int], np.ndarray]:
        """What to read for these missing positions: (chunks, positions) of every window they are
        in, this rank's share of it. A full window's share is whole chunks (its slots feed this
        rank's positions of every batch of the window); the epoch's last, partial window is one
        permutation of its records, so its share is the records at this rank's positions, read one
        by one (its chunks would be ``world_size`` times the share). Positions asked that are not
        this rank's (readers that cut batches their own way) are read as well."""
        o = self.order
        epoch, offset = np.divmod(positions, o.total)
        window = offset // (o.batch_size * o.block_size)
        tail = window >= o.total // (o.batch_size * o.block_size)
        placed = o.place(positions[~tail])
        codes = dict.fromkeys((placed.epoch * self._per_epoch + placed.chunk(o.block_size)).tolist())
        extra = [positions[tail]]
        for e, w in sorted(set(zip(epoch.tolist(), window.tolist(), strict=True))):
            chunks, records = self._window_share(e, w, int(positions[(epoch == e) & (window == w)].min()))
            codes.update(dict.fromkeys(chunks))
            extra.append(records)
        return list(codes), np.unique(np.concatenate(extra))

    def _window_share(self, epoch: int, window: int, since: int = 0) -> tuple[list[int], np.ndarray]:
        """This rank's share of a window of an epoch: (chunk codes, positions). Rank ``r`` holds
        positions ``p`` with ``p mod B`` in ``[r*B/N, (r+1)*B/N)``; an epoch starts at position
        ``epoch * total``, which need not be a batch's first, so in a full window its slots are
        those positions shifted by ``epoch * total mod B`` (cyclically). Of a tail window, only
        positions from ``since`` on: a run moves forward, and one resumed in the tail (or whose
        first batch straddles into an epoch) would read records it has passed."""
        o = self.order
        B, window_len = o.batch_size, o.batch_size * o.block_size
        share = B // self.world_size
        if window < o.total // window_len:
            slots = (self.rank * share + np.arange(share, dtype=np.int64) - epoch * o.total) % B
            return (epoch * self._per_epoch + window * B + slots).tolist(), np.zeros(0, np.int64)
        first = max(epoch * o.total + window * window_len, since)
        # No position past the order's last batch (the last epoch the order holds ends inside it).
        end = min((epoch + 1) * o.total, max_batches(B) * B if self.stop is None else self.stop * B)
        positions = np.arange(first, max(first, end), dtype=np.int64)
        return [], positions[(positions % B) // share == self.rank]

    def _load(self, codes: list[int], positions: np.ndarray | None = None) -> None:
        """Read and decode these chunks and the records at these positions together into one store,
        its rows in position order."""
        plan = self._plan(codes, positions)
        if plan is None:
            return
        ranges, position, rows = plan
        src = self.source
        fetched = self._ahead.take(ranges)  # the ranges' bytes when they were read ahead
        if fetched is None:
            fetched = src.fetch(ranges)
        # The bytes are in hand: checked that the dataset is still the one opened (they are then
        # its), and every frame and CRC, before any record of them is decoded.
        src.check(fetched)
        where = []
        for a in range(0, len(rows), _STORE_ROWS):  # a store each, decoded when first asked for
            piece = rows[a:a + _STORE_ROWS]
            where.append(np.stack([np.full(len(piece), self._next_store), np.arange(len(piece))], axis=1))
            self._raw[self._next_store] = (fetched, piece)
            self._next_store += 1
        keys = np.concatenate([self._keys, position[rows]])
        where = np.concatenate([self._where, *where])
        order = np.argsort(keys, kind="stable")
        self._keys, self._where = keys[order], where[order]
        if self.prefetch:
            self._prefetch_after(int(position.max()))

    def _plan(self, codes: list[int], positions: np.ndarray | None = None,
              ) -> tuple[list[tuple[int, int, int]], np.ndarray, np.ndarray] | None:
        """The record ranges of these chunks and positions not in the cache yet, their positions,
        and the order their rows are decoded in (the order they will be asked for); None when all
        are here."""
        o = self.order
        epoch, chunk = np.divmod(np.asarray(codes, np.int64), self._per_epoch)
        sizes = np.minimum((chunk + 1) * o.block_size, o.total) - chunk * o.block_size
        firsts = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
        # The chunks' records, then cut into runs of consecutive records of a shard: one range read
        # per run (a chunk spans one block, or a few where blocks are short).
        virtual = np.repeat(chunk * o.block_size - firsts, sizes) + np.arange(int(sizes.sum()))
        epochs = np.repeat(epoch, sizes)
        shard, index, position = np.empty_like(virtual), np.empty_like(virtual), np.empty_like(virtual)
        for e in np.unique(epochs).tolist():
            sel = epochs == e
            shard[sel], index[sel] = o.locate(e, virtual[sel])
            position[sel] = e * o.total + o.offsets_of(e, virtual[sel])
        if positions is not None and len(positions):
            placed = o.place(positions)
            shard, index = np.concatenate([shard, placed.shard]), np.concatenate([index, placed.index])
            position = np.concatenate([position, positions])
        # In file order: neighbouring blocks and a tail window's single records are then one range
        # each, and the same records always make the same ranges (a read-ahead is recognised).
        new = np.flatnonzero(~self._find(position)[1])  # a chunk may be partly here already
        new = new[np.lexsort((index[new], shard[new]))]
        shard, index, position = shard[new], index[new], position[new]
        if not len(position):
            return None
        run = np.flatnonzero(np.concatenate([[True], (np.diff(shard) != 0) | (np.diff(index) != 1)]))
        length = np.diff(np.append(run, len(shard)))
        ranges = list(zip(shard[run].tolist(), index[run].tolist(), (index[run] + length).tolist(), strict=True))
        # Decoded in the order the records will be asked for; in the dtypes batches have (int32
        # ids): half the bytes to write and copy.
        return ranges, position, np.argsort(position, kind="stable")

    # ------------------------------------------------------------ reading ahead

    def _prefetch_after(self, last: int) -> None:
        """Start fetching this rank's share of the window after the one holding position ``last``
        (the last one just loaded), on a background thread, so that its requests run while the
        current window's batches are used."""
        o = self.order
        B, window_len = o.batch_size, o.batch_size * o.block_size
        epoch, offset = divmod(last, o.total)
        window = offset // window_len + 1
        if window * window_len >= o.total:
            epoch, window = epoch + 1, 0
        if self.stop is not None and epoch * o.total + window * window_len >= self.stop * B:
            return
        plan = self._plan(*self._window_share(epoch, window))
        if plan is not None:
            self._ahead.start(plan[0], self.source.fetch, plan[0])

    def _evict(self, positions: np.ndarray) -> None:
        # Keep the records of the windows this batch is in; a run moves forward through windows.
        oldest = int(np.min(self.order.window_of(positions)))
        if oldest == self._oldest_window:
            return
        self._oldest_window = oldest
        keep = self.order.window_of(self._keys) >= oldest
        self._keys, self._where = self._keys[keep], self._where[keep]
        used = set(np.unique(self._where[:, 0]).tolist())
        for store in [s for s in self._raw if s not in used]:
            del self._raw[store]
            self._stores.pop(store, None)

    def _decoded(self, store: int, keep: int) -> dict[str, np.ndarray]:
        """A store's records, decoded: the last ``keep`` stores asked for are kept decoded, the
        others as the fetched bytes they are decoded from again when asked for (a run moves forward,
        so that is rare; a window's decoded share would be 2-3 times its bytes, and as many page
        faults each time memory that large is taken anew)."""
        arrays = self._stores.pop(store, None)
        if arrays is None:
            fetched, rows = self._raw[store]
            arrays = self.source.decode_rows(fetched, rows, model_inputs=True)
        self._stores[store] = arrays  # the most recent last
        for old in list(self._stores)[:-keep]:
            del self._stores[old]
        return arrays


def masked_batch(source: Source, seed: int, features: dict[str, np.ndarray], epochs: np.ndarray,
                 ) -> dict[str, np.ndarray]:
    """A dynamic-masking dataset's records as a batch: masked by (seed, each record's instance key,
    the epoch it is read in), as every reader of the dataset masks them."""
    masked = mask_records(features["input_ids"], features["input_mask"], features[INSTANCE_KEY][:, 0],
                          epochs, seed, source.mask_config, source.vocab, features.get(WORD_BITS))
    out = dict(features)
    out["input_ids"] = masked.input_ids.astype(np.int32)
    out["masked_lm_positions"] = masked.masked_lm_positions.astype(np.int32)
    out["masked_lm_ids"] = masked.masked_lm_ids.astype(np.int32)
    out["masked_lm_weights"] = masked.masked_lm_weights.astype(np.float32)
    return out
