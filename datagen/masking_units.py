"""Masking units: how a row's candidate positions form groups, and which groups its mask takes.

A registry, as sentence splitters (``bert_datagen.datagen.sentences``) and word segmenters
(``bert_datagen.datagen.segmenters``) are: ``--masking-unit`` names a unit, and
``bert_datagen.datagen.masking.mask_batch`` asks it for its groups and its choice. Registered here, in
this order (the CLI's choices): ``token`` (one position each, the original's default), ``word`` (whole
words, the original's ``--whole-word-mask``) and ``span`` (runs of whole words,
``bert_datagen.datagen.span_masking``).

A unit's ``choose(cand, starts, group, keys, counters, target)`` returns the chosen positions and,
for units that make the mask/keep/random choice once per group, the position whose draw decides each
chosen one (None: each position's own).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from bert_datagen.datagen.rng import u64_for_keys
from bert_datagen.datagen.span_masking import choose_mask_spans

_NEVER = np.uint64(np.iinfo(np.uint64).max)  # order key of a non-candidate
_HEAD_MARGIN = 8

Choice = tuple[np.ndarray, np.ndarray | None]


@dataclass(frozen=True)
class MaskingUnit:
    # Whether "##" pieces (and segmented words' continuations) join the group before them.
    whole_words: bool
    choose: Callable[..., Choice]


_UNITS: dict[str, MaskingUnit] = {}


def register_masking_unit(name: str, whole_words: bool, choose: Callable[..., Choice]) -> None:
    """Add a masking unit; a unit's name is recorded in manifests, so it must keep its meaning."""
    if name in _UNITS:
        raise ValueError(f"masking unit {name!r} is already registered")
    _UNITS[name] = MaskingUnit(whole_words, choose)


def masking_units() -> tuple[str, ...]:
    """The registered units, in registration order."""
    return tuple(_UNITS)


def get_masking_unit(name: str) -> MaskingUnit:
    """The unit registered as ``name`` (a config has checked the name: KeyError otherwise)."""
    return _UNITS[name]


def _choose_positions(cand: np.ndarray, starts: np.ndarray, group: np.ndarray | None, keys: np.ndarray,
                      counters: np.ndarray, target: np.ndarray) -> tuple[np.ndarray, None]:
    """Every group is one position: the ``target`` candidates with the smallest keys are chosen."""
    n, seq = cand.shape
    order_key = u64_for_keys(keys[:, None], counters[None, :])
    order_key[~cand] = _NEVER
    # Only the target-th smallest key of each row matters: partition, then sort that prefix.
    most = int(min(seq, target.max())) if n else 0
    smallest = np.partition(order_key, most - 1, axis=1)[:, :most] if most < seq else order_key.copy()
    smallest.sort(axis=1)
    threshold = smallest[np.arange(n), np.minimum(target, seq) - 1]
    return cand & (order_key <= threshold[:, None]), None


def _choose_whole_words(cand: np.ndarray, starts: np.ndarray, group: np.ndarray, keys: np.ndarray,
                        counters: np.ndarray, target: np.ndarray) -> tuple[np.ndarray, None]:
    """Groups in key order, each taken when it still fits under the row's target."""
    n, seq = cand.shape
    rows, cols = np.nonzero(cand)
    gid = group[rows, cols]
    sizes = np.bincount(rows * seq + gid, minlength=n * seq).reshape(n, seq)
    # A group's order key is the draw at its first position (groups need not
    # be contiguous: a "##" after [SEP] joins A's last word).
    s_rows, s_cols = np.nonzero(starts)
    group_key = np.full((n, seq), _NEVER, dtype=np.uint64)
    group_key[s_rows, group[s_rows, s_cols]] = u64_for_keys(keys[s_rows], counters[s_cols])
    taken = np.zeros((n, seq), dtype=bool)
    # The greedy scan almost always fills a row within its first target + a few
    # groups: order only those (partition + sort), then redo the rare rows
    # that needed more with a full sort.  Keys are distinct, so both orders agree.
    head = int(min(seq, (target.max() if n else 0) + _HEAD_MARGIN))
    if head < seq:
        part = np.argpartition(group_key, head - 1, axis=1)[:, :head]
        order = np.take_along_axis(part, np.argsort(np.take_along_axis(group_key, part, axis=1), axis=1,
                                                    kind="stable"), axis=1)
        total = _greedy(taken, order, sizes, target)
        redo = np.nonzero((total < target) & ((group_key != _NEVER).sum(axis=1) > head))[0]
    else:
        redo = np.arange(n)
    if redo.size:
        sub = np.zeros((redo.size, seq), dtype=bool)
        order = np.argsort(group_key[redo], axis=1, kind="stable")
        _greedy(sub, order, sizes[redo], target[redo])
        taken[redo] = sub
    chosen = np.zeros((n, seq), dtype=bool)
    chosen[rows, cols] = taken[rows, gid]
    return chosen, None


def _greedy(taken: np.ndarray, order: np.ndarray, sizes: np.ndarray, target: np.ndarray) -> np.ndarray:
    """Mark in ``taken`` the groups that the original's scan keeps, visiting them in ``order``."""
    ordered_sizes = np.ascontiguousarray(np.take_along_axis(sizes, order, axis=1).T)
    taken_sorted = np.zeros(ordered_sizes.shape, dtype=bool)
    total = np.zeros(sizes.shape[0], dtype=np.int64)
    for r in range(ordered_sizes.shape[0]):
        size = ordered_sizes[r]
        open_rows = (total < target) & (size > 0)
        if not open_rows.any():
            break  # every row is full or out of groups
        take = open_rows & (total + size <= target)
        taken_sorted[r] = take
        total += np.where(take, size, 0)
    np.put_along_axis(taken, order, taken_sorted.T, axis=1)
    return total


register_masking_unit("token", False, _choose_positions)
register_masking_unit("word", True, _choose_whole_words)
register_masking_unit("span", True, choose_mask_spans)
