"""The tools on a non-local Beam filesystem (an object store without directories, like gs://).

A fake object store, backed by a temp directory, is registered with Beam under the scheme
``fakegcs://``: every path the tools touch then goes through Beam's FileSystems, never os.path.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

sys.path.insert(0, str(Path(__file__).resolve().parent.parent.parent))  # benchmarks/ holds the fixture writer

from benchmarks.bench_verify import make_dataset  # noqa: E402
from bert_datagen.pipelines.tools.cli import diff_command, inspect_command, stats_command, verify_command  # noqa: E402
from tests.support.remote_store import PREFIX, ROOT  # noqa: E402


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> dict[str, str]:
    ROOT["dir"] = str(tmp_path_factory.mktemp("objects"))
    out = {}
    for name, seed in (("a", 1), ("a2", 1), ("b", 2)):
        out[name] = f"{PREFIX}bucket/{name}"
        make_dataset(out[name], seed=seed, records=60, shards=2, eval_records=10, max_seq_length=32,
                     max_predictions=5)
    return out


def test_dataset_written_and_verified_through_the_object_store(store) -> None:
    assert sorted(os.listdir(os.path.join(ROOT["dir"], "bucket", "a"))) == [
        "README.md", "eval", "manifest.json", "train", "vocab.txt"]
    # One worker: the fake store is registered in this process only (remote pools use 'spawn').
    result = CliRunner().invoke(verify_command, [store["a"], "--workers", "1"])
    assert result.exit_code == 0, result.output
    assert "70 records" in result.output


def test_remote_shards_are_read_by_spawned_workers(store) -> None:
    from bert_datagen.contract.dataset import open_dataset
    from bert_datagen.pipelines.beam.fsio import BEAM_FS
    from bert_datagen.pipelines.tools.shards import pool_start_method
    from bert_datagen.pipelines.tools.verify import ShardTask

    ds = open_dataset(store["a"], BEAM_FS)
    assert pool_start_method([ShardTask(r, ds.shape) for r in ds.shards]) == "spawn"


def test_damage_in_the_object_store_is_found(store, tmp_path: Path) -> None:
    import shutil

    shutil.copytree(os.path.join(ROOT["dir"], "bucket", "a"), os.path.join(ROOT["dir"], "bucket", "c"))
    c = f"{PREFIX}bucket/c"
    local = Path(ROOT["dir"]) / "bucket" / "c"
    (local / "train" / "extra.tfrecord").write_bytes(b"")
    os.remove(local / "eval" / "part-00000-of-00001.tfrecord")
    result = CliRunner().invoke(verify_command, [c, "--json", "--workers", "1"])
    assert result.exit_code == 1
    problems = "\n".join(json.loads(result.output)["problems"])
    assert "train/extra.tfrecord: stray file not listed in the manifest" in problems
    assert "eval/part-00000-of-00001.tfrecord: shard is missing" in problems


def test_inspect_stats_diff_through_the_object_store(store) -> None:
    result = CliRunner().invoke(inspect_command, [store["a"], "-n", "1", "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["shard"] == "train/part-00000-of-00002.tfrecord"
    result = CliRunner().invoke(stats_command, [store["a"], "--json", "--workers", "1"])
    assert json.loads(result.output)["records"] == 70
    assert CliRunner().invoke(diff_command, [store["a"], store["a2"]]).exit_code == 0
    assert CliRunner().invoke(diff_command, [store["a"], store["b"]]).exit_code == 1


def test_glob_without_manifest_through_the_object_store(store) -> None:
    vocab = f"{store['a']}/vocab.txt"
    result = CliRunner().invoke(verify_command, [f"{store['a']}/train/*.tfrecord", "--max-seq-length", "32",
                                                 "--max-predictions-per-seq", "5", "--vocab", vocab,
                                                 "--workers", "1"])
    assert result.exit_code == 0, result.output
    assert "60 records" in result.output
