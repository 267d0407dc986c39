"""Several datasets read as one stream, by weight: a mixture with the guarantees of one dataset.

The run's sequence is cut into *mixture windows* of ``window`` positions. Each window holds
``counts[d]`` records of dataset ``d`` (the weights apportioned to the window by largest remainder,
the same in every window, so dataset ``d`` fills ``counts[d] / window`` of any window exactly) in a
seeded order: the window's labels ``d`` are a permutation drawn from (seed, the datasets'
fingerprints, the counts, the window). The ``i``-th position labelled ``d`` reads position ``i`` of
dataset ``d``'s own `GlobalOrder` (its blocks, windows and epochs, by its own fingerprint), so
every record of every dataset comes once per epoch of that dataset, each at its own pace.

So a mixture is a pure function of the fingerprints, the weights (as counts), the seed, and the
batch and block sizes; any position is computed alone (the same for any world size: rank ``r``
takes positions ``[r*B/N, (r+1)*B/N)`` of each global batch, as for one dataset), and its state is
the next step. Each batch carries ``mixture_dataset``: the index of the dataset each record came
from. Datasets must be of one kind, with one vocab and the same features (names, types, lengths);
anything else is refused with one line naming the dataset and the difference.

What it costs: a rank reads just the records at its positions, whichever datasets they are in (a
mixture's rank shares are not a dataset's chunk slots, so reading that dataset's chunks would be up
to N times the share): stepping through the batches, a mixture window's steps at a time, a *read*
(each dataset's records of the read in one fetch, the next read fetched ahead where the shards are
remote); ``read_positions`` of other positions, exactly those records.
"""

from __future__ import annotations

import hashlib
import json
import math
import numbers
from collections.abc import Sequence
from functools import lru_cache

import numpy as np

from bert_datagen.contract.bounds import check_int, max_batches
from bert_datagen.contract.fs import is_remote
from bert_datagen.contract.loading.batches import masked_batch, pretraining_order
from bert_datagen.contract.loading.order import (
    DEFAULT_BLOCK_SIZE,
    check_step,
    check_world,
    permutation,
    positions_array,
)
from bert_datagen.contract.loading.read_ahead import ReadAhead
from bert_datagen.contract.loading.source import Fetched, LoadError, Source
from bert_datagen.contract.loading.stepping import Stepping, check_reader_arguments, local_world
from bert_datagen.contract.manifest import Manifest, ManifestError
from bert_datagen.datagen.rng import derive_key

MIX_VERSION = "loader-mix-v1"
MIX_STATE_VERSION = 1
DEFAULT_MIX_WINDOW = 4096
MIXTURE_FEATURE = "mixture_dataset"


# What a mixture's read fetches: each position's dataset and place in that dataset's order, and per
# dataset (the dataset, its rows among the positions, their fetched bytes, each row's record in them).
MixtureFetch = tuple[np.ndarray, np.ndarray, list[tuple[int, np.ndarray, Fetched, np.ndarray]]]


class MixtureError(ValueError):
    """Datasets or weights that cannot be mixed (names which and why)."""


def apportion(weights: Sequence[float], window: int) -> tuple[int, ...]:
    """Records of each dataset in a window of ``window``: the weights' shares by largest remainder
    (ties to the earlier dataset); MixtureError unless every dataset gets at least one."""
    check_int(window, "window", 1)
    for i, x in enumerate(weights):
        # float() would take "0.7" and True as weights: a mixture of what the caller did not mean
        if isinstance(x, bool) or not isinstance(x, numbers.Real):
            raise TypeError(f"weights[{i}] must be a number, got {x!r} ({type(x).__name__})")
    w = [float(x) for x in weights]
    if not w or any(not math.isfinite(x) or x <= 0 for x in w):
        raise MixtureError(f"weights must be finite and > 0, got {list(weights)}")
    total = sum(w)
    if not math.isfinite(total):  # finite weights whose sum overflows (1e308 twice): their shares are the same
        top = max(w)
        w = [x / top for x in w]
        total = sum(w)
    exact = [x / total * window for x in w]
    counts = [int(math.floor(e)) for e in exact]
    for i in sorted(range(len(w)), key=lambda i: (-(exact[i] - counts[i]), i))[:window - sum(counts)]:
        counts[i] += 1
    if min(counts) == 0:
        raise MixtureError(f"weight {w[counts.index(0)]} of {total:g} gives dataset {counts.index(0)} no record in a "
                           f"mixture window of {window}: raise it or the window")
    return tuple(counts)


