"""The rules of packed rows (bert_datagen.datagen.packed), checked for a batch at once.

First the row's own layout: sequence ids 1..n in runs from position 0 (0 on padding, n at most
``max_sequences_per_row``), positions restarting at each sequence, each sequence's [CLS] position,
weights and labels of the n present slots, masked positions on real tokens in order. Rows that keep
them are unpacked and every instance is checked by the BERT record rules (``check_batch``), so a
packed dataset is held to exactly the rules of the unpacked one.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from bert_datagen.datagen.example_codec import Batch
from bert_datagen.datagen.packed import unpack_rows
from bert_datagen.datagen.record_rules import MAX_PROBLEMS_PER_SHARD, RecordShape, check_batch


def instances_of(batch: Batch, shape: RecordShape) -> Batch:
    """The instances of well-formed packed rows, in key order; ``index`` is each one's row index."""
    unpacked, _, row = unpack_rows(batch.features, shape.max_predictions)
    features = {name: getattr(unpacked, name) for name in unpacked.feature_names}
    if "next_sentence_labels" in features:
        features["next_sentence_labels"] = features["next_sentence_labels"].reshape(-1, 1)
    return Batch(np.asarray(batch.index)[row], features)


def _row_checks(f: dict[str, np.ndarray], shape: RecordShape) -> list[tuple[np.ndarray, Callable[[int], str]]]:
    seq, mask, pos_ids = f["sequence_ids"], f["input_mask"], f["position_ids"]
    n_rows, width = seq.shape
    slots = f["cls_positions"].shape[1]
    count = seq.max(axis=1, initial=0)
    real = seq > 0
    step = np.diff(seq, axis=1)
    runs_ok = ((seq[:, 0] == 1) & ((step == 0) | (step == 1) | ~real[:, 1:]).all(1)
               & (real[:, :-1] | ~real[:, 1:]).all(1) & (count <= slots))
    # Where each position's sequence starts: the last position whose id differs from the one before.
    starts = np.where(np.c_[np.ones((n_rows, 1), bool), step != 0], np.arange(width), 0)
    start_of = np.maximum.accumulate(starts, axis=1)
    want_pos = np.where(real, np.arange(width) - start_of, 0)
    present = np.arange(slots) < count[:, None]
    first_of = np.zeros((n_rows, slots + 1), np.int64)
    rr, cc = np.nonzero(real & np.c_[np.ones((n_rows, 1), bool), step != 0])
    first_of[rr, np.clip(seq[rr, cc], 0, slots)] = cc
    want_cls = np.where(present, first_of[:, 1:], 0)
    w = f["masked_lm_weights"]
    k = (w != 0).sum(1)
    mpos = f["masked_lm_positions"]
    act = np.arange(w.shape[1]) < k[:, None]
    on_real = act & ((mpos < 0) | (mpos >= width) | ~np.take_along_axis(real, np.clip(mpos, 0, width - 1), 1))
    per_seq = np.zeros((n_rows, slots + 1), np.int64)
    ar, ac = np.nonzero(act & ~on_real)
    np.add.at(per_seq, (ar, np.clip(seq[ar, mpos[ar, ac]], 0, slots)), 1)
    checks: list[tuple[np.ndarray, Callable[[int], str]]] = [
        (~runs_ok, lambda r: f"sequence_ids are not runs 1..n (n <= {slots}) from position 0 then 0s: "
                             f"{seq[r].tolist()}"),
        ((mask != real).any(1), lambda r: "input_mask is not 1 exactly where sequence_ids > 0"),
        ((pos_ids != want_pos).any(1) & runs_ok, lambda r: "position_ids do not restart at 0 with each sequence"),
        ((f["cls_positions"] != want_cls).any(1) & runs_ok, lambda r: (
            f"cls_positions {f['cls_positions'][r].tolist()} are not the sequences' starts {want_cls[r].tolist()}")),
        (((f["instance_key"] != 0) & ~present).any(1) & runs_ok, lambda r: "instance_key of an absent sequence "
                                                                          "is not 0"),
        (((w != 0) != act).any(1) | (act & (w != 1)).any(1), lambda r: f"masked_lm_weights are not 1s then 0s: {w[r].tolist()}"),
        (on_real.any(1), lambda r: "a masked position is not on a real token of the row"),
        ((per_seq[:, 1:] > shape.max_predictions).any(1), lambda r: (
            f"a sequence has more than {shape.max_predictions} masked positions")),
    ]
    if "next_sentence_weights" in f:
        nw, nl = f["next_sentence_weights"], f["next_sentence_labels"]
        checks.append(((nw != present).any(1) & runs_ok, lambda r: (
            f"next_sentence_weights {nw[r].tolist()} are not 1 for the {int(count[r])} sequences, 0 after")))
        checks.append((((nl != 0) & ~present).any(1) & runs_ok,
                       lambda r: "next_sentence_labels of an absent sequence is not 0"))
    return checks


def check_packed_batch(batch: Batch, shape: RecordShape, limit: int = MAX_PROBLEMS_PER_SHARD
                       ) -> tuple[list[tuple[int, str]], int, Batch]:
    """Broken rules as (row index, message) (at most ``limit`` per check), their total count, and the
    instances of the rows that keep the row rules (checked by the record rules here too)."""
    if len(batch) == 0:
        return [], 0, batch
    problems: list[tuple[int, str]] = []
    total = 0
    bad = np.zeros(len(batch), bool)
    for failed, message in _row_checks(batch.features, shape):
        rows = np.nonzero(failed)[0]
        bad[rows] = True
        total += len(rows)
        problems += [(int(batch.index[r]), message(int(r))) for r in rows[:limit]]
    good = Batch(np.asarray(batch.index)[~bad], {k: v[~bad] for k, v in batch.features.items()})
    instances = instances_of(good, shape)
    found, count = check_batch(instances, shape.instance_shape(), limit=limit)
    return problems + found, total + count, instances
