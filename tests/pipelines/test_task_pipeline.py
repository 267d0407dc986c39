"""`bert-datagen task` end to end: manifest and side files, golden checksums, runner independence, errors."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from bert_datagen.contract.fs import LOCAL_FS
from bert_datagen.contract.vocab_io import load_vocab
from bert_datagen.datagen.records import frame_columns
from bert_datagen.datagen.tasks import build
from bert_datagen.datagen.tasks.config import TaskConfig
from bert_datagen.pipelines.beam.runners import RunnerOptions
from bert_datagen.pipelines.cli import main
from bert_datagen.pipelines.pretraining.run import DatagenError
from bert_datagen.pipelines.tasks.run import generate_task_dataset
from bert_datagen.vocab.tokenizer import BertTokenizer
from tests.support.pipeline_corpus import manifest_of, write_vocab
from tests.support.taskdata_corpus import write_conll, write_pair_tsv, write_squad

# Pinned: a change that alters these bytes on purpose must update them and say why. (The record
# indexes were added with them unchanged: records of one task have one size, so indexes of shards
# with as many records are the same bytes.)
GOLDEN = {
    "dev/examples.jsonl": "ea74bae541b51f4173d4e5ca972a7af46824cf4490d7b2a0fb3726b020dfbf19",
    "dev/part-00000-of-00003.tfrecord": "3891b47462f64f59b2ca86a4a32bbb8dcdc592d1b85163f923f61cc9345c9ed4",
    "dev/part-00000-of-00003.tfrecord.index": "00f7409c33f61b89c75b100e4fda8032f3ed1df107efd0b79d01109ff1a1a381",
    "dev/part-00000-of-00003.tfrecord.index.blocks": "c873225666a6b881b03b168c231e4e66e4abdf486f1f10cae29be5745c3e8b41",
    "dev/part-00000-of-00003.tfrecord.lengths": "f5afb255398b2d160c0d4c695fc84299d97464b76ffb9ff4a4e37ae725dd9a08",
    "dev/part-00001-of-00003.tfrecord": "5e7f6f3c9e54328a7d6d2d8b355b5710c87a857665c141d32f9f9180185f5fc2",
    "dev/part-00001-of-00003.tfrecord.index": "00f7409c33f61b89c75b100e4fda8032f3ed1df107efd0b79d01109ff1a1a381",
    "dev/part-00001-of-00003.tfrecord.index.blocks": "c873225666a6b881b03b168c231e4e66e4abdf486f1f10cae29be5745c3e8b41",
    "dev/part-00001-of-00003.tfrecord.lengths": "06daad5a76660917d355e93175cfe4d0ac1a7f55399599c69c5c52f084c78a9a",
    "dev/part-00002-of-00003.tfrecord": "db8f883244db46c0666f21c06c006d8f8fd6d63c491fb8dcabe839176dc87c13",
    "dev/part-00002-of-00003.tfrecord.index": "d7010986c6938b15e6e879dc1b798b8d6d476b09a2e86faa51889fc40a664bad",
    "dev/part-00002-of-00003.tfrecord.index.blocks": "069b934003fb2ec19afb0a682ad3dc547cb22cd5bfd84fb2e4ae56ecd10a5cab",
    "dev/part-00002-of-00003.tfrecord.lengths": "d167432f4b6fac035de32cfa01d9a3750054e811e11b43d9abc5c269e34ed7ed",
    "dev/windows.jsonl": "dd0fed35908e3c9f671db732aa7cf198f77c3924db3d28f9a8e5943614029d3f",
    "train/examples.jsonl": "dfe42be87d94b3fc40e7dc4e3861bb9f68e56786386e90f8a77677eead8152e9",
    "train/part-00000-of-00008.tfrecord": "74c455977ec0617307904e3a612bfc340ffbbc0be78e185b8e04799e7a4e0c73",
    "train/part-00000-of-00008.tfrecord.index": "c99145eeffa043b8a548a1d91929cc2989dd211406d80592eb5e31e3038c0841",
    "train/part-00000-of-00008.tfrecord.index.blocks": "a4163f84a513e5a31ddec83e66ee331caf3eb56f8615fbc03c85d8cca6119c77",
    "train/part-00000-of-00008.tfrecord.lengths": "c2b20f9d6962b12fb4b0d98d33003b0a65ba678edfe96ec1afd6f9d7f1857f4e",
    "train/part-00001-of-00008.tfrecord": "c1480db251944cb0d32015ebf55a66fd1ed3aa13cf6a5227ef45ec6eed0cbb42",
    "train/part-00001-of-00008.tfrecord.index": "c99145eeffa043b8a548a1d91929cc2989dd211406d80592eb5e31e3038c0841",
    "train/part-00001-of-00008.tfrecord.index.blocks": "a4163f84a513e5a31ddec83e66ee331caf3eb56f8615fbc03c85d8cca6119c77",
    "train/part-00001-of-00008.tfrecord.lengths": "ed74bfd30abb4d9b933174a8389a74743999918baf9e3618791fb89f5be722d5",
    "train/part-00002-of-00008.tfrecord": "8237e1cce28e5d543afbe48e21a9a17b6e3fef9bccc49e8c10e65fb9a0c9eb70",
    "train/part-00002-of-00008.tfrecord.index": "c99145eeffa043b8a548a1d91929cc2989dd211406d80592eb5e31e3038c0841",
    "train/part-00002-of-00008.tfrecord.index.blocks": "a4163f84a513e5a31ddec83e66ee331caf3eb56f8615fbc03c85d8cca6119c77",
    "train/part-00002-of-00008.tfrecord.lengths": "987a74f66a6a06cba1e5d215e245bd5c5f3ea2535ec6ac1b3c23ab33c3fce4d6",
    "train/part-00003-of-00008.tfrecord": "8044b04c7a83c79fee69e693fef7cde3884329c81671c70e62d5955aa6054fc6",
    "train/part-00003-of-00008.tfrecord.index": "c99145eeffa043b8a548a1d91929cc2989dd211406d80592eb5e31e3038c0841",
    "train/part-00003-of-00008.tfrecord.index.blocks": "a4163f84a513e5a31ddec83e66ee331caf3eb56f8615fbc03c85d8cca6119c77",
    "train/part-00003-of-00008.tfrecord.lengths": "0a6a981e08ef767b4d82f461a48bb4adae34a6c9437ddbf9924dd8f771aa3f67",
    "train/part-00004-of-00008.tfrecord": "ed7b124a6e0d67b779b23ccc19957d31e3366acd22e08e0d456cb8a9aad7508c",
    "train/part-00004-of-00008.tfrecord.index": "c99145eeffa043b8a548a1d91929cc2989dd211406d80592eb5e31e3038c0841",
    "train/part-00004-of-00008.tfrecord.index.blocks": "a4163f84a513e5a31ddec83e66ee331caf3eb56f8615fbc03c85d8cca6119c77",
    "train/part-00004-of-00008.tfrecord.lengths": "a0d65e2e32a95c5d2f180b108a23cb360ef9cd0f9f17a4d2ea534ee6d9f9defa",
    "train/part-00005-of-00008.tfrecord": "158628056518f3308c36055e5c9bad28ff656cdb77032c970bab70354b72c684",
    "train/part-00005-of-00008.tfrecord.index": "c99145eeffa043b8a548a1d91929cc2989dd211406d80592eb5e31e3038c0841",
    "train/part-00005-of-00008.tfrecord.index.blocks": "a4163f84a513e5a31ddec83e66ee331caf3eb56f8615fbc03c85d8cca6119c77",
    "train/part-00005-of-00008.tfrecord.lengths": "3bad0f45d26fbe26456fa75fc58e558e34a7ab303b90cd9e4186ff30ab6f672c",
    "train/part-00006-of-00008.tfrecord": "f485b54e8c32606434b04a7f723675496431be5f90e30e26d3344e06bab2ec15",
    "train/part-00006-of-00008.tfrecord.index": "c99145eeffa043b8a548a1d91929cc2989dd211406d80592eb5e31e3038c0841",
    "train/part-00006-of-00008.tfrecord.index.blocks": "a4163f84a513e5a31ddec83e66ee331caf3eb56f8615fbc03c85d8cca6119c77",
    "train/part-00006-of-00008.tfrecord.lengths": "6986911ba985ac85b5736a9f34d735e7c92c4a0033b0284e4a3282c01d72de22",
    "train/part-00007-of-00008.tfrecord": "2023762bd2712d43190be1861525cae2cfc71233e560c65ad35c3cb7545da975",
    "train/part-00007-of-00008.tfrecord.index": "e26617990cd22f5d9cf7cba34d36e40b5ac42604521727f4a44177d1df9b90bf",
    "train/part-00007-of-00008.tfrecord.index.blocks": "f796c072719306fd9733cde57948190f3421efd5b4801eac89cd7e2c552fc5b2",
    "train/part-00007-of-00008.tfrecord.lengths": "260522aaa82d806e85c5d94538f0056554faf0dca9f045b91392c457550b3142",
    "train/windows.jsonl": "26ae81a4d9fa2dff6c2f6addb6d0d1cbf0533134d37e82119d8d8a61fefe754b",
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
        listed.update({s["index"]["path"]: s["index"]["sha256"] for s in m["splits"][split]["shards"]})
        listed.update({s["index"]["blocks"]["path"]: s["index"]["blocks"]["sha256"] for s in m["splits"][split]["shards"]})
        listed.update({s["lengths"]["path"]: s["lengths"]["sha256"] for s in m["splits"][split]["shards"]})
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
    b = squad(files, tmp_path / "mp2", part_examples=9, runner=RunnerOptions(beam_args=(
        "--direct_num_workers=2", "--direct_running_mode=multi_processing")))
    assert digests(a) == digests(b)
    assert (a / "manifest.json").read_bytes() == (b / "manifest.json").read_bytes()
    assert digests(a) == digests(squad(files, tmp_path / "whole"))  # one part per split: the same bytes


@pytest.mark.integration
def test_byte_identical_on_a_local_dask_cluster(files, tmp_path):
    pytest.importorskip("distributed")
    a = squad(files, tmp_path / "mem", part_examples=9)
    b = squad(files, tmp_path / "dask", part_examples=9, runner=RunnerOptions("DaskRunner"))
    assert digests(a) == digests(b)
    assert manifest_of(b)["created_by"]["runner"] == "DaskRunner"


def test_pair_task_train_is_shuffled_dev_and_test_in_input_order(files, tmp_path):
    out = tmp_path / "pairs"
    config = TaskConfig(kind="tsv", text_a="sentence1", text_b="sentence2", label="label", max_seq_length=32)
    generate_task_dataset(config, splits=[f"train={files['train.tsv']}", f"dev_matched={files['dev.tsv']}",
                                          f"test_matched={files['test.tsv']}"],
                          vocab_path=str(files["vocab"]), output_dir=str(out), part_examples=16)
    m = manifest_of(out)
    assert m["task"]["labels"] == ["contradiction", "entailment", "neutral"]
    assert [m["splits"][s]["labelled"] for s in ("train", "dev_matched", "test_matched")] == [True, True, False]
    assert m["splits"]["train"]["counts"]["examples"] == 60 and m["splits"]["train"]["side"] == []
    # The shards are exactly the split's records: train in its seeded order, the others as read.
    tok = BertTokenizer(load_vocab(str(files["vocab"]), LOCAL_FS), True)
    for split, name, order in (("train", "train.tsv", build.train_order(60, config.random_seed)),
                               ("dev_matched", "dev.tsv", None), ("test_matched", "test.tsv", None)):
        path = files[name]
        si = build.read_split(config, split, [(str(path), path.read_bytes())])
        records = build.split_records(config, si, m["task"]["labels"], tok, order)
        shards = sorted((out / split).glob("part-*.tfrecord"))
        assert b"".join(p.read_bytes() for p in shards) == frame_columns(records.columns)[0]


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
    r = CliRunner().invoke(main, ["task", "--task", "squad", "--split", f"train={files['train.json']}",
                                  "--vocab", str(files["vocab"]), "--output", str(out), "--doc-strid", "8"])
    assert r.exit_code == 2 and "did you mean --doc-stride?" in r.output, r.output
    assert "neither bert-datagen task nor Beam's PipelineOptions" in r.output
    for splits, code, message in (([f"train={tmp_path}/nothing*.json"], 1, "no input file matches"),
                                  (["train"], 2, "expected NAME=PATTERN"),
                                  ([f"train={files['train.json']}", f"train={files['dev.json']}"], 2, "given twice"),
                                  ([f"../x={files['train.json']}"], 2, "must be letters, digits")):
        args = ["task", "--task", "squad", "--vocab", str(files["vocab"]), "--output", str(out)]
        r = CliRunner().invoke(main, args + [a for sp in splits for a in ("--split", sp)])
        assert r.exit_code == code and message in r.output, r.output
    assert not out.exists() or not [p for p in out.rglob("*") if p.is_file()]


def test_existing_dataset_is_kept_without_overwrite(files, tmp_path):
    out = squad(files, tmp_path / "keep")
    before = digests(out)
    with pytest.raises(DatagenError, match="already holds a dataset"):
        squad(files, out)
    assert digests(out) == before
    squad(files, out, overwrite=True)
    assert digests(out) == before
    # A replacement that fails leaves the old dataset as it was (it is swapped out only when complete).
    bad = files["root"] / "bad.json"
    bad.write_text('{"data": [{"paragraphs": [{"context": "A b.", "qas": [{"id": "z", "question": "q?", '
                   '"answers": [{"text": "", "answer_start": 0}]}]}]}]}')
    with pytest.raises(DatagenError, match="empty answer text"):
        generate_task_dataset(TaskConfig(kind="squad"), splits=[f"train={bad}"], vocab_path=str(files["vocab"]),
                              output_dir=str(out), overwrite=True)
    assert digests(out) == before and (out / "manifest.json").is_file()
    assert sorted(p.name for p in out.iterdir()) == ["README.md", "dev", "manifest.json", "train", "vocab.txt"]


def test_conll_cli(files, tmp_path):
    out = tmp_path / "ner"
    r = CliRunner().invoke(main, ["task", "--task", "conll", "--split", f"train={files['train.conll']}",
                                  "--vocab", str(files["vocab"]), "--output", str(out), "--max-seq-length", "16"])
    assert r.exit_code == 0, r.output
    m = manifest_of(out)
    assert m["task"]["labels"] == ["B-LOC", "B-PER", "I-LOC", "I-PER", "O"]
    assert m["splits"]["train"]["features"]["label_ids"] == ["int64", 16]
