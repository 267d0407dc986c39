"""A dataset in an S3 bucket (a local `moto` server): what each rank fetches over one epoch through
the record indexes, and one reader's records/s against MosaicML's `StreamingDataset` reading the
same records from the same server (issue #30 point 3; docs/loading.md).

Data: pre-training records of 128 tokens and 20 predictions (tests/support/synthetic.py, indexes
as `run` writes them), 8 shards of 5,323 records (42,584 records, about 36 MB), uploaded to
``s3://bench/c128``. The order: batch 256, blocks of 64, so an epoch is two full windows of 16,384
records and a partial tail window of 9,816 (one seeded permutation of its records: a rank reads
just the records at its positions).

- **Bytes and requests per rank**, world sizes 1, 4 and 16, every rank over the global batches of
  one epoch (``NumpyBatches(..., stop=records // 256)``): the filesystem handed to ``open_source``
  is a counting wrapper around the library's own (tests/support/counting_fs.py: every ranged read,
  whole-object read, opened stream and metadata request counted; nothing in the library changed
  for it). Record bytes (the shards') are the largest rank's over its share of the dataset
  (target: at most 1.1); index bytes apart (every rank reads the index of each shard it reads
  whole, once, to check it against the manifest: a fixed cost of about 1.4% of the dataset per
  rank, whatever the world size), then all bytes; requests are per rank and per epoch (all
  ranks). For comparison, a dataset without indexes: one rank of 4 (its walk reads every shard).
- **Records/s of one reader** (wall time: the network is the cost), ours (``NumpyBatches``, world 1,
  fresh source each pass, reading ahead) against MDS ``StreamingDataset`` (``shuffle=True``, a fresh
  local cache each pass, records written with ``MDSWriter`` to the same server), passes interleaved,
  best of each. MDS runs in a child process: mosaicml-streaming 0.13 pins numpy < 2.2 and
  transformers < 5, so it is installed apart (``pip install --no-deps --target .bench/mds
  mosaicml-streaming xxhash zstd python-snappy``; the benchmark does it when missing) and its
  torchvision import (its vision datasets, unused here) is stubbed. Target: ours at least 1x MDS.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from bert_datagen.contract.fs import DEFAULT_FS
from bert_datagen.contract.loading.batches import NumpyBatches
from bert_datagen.contract.loading.source import open_source
from tests.support.counting_fs import CountingFS
from tests.support.synthetic import write_synthetic_dataset

SHARDS, PER_SHARD, SEQ, PREDS, VOCAB = 8, 5323, 128, 20, 30522  # an epoch ends in a partial window
BATCH, BLOCK, WORLDS, PASSES = 256, 64, (1, 4, 16), 3
BUCKET, PREFIX = "bench", "c128"
MDS_DIR = Path(__file__).resolve().parent.parent / ".bench" / "mds"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def _moto_server():
    port = _free_port()
    server = subprocess.Popen([str(Path(sys.executable).parent / "moto_server"), "-H", "127.0.0.1", "-p", str(port)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while True:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
                break
            if time.monotonic() > deadline or server.poll() is not None:
                raise RuntimeError("moto_server did not start")
            time.sleep(0.2)
        yield f"http://127.0.0.1:{port}"
    finally:
        server.terminate()
        server.wait(timeout=30)


def _epoch(fs, world: int, rank: int, prefetch: bool = True) -> int:
    source = open_source(f"s3://{BUCKET}/{PREFIX}", fs=fs)
    steps = sum(source.counts) // BATCH
    it = NumpyBatches(source, seed=1, batch_size=BATCH, block_size=BLOCK, world_size=world, rank=rank, stop=steps,
                      prefetch=prefetch)
    return sum(len(b["input_ids"]) for b in it)


def _shares(dataset_bytes: int) -> dict:
    out = {}
    for world in WORLDS:
        records, index, whole, requests = [], [], [], []
        for rank in range(world):
            fs = CountingFS()
            _epoch(fs, world, rank)
            share = dataset_bytes / world * ((SHARDS * PER_SHARD) // BATCH * BATCH) / (SHARDS * PER_SHARD)
            records.append(fs.record_bytes / share)
            index.append(fs.index_bytes / share)
            whole.append(fs.bytes / share)
            requests.append(fs.requests)
        out[f"world_{world}"] = {"record_bytes_over_share_max": round(max(records), 4),
                                 "record_bytes_over_share_mean": round(float(np.mean(records)), 4),
                                 "index_bytes_over_share_max": round(max(index), 4),
                                 "all_bytes_over_share_max": round(max(whole), 4),
                                 "requests_per_rank": round(float(np.mean(requests)), 1),
                                 "requests_per_epoch": int(sum(requests))}
        print(f"world {world:2d}: record bytes per rank {max(records):.3f}x its share (max), index "
              f"{max(index):.3f}x, all {max(whole):.3f}x; {np.mean(requests):.0f} requests per rank, "
              f"{sum(requests)} per epoch")
    return out


def _mixture_shares(second: str) -> dict:
    """A mixture 0.7/0.3 of the dataset and a second one of 3 shards (both in the bucket) over the
    global batches of one epoch of the first: the largest rank's record and all bytes over its share
    (the bytes of the records at its positions, whichever dataset they are in)."""
    from bert_datagen.contract.loading.mixture import MixedBatches

    out = {}
    for world in WORLDS:
        records, whole = [], []
        for rank in range(world):
            counting = [CountingFS(), CountingFS()]
            sources = [open_source(f"s3://{BUCKET}/{p}", fs=fs) for p, fs in zip((PREFIX, second), counting, strict=True)]
            mix = MixedBatches(sources, [0.7, 0.3], seed=1, batch_size=BATCH, block_size=BLOCK, world_size=world,
                               rank=rank, stop=(SHARDS * PER_SHARD) // BATCH)
            labels = np.concatenate([b["mixture_dataset"] for b in mix])
            share = sum(sum(f.expected.bytes for f in src.shards) / sum(src.counts) * int((labels == d).sum())
                        for d, src in enumerate(sources))
            records.append(sum(fs.record_bytes for fs in counting) / share)
            whole.append(sum(fs.bytes for fs in counting) / share)
        out[f"world_{world}"] = {"record_bytes_over_share_max": round(max(records), 4),
                                 "all_bytes_over_share_max": round(max(whole), 4)}
        print(f"mixture, world {world:2d}: record bytes per rank {max(records):.3f}x its share (max), "
              f"all {max(whole):.3f}x")
    return out


_MDS_CHILD = r"""
import importlib.machinery, json, sys, time, types
for name, attrs in (("torchvision", {}), ("torchvision.datasets", {"VisionDataset": object, "CIFAR10": object}),
                    ("torchvision.transforms", {}), ("torchvision.transforms.functional", {"to_tensor": None})):
    m = types.ModuleType(name); m.__dict__.update(attrs); m.__spec__ = importlib.machinery.ModuleSpec(name, None)
    sys.modules[name] = m
