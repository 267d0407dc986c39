"""Packed rows: several whole instances in one ``max_seq_length`` row, so that little of a batch is padding.

A shard's instances (key order) are cut into groups of ``packing_group_size`` consecutive ones; each
group is packed by best-fit decreasing (longest first; each into the open row it fills most
tightly, ties to the oldest row; a row closes at ``max_sequences_per_row`` sequences). Inside a row
the sequences keep key order, and rows are in the key order of their first sequence. Nothing here is random and nothing depends on who runs it: the rows
are a pure function of the shard's records.

Each instance is copied unchanged: its tokens, segment ids, masked positions (shifted by its offset
in the row), ids, weights and NSP label. ``sequence_ids`` (1..n, 0 on padding) and ``position_ids``
(restarting at 0) tell the trainer where each sequence is; ``instance_key`` per slot is the
instance's identity, by which ``unpack`` gives back exactly the unpacked shard's records in its
order. Layout: ``bert_datagen.datagen.record_layout.packed_feature_spec``; docs/packing.md.
"""

from __future__ import annotations

from bisect import bisect_left, insort

import numpy as np

from bert_datagen.datagen.config import DatagenConfig
from bert_datagen.datagen.example_codec import decode_raw
from bert_datagen.datagen.framed import EncodedRecords
from bert_datagen.datagen.record_layout import INSTANCE_KEY, feature_spec
from bert_datagen.datagen.records import InstanceBatch, frame_columns
from bert_datagen.datagen.tfrecord import RawBatch


def plan_rows(lengths: np.ndarray, capacity: int, max_sequences: int, group_size: int
              ) -> tuple[np.ndarray, np.ndarray]:
    """Each instance's row and its offset in the row, for instances of these lengths in key order.

    Rows are numbered in the key order of their first sequence (groups never share a row, so group
    after group); inside a row the sequences are in key order.
    """
    lengths = np.asarray(lengths, np.int64)
    row_of = np.zeros(len(lengths), np.int64)
    rows = 0
    for lo in range(0, len(lengths), group_size):
        group = lengths[lo:lo + group_size]
        order = np.lexsort((np.arange(len(group)), -group))  # longest first, then key order
        open_rows: list[tuple[int, int]] = []  # (room left, row), sorted: the tightest fit first
        count: dict[int, int] = {}
        for i in order.tolist():
            size = int(group[i])
            at = bisect_left(open_rows, (size, -1))
            if at < len(open_rows):
                room, row = open_rows.pop(at)
            else:
                room, row = capacity, rows
                rows += 1
                count[row] = 0
            count[row] += 1
            row_of[lo + i] = row
            if count[row] < max_sequences and room > size:
                insort(open_rows, (room - size, row))
    # Rows in the key order of their first sequence, not in the order they were opened (longest
    # first): a shard read in order must not run from long sequences to short ones.
    first_member = np.full(rows, len(lengths), np.int64)
    np.minimum.at(first_member, row_of, np.arange(len(lengths)))
    renumber = np.empty(rows, np.int64)
    renumber[np.argsort(first_member, kind="stable")] = np.arange(rows)
    row_of = renumber[row_of]
    order = np.lexsort((np.arange(len(lengths)), row_of))
    sorted_rows = row_of[order]
    before = np.cumsum(lengths[order]) - lengths[order]  # tokens of the sequences before, row by row
    offset = np.zeros(len(lengths), np.int64)
    offset[order] = before - before[np.searchsorted(sorted_rows, sorted_rows)]
    return row_of, offset


