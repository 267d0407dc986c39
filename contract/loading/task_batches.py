"""Fine-tuning's training batches of a task split, without TensorFlow: exactly what `bert-train
finetune` reads at every step (the trainer reads through this class, `trainer/finetune/ordered.py`),
so a PyTorch or JAX fine-tuning loop sees the same batches.

Blocks of one record: each epoch is a full shuffle of the split by (seed, dataset, epoch), as the
original's per-epoch shuffle was, and batch ``b`` of epoch ``e`` is positions ``[b*B, (b+1)*B)`` of
that epoch (its last, partial batch left out): ``floor(records / B)`` batches an epoch, step ``s``
is batch ``s mod E`` of epoch ``s div E``. A rank reads only its share of each batch.

Length grouping (``group_by_length``, `bert-train finetune --group-by-length`): the epoch is cut into
windows of `GROUP_WINDOW` batches; a window's records (leftovers beyond its whole batches left out)
are sorted by length (stable), cut into batches, the batches put in an order drawn from (seed,
epoch, window), and each batch cut to the shortest bucket length (`bucket_lengths`) that holds its
longest example. Sorting needs every length of the window: a rank takes them from the shards'
lengths files (`datagen/tasks/lengths.py`, read once, 2 bytes a record) and reads only its share of
each batch, each record's length checked against the file; a dataset written before lengths files
has every rank read the whole window.

Records are read a window of batches at a time (one decode call: a call has a fixed cost of about a
millisecond, which a batch at a time would pay every step), each shard's records in file order.
"""

from __future__ import annotations

import numpy as np

from bert_datagen.contract.fs import FileSystem
from bert_datagen.contract.loading.order import GlobalOrder, check_step, check_world, permutation
from bert_datagen.contract.loading.source import LoadError, Source
from bert_datagen.contract.loading.stepping import Stepping, check_reader_arguments, local_world
from bert_datagen.contract.manifest import SideFile
from bert_datagen.datagen.rng import derive_key
from bert_datagen.datagen.tasks.lengths import LengthsError, read_lengths

BLOCK_SIZE = 1  # a full shuffle per epoch: task splits are small, and examples are often sorted
# Batches per window that length grouping sorts together: wide enough to find similar lengths,
# narrow enough that the epoch's order stays shuffled. Ungrouped reading uses the same windows.
GROUP_WINDOW = 50
# Padded lengths of length-grouped batches: k/BUCKETS of max_seq_length, so at most BUCKETS shapes
# to compile. Eighths, not quarters: at 128 tokens a batch of MRPC pairs (median ~53) pads to 64 or
# 80 instead of 64 or 96 (docs/packing.md).
BUCKETS = 8
STATE_VERSION = 1
ORDER = "finetune-order-v1"


