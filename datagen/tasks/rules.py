"""The task record rules: what a task record and its side data must look like, for a split at once.

Every check is a NumPy expression over all the split's records (in record order) and names the
record it fails on: `[CLS] ... [SEP]` then padding, 1s-then-0s masks, segment ids, label ids inside
the label list, SQuAD spans inside the window's document part (or 0/0), tags -1 exactly where no
owned word starts, and the side files consistent with the records.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np

from bert_datagen.datagen.tasks.config import CLASSIFICATION, REGRESSION, SPAN, TAGGING
from bert_datagen.datagen.tasks.features import FIRST_UNIQUE_ID


@dataclass(frozen=True)
class TaskShape:
    task_type: str
    num_labels: int
    vocab_size: int
    cls_id: int
    sep_id: int
    training: bool  # span: the split carries start/end positions


def _first(bad: np.ndarray, message: str, problems: list[tuple[int, str]], limit: int) -> None:
    for i in np.flatnonzero(bad)[:limit].tolist():
        problems.append((i, message))


def sequence_layout(f: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """(length, position of the first [SEP]-segment boundary) per record: length = sum of the mask."""
    seg = f["segment_ids"]
    length = f["input_mask"].sum(axis=1)
    ones = seg == 1
    boundary = np.where(ones.any(axis=1), np.argmax(ones, axis=1), length)
    return length, boundary


def check_records(f: dict[str, np.ndarray], shape: TaskShape, limit: int = 20) -> list[tuple[int, str]]:
    """Problems of a split's records, as (record index, message), at most `limit` per rule."""
    p: list[tuple[int, str]] = []
    ids, mask, seg = f["input_ids"], f["input_mask"], f["segment_ids"]
    n, L = ids.shape
    if n == 0:
        return p
    rows = np.arange(n)
    length, boundary = sequence_layout(f)
    inside = np.arange(L)[None, :] < length[:, None]
    _first(((mask != 0) & (mask != 1)).any(axis=1) | (mask != inside).any(axis=1),
           "input_mask is not 1s then 0s", p, limit)
    _first(length < 2, "fewer than 2 real tokens ([CLS] and [SEP])", p, limit)
    _first(((ids < 0) | (ids >= shape.vocab_size)).any(axis=1), "input id outside the vocab", p, limit)
    _first(ids[:, 0] != shape.cls_id, "does not start with [CLS]", p, limit)
    _first(ids[rows, np.clip(length - 1, 0, L - 1)] != shape.sep_id, "does not end with [SEP]", p, limit)
    _first((np.where(inside, 0, ids | seg) != 0).any(axis=1), "padding is not all 0", p, limit)
    # Segment 0 up to a boundary, 1 from there to the end of the sequence (tagging: all 0).
    expect = (np.arange(L)[None, :] >= boundary[:, None]) & inside
    _first((seg != expect).any(axis=1), "segment_ids are not 0s then 1s then padding", p, limit)
    if shape.task_type in (CLASSIFICATION, REGRESSION):
        _check_classification(f, shape, boundary, length, p, limit)
    elif shape.task_type == SPAN:
        _check_answer_span(f, shape, boundary, length, p, limit)
    elif shape.task_type == TAGGING:
        _first(boundary != length, "tagging records have segment 0 only", p, limit)
        labels = f["label_ids"]
        _first(((labels < -1) | (labels >= shape.num_labels)).any(axis=1), "label id outside the label list", p,
               limit)
        specials = ~inside
        specials[:, 0] = True
        specials[rows, np.clip(length - 1, 0, L - 1)] = True
        _first((np.where(specials, labels, -1) != -1).any(axis=1), "a label on [CLS], [SEP] or padding", p, limit)
    return sorted(p)


def _check_classification(f, shape: TaskShape, boundary, length, p, limit) -> None:
    ids = f["input_ids"]
    rows = np.arange(len(ids))
    pair = boundary < length
    # A pair's first segment ends with a [SEP]: the one just before segment 1.
    _first(pair & (ids[rows, np.clip(boundary - 1, 0, ids.shape[1] - 1)] != shape.sep_id),
           "segment 0 of a pair does not end with [SEP]", p, limit)
    _first((f["is_real_example"][:, 0] != 1), "is_real_example is not 1", p, limit)
    label = f["label_ids"][:, 0]
    if shape.task_type == REGRESSION:
        _first(~np.isfinite(label), "regression label is not a finite number", p, limit)
    else:
        _first((label < 0) | (label >= shape.num_labels), "label id outside the label list", p, limit)