def pack(features: dict[str, np.ndarray], keys: np.ndarray, config: DatagenConfig
         ) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """Instances (features of their unpacked records, in key order) -> packed rows' columns, and each
    row's key (its first sequence's)."""
    ids = features["input_ids"]
    n, width = ids.shape
    s_max, preds = config.max_sequences_per_row, config.max_predictions_per_seq
    length = features["input_mask"].sum(axis=1)
    row_of, offset = plan_rows(length, width, s_max, config.packing_group_size)
    rows = int(row_of.max()) + 1 if n else 0
    # Slot of each instance in its row: rank by key order among the row's sequences.
    order = np.lexsort((np.arange(n), row_of))
    first = np.searchsorted(row_of[order], row_of[order], side="left")
    slot = np.zeros(n, np.int64)
    slot[order] = np.arange(n) - first

    inst, j = np.nonzero(np.arange(width) < length[:, None])  # every real token
    r, c = row_of[inst], offset[inst] + j
    out: dict[str, np.ndarray] = {name: np.zeros((rows, width), np.int64) for name in
                                  ("input_ids", "input_mask", "segment_ids", "sequence_ids", "position_ids")}
    out["input_ids"][r, c] = ids[inst, j]
    out["input_mask"][r, c] = 1
    out["segment_ids"][r, c] = features["segment_ids"][inst, j]
    out["sequence_ids"][r, c] = slot[inst] + 1
    out["position_ids"][r, c] = j

    weights = features["masked_lm_weights"]
    masked = (weights != 0).sum(axis=1)  # real predictions come first, padding after
    before = np.zeros(n, np.int64)  # predictions of the row's earlier sequences
    csum = np.cumsum(masked[order]) - masked[order]
    before[order] = csum - csum[first]
    inst, j = np.nonzero(np.arange(weights.shape[1]) < masked[:, None])
    r, c = row_of[inst], before[inst] + j
    out["masked_lm_positions"] = np.zeros((rows, preds * s_max), np.int64)
    out["masked_lm_ids"] = np.zeros((rows, preds * s_max), np.int64)
    out["masked_lm_weights"] = np.zeros((rows, preds * s_max), np.float32)
    out["masked_lm_positions"][r, c] = features["masked_lm_positions"][inst, j] + offset[inst]
    out["masked_lm_ids"][r, c] = features["masked_lm_ids"][inst, j]
    out["masked_lm_weights"][r, c] = weights[inst, j]

    out["cls_positions"] = np.zeros((rows, s_max), np.int64)
    out["cls_positions"][row_of, slot] = offset
    out[INSTANCE_KEY] = np.zeros((rows, s_max), np.int64)
    out[INSTANCE_KEY][row_of, slot] = np.asarray(keys, np.uint64).view(np.int64)
    if "next_sentence_labels" in features:
        out["next_sentence_labels"] = np.zeros((rows, s_max), np.int64)
        out["next_sentence_labels"][row_of, slot] = features["next_sentence_labels"].reshape(n)
        out["next_sentence_weights"] = np.zeros((rows, s_max), np.float32)
        out["next_sentence_weights"][row_of, slot] = 1.0
    row_keys = np.zeros(rows, np.uint64)
    row_keys[row_of[slot == 0]] = np.asarray(keys, np.uint64)[slot == 0]
    return out, row_keys


def unpack(rows: dict[str, np.ndarray], max_predictions_per_seq: int
           ) -> tuple[InstanceBatch, np.ndarray]:
    """Packed rows -> the instances they hold, in key order, as the unpacked run writes them, and
    their keys (uint64). The rows must keep the packed rules (``bert_datagen.datagen.packed_rules``)."""
    batch, keys, _ = unpack_rows(rows, max_predictions_per_seq)
    return batch, keys