import numpy as np
from streaming import MDSWriter, StreamingDataset
mode, arg = sys.argv[1], json.loads(sys.argv[2])
if mode == "write":
    with np.load(arg["npz"]) as npz:
        data = {k: npz[k] for k in npz.files}  # (an NpzFile reads the whole array at every access)
    columns = {k: f"ndarray:{v.dtype.name}:{','.join(map(str, v.shape[1:]))}" for k, v in data.items()}
    with MDSWriter(out=(arg["local"], arg["remote"]), columns=columns, size_limit=arg["size_limit"]) as w:
        for i in range(len(next(iter(data.values())))):
            w.write({k: v[i] for k, v in data.items()})
else:
    start = time.perf_counter()
    ds = StreamingDataset(remote=arg["remote"], local=arg["local"], shuffle=True, shuffle_seed=1, batch_size=256)
    n = sum(1 for _ in ds)
    print(json.dumps([n, time.perf_counter() - start]))
"""


def _mds_ready() -> bool:
    # What streaming imports when a writer or a dataset starts, beyond this venv (brotli, cramjam for
    # snappy, catalogue: without them the write failed); its cloud clients are not needed for S3.
    if not (MDS_DIR / "streaming").is_dir() or not (MDS_DIR / "catalogue").is_dir():
        done = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(MDS_DIR),
                               "mosaicml-streaming==0.13.0", "xxhash", "zstd", "python-snappy", "brotli", "cramjam",
                               "catalogue"],
                              capture_output=True, text=True, timeout=600)
        if done.returncode:
            print(f"bench_buckets: cannot install mosaicml-streaming apart: {done.stderr.strip()[-300:]}")
            return False
    return True


def _mds(mode: str, env: dict, **arg) -> list:
    child_env = {**env, "PYTHONPATH": os.pathsep.join([str(MDS_DIR), env.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-c", _MDS_CHILD, mode, json.dumps(arg)], capture_output=True, text=True,
                          timeout=900, env=child_env)
    if done.returncode:
        raise RuntimeError(f"MDS {mode} failed: {done.stderr.strip()[-800:]}")
    return json.loads(done.stdout) if mode == "read" else []


def _speed(local: str, tmp: str, env: dict) -> dict:
    source = open_source(local)
    columns = source.read_ranges([(s, 0, n) for s, n in enumerate(source.counts)])
    total = len(columns["input_ids"])
    mds = _mds_ready()
    if mds:
        npz = os.path.join(tmp, "records.npz")
        np.savez(npz, **columns)
        shard_bytes = sum(s.expected.bytes for s in source.shards) // SHARDS  # MDS shards of our shards' size
        _mds("write", env, npz=npz, local=os.path.join(tmp, "mds-out"), remote=f"s3://{BUCKET}/mds",
             size_limit=int(shard_bytes))
    ours, theirs = [], []
    for p in range(PASSES):  # interleaved: a change in the machine's load touches both alike
        start = time.perf_counter()
        got = _epoch(DEFAULT_FS, 1, 0)
        ours.append(got / (time.perf_counter() - start))
        if mds:
            n, seconds = _mds("read", env, remote=f"s3://{BUCKET}/mds", local=os.path.join(tmp, f"mds-cache-{p}"))
            if n != total:
                raise AssertionError(f"MDS read {n} records, expected {total}")
            theirs.append(n / seconds)
    out = {"ours_records_per_s": round(max(ours)), "passes": PASSES}
    print(f"one reader: ours {max(ours):,.0f} records/s", end="")
    if theirs:
        out.update(mds_records_per_s=round(max(theirs)), ours_over_mds=round(max(ours) / max(theirs), 3))
        print(f", MDS StreamingDataset {max(theirs):,.0f} records/s: {max(ours) / max(theirs):.2f}x", end="")
    print()
    return out


def main() -> dict:
    with tempfile.TemporaryDirectory() as tmp, _moto_server() as endpoint:
        env = {**os.environ, "AWS_ENDPOINT_URL": endpoint, "S3_ENDPOINT_URL": endpoint, "AWS_ACCESS_KEY_ID": "x",
               "AWS_SECRET_ACCESS_KEY": "y", "AWS_DEFAULT_REGION": "us-east-1"}
        # Configured as users configure it: AWS's variables, read by the clients the library makes.
        saved = {k: os.environ.get(k) for k in env if os.environ.get(k) != env[k]}
        os.environ.update(env)
        try:
            local = write_synthetic_dataset(os.path.join(tmp, "c128"), seq_len=SEQ, max_pred=PREDS, vocab_size=VOCAB,
                                            train_shards=SHARDS, records_per_shard=PER_SHARD, eval_records=0)
            import s3fs

            s3 = s3fs.S3FileSystem(skip_instance_cache=True)
            s3.mkdir(BUCKET)
            s3.put(local.rstrip("/") + "/", f"{BUCKET}/{PREFIX}/", recursive=True)
            dataset_bytes = sum(s.expected.bytes for s in open_source(local).shards)
            out: dict = {"dataset_bytes": dataset_bytes, "shares": _shares(dataset_bytes)}
            second = write_synthetic_dataset(os.path.join(tmp, "second"), seq_len=SEQ, max_pred=PREDS,
                                             vocab_size=VOCAB, train_shards=3, records_per_shard=PER_SHARD,
                                             eval_records=0, seed=2)
            s3.put(second.rstrip("/") + "/", f"{BUCKET}/second/", recursive=True)
            out["mixture_shares"] = _mixture_shares("second")
            old = os.path.join(tmp, "old")
            shutil.copytree(local, old)
            manifest = json.loads(Path(old, "manifest.json").read_text())
            for shard in manifest["splits"]["train"]["shards"]:
                index = shard.pop("index")
                os.remove(os.path.join(old, index["path"]))
                os.remove(os.path.join(old, index["blocks"]["path"]))
            Path(old, "manifest.json").write_text(json.dumps(manifest, sort_keys=True, indent=2) + "\n")
            s3.put(old + "/", f"{BUCKET}/old/", recursive=True)
            fs = CountingFS()
            source = open_source(f"s3://{BUCKET}/old", fs=fs)
            list(NumpyBatches(source, seed=1, batch_size=BATCH, block_size=BLOCK, world_size=4, rank=0,
                              stop=sum(source.counts) // BATCH))
            out["without_index_world_4"] = {"bytes_over_share": round(fs.bytes / (dataset_bytes / 4), 3),
                                            "requests_per_rank": fs.requests}
            print(f"without indexes, world 4: rank 0 fetched {fs.bytes / (dataset_bytes / 4):.2f}x its share")
            out["one_reader"] = _speed(local, tmp, env)
            return out
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v


if __name__ == "__main__":
    print(json.dumps(main(), indent=2))
