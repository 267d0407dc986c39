"""Small synthetic datasets in the real format (records + manifest), for tests and benchmarks.

Records are encoded by `bert_datagen.datagen.records` and listed in a manifest written by `bert_datagen.contract.manifest`,
so the trainer reads them through exactly the path it uses for generated data. Token streams are
random but carry a learnable pattern (the masked token equals its left neighbour plus one), so a
short run can show the loss falling.
"""

from __future__ import annotations

import hashlib
import os

import numpy as np

from bert_datagen.datagen.record_layout import feature_spec
from bert_datagen.datagen.records import InstanceBatch
from bert_datagen.datagen.rng import derive_key
from bert_datagen.datagen.tfrecord import frame_records
from tests.support.record_encoding import encode_batch


def synthetic_batch(n: int, seq_len: int, max_pred: int, vocab_size: int, seed: int) -> InstanceBatch:
    # NumPy's generator is fine here: this is test data, not a dataset anyone shares.
    rng = np.random.default_rng(derive_key(seed, "synthetic-batch") & 0xFFFFFFFF)
    lengths = rng.integers(seq_len // 2, seq_len + 1, size=n)
    ids = np.zeros((n, seq_len), np.int64)
    mask = np.zeros((n, seq_len), np.int64)
    segments = np.zeros((n, seq_len), np.int64)
    positions = np.zeros((n, max_pred), np.int64)
    labels = np.zeros((n, max_pred), np.int64)
    weights = np.zeros((n, max_pred), np.float32)
    for i, length in enumerate(lengths):
        start = rng.integers(5, vocab_size - seq_len - 1)
        row = (start + np.arange(length)) % vocab_size
        row[0], row[-1] = 2, 3  # [CLS]-like and [SEP]-like ids
        cut = int(rng.integers(2, length - 1))
        segments[i, cut:length] = 1
        ids[i, :length], mask[i, :length] = row, 1
        k = min(max_pred, max(1, int(round(length * 0.15))))
        chosen = np.sort(rng.choice(np.arange(1, length - 1), size=k, replace=False))
        positions[i, :k], labels[i, :k], weights[i, :k] = chosen, row[chosen], 1.0
        ids[i, chosen] = 4  # [MASK]-like id
    nsp = rng.integers(0, 2, size=n)
    return InstanceBatch(ids, mask, segments, positions, labels, weights, nsp)


def unmasked(batch: InstanceBatch, identity_key: int) -> InstanceBatch:
    """The batch's records as dynamic-masking data: masked positions restored, an identity each."""
    ids = np.array(batch.input_ids, copy=True)
    rows = np.repeat(np.arange(len(batch)), batch.masked_lm_positions.shape[1])
    live = batch.masked_lm_weights.ravel() > 0
    ids[rows[live], batch.masked_lm_positions.ravel()[live]] = batch.masked_lm_ids.ravel()[live]
    keys = (np.uint64(identity_key) + np.arange(len(batch), dtype=np.uint64)).view(np.int64)
    return InstanceBatch(ids, batch.input_mask, batch.segment_ids, next_sentence_labels=batch.next_sentence_labels,
                         instance_key=keys)


def write_index(directory: str, rel: str, data: bytes, records: int) -> dict:
    """The record index of shard ``rel`` (its bytes ``data``) and its block digests, written beside
    it as `run` writes them: the index's manifest entry."""
    import io

    from bert_datagen.datagen.tfrecord import record_offsets
    from bert_datagen.datagen.tfrecord_index import index_files

    files, entry = index_files(np.diff(record_offsets(io.BytesIO(data).read, records, rel)), rel)
    for path, content in files.items():
        with open(os.path.join(directory, *path.split("/")), "wb") as f:
            f.write(content)
    return entry


def write_synthetic_dataset(directory: str, *, seq_len: int = 32, max_pred: int = 5, vocab_size: int = 200,
                            train_shards: int = 2, records_per_shard: int = 64, eval_records: int = 32,
                            seed: int = 0, masking: str = "static", indexed: bool = True) -> str:
    """A complete dataset directory (train + eval shards, vocab.txt, manifest.json).

    `masking="dynamic"` writes the records unmasked with an identity each (the trainer masks them);
    its vocab then names ids 0-4 [PAD] [UNK] [CLS] [SEP] [MASK], as the records use them.
    ``indexed=False``: no record indexes, as datasets written before them.
    """
    from bert_datagen.contract.fs import LOCAL_FS
    from bert_datagen.contract.manifest import build_manifest, write_manifest

    os.makedirs(os.path.join(directory, "train"), exist_ok=True)
    os.makedirs(os.path.join(directory, "eval"), exist_ok=True)
    dynamic = masking == "dynamic"
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] if dynamic else []
    vocab_text = "".join(f"{t}\n" for t in specials + [f"tok{i}" for i in range(len(specials), vocab_size)]).encode()
    with open(os.path.join(directory, "vocab.txt"), "wb") as f:
        f.write(vocab_text)

    def shard(split: str, index: int, count: int, n: int) -> dict:
        rel = f"{split}/part-{index:05d}-of-{count:05d}.tfrecord"
        batch = synthetic_batch(n, seq_len, max_pred, vocab_size, seed * 1000 + index + (500 if split == "eval" else 0))
        if dynamic:
            batch = unmasked(batch, derive_key(seed, "synthetic-identity", split, index))
        data = frame_records(encode_batch(batch))
        with open(os.path.join(directory, rel), "wb") as f:
            f.write(data)
        entry = {"path": rel, "records": n, "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
        if indexed:
            entry["index"] = write_index(directory, rel, data, n)
        return entry

    train = [shard("train", i, train_shards, records_per_shard) for i in range(train_shards)]
    evals = [shard("eval", 0, 1, eval_records)] if eval_records else []
    config = {"max_seq_length": seq_len, "max_predictions_per_seq": max_pred, "random_seed": seed}
    if dynamic:
        config.update(masking="dynamic", dupe_factor=1)
    manifest = build_manifest(
        config=config,
        vocab={"path": "vocab.txt", "sha256": hashlib.sha256(vocab_text).hexdigest(), "size": vocab_size,
               "do_lower_case": True},
        input_info={"patterns": [], "files": 0, "bytes": 0, "fingerprint": "synthetic"},
        features={k: list(v) for k, v in feature_spec(seq_len, max_pred, masking=masking).items()},
        splits={"train": {"shards": train}, "eval": {"shards": evals}},
        totals={"instances": train_shards * records_per_shard + eval_records},
    )
    write_manifest(directory, manifest, LOCAL_FS)
    return directory
