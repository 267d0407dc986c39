"""Record layouts of task datasets (docs/tasks.md) and the array helpers that fill them."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from bert_datagen.datagen.tasks.config import CLASSIFICATION, REGRESSION, SPAN, TAGGING

SEQUENCE_FEATURES = ("input_ids", "input_mask", "segment_ids")
FIRST_UNIQUE_ID = 1000000000


def task_feature_spec(task_type: str, max_seq_length: int, training: bool) -> dict[str, tuple[str, int]]:
    """Name -> (dtype, length) of every feature of a split's records, as a trainer parses them."""
    s = max_seq_length
    spec = {name: ("int64", s) for name in SEQUENCE_FEATURES}
    if task_type == CLASSIFICATION:
        spec.update(label_ids=("int64", 1), is_real_example=("int64", 1))
    elif task_type == REGRESSION:
        spec.update(label_ids=("float32", 1), is_real_example=("int64", 1))
    elif task_type == SPAN:
        spec["unique_ids"] = ("int64", 1)
        if training:
            spec.update(start_positions=("int64", 1), end_positions=("int64", 1), is_impossible=("int64", 1))
    elif task_type == TAGGING:
        spec["label_ids"] = ("int64", s)
    else:
        raise ValueError(f"unknown task type {task_type!r}")
    return dict(sorted(spec.items()))


@dataclass
class TaskRecords:
    """Records of a split (or of a consecutive part of one) as fixed-length feature columns
    (name -> (n, length) array), with the split's counts and, for span and tagging tasks, the side
    data: one JSON line per example and one per record.

    A part built on its own knows only its own numbering: its side lines are kept as tails (the
    line after its leading index fields) with each record's example, and `combine` numbers the
    parts of a split in order, so parts can be built by different workers."""

    columns: dict[str, np.ndarray]
    counts: dict[str, int] = field(default_factory=dict)
    example_tails: list[str] | None = None
    window_tails: list[str] | None = None
    record_example: np.ndarray | None = None  # per record: its example's index in this part
    histogram: dict[int, int] | None = None  # windows per example -> examples (span, tagging)
    example_lines: list[str] | None = None  # set by `combine`
    window_lines: list[str] | None = None

    def __len__(self) -> int:
        return int(self.columns["input_ids"].shape[0])


# Counts that combine by maximum; every other count is a sum.
_MAX_COUNTS = ("max_windows_per_example",)


def combine(parts: list[TaskRecords]) -> TaskRecords:
    """The split made of its parts in order: columns concatenated, records numbered (SQuAD
    `unique_ids` from 1000000000 in record order), side lines completed, counts summed."""
    names = parts[0].columns
    columns = {name: np.concatenate([p.columns[name] for p in parts]) if len(parts) > 1 else parts[0].columns[name]
               for name in names}
    if "unique_ids" in columns:
        columns["unique_ids"] = unique_ids(0, len(columns["unique_ids"]))
    out = combine_side(parts)
    out.columns = columns
    return out


def unique_ids(first_record: int, n: int) -> np.ndarray:
    """SQuAD's `unique_ids` of n records from the split's record `first_record` on."""
    return (FIRST_UNIQUE_ID + first_record + np.arange(n, dtype=np.int64)).reshape(n, 1)


def combine_side(parts: list[TaskRecords]) -> TaskRecords:
    """Everything of the split but its columns: counts, histogram and the numbered side lines."""
    counts: dict[str, int] = {}
    for p in parts:
        for key, value in p.counts.items():
            counts[key] = max(counts.get(key, 0), value) if key in _MAX_COUNTS else counts.get(key, 0) + value
    out = TaskRecords(columns={}, counts=counts)
    if parts[0].example_tails is None:
        return out
    histogram: dict[int, int] = {}
    example_lines: list[str] = []
    window_lines: list[str] = []
    span = "unique_ids" in parts[0].columns
    for p in parts:
        first = len(example_lines)
        example_lines += [f'{{"index":{first + i},{tail}' for i, tail in enumerate(p.example_tails or [])]
        for k, count in (p.histogram or {}).items():
            histogram[k] = histogram.get(k, 0) + count
        examples = (p.record_example if p.record_example is not None else np.zeros(0, np.int64)) + first
        for ex, tail in zip(examples.tolist(), p.window_tails or [], strict=True):
            uid = f'"unique_id":{FIRST_UNIQUE_ID + len(window_lines)},' if span else ""
            window_lines.append(f'{{{uid}"example_index":{ex},{tail}')
    out.example_lines, out.window_lines, out.histogram = example_lines, window_lines, histogram
    return out


def ragged(arrays: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """A list of 1-D id arrays as one flat int32 array and its offsets (n + 1)."""
    lengths = np.fromiter(map(len, arrays), dtype=np.int64, count=len(arrays))
    offsets = np.zeros(len(arrays) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    flat = np.concatenate(arrays).astype(np.int32, copy=False) if arrays and offsets[-1] else np.zeros(0, np.int32)
    return flat, offsets


def place(out: np.ndarray, flat: np.ndarray, starts: np.ndarray, take: np.ndarray, at: np.ndarray) -> None:
    """out[r, at[r] + j] = flat[starts[r] + j] for j < take[r], for every row r at once."""
    take = take.astype(np.int64)
    total = int(take.sum())
    if total == 0:
        return
    rows = np.repeat(np.arange(len(take)), take)
    first = np.repeat(np.cumsum(take) - take, take)
    within = np.arange(total) - first
    out[rows, at[rows] + within] = flat[starts[rows] + within]


def sequence_mask(lengths: np.ndarray, width: int) -> np.ndarray:
    """1s then 0s per row (uint8: masks and segment ids cross worker boundaries in bulk)."""
    return (np.arange(width)[None, :] < lengths[:, None]).astype(np.uint8)
