"""SQuAD examples -> windowed features, as the original `convert_examples_to_features` (RECIPE.md s.10).

Per question: the question's pieces cut to `max_query_length`; each context word WordPiece-tokenized
on its own (once per paragraph here, where the original redoes it for every question: same pieces);
document windows of L - len(q) - 3 pieces every `doc_stride` pieces, the last one ending at the
document's end; for each piece, "max context" in the window where min(left, right context) +
0.01 x window length is largest (the first such window on ties). Training labels: the answer's
piece span narrowed to the tokenized answer text when that occurs inside it (`_improve_answer_span`),
as positions in the window, or 0/0 when the window does not hold the whole answer or the question
is impossible. `unique_ids` count from 1000000000 in record order.
"""

from __future__ import annotations

from collections.abc import Sequence
from json.encoder import encode_basestring  # the C encoder: json.dumps(s, ensure_ascii=False)

import numpy as np

from bert_datagen.datagen.tasks.features import TaskRecords, place, ragged, sequence_mask
from bert_datagen.datagen.tasks.squad_read import SquadExample

MAX_CONTEXT_WEIGHT = 0.01


def doc_windows(num_tokens: int, max_tokens_for_doc: int, doc_stride: int) -> list[tuple[int, int]]:
    """(start, length) of each window, as the original's `_DocSpan` loop."""
    spans = []
    start = 0
    while start < num_tokens:
        length = min(num_tokens - start, max_tokens_for_doc)
        spans.append((start, length))
        if start + length == num_tokens:
            break
        start += min(length, doc_stride)
    return spans


def max_context_window(spans: Sequence[tuple[int, int]], num_tokens: int) -> np.ndarray:
    """For every document piece, the index of the window where it has the most context."""
    if len(spans) == 1:
        return np.zeros(num_tokens, dtype=np.int64)
    starts = np.array([s for s, _ in spans], dtype=np.int64)[:, None]
    lengths = np.array([n for _, n in spans], dtype=np.int64)[:, None]
    pos = np.arange(num_tokens, dtype=np.int64)[None, :]
    left, right = pos - starts, starts + lengths - 1 - pos
    score = np.where((left >= 0) & (right >= 0), np.minimum(left, right) + MAX_CONTEXT_WEIGHT * lengths, -np.inf)
    return score.argmax(axis=0)  # first maximum: the original replaces only on a strictly larger score


def improve_answer_span(doc_ids: np.ndarray, start: int, end: int, answer_ids: np.ndarray) -> tuple[int, int]:
    """The first sub-span of [start, end] whose pieces are the answer's pieces, else [start, end].

    The original compares space-joined piece strings; pieces hold no spaces, so equal strings are
    equal piece sequences, and only a span of the answer's length can match.
    """
    n = len(answer_ids)
    if n == 0:
        return start, end
    for new_start in range(start, end - n + 2):
        if np.array_equal(doc_ids[new_start:new_start + n], answer_ids):
            return new_start, new_start + n - 1
    return start, end


def word_pieces(tokenizer, words: list[str]) -> list[np.ndarray]:
    """The pieces of each word, tokenized on its own; each distinct word once (text repeats its words)."""
    if not words:
        return []
    index: dict[str, int] = {}
    slots = [index.setdefault(w, len(index)) for w in words]
    distinct = tokenizer.encode_batch_ids(list(index))
    return [distinct[i] for i in slots]


