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

``masking_unit`` picks the groups and how they are chosen (the registry of
``bert_datagen.datagen.masking_units``): ``token`` (one position each), ``word``
(whole words, the original's ``--whole-word-mask``) or ``span`` (runs of whole
words, ``bert_datagen.datagen.span_masking``; there the mask/keep/random choice is made once per
span, from the draw of its first position).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from bert_datagen.datagen.config import DatagenConfig
from bert_datagen.datagen.masking_units import get_masking_unit
from bert_datagen.datagen.rng import u64_for_keys

_U53 = np.float64(1.0 / (1 << 53))


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
    unit = get_masking_unit(config.masking_unit)
    cand, starts, group = candidate_groups(ids, lengths, vocab, unit.whole_words, continues)
    target = num_to_predict(lengths, config)
    counters = np.arange(1, seq + 1, dtype=np.uint64)
    chosen, owner = unit.choose(cand, starts, group, keys, counters, target)

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