def _check_answer_span(f, shape: TaskShape, boundary, length, p, limit) -> None:
    ids = f["input_ids"]
    n = len(ids)
    rows = np.arange(n)
    _first(f["unique_ids"][:, 0] != FIRST_UNIQUE_ID + rows, "unique_ids are not 1000000000 + record number", p,
           limit)
    _first(ids[rows, np.clip(boundary - 1, 0, ids.shape[1] - 1)] != shape.sep_id,
           "the question is not followed by [SEP]", p, limit)
    _first(boundary >= length - 1, "no document tokens", p, limit)
    if not shape.training:
        return
    start, end, impossible = f["start_positions"][:, 0], f["end_positions"][:, 0], f["is_impossible"][:, 0]
    null = (start == 0) & (end == 0)
    in_doc = (start >= boundary) & (end <= length - 2) & (start <= end)
    _first(~(null | in_doc), "answer span is neither 0/0 nor inside the window's document part", p, limit)
    _first((impossible != 0) & (impossible != 1), "is_impossible is not 0 or 1", p, limit)
    _first((impossible == 1) & ~null, "an impossible question with an answer span", p, limit)


def _parse(lines: list[str], name: str, p: list[tuple[int, str]]) -> list[dict] | None:
    out = []
    for i, line in enumerate(lines):
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError as e:
            p.append((-1, f"{name} line {i + 1}: not valid JSON ({e.msg})"))
            return None
    return out


def check_side(f: dict[str, np.ndarray], shape: TaskShape, example_lines: list[str], window_lines: list[str],
               tokens: tuple[str, ...], limit: int = 20) -> list[tuple[int, str]]:
    """The side files against the records: one window line per record, its maps and its example.

    Record-level problems carry the record index; file-level ones -1."""
    p: list[tuple[int, str]] = []
    n = len(f["input_ids"])
    examples, windows = _parse(example_lines, "examples.jsonl", p), _parse(window_lines, "windows.jsonl", p)
    if examples is None or windows is None:
        return p
    if len(windows) != n:
        return [(-1, f"windows.jsonl has {len(windows)} lines for {n} records")]
    if [e.get("index") for e in examples] != list(range(len(examples))):
        p.append((-1, "examples.jsonl: indexes are not 0, 1, 2, ... in order"))
    length, boundary = sequence_layout(f)
    previous = (-1, -1)
    for r, w in enumerate(windows):
        if len([q for q in p if q[0] >= 0]) >= limit:
            break
        ex, k = w.get("example_index"), w.get("window_index")
        expected = (previous[0], previous[1] + 1) if ex == previous[0] else (previous[0] + 1, 0)
        if (ex, k) != expected or not 0 <= ex < len(examples):
            p.append((r, f"windows.jsonl: (example_index, window_index) is ({ex}, {k}), expected {expected}"))
            break
        previous = (ex, k)
        words = examples[ex].get("words", [])
        if shape.task_type == SPAN:
            _answer_span_window(f, r, w, words, tokens, int(length[r]), int(boundary[r]), p)
        else:
            _tag_window(f, r, w, len(words), p)
    if windows and previous[0] != len(examples) - 1:
        p.append((-1, f"windows.jsonl ends at example {previous[0]}, examples.jsonl has {len(examples)}"))
    if shape.task_type == TAGGING:
        owned: dict[int, list[int]] = {}
        for w in windows:
            owned.setdefault(w["example_index"], []).extend(x for x in w["word_ids"] if x >= 0)
        for ex, e in enumerate(examples):
            if sorted(owned.get(ex, [])) != list(range(len(e.get("words", [])))):
                p.append((-1, f"example {ex}: its windows do not own each of its words exactly once"))
                break
    return p


def _answer_span_window(f, r: int, w: dict, words: list, tokens: tuple[str, ...], length: int, boundary: int, p) -> None:
    if w.get("unique_id") != int(f["unique_ids"][r, 0]):
        p.append((r, f"windows.jsonl unique_id {w.get('unique_id')} is not the record's {int(f['unique_ids'][r, 0])}"))
    if w.get("tokens") != [tokens[i] for i in f["input_ids"][r, :length].tolist()]:
        p.append((r, "windows.jsonl tokens are not the record's pieces"))
    doc = [str(i) for i in range(boundary, length - 1)]
    t2w, ctx = w.get("token_to_word", {}), w.get("max_context", {})
    if list(t2w) != doc or list(ctx) != doc:
        p.append((r, "windows.jsonl maps do not cover exactly the window's document positions"))
    elif any(not (isinstance(v, int) and 0 <= v < len(words)) for v in t2w.values()):
        p.append((r, "windows.jsonl token_to_word points outside the example's words"))


def _tag_window(f, r: int, w: dict, n_words: int, p) -> None:
    word_ids = np.asarray(w.get("word_ids", []), dtype=np.int64)
    labels = f["label_ids"][r]
    if word_ids.shape != labels.shape:
        p.append((r, f"windows.jsonl word_ids has {len(word_ids)} entries, records have {len(labels)}"))
    elif ((word_ids >= 0) != (labels >= 0)).any():
        p.append((r, "label_ids are not -1 exactly where no owned word starts"))
    elif (word_ids >= n_words).any():
        p.append((r, "windows.jsonl word_ids point outside the example's words"))
