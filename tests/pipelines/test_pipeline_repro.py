"""Identical shard bytes whoever runs the pipeline: runners, worker counts, hash seeds, file layout.

Also: a run killed midway leaves no manifest and no final-named partial shard.
"""

from __future__ import annotations

import dataclasses
import io
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bert_datagen.datagen.config import DatagenConfig
from bert_datagen.datagen.tfrecord import iter_tfrecords
from bert_datagen.pipelines.beam.runners import RunnerOptions
from bert_datagen.pipelines.pretraining.run import generate_dataset, read_tasks
from tests.support.pipeline_corpus import (
    make_documents,
    manifest_of,
    shard_digests,
    write_sentence_files,
    write_text_files,
    write_vocab,
)

pytestmark = pytest.mark.integration

CONFIG = DatagenConfig(max_seq_length=48, max_predictions_per_seq=7, dupe_factor=3, num_shards=3,
                       eval_fraction=0.15, notnext_pool_size=25)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("repro")
    docs = make_documents(90, seed=21)
    write_text_files(root / "a", docs, n_files=4)
    # The same documents, in another order and another number of files.
    write_text_files(root / "b", docs[45:] + docs[:45], n_files=7, stem="zz")
    return {"root": root, "vocab": str(write_vocab(root / "vocab.txt"))}


def generate(corpus: dict, name: str, inputs: str = "a/*.txt", runner: str = "DirectRunner",
             beam_args: list[str] | None = None) -> Path:
    out = corpus["root"] / name
    generate_dataset(CONFIG, inputs=[str(corpus["root"] / inputs)], vocab_path=corpus["vocab"],
                     output_dir=str(out), runner=RunnerOptions(runner, beam_args or ()))
    return out


@pytest.fixture(scope="module")
def reference(corpus) -> dict[str, str]:
    out = generate(corpus, "in-memory")
    digests = shard_digests(out)
    assert len(digests) == 3 + 1 and manifest_of(out)["totals"]["instances"] > 100
    return digests


def test_multi_processing_one_worker(corpus, reference) -> None:
    out = generate(corpus, "mp1", beam_args=["--direct_num_workers=1", "--direct_running_mode=multi_processing"])
    assert shard_digests(out) == reference


def test_multi_processing_two_workers(corpus, reference) -> None:
    out = generate(corpus, "mp2", beam_args=["--direct_num_workers=2"])
    assert shard_digests(out) == reference


def test_dask_local_cluster_two_worker_processes(corpus, reference) -> None:
    pytest.importorskip("distributed")
    out = generate(corpus, "dask", runner="DaskRunner")
    assert shard_digests(out) == reference
    assert manifest_of(out)["created_by"]["runner"] == "DaskRunner"


def test_other_file_split_and_order(corpus, reference) -> None:
    out = generate(corpus, "resplit", inputs="b/zz-*.txt")
    assert shard_digests(out) == reference


def test_one_big_file_read_by_byte_ranges(corpus) -> None:
    """A file bigger than --read-chunk-mb is read as byte ranges by several tasks: same bytes."""
    (path,) = write_sentence_files(corpus["root"] / "one", make_documents(90, seed=21), n_files=1)
    config = dataclasses.replace(CONFIG, input_format="sentences")
    outs = {}
    for name, chunk_mb, args in (("whole", 64.0, []), ("ranges", 2048 / 2**20, ["--direct_num_workers=2"])):
        outs[name] = corpus["root"] / f"one-{name}"
        generate_dataset(config, inputs=[str(path)], vocab_path=corpus["vocab"], output_dir=str(outs[name]),
                         runner=RunnerOptions(beam_args=args), read_chunk_mb=chunk_mb)
    assert len(read_tasks([(str(path), path.stat().st_size)], "sentences", 2048 / 2**20)) > 10
    assert shard_digests(outs["ranges"]) == shard_digests(outs["whole"])
    whole, ranges = manifest_of(outs["whole"]), manifest_of(outs["ranges"])
    assert ranges["totals"] == whole["totals"] and whole["totals"]["documents"] == 90
    assert ranges["input"] == whole["input"]


def _cli(corpus: dict, out: Path, env_extra: dict[str, str], *extra: str) -> subprocess.Popen:
    env = {**os.environ, **env_extra}
    cmd = [sys.executable, "-m", "bert_datagen.pipelines.cli", "run", "--input", str(corpus["root"] / "a" / "*.txt"),
           "--vocab", corpus["vocab"], "--output", str(out), "--max-seq-length", "48",
           "--max-predictions-per-seq", "7", "--dupe-factor", "3", "--num-shards", "3",
           "--eval-fraction", "0.15", "--notnext-pool-size", "25", *extra]
    return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_python_hash_seed_does_not_matter(corpus, reference) -> None:
    procs = {seed: _cli(corpus, corpus["root"] / f"hs{seed}", {"PYTHONHASHSEED": seed}, "--quiet")
             for seed in ("1", "987")}
    for seed, proc in procs.items():
        _, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err
        assert shard_digests(corpus["root"] / f"hs{seed}") == reference


def test_killed_run_leaves_nothing_that_looks_complete(tmp_path) -> None:
    docs = make_documents(1500, seed=5, max_sentences=20)
    write_text_files(tmp_path / "in", docs, n_files=6)
    corpus = {"root": tmp_path, "vocab": str(write_vocab(tmp_path / "vocab.txt"))}
    (tmp_path / "a").mkdir()
    for p in (tmp_path / "in").iterdir():
        p.rename(tmp_path / "a" / p.name)
    out = tmp_path / "out"
    proc = _cli(corpus, out, {}, "--dupe-factor", "8", "--num-shards", "4")
    # Kill as soon as the pipeline has started producing instances (or shards).
    deadline = time.monotonic() + 120
    lines = []
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        lines.append(line)
        if "instances" in line or "records written" in line or proc.poll() is not None:
            break
    assert proc.poll() is None, "".join(lines) + "the run finished before it could be killed"
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    assert not (out / "manifest.json").exists()
    for shard in out.glob("*/part-*.tfrecord"):
        records = list(iter_tfrecords(io.BytesIO(shard.read_bytes()), str(shard)))
        assert records is not None  # a final-named shard is always whole: framing and CRCs check out
    # A rerun replaces whatever the killed run left, temp files included.
    rerun = _cli(corpus, out, {}, "--dupe-factor", "1", "--num-shards", "2", "--quiet", "--overwrite")
    _, err = rerun.communicate(timeout=300)
    assert rerun.returncode == 0, err
    assert (out / "manifest.json").exists()
    listed = [p for split in manifest_of(out)["splits"].values() for s in split["shards"]
              for p in (s["path"], s["index"]["path"], s["index"]["blocks"]["path"])]
    on_disk = sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file())
    assert on_disk == sorted(["README.md", "manifest.json", "vocab.txt", *listed])
