"""Shuffle quality of the loaders' global order (bert_datagen.contract.loading.order) against today's
tf.data pipeline of the trainer (seeded file shuffle, interleave of 8 files, shuffle buffer of 10,000:
trainer/pretrain/earlier_runs_input.py), on the same shards, and what computing the order costs per batch.

"How far apart in the shards consecutive samples come from": each record's place in the dataset
(shard-major, record-minor) is known; for pairs of samples ``lag`` apart in the stream we report how
often they come from the same shard and from within 64 records of each other, and the median
distance between them as a fraction of the dataset (a perfect shuffle: 0.29). Per batch: distinct
shards among its records (a perfect shuffle of 256 out of 64 equal shards: 63.0), and how many
records of a batch lie within 64 records (one block) of a record of the batch 1, 16 or 64 before it.

The tf.data side runs the trainer's real pipeline structure on TFRecords whose payload is the
record's own (shard, index), so its order is measured, not modelled. Needs TensorFlow for that half.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time

import numpy as np

from bert_datagen.contract.loading.order import GlobalOrder
from bert_datagen.datagen.tfrecord import frame_records

SHARDS, PER_SHARD, BATCH, SAMPLES, BLOCK = 64, 16384, 256, 131072, 64


def quality(shard: np.ndarray, index: np.ndarray) -> dict[str, float]:
    place = shard.astype(np.int64) * PER_SHARD + index
    total = SHARDS * PER_SHARD
    out: dict[str, float] = {}
    for lag in (1, BATCH):
        same = shard[lag:] == shard[:-lag]
        near = same & (np.abs(index[lag:] - index[:-lag]) < 64)
        out[f"lag{lag}_same_shard"] = float(same.mean())
        out[f"lag{lag}_within_64_records"] = float(near.mean())
        out[f"lag{lag}_median_distance"] = float(np.median(np.abs(place[lag:] - place[:-lag])) / total)
    batches = shard[: len(shard) // BATCH * BATCH].reshape(-1, BATCH)
    out["distinct_shards_per_batch"] = float(np.mean([len(np.unique(b)) for b in batches]))
    out["shards_in_first_16_batches"] = float(len(np.unique(shard[: 16 * BATCH])))
    # Set-level: how many records of batch k+lag have a record of batch k within 64 records of them
    # (the model does not see a record's place inside its batch, only which batch it is in).
    bins = (place // 64)[: len(batches) * BATCH].reshape(-1, BATCH)
    for lag in (1, 16, 64):
        near = [np.isin(bins[k + lag], np.concatenate([bins[k] - 1, bins[k], bins[k] + 1])).mean()
                for k in range(0, len(bins) - lag, 4)]
        out[f"batch_lag{lag}_near"] = float(np.mean(near))
    return out


def ours(seed: int, block: int = BLOCK) -> tuple[dict[str, float], float]:
    order = GlobalOrder((PER_SHARD,) * SHARDS, "bench", seed, BATCH, block)
    placed = order.place(np.arange(SAMPLES, dtype=np.int64))
    start = time.perf_counter()
    steps = 64
    for step in range(1000, 1000 + steps):
        order.batch(step)
    per_batch_ms = (time.perf_counter() - start) / steps * 1e3
    return quality(placed.shard, placed.index), per_batch_ms


def tf_data(seed: int, directory: str) -> dict[str, float]:
    import tensorflow as tf

    files = []
    for s in range(SHARDS):
        path = os.path.join(directory, f"part-{s:05d}.tfrecord")
        payloads = np.stack([np.full(PER_SHARD, s, np.int64), np.arange(PER_SHARD, dtype=np.int64)], 1)
        with open(path, "wb") as f:
            f.write(frame_records([row.tobytes() for row in payloads]))
        files.append(path)
    # The structure of trainer/pretrain/earlier_runs_input.py's train_dataset (static masking).
    ds = tf.data.Dataset.from_tensor_slices(files).shuffle(len(files), seed=seed, reshuffle_each_iteration=True)
    ds = ds.repeat().interleave(lambda f: tf.data.TFRecordDataset(f, buffer_size=1 << 20),
                                cycle_length=min(8, len(files)), block_length=1,
                                num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    ds = ds.shuffle(10000, seed=seed + 1, reshuffle_each_iteration=True).batch(4096)
    got = []
    for batch in ds.take(SAMPLES // 4096):
        got.append(np.frombuffer(b"".join(batch.numpy().tolist()), np.int64).reshape(-1, 2))
    pairs = np.concatenate(got)
    return quality(pairs[:, 0], pairs[:, 1])


def main() -> dict:
    seed = 12345
    results: dict[str, dict] = {}
    mine, per_batch_ms = ours(seed)
    results[f"global_order_b{BLOCK}"] = {**mine, "order_ms_per_batch": per_batch_ms}
    small, _ = ours(seed, 16)
    results["global_order_b16"] = small
    try:
        with tempfile.TemporaryDirectory() as d:
            results["tf_data_trainer"] = tf_data(seed, d)
    except ImportError:
        print("TensorFlow is not installed: the tf.data half is skipped", file=sys.stderr)
    perm = np.random.default_rng(seed).permutation(SHARDS * PER_SHARD)[:SAMPLES]
    results["perfect_shuffle"] = quality(perm // PER_SHARD, perm % PER_SHARD)
    names = list(results)
    print(f"{SHARDS} shards x {PER_SHARD} records, batch {BATCH}, block {BLOCK}, first {SAMPLES} samples")
    print(f"{'metric':32s}" + "".join(f"{n:>18s}" for n in names))
    for metric in results["perfect_shuffle"]:
        print(f"{metric:32s}" + "".join(f"{results[n][metric]:18.4f}" for n in names))
    print(f"order computation: {per_batch_ms:.2f} ms per global batch of {BATCH}")
    return results


if __name__ == "__main__":
    main()
