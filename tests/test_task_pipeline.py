"""`bert-datagen task` end to end: manifest and side files, golden checksums, runner independence, errors."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from pipeline_corpus import manifest_of, write_vocab
from task_corpus import write_conll, write_pair_tsv, write_squad

from datagen.tasks import build
from datagen.tasks.config import TaskConfig
from datagen.tasks.encode import encode_framed
from pipelines.cli import main
from pipelines.run import DatagenError
from pipelines.task_run import generate_task_dataset
from vocab.tokenizer import BertTokenizer
from vocab.vocab_file import load_vocab

# Pinned: a change that alters these bytes on purpose must update them and say why.
GOLDEN = {
    "dev/examples.jsonl": "",
    "dev/part-00000-of-00001.tfrecord": "",
    "dev/windows.jsonl": "",
    "train/examples.jsonl": "",
    "train/part-00000-of-00002.tfrecord": "",
    "train/part-00001-of-00002.tfrecord": "",
    "train/windows.jsonl": "",
}


def digests(out: Path) -> dict[str, str]:
    return {p.relative_to(out).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(out.glob("*/*")) if p.is_file()}


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("taskdata")
    return {"vocab": write_vocab(root / "vocab.txt"),
            "train.tsv": write_pair_tsv(root / "train.tsv", 60, 3), "dev.tsv": write_pair_tsv(root / "dev.tsv", 20, 4),
            "test.tsv": write_pair_tsv(root / "test.tsv", 10, 5, labelled=False),
            "train.json": write_squad(root / "train.json", 30, 6), "dev.json": write_squad(root / "dev.json", 12, 7),
            "train.conll": write_conll(root / "train.conll", 40, 8), "root": root}


def squad(files, out: Path, **kwargs) -> Path:
    config = TaskConfig(kind="squad", max_seq_length=48, doc_stride=16, max_query_length=12, num_shards=None,
                        target_shard_mb=0.01)
    generate_task_dataset(config, splits=[f"train={files['train.json']}", f"dev={files['dev.json']}"],
                          vocab_path=str(files["vocab"]), output_dir=str(out), **kwargs)
    return out


def test_squad_dataset_manifest_and_side_files(files, tmp_path):
    out = squad(files, tmp_path / "squad")
    m = manifest_of(out)
    assert m["kind"] == "task" and m["task"]["type"] == "span" and m["task"]["doc_stride"] == 16
    train, dev = m["splits"]["train"], m["splits"]["dev"]
    assert (train["mode"], dev["mode"]) == ("train", "predict")
    assert set(train["features"]) - set(dev["features"]) == {"start_positions", "end_positions", "is_impossible"}
    assert set(m["features"]) == set(dev["features"])
    assert dev["counts"]["features"] == dev["records"] and dev["counts"]["multi_window_examples"] > 0
    for split in ("train", "dev"):
        listed = {s["path"]: s["sha256"] for s in m["splits"][split]["side"] + m["splits"][split]["shards"]}
        on_disk = {k: v for k, v in digests(out).items() if k.startswith(split + "/")}
        assert listed == on_disk
        windows = [json.loads(line) for line in (out / split / "windows.jsonl").read_text().splitlines()]
        assert [w["unique_id"] for w in windows] == list(range(1000000000, 1000000000 + len(windows)))
        examples = (out / split / "examples.jsonl").read_text().splitlines()
        assert len(examples) == m["splits"][split]["counts"]["examples"]
    assert (out / "README.md").read_text().count("examples.jsonl") == 2
    assert (out / "vocab.txt").read_bytes() == files["vocab"].read_bytes()


def test_golden_checksums(files, tmp_path):
    out = squad(files, tmp_path / "golden", part_examples=7)
    assert digests(out) == GOLDEN


@pytest.mark.integration
def test_byte_identical_in_memory_and_two_worker_processes(files, tmp_path):
    a = squad(files, tmp_path / "mem", part_examples=9)
    b = squad(files, tmp_path / "mp2", part_examples=9, beam_args=["--direct_num_workers=2",
                                                                     "--direct_running_mode=multi_processing"])
    assert digests(a) == digests(b)
    assert (a / "manifest.json").read_bytes() == (b / "manifest.json").read_bytes()
    assert digests(a) == digests(squad(files, tmp_path / "whole"))  # one part per split: the same bytes


def test_pair_task_train_is_shuffled_dev_and_test_in_input_order(files, tmp_path):
    out = tmp_path / "pairs"
    config = TaskConfig(kind="glue/mnli", max_seq_length=32)
    generate_task_dataset(config, splits=[f"train={files['train.tsv']}", f"dev_matched={files['dev.tsv']}",
                                          f"test_matched={files['test.tsv']}"],
                          vocab_path=str(files["vocab"]), output_dir=str(out), part_examples=16)
    m = manifest_of(out)
    assert m["task"]["labels"] == ["contradiction", "entailment", "neutral"]
    assert [m["splits"][s]["labelled"] for s in ("train", "dev_matched", "test_matched")] == [True, True, False]
    assert m["splits"]["train"]["counts"]["examples"] == 60 and m["splits"]["train"]["side"] == []
    # The shards are exactly the split's records: train in its seeded order, the others as read.
    tok = BertTokenizer(load_vocab(str(files["vocab"])), True)
    for split, name, order in (("train", "train.tsv", build.train_order(60, config.random_seed)),
                               ("dev_matched", "dev.tsv", None), ("test_matched", "test.tsv", None)):
        path = files[name]
        si = build.read_split(config, split, [(str(path), path.read_bytes())])
        records = build.split_records(config, si, m["task"]["labels"], tok, order)
        shards = sorted((out / split).glob("part-*.tfrecord"))
        assert b"".join(p.read_bytes() for p in shards) == encode_framed(records.columns)[0]


def test_cli_errors_name_file_and_line_and_leave_nothing(files, tmp_path):
    bad = tmp_path / "bad.tsv"
    bad.write_text("index\tsentence1\tsentence2\tlabel\n0\ta\tb\tentailment\n1\tonly two\n")
    out = tmp_path / "out"
    r = CliRunner().invoke(main, ["task", "--task", "glue/rte", "--split", f"train={bad}", "--vocab",
                                  str(files["vocab"]), "--output", str(out), "--quiet"])
    assert r.exit_code == 1, r.output
    assert f"{bad}: line 3: 2 column(s), the layout needs at least 4" in r.output
    assert "Traceback" not in r.output
    assert not out.exists() or not [p for p in out.rglob("*") if p.is_file()]
    r = CliRunner().invoke(main, ["task", "--task", "squad", "--split", f"train={files['train.json']}",
                                  "--vocab", str(files["vocab"]), "--output", str(out), "--doc-stride", "0"])
    assert r.exit_code == 2 and "--doc-stride 0" in r.output
    r = CliRunner().invoke(main, ["task", "--task", "squad", "--split", "train", "--vocab", str(files["vocab"]),
                                  "--output", str(out)])
    assert r.exit_code == 1 and "expected NAME=PATTERN" in r.output


def test_existing_dataset_is_kept_without_overwrite(files, tmp_path):
    out = squad(files, tmp_path / "keep")
    before = digests(out)
    with pytest.raises(DatagenError, match="already holds a dataset"):
        squad(files, out)
    assert digests(out) == before
    squad(files, out, overwrite=True)
    assert digests(out) == before


def test_conll_cli(files, tmp_path):
    out = tmp_path / "ner"
    r = CliRunner().invoke(main, ["task", "--task", "conll", "--split", f"train={files['train.conll']}",
                                  "--vocab", str(files["vocab"]), "--output", str(out), "--max-seq-length", "16"])
    assert r.exit_code == 0, r.output
    m = manifest_of(out)
    assert m["task"]["labels"] == ["B-LOC", "B-PER", "I-LOC", "I-PER", "O"]
    assert m["splits"]["train"]["features"]["label_ids"] == ["int64", 16]
