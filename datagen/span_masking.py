"""SpanBERT-style span selection for masking (``--masking-unit span``), vectorized over rows.

Spans are runs of whole words (the word groups of whole-word masking). Per instance:

* every word has a span length ``L`` drawn from the geometric distribution with ``p = 0.2``
  restricted to ``1..10`` words (renormalised, as SpanBERT's own code does; its mean, 3.8 words,
  is the one the SpanBERT paper reports);
* words are visited in a random order (the order key of whole-word masking); a visited word that is
  not yet masked starts a span of its ``L`` words, cut short before the first word already masked,
  before the end of the candidates, and to the longest run of whole words that still fits under
  ``num_to_predict`` (a span that cannot fit one word is skipped, like a group in the recipe);
* this repeats until ``num_to_predict`` positions are chosen or every word was visited.

The 80/10/10 choice (``mask_ratios``) is made once per span, from the draw of the span's first
position; random tokens are still drawn per position.

Randomness: on top of the counters of ``bert_datagen.datagen.masking`` (order ``p + 1``, choice ``S + p + 1``,
random token ``2S + p + 1``), the span length of the word starting at position ``p`` is draw
``3S + p + 1`` of the instance's mask key.
"""

from __future__ import annotations

import numpy as np

from bert_datagen.datagen.rng import u64_for_keys

SPAN_P = 0.2
MAX_SPAN_WORDS = 10
_U53 = np.float64(1.0 / (1 << 53))
_NEVER = np.uint64(np.iinfo(np.uint64).max)


def span_length_probabilities(p: float = SPAN_P, max_words: int = MAX_SPAN_WORDS) -> np.ndarray:
    """P(L = 1..max_words): the geometric distribution restricted to that range."""
    lengths = np.arange(1, max_words + 1, dtype=np.float64)
    weights = p * (1.0 - p) ** (lengths - 1)
    return weights / weights.sum()


_CDF = np.cumsum(span_length_probabilities())
_CDF[-1] = 1.0  # a uniform draw below 1 must never fall past the last length


def span_lengths(draws: np.ndarray) -> np.ndarray:
    """Span lengths in words (1..10) from 64-bit draws, by the inverse CDF."""
    u = (np.asarray(draws, dtype=np.uint64) >> np.uint64(11)).astype(np.float64) * _U53
    return np.searchsorted(_CDF, u, side="right").astype(np.int64) + 1


def choose_mask_spans(cand: np.ndarray, starts: np.ndarray, group: np.ndarray, keys: np.ndarray,
                 counters: np.ndarray, target: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(chosen positions, first position of the span of each chosen position) for each row.

    ``cand``/``starts``/``group`` are the whole-word groups of ``masking.candidate_groups``;
    ``counters`` are ``1..S``. Groups are consecutive word indices, so a span of words is a range
    of group indices.
    """
    n, seq = cand.shape
    rows_all = np.arange(n)
    n_groups = np.where(cand.any(axis=1), group.max(axis=1, initial=-1) + 1, 0)
    # Per group: its first position, size in tokens (prefix sums), order key and span length.
    s_rows, s_cols = np.nonzero(starts)
    s_group = group[s_rows, s_cols]
    first_pos = np.zeros((n, seq), dtype=np.int64)
    first_pos[s_rows, s_group] = s_cols
    c_rows, c_cols = np.nonzero(cand)
    sizes = np.bincount(c_rows * seq + group[c_rows, c_cols], minlength=n * seq).reshape(n, seq)
    # cum[:, g] = tokens of groups < g; padded so that g + MAX_SPAN_WORDS never indexes past it.
    width = seq + MAX_SPAN_WORDS + 1
    cum = np.zeros((n, width), dtype=np.int64)
    cum[:, 1:seq + 1] = np.cumsum(sizes, axis=1)
    cum[:, seq + 1:] = cum[:, seq:seq + 1]
    order_key = np.full((n, seq), _NEVER, dtype=np.uint64)
    order_key[s_rows, s_group] = u64_for_keys(keys[s_rows], counters[s_cols])
    length = np.zeros((n, seq), dtype=np.int64)
    length[s_rows, s_group] = span_lengths(u64_for_keys(keys[s_rows], counters[s_cols] + np.uint64(3 * seq)))
    order = np.argsort(order_key, axis=1, kind="stable")

    taken = np.zeros((n, width), dtype=bool)  # by group index, padded like cum
    span_start = np.zeros((n, width), dtype=np.int64)  # first position of the span holding the group
    total = np.zeros(n, dtype=np.int64)
    offsets = np.arange(MAX_SPAN_WORDS)
    for rank in range(int(n_groups.max(initial=0))):
        open_rows = (total < target) & (rank < n_groups)
        if not open_rows.any():
            break
        rows = rows_all[open_rows]
        g = order[rows, rank]
        words = g[:, None] + offsets[None, :]
        within = (offsets[None, :] < length[rows, g][:, None]) & (words < n_groups[rows][:, None])
        free = ~taken[rows[:, None], words]
        fits = cum[rows[:, None], words + 1] - cum[rows, g][:, None] <= (target[rows] - total[rows])[:, None]
        # A run: stop at the first word that is past the span, already masked or over budget.
        run = np.logical_and.accumulate(within & free & fits, axis=1)
        r_idx, k_idx = np.nonzero(run)
        taken[rows[r_idx], words[r_idx, k_idx]] = True
        span_start[rows[r_idx], words[r_idx, k_idx]] = first_pos[rows[r_idx], g[r_idx]]
        span_words = run.sum(axis=1)
        total[rows] += cum[rows, g + span_words] - cum[rows, g]
    chosen = np.zeros((n, seq), dtype=bool)
    chosen[c_rows, c_cols] = taken[c_rows, group[c_rows, c_cols]]
    owner = np.zeros((n, seq), dtype=np.int64)
    owner[c_rows, c_cols] = span_start[c_rows, group[c_rows, c_cols]]
    return chosen, owner
