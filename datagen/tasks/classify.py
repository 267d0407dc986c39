"""Sentence and pair features exactly as the original `run_classifier.py` builds them (RECIPE.md s.10).

`[CLS] A [SEP]` or `[CLS] A [SEP] B [SEP]`, segment 1 on B and its `[SEP]`. A pair is cut to
L - 3 tokens by removing the last token of the longer side (of B when equal), one at a time; a
single text to L - 2. A B that tokenizes to nothing counts as no B (the original tests
`if tokens_b:`). The one-at-a-time loop has a closed form, computed here for all rows at once.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from bert_datagen.datagen.tasks.config import REGRESSION
from bert_datagen.datagen.tasks.features import TaskRecords, place, ragged, sequence_mask


def truncate_pair_lengths(len_a: np.ndarray, len_b: np.ndarray, max_total: int) -> tuple[np.ndarray, np.ndarray]:
    """Lengths after the original's `_truncate_seq_pair` (pop from the longer, B when equal)."""
    la, lb = len_a.astype(np.int64), len_b.astype(np.int64)
    excess = np.maximum(la + lb - max_total, 0)
    diff = la - lb
    # Enough difference: only the longer side shrinks. Otherwise both meet at the middle, A keeping
    # the odd token (B loses first when they are equal).
    one_sided = excess <= np.abs(diff)
    a_longer = diff > 0
    new_a = np.where(one_sided, np.where(a_longer, la - excess, la), (max_total + 1) // 2)
    new_b = np.where(one_sided, np.where(a_longer, lb, lb - excess), max_total // 2)
    return new_a, new_b


def classification_records(tokenizer, texts_a: Sequence[str], texts_b: Sequence[str | None],
                           labels: Sequence[int] | Sequence[float], max_seq_length: int,
                           task_type: str) -> TaskRecords:
    """The records of a sentence/pair split in input order, and how many examples were truncated."""
    n = len(texts_a)
    L = max_seq_length
    vocab = tokenizer.vocab
    ids_a = tokenizer.encode_batch_ids(list(texts_a))
    with_b = [i for i, b in enumerate(texts_b) if b]
    ids_b: list[np.ndarray] = [np.zeros(0, dtype=np.int32)] * n
    for i, ids in zip(with_b, tokenizer.encode_batch_ids([texts_b[i] for i in with_b]), strict=True):
        ids_b[i] = ids
    flat_a, off_a = ragged(ids_a)
    flat_b, off_b = ragged(ids_b)
    len_a, len_b = np.diff(off_a), np.diff(off_b)
    has_b = len_b > 0
    pair_a, pair_b = truncate_pair_lengths(len_a, len_b, L - 3)
    keep_a = np.where(has_b, pair_a, np.minimum(len_a, L - 2))
    keep_b = np.where(has_b, pair_b, 0)
    truncated = (keep_a < len_a) | (keep_b < len_b)

    input_ids = np.zeros((n, L), dtype=np.int32)
    input_ids[:, 0] = vocab.cls_id
    place(input_ids, flat_a, off_a[:-1], keep_a, np.ones(n, dtype=np.int64))
    rows = np.arange(n)
    input_ids[rows, 1 + keep_a] = vocab.sep_id
    place(input_ids, flat_b, off_b[:-1], keep_b, 2 + keep_a)
    input_ids[rows[has_b], (2 + keep_a + keep_b)[has_b]] = vocab.sep_id
    lengths = 2 + keep_a + np.where(has_b, keep_b + 1, 0)
    input_mask = sequence_mask(lengths, L)
    segment_ids = input_mask * (np.arange(L)[None, :] >= (2 + keep_a)[:, None]) * has_b[:, None]
    if task_type == REGRESSION:
        label_ids = np.asarray(labels, dtype=np.float32).reshape(n, 1)
    else:
        label_ids = np.asarray(labels, dtype=np.int64).reshape(n, 1)
    columns = {
        "input_ids": input_ids,
        "input_mask": input_mask,
        "is_real_example": np.ones((n, 1), dtype=np.int64),
        "label_ids": label_ids,
        "segment_ids": segment_ids,
    }
    counts = {"examples": n, "features": n, "truncated_examples": int(truncated.sum())}
    return TaskRecords(columns=columns, counts=counts)