def parse_weights(text: str, n: int) -> list[float]:
    """``"0.7,0.3"`` for ``n`` datasets; MixtureError for anything else."""
    try:
        weights = [float(x) for x in text.split(",")]
    except ValueError:
        raise MixtureError(f"{text!r} is not a list of weights: write e.g. 0.7,0.3") from None
    if len(weights) != n:
        raise MixtureError(f"{len(weights)} weights ({text}) for {n} datasets: give one per dataset")
    apportion(weights, DEFAULT_MIX_WINDOW)  # finite and > 0
    return weights


def check_compatible(sources: Sequence[Source]) -> None:
    """MixtureError (one line) unless the datasets share kind, vocab and features, and differ."""
    if not sources:
        raise MixtureError("a mixture needs at least one dataset")
    first = sources[0]
    first_vocab = _vocab_sha(first)
    # A dataset's splits are disjoint (documents are split by identity), so one dataset's train and
    # eval splits mix like two datasets; only the same split twice is the same records.
    seen = {(first.fingerprint, first.split): first.root}
    for other in sources[1:]:
        where = f"{other.root} (split {other.split})"
        if other.kind != first.kind:
            raise MixtureError(f"{where}: a {other.kind} dataset cannot be mixed with {first.root}'s {first.kind} data")
        if _vocab_sha(other) != first_vocab:
            raise MixtureError(f"{where}: its vocab differs from {first.root}'s: mixed datasets must share one vocab")
        if other.spec != first.spec:
            diff = sorted(set(other.spec.items()) ^ set(first.spec.items()))
            raise MixtureError(f"{where}: its features differ from {first.root}'s ({diff[0][0]}: "
                               f"{other.spec.get(diff[0][0])} vs {first.spec.get(diff[0][0])}): mix datasets of one layout")
        if other.dynamic != first.dynamic:
            raise MixtureError(f"{where}: dynamic and static masking cannot be mixed ({first.root})")
        if (other.fingerprint, other.split) in seen:
            raise MixtureError(f"{where}: the same dataset and split as {seen[other.fingerprint, other.split]}: give "
                               "it once, with its weight")
        seen[other.fingerprint, other.split] = other.root


def _vocab_sha(source: Source) -> str | None:
    try:
        return Manifest.load(source.root, source.fs).vocab.sha256
    except (ManifestError, OSError, KeyError) as e:
        raise LoadError(f"{source.root}: cannot read its vocab's digest: {e}") from e


