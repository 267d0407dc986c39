"""Decoding speed of the loaders (bert_datagen.contract.loading) on one core, against the `tfrecord`
PyPI package's reader and tf.data, on the same shards (docs/loading.md, issue #22 point 6).

Shards: pre-training records of 128 tokens and 20 predictions (tests/support/synthetic.py), 4 shards.
Every reader decodes every feature of every record into arrays; records/s, best of a few passes:

- numpy read: ``Source.read`` of whole shards (CRC-checked, decoded into NumPy);
- numpy read 64: the same in ranges of 64 records (the iterators' chunk: block size 64);
- numpy batches: ``NumpyBatches`` over an epoch in the global order (batch 256; reads, CRCs, order,
  gathering into batches);
- torch batches: the PyTorch adapter over the same epoch (no workers: one core);
- tfrecord package: ``tfrecord.reader.tfrecord_loader`` (one dict of arrays per record, no batching:
  its DataLoader collation would only add to it); skipped with a line when not installed
  (``pip install bert-datagen[bench]``);
- tf.data: ``TFRecordDataset`` -> ``batch(256)`` -> ``parse_example``, tensors not converted.

The process is pinned to one CPU for the measurement (and tf.data's own thread pools to one thread).
Targets: numpy/torch at least 3x the tfrecord package and at least 0.8x tf.data.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable

from bert_datagen.contract.loading.batches import NumpyBatches
from bert_datagen.contract.loading.source import open_source
from tests.support.synthetic import write_synthetic_dataset

SHARDS, PER_SHARD, SEQ, PREDS, BATCH, PASSES = 4, 4096, 128, 20, 256, 3


def _rate(records: int, run: Callable[[], int]) -> float:
    best = float("inf")
    for _ in range(PASSES):
        start = time.perf_counter()
        got = run()
        best = min(best, time.perf_counter() - start)
        if got != records:
            raise AssertionError(f"read {got} records, expected {records}")
    return records / best


def _numpy_read(data: str) -> int:
    source = open_source(data)  # a fresh source: the offset index is part of the cost
    return sum(len(source.read(s, 0, n)["input_ids"]) for s, n in enumerate(source.counts))


def _numpy_read_chunks(data: str, size: int) -> int:
    """Whole shards in ranges of ``size`` records: what a decode call costs at the iterators' chunk size."""
    source = open_source(data)
    return sum(len(source.read(s, a, min(a + size, n))["input_ids"])
               for s, n in enumerate(source.counts) for a in range(0, n, size))


def _numpy_batches(data: str, steps: int) -> int:
    it = NumpyBatches(open_source(data), seed=1, batch_size=BATCH, stop=steps)
    return sum(len(b["input_ids"]) for b in it)


def _torch_batches(data: str, steps: int) -> int:
    from bert_datagen.contract.loading.torch_adapter import torch_batches

    return sum(int(b["input_ids"].shape[0]) for b in torch_batches(open_source(data), seed=1, batch_size=BATCH,
                                                                    stop=steps))


# In a child process: the tfrecord package registers its own copy of TensorFlow's Example protos
# ("tensorflow.BytesList", ...), and protobuf refuses both in one process, whichever comes first.
_TFRECORD_CHILD = """
import json, sys, time
try:
    from tfrecord.reader import tfrecord_loader
except ImportError:
    sys.exit(3)
files, description, passes = json.loads(sys.argv[1])
best = float("inf")
for _ in range(passes):
    start = time.perf_counter()
    n = sum(1 for f in files for _ in tfrecord_loader(f, None, description))
    best = min(best, time.perf_counter() - start)
print(json.dumps([n, best]))
"""


def _tfrecord_package(files: list[str], spec: dict, records: int) -> float | None:
    """records/s of the tfrecord package (None when it is not installed), on the same pinned core."""
    description = {k: "float" if d == "float32" else "int" for k, (d, _) in spec.items()}
    done = subprocess.run([sys.executable, "-c", _TFRECORD_CHILD, json.dumps([files, description, PASSES])],
                          capture_output=True, text=True)
    if done.returncode == 3:
        return None
    if done.returncode:
        raise RuntimeError(f"tfrecord package baseline failed: {done.stderr.strip()[-500:]}")
    n, best = json.loads(done.stdout)
    if n != records:
        raise AssertionError(f"the tfrecord package read {n} records, expected {records}")
    return records / best


def _tf_data(files: list[str], spec: dict) -> Callable[[], int]:
    import tensorflow as tf

    features = {k: tf.io.FixedLenFeature([c], tf.float32 if d == "float32" else tf.int64) for k, (d, c) in spec.items()}
    options = tf.data.Options()
    options.threading.private_threadpool_size = 1
    options.threading.max_intra_op_parallelism = 1
    ds = tf.data.TFRecordDataset(files).batch(BATCH).map(lambda r: tf.io.parse_example(r, features))
    ds = ds.with_options(options)
    return lambda: sum(int(b["input_ids"].shape[0]) for b in ds)


def main() -> dict:
    affinity = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {min(affinity)})
    try:
        with tempfile.TemporaryDirectory() as tmp:
            return _measure(os.path.join(tmp, "data"))
    finally:
        os.sched_setaffinity(0, affinity)


def _measure(data: str) -> dict:
    write_synthetic_dataset(data, seq_len=SEQ, max_pred=PREDS, vocab_size=4000, train_shards=SHARDS,
                            records_per_shard=PER_SHARD, eval_records=0)
    source = open_source(data)
    files = [s.path for s in source.shards]
    total = sum(source.counts)
    steps = total // BATCH
    rates = {
        "numpy_read": _rate(total, lambda: _numpy_read(data)),
        "numpy_read_64": _rate(total, lambda: _numpy_read_chunks(data, 64)),
        "numpy_batches": _rate(steps * BATCH, lambda: _numpy_batches(data, steps)),
    }
    try:
        rates["torch_batches"] = _rate(steps * BATCH, lambda: _torch_batches(data, steps))
    except ImportError:
        print("bench_loader_speed: torch is not installed; no torch figure")
    package = _tfrecord_package(files, source.spec, total)
    if package is None:
        print("bench_loader_speed: the tfrecord package is not installed (pip install bert-datagen[bench]); "
              "no tfrecord baseline")
    else:
        rates["tfrecord_package"] = package
    try:
        tf_run = _tf_data(files, source.spec)
    except ImportError:
        print("bench_loader_speed: TensorFlow is not installed; no tf.data baseline")
    else:
        rates["tf_data"] = _rate(total, tf_run)
    out: dict = {f"{k}_records_per_s": round(v) for k, v in rates.items()}
    print(f"{total} records of {SEQ} tokens in {SHARDS} shards, one core, records/s (best of {PASSES}):")
    for k, v in rates.items():
        print(f"  {k:<18} {v:>10,.0f}")
    for ours in ("numpy_read", "numpy_read_64", "numpy_batches", "torch_batches"):
        for base in ("tfrecord_package", "tf_data"):
            if ours in rates and base in rates:
                ratio = rates[ours] / rates[base]
                out[f"{ours}_vs_{base}"] = round(ratio, 2)
                print(f"  {ours} / {base}: {ratio:.2f}x")
    return out


if __name__ == "__main__":
    main()
    sys.exit(0)