class _Documents:
    """Every distinct paragraph's pieces in one flat array, with word <-> piece maps."""

    def __init__(self, tokenizer, examples: Sequence[SquadExample]) -> None:
        self.index: dict[int, int] = {}
        paragraphs = []
        for ex in examples:
            if id(ex.paragraph) not in self.index:
                self.index[id(ex.paragraph)] = len(paragraphs)
                paragraphs.append(ex.paragraph)
        words = [w for p in paragraphs for w in p.words]
        self.flat, word_offsets = ragged(word_pieces(tokenizer, words))
        word_counts = np.array([len(p.words) for p in paragraphs], dtype=np.int64)
        first_word = np.concatenate(([0], np.cumsum(word_counts)))
        self.piece_start = word_offsets[first_word]  # per paragraph, into flat
        self.word_offsets = word_offsets  # per word (global), into flat
        self.first_word = first_word
        # Per piece: its word, within its paragraph.
        pieces_per_word = np.diff(word_offsets)
        global_word = np.repeat(np.arange(len(words), dtype=np.int64), pieces_per_word)
        para_of_word = np.repeat(np.arange(len(paragraphs), dtype=np.int64), word_counts)
        self.tok_to_orig = global_word - first_word[para_of_word[global_word]] if len(words) else global_word

    def of(self, ex: SquadExample) -> tuple[int, int, int]:
        """(paragraph index, first piece in flat, number of pieces)."""
        p = self.index[id(ex.paragraph)]
        lo = int(self.piece_start[p])
        return p, lo, int(self.piece_start[p + 1]) - lo

    def orig_to_tok(self, p: int, word: int) -> int:
        """Paragraph-local index of a word's first piece (the original's orig_to_tok_index)."""
        return int(self.word_offsets[self.first_word[p] + word] - self.piece_start[p])


def _answer_pieces(docs: _Documents, ex: SquadExample, p: int, lo: int, n_tok: int,
                   answer_ids: np.ndarray) -> tuple[int, int]:
    start = docs.orig_to_tok(p, ex.start_word)
    if ex.end_word < len(ex.paragraph.words) - 1:
        end = docs.orig_to_tok(p, ex.end_word + 1) - 1
    else:
        end = n_tok - 1
    return improve_answer_span(docs.flat[lo:lo + n_tok], start, end, answer_ids)


def _json_strings(values: Sequence[str]) -> str:
    return "[" + ",".join(map(encode_basestring, values)) + "]"