class MixedBatches(Stepping):
    """Rank ``rank`` of ``world_size``'s share of every global batch of the mixture (see the module
    docstring); the interface of `NumpyBatches`: iteration, ``batch_at``, ``read_positions``, state."""

    def __init__(self, sources: Sequence[Source], weights: Sequence[float], *, seed: int, batch_size: int,
                 world_size: int | None = None, rank: int | None = None, block_size: int = DEFAULT_BLOCK_SIZE,
                 start: int = 0, stop: int | None = None, window: int = DEFAULT_MIX_WINDOW,
                 prefetch: bool | None = None) -> None:
        world_size, rank = local_world(world_size, rank)
        check_reader_arguments(seed, batch_size, block_size, world_size, rank, start, stop)
        check_world(batch_size, world_size, rank)
        if prefetch is not None and not isinstance(prefetch, (bool, np.bool_)):  # bool("no") is True
            raise TypeError(f"prefetch must be True, False or None, got {prefetch!r} ({type(prefetch).__name__}): "
                            "None reads ahead where the shards are remote")
        if len(weights) != len(sources):
            raise MixtureError(f"{len(weights)} weights for {len(sources)} datasets: give one per dataset")
        check_compatible(sources)
        self.counts = apportion(weights, window)
        self.weights = [float(w) for w in weights]
        self.sources = list(sources)
        self.orders = [pretraining_order(s, seed, batch_size, block_size) for s in sources]  # each dataset's own
        self.seed, self.batch_size, self.block_size, self.window = seed, batch_size, block_size, window
        self.world_size, self.rank = world_size, rank
        self.step, self.stop = start, stop
        self.fingerprint = mixture_fingerprint([split_identity(s) for s in sources], self.counts, window)
        self._key = derive_key(seed, MIX_VERSION, self.fingerprint)
        # Steps read together while stepping: a mixture window's worth, so that each dataset's records
        # of them are one fetch (a fetch and a decode call have fixed costs).
        self.steps_per_read = max(1, window // batch_size)
        self._held: tuple[int, np.ndarray, dict[str, np.ndarray]] | None = None  # (read, positions, rows)
        self.prefetch = (any(is_remote(f.path) for s in sources for f in s.shards) if prefetch is None
                         else bool(prefetch))
        self._ahead = ReadAhead("bert-datagen-mix-prefetch")  # keyed by the read it fetches

    # ------------------------------------------------------------ where each position reads

    def place(self, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(dataset, position in that dataset's own order) of each position of the mixture."""
        pos = positions_array(positions)
        w, q = np.divmod(pos, self.window)
        dataset = np.empty_like(pos)
        sub = np.empty_like(pos)
        base = np.asarray(self.counts, np.int64)
        for win in np.unique(w).tolist():
            sel = w == win
            labels, nth = _window_labels(self._key, self.counts, win)
            dataset[sel] = labels[q[sel]]
            sub[sel] = win * base[dataset[sel]] + nth[q[sel]]
        return dataset, sub

    # ------------------------------------------------------------ iteration

    def batch_at(self, step: int) -> dict[str, np.ndarray]:
        """This rank's share of global batch ``step``: read with the other steps of its read."""
        check_step(step, self.batch_size)
        share = self.batch_size // self.world_size
        first = step * self.batch_size + self.rank * share
        read = step // self.steps_per_read
        if self._held is None or self._held[0] != read:
            self._held = None  # the old read's memory goes before the new one is read
            positions = self._positions_of_read(read)
            self._held = (read, positions, self._read(self._ahead.take(read) or self._fetch(positions)))
            if self.prefetch:
                self._prefetch(read + 1)
        _, positions, rows = self._held
        at = int(np.searchsorted(positions, first))
        return {k: v[at:at + share].copy() for k, v in rows.items()}  # a copy: the caller may change it

    def read_positions(self, positions: np.ndarray) -> dict[str, np.ndarray]:
        """The records at these positions of the mixture, with ``mixture_dataset`` (int32): exactly
        those records are read."""
        pos = positions_array(positions)
        if not len(pos):
            out = self.sources[0].read_ranges([], model_inputs=True)
            out[MIXTURE_FEATURE] = np.zeros(0, np.int32)
            return out
        return self._read(self._fetch(pos))

    def _positions_of_read(self, read: int) -> np.ndarray:
        """This rank's positions of the steps of a read (none past ``stop`` or the last step an order holds)."""
        end = min((read + 1) * self.steps_per_read, max_batches(self.batch_size) if self.stop is None else self.stop)
        steps = np.arange(read * self.steps_per_read, max(end, read * self.steps_per_read + 1), dtype=np.int64)
        share = self.batch_size // self.world_size
        firsts = steps * self.batch_size + self.rank * share
        return (firsts[:, None] + np.arange(share, dtype=np.int64)[None, :]).reshape(-1)

    def _fetch(self, positions: np.ndarray) -> MixtureFetch:
        """The records at these positions, fetched (`MixtureFetch`)."""
        dataset, sub = self.place(positions)
        parts = []
        for d in np.unique(dataset).tolist():
            mine = np.flatnonzero(dataset == d)
            ranges, order = self.orders[d].record_ranges(sub[mine])
            parts.append((d, mine, self.sources[d].fetch(ranges), order))
        return dataset, sub, parts

    def _read(self, fetched: MixtureFetch) -> dict[str, np.ndarray]:
        """Fetched records (`_fetch`), rows in their positions' order, decoded and, for dynamic
        masking, masked as each dataset's own reader masks them."""
        dataset, sub, parts = fetched
        out: dict[str, np.ndarray] = {}
        for d, mine, got, order in parts:
            source = self.sources[d]
            part = source.decode(got, model_inputs=True, order=order, piece=len(order))[0]
            if source.dynamic:
                part = masked_batch(source, self.seed, part, sub[mine] // self.orders[d].total)
            for k, v in part.items():
                if k not in out:
                    out[k] = np.empty((len(dataset), *v.shape[1:]), v.dtype)
                out[k][mine] = v
        out[MIXTURE_FEATURE] = dataset.astype(np.int32)
        return out

    # ------------------------------------------------------------ reading ahead

    def _prefetch(self, read: int) -> None:
        """Start fetching a read's records on a background thread (its requests run while the
        current read's batches are used)."""
        if self.stop is not None and read * self.steps_per_read >= self.stop:
            return
        self._ahead.start(read, self._fetch, self._positions_of_read(read))

    # ------------------------------------------------------------ state

    def state_dict(self) -> dict:
        return {"version": MIX_STATE_VERSION, "mixture": self.fingerprint, "seed": self.seed,
                "batch_size": self.batch_size, "block_size": self.block_size, "step": self.step}

    def load_state_dict(self, state: dict) -> None:
        """Continue at ``state["step"]``, any world size and rank."""
        if state.get("version") != MIX_STATE_VERSION:
            raise LoadError(f"mixture state of version {state.get('version')!r}; this reader knows {MIX_STATE_VERSION}")
        for name, mine in (("mixture", self.fingerprint), ("seed", self.seed), ("batch_size", self.batch_size),
                           ("block_size", self.block_size)):
            if state.get(name) != mine:
                raise LoadError(f"mixture state has {name} {state.get(name)!r}, this mixture {mine!r}: it belongs to "
                                "another mixture (datasets, weights, seed or batch size)")
        self.step = check_step(state.get("step"), self.batch_size)

    def record(self) -> dict:
        """What a run records of the mixture: each dataset, its weight and its records per window."""
        return {"mixture": self.fingerprint, "window": self.window,
                "datasets": [{"path": s.root, "split": s.split, "fingerprint": s.fingerprint, "weight": w,
                              "per_window": c} for s, w, c in zip(self.sources, self.weights, self.counts, strict=True)]}


def split_identity(source: Source) -> str:
    """What names a split's records in a mixture: the dataset's fingerprint, with the split's name
    unless it is ``train`` (so the mixtures of train splits, all runs' so far, keep their fingerprints,
    while A's eval split and A's train split are two datasets)."""
    return source.fingerprint if source.split == "train" else f"{source.fingerprint}/{source.split}"


def mixture_fingerprint(fingerprints: Sequence[str], counts: Sequence[int], window: int) -> str:
    """What the mixture is: the datasets in order and their records per window (not the weights as
    typed: 0.7,0.3 and 7,3 are one mixture)."""
    content = {"version": MIX_VERSION, "datasets": list(fingerprints), "counts": [int(c) for c in counts],
               "window": int(window)}
    return hashlib.sha256(json.dumps(content, sort_keys=True).encode()).hexdigest()


@lru_cache(maxsize=64)
def _window_labels(key: int, counts: tuple[int, ...], window: int) -> tuple[np.ndarray, np.ndarray]:
    """Window ``window``'s dataset at each place, and each place's rank among its dataset's places."""
    labels = np.repeat(np.arange(len(counts)), counts)[permutation(derive_key(key, "window", window), sum(counts))]
    nth = np.empty(len(labels), np.int64)
    for d in range(len(counts)):
        at = np.flatnonzero(labels == d)
        nth[at] = np.arange(len(at))
    labels.setflags(write=False)
    nth.setflags(write=False)
    return labels, nth
