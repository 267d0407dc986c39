"""verify / inspect / stats / diff on task datasets: the task record rules catch each broken invariant."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from pipeline_corpus import write_vocab
from taskdata_corpus import write_conll, write_pair_tsv, write_squad

from contract.fs import LOCAL_FS
from contract.manifest import manifest_bytes
from datagen.tasks.config import TaskConfig
from datagen.tasks.encode import encode_framed
from pipelines.cli import main
from pipelines.task_run import generate_task_dataset
from pipelines.task_tools import read_split


@pytest.fixture(scope="module")
def datasets(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("tasktools")
    vocab = str(write_vocab(root / "vocab.txt"))
    made = {}
    for name, config, splits in (
        ("squad", TaskConfig(kind="squad", max_seq_length=48, doc_stride=16, max_query_length=12),
         [f"train={write_squad(root / 'tr.json', 12, 6)}", f"dev={write_squad(root / 'dv.json', 6, 7)}"]),
        ("ner", TaskConfig(kind="conll", max_seq_length=12),
         [f"train={write_conll(root / 'tr.conll', 20, 8)}", f"dev={write_conll(root / 'dv.conll', 8, 9)}"]),
        ("pairs", TaskConfig(kind="tsv", text_a="sentence1", text_b="sentence2", label="label", max_seq_length=24),
         [f"train={write_pair_tsv(root / 'tr.tsv', 30, 3)}", f"dev={write_pair_tsv(root / 'dv.tsv', 10, 4)}"]),
    ):
        generate_task_dataset(config, splits=splits, vocab_path=vocab, output_dir=str(root / name))
        made[name] = root / name
    return made


def _copy(src: Path, dst: Path) -> Path:
    import shutil

    shutil.copytree(src, dst)
    return dst


def _rewrite(out: Path, split: str, edit) -> None:
    """Change the split's records and re-sign them in the manifest: only the record rules can object."""
    from contract.dataset import open_dataset

    ds = open_dataset(str(out), LOCAL_FS)
    columns, problems = read_split(ds, split)
    assert not problems
    edit(columns)
    blob, _ = encode_framed(columns)
    manifest = json.loads((out / "manifest.json").read_text())
    [shard] = manifest["splits"][split]["shards"] if len(manifest["splits"][split]["shards"]) == 1 else [None]
    assert shard is not None
    (out / shard["path"]).write_bytes(blob)
    shard.update(bytes=len(blob), sha256=hashlib.sha256(blob).hexdigest())
    manifest["splits"][split]["bytes"] = len(blob)
    (out / "manifest.json").write_bytes(manifest_bytes(manifest))


def _resign_side(out: Path, rel: str, text: str) -> None:
    (out / rel).write_text(text, encoding="utf-8")
    manifest = json.loads((out / "manifest.json").read_text())
    for info in manifest["splits"].values():
        for s in info.get("side", []):
            if s["path"] == rel:
                data = (out / rel).read_bytes()
                s.update(bytes=len(data), sha256=hashlib.sha256(data).hexdigest())
    (out / "manifest.json").write_bytes(manifest_bytes(manifest))


def verify(path: Path) -> tuple[int, str]:
    r = CliRunner().invoke(main, ["verify", str(path)])
    return r.exit_code, r.output


def test_fresh_task_datasets_verify(datasets):
    for path in datasets.values():
        code, out = verify(path)
        assert code == 0, out
        assert out.startswith("OK:")


def _set(name: str, row: int, col: int, value: int):
    def edit(c):
        c[name][row, col] = value
    return edit


