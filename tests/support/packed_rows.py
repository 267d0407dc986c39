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
                                     ("cls_positions", s, np.int32), ("instance_key", s, np.int64))}
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
            out["instance_key"][r, k] = sum(len(before) for before in rows[:r]) + k + 1  # any distinct identity
            start += n
    return out


def unbatch(batch: dict[str, np.ndarray]) -> list[dict[str, np.ndarray]]:
    """The rows of a batch of unpacked instances, one dict each."""
    n = len(next(iter(batch.values())))
    return [{k: np.asarray(v)[i] for k, v in batch.items()} for i in range(n)]


def write_packed_dataset(directory: str, *, row_length: int = 64, max_sequences: int = 4, seq_len: int = 32,
                         max_pred: int = 5, vocab_size: int = 200, instances: int = 96, seed: int = 0) -> str:
    """A packed dataset directory (train + eval split, vocab, manifest with `packing`) from synthetic
    instances, its records written as tf.train.Example (needs TensorFlow)."""
    import hashlib
    import os

    import tensorflow as tf

    from bert_datagen.contract.fs import LOCAL_FS
    from bert_datagen.contract.manifest import build_manifest, write_manifest
    from tests.support.synthetic import synthetic_batch

    os.makedirs(directory, exist_ok=True)
    vocab_text = "".join(f"tok{i}\n" for i in range(vocab_size)).encode()
    with open(os.path.join(directory, "vocab.txt"), "wb") as f:
        f.write(vocab_text)
    features: dict = {}

    def shard(split: str, offset: int) -> dict:
        batch = synthetic_batch(instances, seq_len, max_pred, vocab_size, seed * 1000 + offset)
        unpacked = {"input_ids": batch.input_ids, "input_mask": batch.input_mask, "segment_ids": batch.segment_ids,
                    "masked_lm_positions": batch.masked_lm_positions, "masked_lm_ids": batch.masked_lm_ids,
                    "masked_lm_weights": batch.masked_lm_weights,
                    "next_sentence_labels": np.asarray(batch.next_sentence_labels).reshape(-1, 1)}
        rows = pack_instances(unbatch(unpacked), row_length, max_sequences, max_pred)
        rel = f"{split}/part-00000-of-00001.tfrecord"
        os.makedirs(os.path.join(directory, split), exist_ok=True)
        path = os.path.join(directory, rel)
        with tf.io.TFRecordWriter(path) as writer:
            for r in range(len(rows["input_ids"])):
                feats = {}
                for name, values in rows.items():
                    v = values[r]
                    floats = v.dtype == np.float32
                    feats[name] = (tf.train.Feature(float_list=tf.train.FloatList(value=v.tolist())) if floats
                                   else tf.train.Feature(int64_list=tf.train.Int64List(value=v.tolist())))
                    features[name] = ["float32" if floats else "int64", int(v.size)]
                writer.write(tf.train.Example(features=tf.train.Features(feature=feats)).SerializeToString(deterministic=True))
        data = open(path, "rb").read()
        return {"path": rel, "records": len(rows["input_ids"]), "bytes": len(data),
                "sha256": hashlib.sha256(data).hexdigest()}

    train, evals = shard("train", 0), shard("eval", 500)
    manifest = build_manifest(
        config={"max_seq_length": row_length, "max_predictions_per_seq": max_pred, "random_seed": seed,
                "packing": True},
        vocab={"path": "vocab.txt", "sha256": hashlib.sha256(vocab_text).hexdigest(), "size": vocab_size,
               "do_lower_case": True},
        input_info={"patterns": [], "files": 0, "bytes": 0, "fingerprint": "synthetic-packed"},
        features=features, splits={"train": {"shards": [train]}, "eval": {"shards": [evals]}},
        totals={"instances": 2 * instances},
    )
    write_manifest(directory, manifest, LOCAL_FS)
    return directory
