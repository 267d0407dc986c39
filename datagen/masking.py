"""Static masked-LM masking (RECIPE.md section 3), vectorized over a batch of instances.

Per instance, as in the original:

* candidates are all positions but ``[CLS]`` and ``[SEP]``; with whole-word
  masking a ``##`` piece joins the candidate group before it (even across the
  ``[SEP]`` between A and B, as the original does);
* ``num_to_predict = min(max_predictions_per_seq, max(1, round(len * masked_lm_prob)))``
  with Python's round-half-to-even;
* groups are visited in a random order; a group that would take the count past
  ``num_to_predict`` is skipped, later smaller ones may still fit;
* each chosen position becomes ``[MASK]``, keeps its token, or becomes a token
  drawn uniformly from the whole vocabulary, with ``mask_ratios``; the label is
  the original token; positions are stored sorted, padded with 0 (weight 0.0).

Randomness: instance ``r`` has a key ``keys[r]``; position ``p`` draws its
group-order key at counter ``p + 1``, its mask/keep/random choice at
``S + p + 1`` and its random token at ``2S + p + 1`` (``S = max_seq_length``),
all through ``bert_datagen.datagen.rng.u64_for_keys``.  The random order of groups is the
order of the keys drawn at their first positions (``argsort``, stable).

``masking_unit`` picks the groups: ``token`` (one position each), ``word``
(whole words, the original's ``--whole-word-mask``) or ``span`` (runs of whole
words, ``bert_datagen.datagen.spans``; there the mask/keep/random choice is made once per
span, from the draw of its first position).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from bert_datagen.datagen.config import DatagenConfig
from bert_datagen.datagen.rng import u64_for_keys
from bert_datagen.datagen.spans import choose_spans

_U53 = np.float64(1.0 / (1 << 53))
_NEVER = np.uint64(np.iinfo(np.uint64).max)  # order key of a non-candidate
_HEAD_MARGIN = 8


@dataclass
class MaskedBatch:
    input_ids: np.ndarray  # (n, S) int32, with masks applied
    masked_lm_positions: np.ndarray  # (n, P) int32
    masked_lm_ids: np.ndarray  # (n, P) int32
    masked_lm_weights: np.ndarray  # (n, P) float32


def num_to_predict(lengths: np.ndarray, config: DatagenConfig) -> np.ndarray:
    """Masked positions per instance of ``lengths`` real tokens (round half to even, like Python)."""
    wanted = np.round(np.asarray(lengths, dtype=np.float64) * config.masked_lm_prob).astype(np.int64)
    return np.minimum(config.max_predictions_per_seq, np.maximum(1, wanted))


def _uniform(draws: np.ndarray) -> np.ndarray:
    return (draws >> np.uint64(11)).astype(np.float64) * _U53


def candidate_groups(ids: np.ndarray, lengths: np.ndarray, vocab: Any, whole_word: bool,
                     continues: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """(candidate mask, group-start mask, group index of each position or None without whole words).

    ``continues`` (optional, like ``ids``): positions that continue a segmented word
    (``bert_datagen.datagen.segmenters``); they join the group before them as "##" pieces do.
    """
    n, seq = ids.shape
    pos = np.arange(seq)
    real = pos[None, :] < lengths[:, None]
    cand = real & (ids != vocab.cls_id) & (ids != vocab.sep_id)
    if not whole_word:
        return cand, cand, None
    cont = np.asarray(vocab.is_continuation, dtype=bool)[ids]
    if continues is not None:
        cont = cont | continues
    cont &= cand
    # A "##" piece joins the previous candidate group when there is one.
    seen_before = np.cumsum(cand, axis=1) - cand > 0
    starts = cand & ~(cont & seen_before)
    group = np.cumsum(starts, axis=1) - 1
    return cand, starts, group


def mask_batch(ids: np.ndarray, lengths: np.ndarray, keys: np.ndarray, config: DatagenConfig, vocab: Any,
               continues: np.ndarray | None = None) -> MaskedBatch:
    """Apply static masking to every row of ``ids`` (``lengths`` real tokens each); ``continues``:
    see ``candidate_groups``."""
    ids = np.asarray(ids)
    n, seq = ids.shape
    npred = config.max_predictions_per_seq
    lengths = np.asarray(lengths, dtype=np.int64)
    keys = np.asarray(keys, dtype=np.uint64)
    cand, starts, group = candidate_groups(ids, lengths, vocab, config.masking_unit != "token", continues)
    target = num_to_predict(lengths, config)
    counters = np.arange(1, seq + 1, dtype=np.uint64)

    owner = None
    if config.masking_unit == "span":
        chosen, owner = choose_spans(cand, starts, group, keys, counters, target)
    elif config.masking_unit == "word":
        chosen = _choose_whole_words(cand, starts, group, keys, counters, target)
    else:
        chosen = _choose_positions(cand, keys, counters, target)

    rows, cols = np.nonzero(chosen)  # row-major, so positions come out sorted
    labels = ids[rows, cols]
    choice_cols = cols if owner is None else owner[rows, cols]
    choice = _uniform(u64_for_keys(keys[rows], counters[choice_cols] + np.uint64(seq)))
    mask_p, keep_p, _ = config.mask_ratios
    to_mask = choice < mask_p
    to_random = choice >= mask_p + keep_p
    random_ids = u64_for_keys(keys[rows], counters[cols] + np.uint64(2 * seq)) % np.uint64(vocab.size)
    new_ids = np.where(to_mask, vocab.mask_id, np.where(to_random, random_ids.astype(np.int64), labels))
    out_ids = ids.astype(np.int32, copy=True)
    out_ids[rows, cols] = new_ids

    per_row = np.bincount(rows, minlength=n)
    slot = np.arange(rows.shape[0]) - np.repeat(np.cumsum(per_row) - per_row, per_row)
    positions = np.zeros((n, npred), dtype=np.int32)
    label_ids = np.zeros((n, npred), dtype=np.int32)
    weights = np.zeros((n, npred), dtype=np.float32)
    positions[rows, slot] = cols
    label_ids[rows, slot] = labels
    weights[rows, slot] = 1.0
    return MaskedBatch(out_ids, positions, label_ids, weights)


def _choose_positions(cand: np.ndarray, keys: np.ndarray, counters: np.ndarray, target: np.ndarray) -> np.ndarray:
    """Every group is one position: the ``target`` candidates with the smallest keys are chosen."""
    n, seq = cand.shape
    order_key = u64_for_keys(keys[:, None], counters[None, :])
    order_key[~cand] = _NEVER
    # Only the target-th smallest key of each row matters: partition, then sort that prefix.
    most = int(min(seq, target.max())) if n else 0
    smallest = np.partition(order_key, most - 1, axis=1)[:, :most] if most < seq else order_key.copy()
    smallest.sort(axis=1)
    threshold = smallest[np.arange(n), np.minimum(target, seq) - 1]
    return cand & (order_key <= threshold[:, None])


def _choose_whole_words(cand: np.ndarray, starts: np.ndarray, group: np.ndarray, keys: np.ndarray,
                        counters: np.ndarray, target: np.ndarray) -> np.ndarray:
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
    return chosen


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