@pytest.mark.parametrize("dataset, split, edit, message", [
    ("pairs", "train", _set("label_ids", 3, 0, 7), r"train/part-00000-of-00001\.tfrecord: record 3: label id outside"),
    ("pairs", "dev", _set("input_mask", 2, 0, 0), r"dev/.*record 2: input_mask is not 1s then 0s"),
    ("pairs", "dev", _set("segment_ids", 1, 1, 1), r"record 1: segment_ids are not 0s then 1s"),
    ("squad", "train", _set("start_positions", 4, 0, 1), r"record 4: answer span is neither 0/0 nor inside"),
    ("squad", "train", _set("unique_ids", 0, 0, 5), r"record 0: unique_ids are not 1000000000"),
    ("squad", "dev", _set("input_ids", 2, 0, 3), r"record 2: does not start with \[CLS\]"),
    ("ner", "train", _set("label_ids", 0, 0, 1), r"record 0: a label on \[CLS\], \[SEP\] or padding"),
])
def test_verify_names_the_broken_record(datasets, tmp_path, dataset, split, edit, message):
    out = _copy(datasets[dataset], tmp_path / "d")
    _rewrite(out, split, edit)
    code, text = verify(out)
    assert code == 1
    assert pytest.importorskip("re").search(message, text), text


def test_tags_must_match_the_owned_words(datasets, tmp_path):
    out = _copy(datasets["ner"], tmp_path / "d")

    def move_tag(c):
        row = c["label_ids"][5]
        first = int(np.flatnonzero(row >= 0)[0])
        row[first + 1], row[first] = row[first], -1  # the tag on a position no owned word starts at

    _rewrite(out, "dev", move_tag)
    code, text = verify(out)
    assert code == 1 and "record 5: label_ids are not -1 exactly where no owned word starts" in text


def test_side_files_are_checked(datasets, tmp_path):
    out = _copy(datasets["squad"], tmp_path / "d")
    rel = "dev/windows.jsonl"
    lines = (out / rel).read_text().splitlines()
    w = json.loads(lines[1])
    w["unique_id"] += 1
    lines[1] = json.dumps(w, separators=(",", ":"))
    (out / rel).write_text("\n".join(lines) + "\n")
    code, text = verify(out)
    assert code == 1 and "dev/windows.jsonl: size or sha256 differs from the manifest" in text
    _resign_side(out, rel, "\n".join(lines) + "\n")
    code, text = verify(out)
    assert code == 1 and "record 1: windows.jsonl unique_id" in text
    (out / "dev" / "extra.txt").write_text("x")
    assert "dev/extra.txt: stray file not listed in the manifest" in verify(out)[1]


def test_inspect_stats_and_diff(datasets, tmp_path):
    r = CliRunner().invoke(main, ["inspect", str(datasets["squad"]), "-n", "2"])
    assert r.exit_code == 0 and "question:" in r.output and "answer:" in r.output
    r = CliRunner().invoke(main, ["inspect", str(datasets["ner"]), "--split", "dev", "--json", "-n", "1"])
    view = json.loads(r.output.splitlines()[0])
    assert view["tags"] and all(t[1] in ("B-LOC", "B-PER", "I-LOC", "I-PER", "O") for t in view["tags"])
    r = CliRunner().invoke(main, ["inspect", str(datasets["pairs"]), "--split", "dev", "-n", "1"])
    assert "label" in r.output and "  B: " in r.output
    r = CliRunner().invoke(main, ["stats", str(datasets["pairs"]), "--json"])
    st = json.loads(r.output)
    assert sum(st["splits"]["train"]["labels"].values()) == 30
    assert st["splits"]["dev"]["length"]["max"] <= 24
    r = CliRunner().invoke(main, ["stats", str(datasets["squad"])])
    assert "windows per example" in r.output
    other = _copy(datasets["pairs"], tmp_path / "other")
    _rewrite(other, "dev", _set("label_ids", 4, 0, 0 if _label(datasets["pairs"], 4) else 1))
    r = CliRunner().invoke(main, ["diff", str(datasets["pairs"]), str(other)])
    assert r.exit_code == 1 and "first differing record: split dev, record 4" in r.output and "label" in r.output
    assert CliRunner().invoke(main, ["diff", str(datasets["pairs"]), str(datasets["pairs"])]).exit_code == 0


def _label(path: Path, row: int) -> int:
    from contract.dataset import open_dataset

    columns, _ = read_split(open_dataset(str(path), LOCAL_FS), "dev")
    return int(columns["label_ids"][row, 0])
