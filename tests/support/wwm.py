"""Whole-word masking measured on laid-out rows: how many masked CJK characters had their whole
segmented word masked (tests and benchmarks/bench_zh.py)."""

from __future__ import annotations

import numpy as np

from bert_datagen.datagen.documents import split_marks
from bert_datagen.datagen.masking import candidate_groups


def cjk_ids(vocab) -> np.ndarray:
    """A boolean per id: the token is one CJK ideograph."""
    from bert_datagen.vocab.train import is_cjk_ideograph

    return np.array([len(t) == 1 and is_cjk_ideograph(t) for t in vocab.tokens], dtype=bool)


def whole_word_counts(marked_ids: np.ndarray, lengths: np.ndarray, positions: np.ndarray, weights: np.ndarray,
                      vocab) -> dict[str, int]:
    """Counts over masked CJK characters: all, those whose whole group (segmented word, as laid out
    in the row) is masked, and those of words of two or more characters."""
    ids, continues = split_marks(marked_ids)
    cand, _, group = candidate_groups(ids, lengths, vocab, True, continues)
    n, seq = ids.shape
    masked = np.zeros((n, seq), dtype=bool)
    rows, slots = np.nonzero(weights > 0)
    masked[rows, positions[rows, slots]] = True
    gid = np.where(cand, group, -1)
    key = np.arange(n)[:, None] * seq + gid
    sizes = np.bincount(key[cand], minlength=n * seq)
    masked_in = np.bincount(key[cand & masked], minlength=n * seq)
    is_cjk = cjk_ids(vocab)[ids] & masked
    whole = is_cjk & (masked_in[key] == sizes[key])
    multi = is_cjk & (sizes[key] > 1)
    return {"masked_cjk": int(is_cjk.sum()), "whole_word": int(whole.sum()), "in_multi_char_words": int(multi.sum()),
            "whole_multi_char_words": int((whole & multi).sum())}
