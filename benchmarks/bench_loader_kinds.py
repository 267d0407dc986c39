"""The loaders on every dataset kind, and DataLoader workers (docs/loading.md, issue #31 point 6).

1. **Workers.** The PyTorch adapter in the training process (no workers) against
   ``ds.loader(num_workers=2)`` (workers take a window's batches each and hand them over together,
   `contract/loading/torch_workers.py`) and against a plain ``DataLoader(ds, batch_size=None,
   num_workers=2)`` (a batch at a time: what the adapter did before). Pre-training records of 128
   tokens (4 shards x 4,096), global batch 256, a stream of 8 passes; records/s of wall time (the
   workers are other processes), from the DataLoader's start (worker start-up included), best of 3
   passes taken round the readers in turn. Target: 2 workers at least 0.5x no workers.
2. **Packed and task readers on one core** against tf.data's parser on the same shards
   (``TFRecordDataset -> batch(256) -> parse_example``): packed rows of 128 tokens (up to 4
   sequences, built by `datagen/packed.py` from synthetic instances) read by `NumpyBatches` in the
   global order, and a classification split of 128 tokens read by `TaskBatches` in fine-tuning's order
   (plain and length-grouped), one epoch each; the shards have record indexes, as `run` and `task`
   write them. The process pinned to one CPU, records per CPU second (as `bench_loader_speed`), 7
   passes round the five readers (every other pass backwards), after a pass that is not timed. The
   ratio is the median over the passes of ours / tf.data within the pass (a load that changes
   between passes touches both sides of each ratio), printed with its spread and the best-of ratio.
   Target: at least 0.8x tf.data.
"""

from __future__ import annotations

import hashlib
import os
import sys
import tempfile
import time
from collections.abc import Callable

import numpy as np

from benchmarks.bench_loader_speed import _tf_data, _times
from bert_datagen.contract.fs import LOCAL_FS
from bert_datagen.contract.loading.kinds import batches_for
from bert_datagen.contract.loading.source import open_source
from bert_datagen.contract.manifest import build_manifest, write_manifest
from bert_datagen.datagen.config import DatagenConfig
from bert_datagen.datagen.packed import pack
from bert_datagen.datagen.records import frame_columns
from bert_datagen.datagen.tasks.features import task_feature_spec
from tests.support.synthetic import synthetic_batch, write_index, write_synthetic_dataset

SHARDS, PER_SHARD, SEQ, PREDS, BATCH, PASSES, STREAM_PASSES = 4, 4096, 128, 20, 256, 3, 8
WORKERS = 2
ROUNDS = 7  # one-core passes, each reader once per pass
PAIRS = {"packed_numpy_batches": "packed_tf_data", "task_batches": "task_tf_data", "task_batches_grouped": "task_tf_data"}


def _write_shards(directory: str, split: str, shards: list[dict[str, np.ndarray]]) -> list[dict]:
    os.makedirs(os.path.join(directory, split), exist_ok=True)
    out = []
    for i, columns in enumerate(shards):
        data, _ = frame_columns(columns)
        rel = f"{split}/part-{i:05d}-of-{len(shards):05d}.tfrecord"
        with open(os.path.join(directory, rel), "wb") as f:
            f.write(data)
        records = len(next(iter(columns.values())))
        out.append({"path": rel, "records": records, "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest(),
                    "index": write_index(directory, rel, data, records)})  # as `run` and `task` write them
    return out


def _vocab(directory: str, size: int = 30522) -> dict:
    text = "".join(f"t{i}\n" for i in range(size)).encode()
    with open(os.path.join(directory, "vocab.txt"), "wb") as f:
        f.write(text)
    return {"path": "vocab.txt", "sha256": hashlib.sha256(text).hexdigest(), "size": size, "do_lower_case": True}


