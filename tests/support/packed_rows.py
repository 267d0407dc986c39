"""Packed pre-training rows built from unpacked instances, in NumPy (the row contract of issue 24).

Tests build their packed rows here rather than through the data pipeline, so the trainer's packed
path is checked against exactly the instances of an unpacked batch.
"""

from __future__ import annotations

import numpy as np


def pack_instances(instances: list[dict[str, np.ndarray]], row_length: int, max_sequences: int,
                   max_predictions: int) -> dict[str, np.ndarray]:
    """Rows of `row_length` holding the instances in order (first fit into the current row, a new
    row when the next one does not fit or the row is full). `instances` are unpacked records:
    input_ids, input_mask, segment_ids [L]; masked_lm_* [P]; next_sentence_labels [1]."""
    rows: list[list[dict]] = [[]]
    used = 0
    for inst in instances:
        n = int(np.sum(inst["input_mask"]))
        if rows[-1] and (used + n > row_length or len(rows[-1]) == max_sequences):
            rows.append([])
            used = 0
        rows[-1].append(inst)
        used += n
    s, p = max_sequences, max_predictions
    out = {name: np.zeros((len(rows), size), dtype)
           for name, size, dtype in (("input_ids", row_length, np.int32), ("input_mask", row_length, np.int32),
                                     ("segment_ids", row_length, np.int32), ("sequence_ids", row_length, np.int32),
                                     ("position_ids", row_length, np.int32),
                                     ("masked_lm_positions", p * s, np.int32), ("masked_lm_ids", p * s, np.int32),
                                     ("masked_lm_weights", p * s, np.float32),
                                     ("next_sentence_labels", s, np.int32), ("next_sentence_weights", s, np.float32),
                                     ("cls_positions", s, np.int32))}
    for r, row in enumerate(rows):
        start, slot = 0, 0
        for k, inst in enumerate(row):
            n = int(np.sum(inst["input_mask"]))
            span = slice(start, start + n)
            out["input_ids"][r, span] = inst["input_ids"][:n]
            out["input_mask"][r, span] = 1
            out["segment_ids"][r, span] = inst["segment_ids"][:n]
            out["sequence_ids"][r, span] = k + 1
            out["position_ids"][r, span] = np.arange(n)
            for j in np.flatnonzero(np.asarray(inst["masked_lm_weights"]) > 0):
                out["masked_lm_positions"][r, slot] = start + int(inst["masked_lm_positions"][j])
                out["masked_lm_ids"][r, slot] = inst["masked_lm_ids"][j]
                out["masked_lm_weights"][r, slot] = inst["masked_lm_weights"][j]
                slot += 1
            out["next_sentence_labels"][r, k] = int(np.ravel(inst["next_sentence_labels"])[0])
            out["next_sentence_weights"][r, k] = 1.0
            out["cls_positions"][r, k] = start
            start += n
    return out


def unbatch(batch: dict[str, np.ndarray]) -> list[dict[str, np.ndarray]]:
    """The rows of a batch of unpacked instances, one dict each."""
    n = len(next(iter(batch.values())))
    return [{k: np.asarray(v)[i] for k, v in batch.items()} for i in range(n)]