def unpack_rows(rows: dict[str, np.ndarray], max_predictions_per_seq: int
                ) -> tuple[InstanceBatch, np.ndarray, np.ndarray]:
    """``unpack``, with the row (index into ``rows``) each instance came from."""
    seq = rows["sequence_ids"]
    n_rows, width = seq.shape
    present = np.arange(rows["cls_positions"].shape[1]) < seq.max(axis=1, initial=0)[:, None]
    row, slot = np.nonzero(present)
    keys = rows[INSTANCE_KEY][row, slot].view(np.uint64)
    order = np.argsort(keys, kind="stable")
    row, slot, keys = row[order], slot[order], keys[order]
    n = len(row)
    start = rows["cls_positions"][row, slot]
    length = (seq[row] == (slot + 1)[:, None]).sum(axis=1)
    inst, j = np.nonzero(np.arange(width) < length[:, None])
    src_r, src_c = row[inst], start[inst] + j
    batch = InstanceBatch(*(np.zeros((n, width), np.int64) for _ in range(3)))
    batch.input_ids[inst, j] = rows["input_ids"][src_r, src_c]
    batch.input_mask[inst, j] = 1
    batch.segment_ids[inst, j] = rows["segment_ids"][src_r, src_c]

    # Each real prediction belongs to the sequence at its position; they are in row order already.
    index_of = np.full((n_rows, present.shape[1]), -1, np.int64)
    index_of[row, slot] = np.arange(n)
    w = rows["masked_lm_weights"]
    pr, pc = np.nonzero(w != 0)
    pos = rows["masked_lm_positions"][pr, pc]
    owner = index_of[pr, seq[pr, pos] - 1]
    order = np.lexsort((pc, owner))
    pr, pc, pos, owner = pr[order], pc[order], pos[order], owner[order]
    first = np.searchsorted(owner, owner, side="left")
    k = np.arange(len(owner)) - first
    p = max_predictions_per_seq
    batch.masked_lm_positions = np.zeros((n, p), np.int64)
    batch.masked_lm_ids = np.zeros((n, p), np.int64)
    batch.masked_lm_weights = np.zeros((n, p), np.float32)
    batch.masked_lm_positions[owner, k] = pos - start[owner]
    batch.masked_lm_ids[owner, k] = rows["masked_lm_ids"][pr, pc]
    batch.masked_lm_weights[owner, k] = w[pr, pc]
    if "next_sentence_labels" in rows:
        batch.next_sentence_labels = rows["next_sentence_labels"][row, slot]
    return batch, keys, row


def framed_payloads(records: EncodedRecords) -> RawBatch:
    """The payloads of framed records (length, its CRC, payload, its CRC) as ranges of one buffer."""
    data = bytes(records.blob)
    ends = np.cumsum(records.lengths)
    starts = (ends - records.lengths + 12).tolist()
    return RawBatch(list(range(len(records))), data, starts, (records.lengths - 16).tolist())


def pack_records(records: EncodedRecords, config: DatagenConfig, where: str) -> EncodedRecords:
    """A shard's records (key order) as packed rows, framed; the rows' keys are their first sequence's.

    Groups never share a row, so they are decoded, packed and encoded one at a time: memory stays
    bounded by a group, whatever the shard's size.
    """
    spec = feature_spec(config.max_seq_length, config.max_predictions_per_seq, config.objective, config.masking)
    keys, lengths, blobs = [], [], []
    for lo in range(0, len(records), config.packing_group_size):
        group = records.slice(lo, lo + config.packing_group_size)
        batch, problems = decode_raw(framed_payloads(group), spec)
        if problems:  # records this run has just encoded: a bug, not bad input
            raise RuntimeError(f"{where}: record {lo + problems[0][0]} does not decode for packing: "
                               f"{problems[0][1]}")
        columns, row_keys = pack(batch.features, group.keys, config)
        blob, framed = frame_columns(columns)
        keys.append(row_keys)
        lengths.append(framed)
        blobs.append(blob)
    if not blobs:
        return records
    return EncodedRecords(np.concatenate(keys), np.concatenate(lengths), b"".join(blobs))


MLM_SLOT_FEATURES = ("masked_lm_positions", "masked_lm_ids", "masked_lm_weights")


def compact_predictions(batch: dict[str, np.ndarray], unit: int) -> dict[str, np.ndarray]:
    """A batch of packed rows with each row's used prediction slots (weight > 0) moved to its front,
    in order, and the slots cut to the fewest multiple of ``unit`` (one sequence's slots) that holds
    the fullest row. A row of S sequences has S x unit slots, most of them unused when its sequences
    are short, and the MLM head computes every slot it is given; a slot of weight 0 adds nothing to
    a loss or a metric, so this changes no figure, only the work (and the slot axis takes at most S
    lengths: a few shapes to compile)."""
    used = batch["masked_lm_weights"] > 0
    order = np.argsort(~used, axis=1, kind="stable")
    fullest = max(int(used.sum(axis=1).max()), 1)
    keep = min(used.shape[1], -(-fullest // unit) * unit)
    out = dict(batch)
    for name in MLM_SLOT_FEATURES:
        out[name] = np.take_along_axis(batch[name], order, axis=1)[:, :keep]
    return out
