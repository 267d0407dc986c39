"""Decoding speed of the loaders (bert_datagen.contract.loading) on one core, against the `tfrecord`
PyPI package's reader and tf.data, on the same shards (docs/loading.md, issue #22 point 6).

Shards: pre-training records of 128 tokens and 20 predictions (tests/support/synthetic.py), 4 shards,
twice: token ids below 4,000 (one or two varint bytes) and below 30,522 (BERT's vocabulary: up to
three). Every reader decodes every feature of every record into arrays; records/s, best of a few
passes taken round the readers in turn:

- numpy read: ``Source.read`` of whole shards (CRC-checked, decoded into NumPy);
- numpy read 64: the same in ranges of 64 records (what one decode call per block would cost);
- numpy batches: ``NumpyBatches`` over an epoch in the global order (batch 256; reads, CRCs, order,
  gathering into batches);
- torch batches: the PyTorch adapter over the same epoch (no workers: one core);
- tfrecord package: ``tfrecord.reader.tfrecord_loader`` (one dict of arrays per record, no batching:
  its DataLoader collation would only add to it); skipped with a line when not installed
  (``pip install bert-datagen[bench]``);
- tf.data: ``TFRecordDataset`` -> ``batch(256)`` -> ``parse_example``, tensors not converted;
- tf.data shuffled: the same behind the interleave and 10,000-record shuffle buffer the trainer
  used before the global order (what the iterators replace: they shuffle too).

The process is pinned to one CPU for the measurement (and tf.data's own thread pools to one thread),
and time is the process's CPU time (all its threads), not wall time: on a shared machine another
job's slices of that CPU would otherwise count against whichever reader ran then.
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
# Token ids of one or two varint bytes, and BERT's vocabulary size: up to three bytes.
VOCABS = (4000, 30522)


def _rates(runs: dict[str, tuple[int, Callable[[], int]]]) -> dict[str, float]:
    """records per CPU second of each reader, best of PASSES (see `_times`)."""
    return {name: runs[name][0] / min(t) for name, t in _times(runs, PASSES).items()}


def _times(runs: dict[str, tuple[int, Callable[[], int]]], passes: int) -> dict[str, list[float]]:
    """CPU seconds of each reader's run in each of ``passes`` passes. The passes go round the readers
    in turn, every other pass backwards, so a change in the machine's load, and whatever one run
    leaves behind for the next (caches, the allocator's free memory), touches them all alike."""
    times: dict[str, list[float]] = {name: [] for name in runs}
    for p in range(passes):
        for name in list(runs)[::-1 if p % 2 else 1]:
            records, run = runs[name]
            start = time.process_time()
            got = run()
            times[name].append(time.process_time() - start)
            if got != records:
                raise AssertionError(f"{name} read {got} records, expected {records}")
    return times


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
    start = time.process_time()
    n = sum(1 for f in files for _ in tfrecord_loader(f, None, description))
    best = min(best, time.process_time() - start)
print(json.dumps([n, best]))
"""


def _tfrecord_package(files: list[str], spec: dict, records: int) -> float | None:
    """records/s of the tfrecord package (None when it is not installed), on the same pinned core."""
    description = {k: "float" if d == "float32" else "int" for k, (d, _) in spec.items()}
    done = subprocess.run([sys.executable, "-c", _TFRECORD_CHILD, json.dumps([files, description, PASSES])],
                          capture_output=True, text=True, timeout=600)  # killed past it
    if done.returncode == 3:
        return None
    if done.returncode:
        raise RuntimeError(f"tfrecord package baseline failed: {done.stderr.strip()[-500:]}")
    n, best = json.loads(done.stdout)
    if n != records:
        raise AssertionError(f"the tfrecord package read {n} records, expected {records}")
    return records / best


def _tf_data(files: list[str], spec: dict, shuffled: bool) -> Callable[[], int]:
    """Plain: the shards in file order. Shuffled: what the trainer read through before the global
    order (trainer/pretrain/earlier_runs_input.py `train_dataset`): interleaved files, a 10,000-record buffer."""
    import tensorflow as tf

    features = {k: tf.io.FixedLenFeature([c], tf.float32 if d == "float32" else tf.int64) for k, (d, c) in spec.items()}
    options = tf.data.Options()
    options.threading.private_threadpool_size = 1
    options.threading.max_intra_op_parallelism = 1
    if shuffled:
        records = tf.data.Dataset.from_tensor_slices(files).interleave(
            tf.data.TFRecordDataset, cycle_length=min(8, len(files)), block_length=1, deterministic=True)
        records = records.shuffle(10_000, seed=1)
    else:
        records = tf.data.TFRecordDataset(files)
    ds = records.batch(BATCH).map(lambda r: tf.io.parse_example(r, features)).with_options(options)
    return lambda: sum(int(b["input_ids"].shape[0]) for b in ds)


def main() -> dict:
    affinity = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {min(affinity)})
    try:
        out = {}
        for vocab in VOCABS:
            with tempfile.TemporaryDirectory() as tmp:
                out[f"vocab_{vocab}"] = _measure(os.path.join(tmp, "data"), vocab)
        return out
    finally:
        os.sched_setaffinity(0, affinity)


def _measure(data: str, vocab: int) -> dict:
    write_synthetic_dataset(data, seq_len=SEQ, max_pred=PREDS, vocab_size=vocab, train_shards=SHARDS,
                            records_per_shard=PER_SHARD, eval_records=0)
    source = open_source(data)
    files = [s.path for s in source.shards]
    total = sum(source.counts)
    steps = total // BATCH
    runs = {
        "numpy_read": (total, lambda: _numpy_read(data)),
        "numpy_read_64": (total, lambda: _numpy_read_chunks(data, 64)),
        "numpy_batches": (steps * BATCH, lambda: _numpy_batches(data, steps)),
    }
    try:
        import bert_datagen.contract.loading.torch_adapter  # noqa: F401
    except ImportError:
        print("bench_loader_speed: torch is not installed; no torch figure")
    else:
        runs["torch_batches"] = (steps * BATCH, lambda: _torch_batches(data, steps))
    try:
        runs["tf_data"] = (total, _tf_data(files, source.spec, shuffled=False))
        runs["tf_data_shuffled"] = (total, _tf_data(files, source.spec, shuffled=True))
    except ImportError:
        print("bench_loader_speed: TensorFlow is not installed; no tf.data baseline")
    rates = _rates(runs)
    package = _tfrecord_package(files, source.spec, total)
    if package is None:
        print("bench_loader_speed: the tfrecord package is not installed (pip install bert-datagen[bench]); "
              "no tfrecord baseline")
    else:
        rates["tfrecord_package"] = package
    out: dict = {f"{k}_records_per_s": round(v) for k, v in rates.items()}
    print(f"{total} records of {SEQ} tokens in {SHARDS} shards, token ids below {vocab}, one core, "
          f"records/s (best of {PASSES}):")
    for k, v in rates.items():
        print(f"  {k:<18} {v:>10,.0f}")
    for ours in ("numpy_read", "numpy_read_64", "numpy_batches", "torch_batches"):
        for base in ("tfrecord_package", "tf_data", "tf_data_shuffled"):
            if ours in rates and base in rates:
                ratio = rates[ours] / rates[base]
                out[f"{ours}_vs_{base}"] = round(ratio, 2)
                print(f"  {ours} / {base}: {ratio:.2f}x")
    return out


if __name__ == "__main__":
    main()
    sys.exit(0)