def write_packed(directory: str) -> str:
    """Packed rows of SEQ tokens (up to 4 sequences of 32-64 tokens each), SHARDS shards."""
    os.makedirs(directory, exist_ok=True)
    config = DatagenConfig(max_seq_length=SEQ, max_predictions_per_seq=PREDS // 2, packing=True,
                           max_sequences_per_row=4)
    shards = []
    for s in range(SHARDS):
        b = synthetic_batch(PER_SHARD * 5 // 2, SEQ // 2, PREDS // 2, 30522, 100 + s)
        pad = np.zeros((len(b), SEQ // 2), np.int64)
        features = {"input_ids": np.hstack([b.input_ids, pad]), "input_mask": np.hstack([b.input_mask, pad]),
                    "segment_ids": np.hstack([b.segment_ids, pad]), "masked_lm_positions": b.masked_lm_positions,
                    "masked_lm_ids": b.masked_lm_ids, "masked_lm_weights": b.masked_lm_weights,
                    "next_sentence_labels": np.asarray(b.next_sentence_labels).reshape(-1, 1)}
        keys = np.arange(len(b), dtype=np.uint64) + np.uint64(s << 32)
        rows, _ = pack(features, keys, config)
        shards.append(rows)
    spec = {k: ("float32" if v.dtype == np.float32 else "int64", int(v.shape[1])) for k, v in shards[0].items()}
    manifest = build_manifest(
        config={"max_seq_length": SEQ, "max_predictions_per_seq": PREDS // 2, "random_seed": 0, "packing": True,
                "max_sequences_per_row": 4},
        vocab=_vocab(directory), input_info={"patterns": [], "files": 0, "bytes": 0, "fingerprint": "bench-packed"},
        features=spec, splits={"train": {"shards": _write_shards(directory, "train", shards)}},
        totals={"instances": SHARDS * PER_SHARD * 5 // 2})
    write_manifest(directory, manifest, LOCAL_FS)
    return directory


def write_task(directory: str) -> str:
    """A classification split of SEQ tokens (examples of 8 to SEQ tokens), SHARDS shards."""
    os.makedirs(directory, exist_ok=True)
    spec = task_feature_spec("classification", SEQ, training=True)
    rng = np.random.default_rng(7)
    shards = []
    for _ in range(SHARDS):
        lengths = rng.integers(8, SEQ + 1, PER_SHARD)
        live = np.arange(SEQ)[None, :] < lengths[:, None]
        columns = {"input_ids": np.where(live, rng.integers(5, 30522, (PER_SHARD, SEQ)), 0),
                   "input_mask": live.astype(np.int64), "segment_ids": (live & (np.arange(SEQ) > 40)).astype(np.int64),
                   "label_ids": rng.integers(0, 3, (PER_SHARD, 1)), "is_real_example": np.ones((PER_SHARD, 1), np.int64)}
        shards.append({k: columns[k] for k in spec})
    train = _write_shards(directory, "train", shards)
    features = {k: [d, c] for k, (d, c) in spec.items()}
    manifest = build_manifest(
        config={}, vocab=_vocab(directory), input_info={"patterns": [], "files": 0, "bytes": 0, "fingerprint": "b"},
        features=features, kind="task", extra={"task": {"type": "classification", "labels": ["a", "b", "c"]}},
        splits={"train": {"shards": train, "features": features, "labelled": True, "mode": "train"}},
        totals={"records": SHARDS * PER_SHARD})
    write_manifest(directory, manifest, LOCAL_FS)
    return directory


def _epoch(data: str, **kw) -> Callable[[], int]:
    def run() -> int:
        reader = batches_for(open_source(data), seed=1, batch_size=BATCH, **kw)
        steps = getattr(reader, "per_epoch", None) or reader.order.total // BATCH
        return sum(len(reader.batch_at(s)["input_ids"]) for s in range(steps))
    return run


def _workers(data: str) -> dict:
    import torch

    from bert_datagen.contract.loading.torch_adapter import torch_batches

    steps = STREAM_PASSES * SHARDS * PER_SHARD // BATCH

    def adapter(workers: int | None) -> Callable[[], int]:
        def run() -> int:
            ds = torch_batches(open_source(data), seed=1, batch_size=BATCH, stop=steps)
            if workers is None:  # a DataLoader of the adapter itself, a batch per item (what loader() did before)
                ds._counted = True  # the adapter refuses this outside a counting loader: here it is measured
                it = iter(torch.utils.data.DataLoader(ds, batch_size=None, num_workers=WORKERS))
                ds._counted = False
            else:
                it = ds.loader(num_workers=workers)
            return sum(int(b["input_ids"].shape[0]) for b in it)
        return run

    runs = {"in_process": adapter(0), f"loader_{WORKERS}_workers": adapter(WORKERS),
            f"plain_dataloader_{WORKERS}_workers": adapter(None)}
    best = dict.fromkeys(runs, float("inf"))
    for _ in range(PASSES):
        for name, run in runs.items():
            start = time.perf_counter()
            got = run()
            best[name] = min(best[name], time.perf_counter() - start)
            assert got == steps * BATCH, (name, got)
    rates = {k: steps * BATCH / t for k, t in best.items()}
    out = {f"{k}_records_per_s": round(v) for k, v in rates.items()}
    print(f"workers: {steps} batches of {BATCH} ({STREAM_PASSES} passes of {SHARDS * PER_SHARD} records), "
          f"records/s of wall time (best of {PASSES}), load average {os.getloadavg()[0]:.1f}:")
    for k, v in rates.items():
        ratio = v / rates["in_process"]
        out[f"{k}_vs_in_process"] = round(ratio, 2)
        print(f"  {k:<28} {v:>10,.0f}  {ratio:.2f}x")
    return out


def _one_core(packed: str, task: str) -> dict:
    runs = {"packed_numpy_batches": _epoch(packed), "task_batches": _epoch(task),
            "task_batches_grouped": _epoch(task, group_by_length=True)}
    counts = {k: run() for k, run in runs.items()}  # the records an epoch gives (whole batches)
    timed = {k: (counts[k], run) for k, run in runs.items()}
    for name, data in (("packed", packed), ("task", task)):
        source = open_source(data)
        total = sum(source.counts)
        timed[f"{name}_tf_data"] = (total, _tf_data([s.path for s in source.shards], source.spec, shuffled=False))
        timed[f"{name}_tf_data"][1]()  # a first pass sets up TensorFlow's machinery: not timed, as ours is not
    times = _times(timed, ROUNDS)
    rates = {k: timed[k][0] / min(t) for k, t in times.items()}
    out: dict = {f"{k}_records_per_s": round(v) for k, v in rates.items()}
    print(f"one core, records per CPU second (best of {ROUNDS} passes round the readers):")
    for k, v in rates.items():
        print(f"  {k:<22} {v:>10,.0f}")
    for ours, base in PAIRS.items():
        # Each pass's ratio from the two runs of that pass: a load that changes between passes
        # touches both sides of it; the median of the passes is the figure, the spread beside it.
        paired = sorted((timed[ours][0] / a) / (timed[base][0] / b) for a, b in zip(times[ours], times[base], strict=True))
        median, best = paired[len(paired) // 2], rates[ours] / rates[base]
        out[f"{ours}_vs_tf_data"] = round(median, 2)
        out[f"{ours}_vs_tf_data_range"] = [round(paired[0], 2), round(paired[-1], 2)]
        out[f"{ours}_vs_tf_data_best_of"] = round(best, 2)
        print(f"  {ours} / tf.data: {median:.2f}x (median of {ROUNDS} passes, {paired[0]:.2f}-{paired[-1]:.2f}; "
              f"best against best {best:.2f}x)")
    return out


def main() -> dict:
    out: dict = {}
    with tempfile.TemporaryDirectory() as tmp:
        plain = write_synthetic_dataset(os.path.join(tmp, "plain"), seq_len=SEQ, max_pred=PREDS, vocab_size=30522,
                                        train_shards=SHARDS, records_per_shard=PER_SHARD, eval_records=0)
        try:
            import bert_datagen.contract.loading.torch_adapter  # noqa: F401
        except ImportError:
            print("bench_loader_kinds: torch is not installed; no workers figure")
        else:
            out["workers"] = _workers(plain)
        packed, task = write_packed(os.path.join(tmp, "packed")), write_task(os.path.join(tmp, "task"))
        affinity = os.sched_getaffinity(0)
        os.sched_setaffinity(0, {min(affinity)})
        try:
            import tensorflow  # noqa: F401
        except ImportError:
            print("bench_loader_kinds: TensorFlow is not installed; no tf.data baseline")
        else:
            out["one_core"] = _one_core(packed, task)
        finally:
            os.sched_setaffinity(0, affinity)
    return out


if __name__ == "__main__":
    main()
    sys.exit(0)