def bucket_lengths(max_seq_length: int) -> list[int]:
    """The padded lengths a grouped or trimmed batch may have, shortest first (multiples of 8)."""
    lengths = {max(8, -(-max_seq_length * k // BUCKETS // 8) * 8) for k in range(1, BUCKETS + 1)}
    return sorted({min(n, max_seq_length) for n in lengths})


def bucket_length(longest: int, max_seq_length: int) -> int:
    """The shortest bucket length that holds ``longest`` tokens."""
    return next(n for n in bucket_lengths(max_seq_length) if n >= longest)


def read_positions(source: Source, order: GlobalOrder, positions: np.ndarray,
                   piece: int | None = None) -> list[dict[str, np.ndarray]]:
    """The records at these positions of the run's sequence, in pieces of consecutive rows (row i:
    position i; ``piece``: `Source.read_pieces`'), read in file order (each shard's records in runs
    of consecutive ones) and decoded in the trainer's dtypes."""
    ranges, rows = order.record_ranges(positions)
    return source.read_pieces(ranges, model_inputs=True, order=rows, piece=piece)


def _gather(pieces: list[dict[str, np.ndarray]], rows: np.ndarray, width: int | None, seq: int) -> dict[str, np.ndarray]:
    """Rows ``rows`` of the pieces laid end to end, as new arrays (a caller may change its batch);
    sequence features cut to ``width`` columns when given."""
    sizes = np.array([len(next(iter(p.values()))) for p in pieces], np.int64)
    firsts = np.cumsum(sizes) - sizes
    piece = np.searchsorted(firsts, rows, side="right") - 1
    at = rows - firsts[piece]

    def cut(v: np.ndarray) -> np.ndarray:
        return v[:, :width] if width is not None and v.ndim == 2 and v.shape[1] == seq else v

    if (piece == piece[0]).all():
        arrays = pieces[int(piece[0])]
        if (at == np.arange(at[0], at[0] + len(at))).all():  # one run: a copy of it
            return {k: cut(v[at[0]:at[0] + len(at)]).copy() for k, v in arrays.items()}
        return {k: cut(v)[at] for k, v in arrays.items()}  # an index makes new arrays
    out = {}
    for name, first in pieces[int(piece[0])].items():
        values = np.empty((len(rows),) + cut(first).shape[1:], first.dtype)
        for p in np.unique(piece).tolist():
            sel = piece == p
            values[sel] = cut(pieces[p][name])[at[sel]]
        out[name] = values
    return out


class TaskBatches(Stepping):
    """Rank ``rank`` of ``world_size``'s share of fine-tuning's batch at every step (see the module
    docstring); iterates steps ``start, start + 1, ...`` (below ``stop``); its state is the step."""

    def __init__(self, source: Source, *, seed: int, batch_size: int, world_size: int | None = None,
                 rank: int | None = None, group_by_length: bool = False, start: int = 0,
                 stop: int | None = None) -> None:
        world_size, rank = local_world(world_size, rank)
        check_reader_arguments(seed, batch_size, BLOCK_SIZE, world_size, rank, start, stop)
        try:
            check_world(batch_size, world_size, rank)
            self.order = GlobalOrder(source.counts, source.fingerprint, seed, batch_size, BLOCK_SIZE)
        except ValueError as e:
            raise LoadError(f"{source.root} (split {source.split}): {e}") from e
        self.source = source
        self.world_size, self.rank, self.grouped = world_size, rank, bool(group_by_length)
        self.step, self.stop = start, stop
        self.per_epoch = self.order.total // batch_size
        self.max_seq_length = int(source.spec["input_ids"][1])
        # The window last read: ((epoch, window), its records in pieces, per batch (positions, rows, width)).
        self._window: tuple | None = None
        self._lengths: np.ndarray | None = None  # every record's length, shards end to end (grouped reading)
        self._shard_starts = np.cumsum([0, *source.counts])[:-1].astype(np.int64)

    # ------------------------------------------------------------ iteration

    def batch_at(self, step: int) -> dict[str, np.ndarray]:
        """This rank's share of training step ``step``'s batch (a copy: the caller may change it)."""
        pieces, (_, rows, width) = self._entry(step)
        return _gather(pieces, rows, width, self.max_seq_length)

    def positions_at(self, step: int) -> np.ndarray:
        """The positions in the run's sequence (``GlobalOrder.place`` names their records) of the rows
        of this rank's share of step ``step``'s batch, in row order."""
        return self._entry(step)[1][0].copy()

    def group_end(self, step: int) -> int:
        """The first step after the window ``step`` is in (a window is read at once)."""
        epoch, index = divmod(check_step(step, self.order.batch_size), self.per_epoch)
        return epoch * self.per_epoch + min((index // GROUP_WINDOW + 1) * GROUP_WINDOW, self.per_epoch)

    # ------------------------------------------------------------ state

    def state_dict(self) -> dict:
        o = self.order
        return {"version": STATE_VERSION, "order": ORDER, "fingerprint": o.fingerprint, "seed": o.seed,
                "batch_size": o.batch_size, "group_by_length": self.grouped, "step": self.step}

    def load_state_dict(self, state: dict) -> None:
        """Continue at ``state["step"]``; any world size and rank (the order does not depend on them)."""
        if state.get("version") != STATE_VERSION or state.get("order") != ORDER:
            raise LoadError(f"loader state of order {state.get('order')!r} version {state.get('version')!r}; "
                            f"this reader is fine-tuning's ({ORDER}, version {STATE_VERSION})")
        o = self.order
        for name, mine in (("fingerprint", o.fingerprint), ("seed", o.seed), ("batch_size", o.batch_size),
                           ("group_by_length", self.grouped)):
            if state.get(name) != mine:
                raise LoadError(f"loader state has {name} {state.get(name)!r}, this loader {mine!r}: "
                                "it belongs to another order (dataset, seed, batch size or grouping)")
        self.step = check_step(state.get("step"), o.batch_size)

    # ------------------------------------------------------------ reading

    def _entry(self, step: int) -> tuple[list[dict[str, np.ndarray]], tuple[np.ndarray, np.ndarray, int | None]]:
        """The window's records of ``step`` (in pieces), and its batch: (positions, rows, width)."""
        epoch, index = divmod(check_step(step, self.order.batch_size), self.per_epoch)
        window, within = divmod(index, GROUP_WINDOW)
        if self._window is None or self._window[0] != (epoch, window):
            self._window = None  # the old window's memory goes before the new one is read
            self._window = ((epoch, window), *self._read_window(epoch, window))
        return self._window[1], self._window[2][within]

    def _read_window(self, epoch: int, window: int) -> tuple[list[dict[str, np.ndarray]],
                                                            list[tuple[np.ndarray, np.ndarray, int | None]]]:
        """A window's records, and each of its batches: this rank's positions, their rows in the
        records, and the width its sequence features are cut to (None: not cut). A batch's arrays
        are gathered when it is asked for, so each is copied once."""
        B, T = self.order.batch_size, self.order.total
        first_batch = window * GROUP_WINDOW
        batches = min(GROUP_WINDOW, self.per_epoch - first_batch)
        base = epoch * T + first_batch * B
        share = B // self.world_size
        if not self.grouped:
            starts = base + np.arange(batches, dtype=np.int64) * B + self.rank * share
            positions = (starts[:, None] + np.arange(share, dtype=np.int64)[None, :]).reshape(-1)
            pieces = read_positions(self.source, self.order, positions)
            rows = np.arange(len(positions), dtype=np.int64)
            return pieces, [(positions[b * share:(b + 1) * share], rows[b * share:(b + 1) * share], None)
                            for b in range(batches)]
        positions = np.arange(base, base + batches * B, dtype=np.int64)
        listed = self._listed_lengths()
        if listed is None:
            # A grouped batch's rows lie all over the window: decoded as one piece, to gather from.
            pieces = read_positions(self.source, self.order, positions, piece=len(positions))
            lengths = pieces[0]["input_mask"].sum(axis=1)
        else:
            placed = self.order.place(positions)
            lengths = listed[self._shard_starts[placed.shard] + placed.index]
        by_length = np.argsort(lengths, kind="stable")
        key = derive_key(self.order.seed, "finetune-length-groups", self.order.fingerprint, epoch, window)
        seq = self.max_seq_length
        out = []
        for b in permutation(key, batches).tolist():
            rows = by_length[b * B:(b + 1) * B]
            width = bucket_length(int(lengths[rows].max()), seq)  # the whole batch's, on every rank
            mine = rows[self.rank * share:(self.rank + 1) * share]  # only this rank's rows are gathered
            out.append((positions[mine], mine, width))
        if listed is None:
            return pieces, out
        # Only this rank's rows are read, in the batches' order; each checked against its listed length.
        mine = np.concatenate([rows for _, rows, _ in out])
        pieces = read_positions(self.source, self.order, positions[mine], piece=len(mine))
        counted = pieces[0]["input_mask"].sum(axis=1)
        if (counted != lengths[mine]).any():
            wrong = placed.shard[mine][np.argmax(counted != lengths[mine])]
            raise LoadError(f"{self.source.shards[int(wrong)].path}: a record holds another number of tokens than "
                            "its shard's lengths file says (bert-datagen verify tells more)")
        return pieces, [(p, np.arange(i * share, (i + 1) * share), width) for i, (p, _, width) in enumerate(out)]

    def _listed_lengths(self) -> np.ndarray | None:
        """Every record's length from the shards' lengths files (read once, checked against the
        manifest), the shards end to end; None when a shard has none (written before them)."""
        if self._lengths is None:
            refs = self.source.shards
            entries = [r.expected.lengths if r.expected is not None else None for r in refs]
            paths = [r.beside(e.path) if e is not None else None for r, e in zip(refs, entries, strict=True)]
            if any(p is None for p in paths):
                return None
            with self.source.explained():  # a replaced dataset is reported as one
                parts = [_read_listed_lengths(self.source.fs, path, entry, count)  # type: ignore[arg-type]
                         for path, entry, count in zip(paths, entries, self.source.counts, strict=True)]
            self._lengths = np.concatenate(parts) if parts else np.zeros(0, np.int64)
        return self._lengths


def _read_listed_lengths(fs: FileSystem, path: str, entry: SideFile, records: int) -> np.ndarray:
    """A shard's lengths file, checked against its manifest entry; LoadError names the file."""
    try:
        return read_lengths(fs.read_bytes(path), records, entry.bytes, entry.sha256, path)
    except LengthsError as e:
        raise LoadError(f"corrupt lengths: {e} (bert-datagen verify tells more)") from e
    except FileNotFoundError as e:
        raise LoadError(f"{path}: lengths listed in the manifest are missing") from e
    except OSError as e:
        raise LoadError(f"{path}: cannot read lengths: {e}") from e
