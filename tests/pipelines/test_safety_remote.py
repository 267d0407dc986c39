"""`run --overwrite` into an object store (no directories, rename = copy + delete): the staging,
the swap, its rollback and the recovery go through Beam's FileSystems only. The fake store of
tests/pipelines/test_tools_remote.py stands in for gs://."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from click.testing import CliRunner

from bert_datagen.pipelines.beam import outputs
from bert_datagen.pipelines.cli import main
from tests.support.deleting_store import PREFIX, ROOT
from tests.support.pipeline_corpus import make_documents, tree_snapshot, write_text_files, write_vocab


@pytest.fixture
def store(tmp_path) -> dict:
    ROOT["dir"] = str(tmp_path / "objects")
    os.makedirs(ROOT["dir"])
    write_text_files(tmp_path / "in", make_documents(30, seed=3), n_files=2)
    return {"inputs": str(tmp_path / "in" / "*.txt"), "vocab": str(write_vocab(tmp_path / "vocab.txt")),
            "objects": Path(ROOT["dir"])}


def objects(store) -> dict[str, str]:
    """The store's objects (the fake keeps empty directories behind; an object store has none)."""
    return {k: v for k, v in tree_snapshot(store["objects"]).items() if not k.endswith("/")}


def run(store, out: str, *extra: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, ["run", "--input", store["inputs"], "--vocab", store["vocab"], "--output", out,
                                       "--dupe-factor", "2", "--max-seq-length", "32", "--max-predictions-per-seq", "5",
                                       "--quiet", *extra])
    return result.exit_code, result.output


def test_overwrite_and_failed_overwrite_on_an_object_store(store, tmp_path) -> None:
    out = f"{PREFIX}bucket/ds"
    assert run(store, out, "--num-shards", "3")[0] == 0
    (store["objects"] / "bucket" / "ds" / "notes.txt").write_text("mine\n")
    before = objects(store)
    (tmp_path / "in" / "zz-blob.txt").write_bytes(bytes(range(256)) * 64)
    code, output = run(store, out, "--num-shards", "2", "--overwrite")
    assert code == 1 and "zz-blob.txt" in output
    assert objects(store) == before
    (tmp_path / "in" / "zz-blob.txt").unlink()
    code, output = run(store, out, "--num-shards", "2", "--overwrite")
    assert code == 0, output
    after = objects(store)
    assert after["bucket/ds/notes.txt"] == before["bucket/ds/notes.txt"]
    assert sorted(p for p in after if p.endswith(".tfrecord")) == [
        f"bucket/ds/train/part-{i:05d}-of-00002.tfrecord" for i in range(2)]
    assert not [p for p in after if outputs.MARK in p or ".tmp-" in p]
    (store["objects"] / "bucket" / "ds" / "notes.txt").unlink()  # verify would report it as a stray file
    result = CliRunner().invoke(main, ["verify", out, "--workers", "1"])
    assert result.exit_code == 0, result.output


def test_interrupted_swap_on_an_object_store_rolls_back(store, monkeypatch) -> None:
    out = f"{PREFIX}bucket/ds"
    assert run(store, out, "--num-shards", "3")[0] == 0
    before = objects(store)
    real_move, calls = outputs._move, {"n": 0}

    def dying_move(src: str, dst: str) -> None:
        calls["n"] += 1
        if calls["n"] == 5:  # after the old manifest and three more objects have moved: Ctrl-C
            raise KeyboardInterrupt
        real_move(src, dst)

    monkeypatch.setattr(outputs, "_move", dying_move)
    code, _ = run(store, out, "--num-shards", "2", "--overwrite")
    assert code == 130 and calls["n"] > 5  # the rollback moved objects back
    monkeypatch.setattr(outputs, "_move", real_move)
    assert objects(store) == before
    assert CliRunner().invoke(main, ["verify", out, "--workers", "1"]).exit_code == 0
