"""Tagged sentences -> token-tagging features (first-piece labelling, whole-word windows).

Each word is WordPiece-tokenized on its own; a word with no pieces (only characters the tokenizer
deletes) becomes `[UNK]`, so every word has a first piece and gets a prediction. The word's tag is
on its first piece, -1 on its other pieces, on `[CLS]`, `[SEP]` and padding (the loss and metrics
skip -1). A sentence of more than L - 2 pieces is cut into consecutive, non-overlapping windows of
whole words, so every word is owned by exactly one window; a single word of more than L - 2
pieces keeps its first L - 2 (counted as truncated).
"""

from __future__ import annotations

import json
from collections.abc import Sequence

import numpy as np

from bert_datagen.datagen.tasks.conll import Sentence
from bert_datagen.datagen.tasks.features import TaskRecords, ragged, sequence_mask
from bert_datagen.datagen.tasks.squad import word_pieces


def word_windows(piece_counts: Sequence[int], capacity: int) -> list[tuple[int, int]]:
    """(first word, end word) of each window: greedy, whole words, at most `capacity` pieces."""
    windows = []
    first, used = 0, 0
    for w, count in enumerate(piece_counts):
        if used and used + count > capacity:
            windows.append((first, w))
            first, used = w, 0
        used += count
    windows.append((first, len(piece_counts)))
    return windows


def _dumps_ints(values: np.ndarray) -> str:
    return "[" + ",".join(map(str, values.tolist())) + "]"


def tagging_records(tokenizer, sentences: Sequence[Sentence], tags: Sequence[list[int] | None],
                    max_seq_length: int, labelled: bool) -> TaskRecords:
    """The records of a tagging split in sentence order, with the word maps of each window."""
    L = max_seq_length
    cap = L - 2
    vocab = tokenizer.vocab
    words = [w for s in sentences for w in s.words]
    pieces = word_pieces(tokenizer, words)
    unk = np.array([vocab.unk_id], dtype=np.int32)
    pieces = [p if len(p) else unk for p in pieces]
    flat, offsets = ragged(pieces)
    counts_all = np.minimum(np.diff(offsets), cap)
    truncated_words = int((np.diff(offsets) > cap).sum())

    # Per window: (sentence, window index, first global word, end global word).
    plan: list[tuple[int, int, int, int]] = []
    example_tails = []
    histogram: dict[int, int] = {}
    first_word = 0
    for i, s in enumerate(sentences):
        n = len(s.words)
        spans = word_windows(counts_all[first_word:first_word + n].tolist(), cap)
        histogram[len(spans)] = histogram.get(len(spans), 0) + 1
        plan += [(i, k, first_word + a, first_word + b) for k, (a, b) in enumerate(spans)]
        line = {"words": s.words}
        if labelled:
            line["tags"] = s.tags
        example_tails.append(json.dumps(line, ensure_ascii=False, separators=(",", ":"))[1:])
        first_word += n

    n_rec = len(plan)
    input_ids = np.zeros((n_rec, L), dtype=np.int32)
    label_ids = np.full((n_rec, L), -1, dtype=np.int64)
    word_ids = np.full((n_rec, L), -1, dtype=np.int64)
    input_ids[:, 0] = vocab.cls_id
    word_tag = np.concatenate([np.asarray(t if t is not None else [0] * len(s.words), dtype=np.int64)
                               for s, t in zip(sentences, tags, strict=True)]) if words else np.zeros(0, np.int64)
    sentence_start = np.cumsum([0] + [len(s.words) for s in sentences])
    lengths = np.zeros(n_rec, dtype=np.int64)
    for r, (i, _, a, b) in enumerate(plan):
        counts = counts_all[a:b]
        starts = np.concatenate(([1], 1 + np.cumsum(counts)[:-1])) if b > a else np.zeros(0, np.int64)
        seq_pieces = np.concatenate([flat[offsets[w]:offsets[w] + counts_all[w]] for w in range(a, b)])
        input_ids[r, 1:1 + len(seq_pieces)] = seq_pieces
        input_ids[r, 1 + len(seq_pieces)] = vocab.sep_id
        label_ids[r, starts] = word_tag[a:b]
        word_ids[r, starts] = np.arange(a, b) - sentence_start[i]
        lengths[r] = len(seq_pieces) + 2
    input_mask = sequence_mask(lengths, L)
    columns = {"input_ids": input_ids, "input_mask": input_mask, "label_ids": label_ids,
               "segment_ids": np.zeros((n_rec, L), dtype=np.uint8)}
    window_tails = [f'"window_index":{k},"word_ids":{_dumps_ints(word_ids[r])}}}' for r, (_, k, _, _) in enumerate(plan)]
    counts = {"examples": len(sentences), "features": n_rec,
              "truncated_examples": _sentences_with_cut_words(sentences, np.diff(offsets), cap),
              "truncated_words": truncated_words,
              "multi_window_examples": sum(c for k, c in histogram.items() if k > 1),
              "max_windows_per_example": max(histogram, default=0)}
    return TaskRecords(columns=columns, counts=counts, example_tails=example_tails, window_tails=window_tails,
                       record_example=np.array([i for i, _, _, _ in plan], dtype=np.int64), histogram=histogram)


def _sentences_with_cut_words(sentences: Sequence[Sentence], pieces_per_word: np.ndarray, cap: int) -> int:
    bounds = np.cumsum([0] + [len(s.words) for s in sentences])
    cut = np.concatenate(([0], np.cumsum(pieces_per_word > cap)))
    return int((cut[bounds[1:]] > cut[bounds[:-1]]).sum())