def squad_records(tokenizer, examples: Sequence[SquadExample], max_seq_length: int, doc_stride: int,
                  max_query_length: int, training: bool, version2: bool, labelled: bool) -> TaskRecords:
    """The records of a SQuAD split in example order, with the side data post-processing reads."""
    L = max_seq_length
    vocab = tokenizer.vocab
    docs = _Documents(tokenizer, examples)
    q_flat, q_off = ragged(tokenizer.encode_batch_ids([ex.question for ex in examples]))
    q_len = np.minimum(np.diff(q_off), max_query_length)
    answers: list[np.ndarray] = [np.zeros(0, dtype=np.int32)] * len(examples)
    if training:
        with_answer = [i for i, ex in enumerate(examples) if not ex.is_impossible]
        for i, ids in zip(with_answer, tokenizer.encode_batch_ids([examples[i].answer_text for i in with_answer]),
                          strict=True):
            answers[i] = ids

    token_json = np.array([encode_basestring(t) for t in vocab.tokens], dtype=object)
    key_json = np.array([f'"{p}":' for p in range(L)], dtype=object)
    key_true = np.array([f'"{p}":true' for p in range(L)], dtype=object)
    key_false = np.array([f'"{p}":false' for p in range(L)], dtype=object)
    most_words = max((len(ex.paragraph.words) for ex in examples), default=0)
    int_json = np.array([str(i) for i in range(most_words)], dtype=object)
    windows: list[tuple[int, int, int, int]] = []  # example, q length, first doc piece in flat, length
    labels: list[tuple[int, int, int]] = []
    window_meta: list[tuple[int, int, np.ndarray, np.ndarray]] = []  # example, window, words, max-context
    example_tails = []
    histogram: dict[int, int] = {}
    for i, ex in enumerate(examples):
        p, lo, n_tok = docs.of(ex)
        lq = int(q_len[i])
        spans = doc_windows(n_tok, L - lq - 3, doc_stride)
        best = max_context_window(spans, n_tok)
        if training and not ex.is_impossible:
            tok_start, tok_end = _answer_pieces(docs, ex, p, lo, n_tok, answers[i])
        histogram[len(spans)] = histogram.get(len(spans), 0) + 1
        for w, (start, length) in enumerate(spans):
            windows.append((i, lq, lo + start, length))
            window_meta.append((i, w, docs.tok_to_orig[lo + start:lo + start + length], best[start:start + length] == w))
            if training:
                labels.append(_window_label(ex, tok_start if not ex.is_impossible else 0,
                                            tok_end if not ex.is_impossible else 0, start, length, lq))
        example_tails.append(_example_tail(ex, labelled, version2))

    n = len(windows)
    win = np.array(windows, dtype=np.int64).reshape(n, 4)
    ex_of, lq_w, doc_lo, doc_len = win[:, 0], win[:, 1], win[:, 2], win[:, 3]
    input_ids = np.zeros((n, L), dtype=np.int32)
    rows = np.arange(n)
    input_ids[:, 0] = vocab.cls_id
    place(input_ids, q_flat, q_off[:-1][ex_of], lq_w, np.ones(n, dtype=np.int64))
    input_ids[rows, 1 + lq_w] = vocab.sep_id
    place(input_ids, docs.flat, doc_lo, doc_len, 2 + lq_w)
    seq_len = lq_w + doc_len + 3
    input_ids[rows, seq_len - 1] = vocab.sep_id
    input_mask = sequence_mask(seq_len, L)
    segment_ids = input_mask * (np.arange(L)[None, :] >= (2 + lq_w)[:, None])
    # Record numbers within this part; `combine` makes them the split's unique ids.
    columns = {"input_ids": input_ids, "input_mask": input_mask, "segment_ids": segment_ids,
               "unique_ids": rows.reshape(n, 1)}
    if training:
        lab = np.array(labels, dtype=np.int64).reshape(n, 3)
        columns.update(start_positions=lab[:, :1], end_positions=lab[:, 1:2], is_impossible=lab[:, 2:])

    window_tails = []
    for r in range(n):
        _, w, words, ctx = window_meta[r]
        doc = slice(int(lq_w[r]) + 2, int(lq_w[r]) + 2 + len(words))
        # Object-array operations build the strings in one C loop per window.
        window_tails.append(
            f'"window_index":{w},"tokens":[{",".join(token_json[input_ids[r, :seq_len[r]]].tolist())}],'
            f'"token_to_word":{{{",".join((key_json[doc] + int_json[words]).tolist())}}},'
            f'"max_context":{{{",".join(np.where(ctx, key_true[doc], key_false[doc]).tolist())}}}}}')
    counts = {"examples": len(examples), "features": n,
              "truncated_examples": int((np.diff(q_off) > max_query_length).sum()),
              "multi_window_examples": sum(c for k, c in histogram.items() if k > 1),
              "max_windows_per_example": max(histogram, default=0)}
    if training:
        counts["windows_without_answer"] = int(((columns["start_positions"][:, 0] == 0)
                                                & (columns["is_impossible"][:, 0] == 0)).sum())
    return TaskRecords(columns=columns, counts=counts, example_tails=example_tails, window_tails=window_tails,
                       record_example=ex_of, histogram=histogram)


def _window_label(ex: SquadExample, tok_start: int, tok_end: int, start: int, length: int,
                  lq: int) -> tuple[int, int, int]:
    if ex.is_impossible:
        return 0, 0, 1
    if not (tok_start >= start and tok_end <= start + length - 1):
        return 0, 0, 0
    offset = lq + 2
    return tok_start - start + offset, tok_end - start + offset, 0


def _example_tail(ex: SquadExample, labelled: bool, version2: bool) -> str:
    parts = [f'"id":{encode_basestring(ex.qas_id)},"question":{encode_basestring(ex.question)},'
             f'"words":{ex.paragraph.words_json}']
    if ex.paragraph.context is not None:  # unspaced: predictions map back to these exact characters
        parts.append(f',"context":{encode_basestring(ex.paragraph.context)},"word_starts":{ex.paragraph.starts_json}')
    if labelled:
        parts.append(f',"answers":{_json_strings(ex.answers or [])}')
    if version2:
        parts.append(f',"is_impossible":{"true" if ex.is_impossible else "false"}')
    parts.append("}")
    return "".join(parts)
