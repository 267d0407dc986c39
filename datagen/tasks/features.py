"""Record layouts of task datasets (docs/tasks.md) and the array helpers that fill them."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from datagen.tasks.config import CLASSIFICATION, REGRESSION, SPAN, TAGGING

SEQUENCE_FEATURES = ("input_ids", "input_mask", "segment_ids")


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
    """The records of one split, as fixed-length feature columns (name -> (n, length) array), plus
    the side-data lines (JSON, one per example / one per record) and the split's counts."""

    columns: dict[str, np.ndarray]
    counts: dict[str, int] = field(default_factory=dict)
    example_lines: list[str] | None = None
    window_lines: list[str] | None = None
    histogram: dict[str, int] | None = None  # windows per example -> number of examples (span, tagging)

    def __len__(self) -> int:
        return int(self.columns["input_ids"].shape[0])

    def select(self, rows: np.ndarray) -> dict[str, np.ndarray]:
        return {name: values[rows] for name, values in self.columns.items()}


def ragged(arrays: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """A list of 1-D id arrays as one flat int64 array and its offsets (n + 1)."""
    lengths = np.fromiter(map(len, arrays), dtype=np.int64, count=len(arrays))
    offsets = np.zeros(len(arrays) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    flat = np.concatenate(arrays).astype(np.int64) if arrays and offsets[-1] else np.zeros(0, dtype=np.int64)
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
    return (np.arange(width)[None, :] < lengths[:, None]).astype(np.int64)
