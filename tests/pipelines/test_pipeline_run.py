"""`bert-datagen run` end to end on the in-memory DirectRunner: output, totals, bad input, overwrite."""

from __future__ import annotations

import hashlib
import io
import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from bert_datagen.datagen.example_exact import decode_example
from bert_datagen.datagen.tfrecord import iter_tfrecords
from bert_datagen.pipelines.cli import main
from tests.support.pipeline_corpus import (
    make_documents,
    manifest_of,
    shard_digests,
    write_text_files,
    write_vocab,
)


def run_cli(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, ["run", *args])
    if result.exception and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result.exit_code, result.output


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("corpus")
    write_text_files(root / "in", make_documents(60, seed=3), n_files=3)
    return {"root": root, "inputs": root / "in", "vocab": write_vocab(root / "vocab.txt")}


def base_args(corpus: dict[str, Path], out: Path, *extra: str) -> list[str]:
    return ["--input", str(corpus["inputs"] / "*.txt"), "--vocab", str(corpus["vocab"]), "--output", str(out),
            "--dupe-factor", "2", "--max-seq-length", "32", "--max-predictions-per-seq", "5",
            "--notnext-pool-size", "20", *extra]


@pytest.fixture(scope="module")
def dataset(corpus, tmp_path_factory) -> tuple[Path, str]:
    out = tmp_path_factory.mktemp("ds") / "out"
    code, output = run_cli(*base_args(corpus, out, "--num-shards", "3", "--eval-fraction", "0.2"))
    assert code == 0, output
    return out, output


def test_run_writes_a_complete_dataset(dataset, corpus) -> None:
    from bert_datagen.contract.fs import LOCAL_FS
    from bert_datagen.contract.manifest import load_manifest

    out, output = dataset
    manifest = load_manifest(str(out), LOCAL_FS)
    assert (out / "README.md").is_file()
    assert (out / "vocab.txt").read_bytes() == corpus["vocab"].read_bytes()
    assert manifest["vocab"]["sha256"] == hashlib.sha256(corpus["vocab"].read_bytes()).hexdigest()
    assert manifest["config"]["max_seq_length"] == 32 and manifest["seed"] == 12345
    assert manifest["input"]["files"] == 3 and len(manifest["input"]["fingerprint"]) == 64
    train = manifest["splits"]["train"]["shards"]
    assert [s["path"] for s in train] == [f"train/part-{i:05d}-of-00003.tfrecord" for i in range(3)]
    assert set(manifest["splits"]) == {"train", "eval"}
    on_disk = shard_digests(out)
    listed = [s for split in manifest["splits"].values() for s in split["shards"]]
    assert {s["path"]: s["sha256"] for s in listed} == on_disk
    n_records = 0
    for shard in listed:
        data = (out / shard["path"]).read_bytes()
        assert len(data) == shard["bytes"]
        payloads = list(iter_tfrecords(io.BytesIO(data), shard["path"]))
        assert len(payloads) == shard["records"]
        n_records += len(payloads)
        for payload in payloads[:20]:
            features = decode_example(payload)
            assert features["input_ids"].shape == (32,) and features["masked_lm_ids"].shape == (5,)
    totals = manifest["totals"]
    assert totals["instances"] == n_records > 0
    assert totals["documents"] == 60 and totals["duplicate_documents"] == 0
    assert 0.3 < totals["notnext_fraction"] < 0.8
    assert totals["tokens"] > totals["sentences"] > totals["documents"]
    assert "instances" in output and "input fingerprint" in output  # the summary table
    # where the time went: CPU seconds of each kind of task, summed over workers (not in the manifest)
    cpu_line = next(line for line in output.splitlines() if "CPU seconds in tasks" in line)
    assert all(f"{kind} " in cpu_line for kind in ("read", "build", "write"))
    assert "cpu_seconds" not in json.dumps(manifest)


def test_eval_split_holds_whole_documents_apart(dataset) -> None:
    out, _ = dataset
    manifest = manifest_of(out)
    assert manifest["splits"]["eval"]["records"] > 0
    assert manifest["splits"]["train"]["records"] > manifest["splits"]["eval"]["records"]


def test_same_documents_in_other_files_and_duplicates_give_the_same_shards(corpus, tmp_path) -> None:
    docs = make_documents(60, seed=3)
    # 25 repeats would make 4 pools of 20 instead of 3 if duplicates counted: they must not.
    write_text_files(tmp_path / "in", docs[::-1] + docs[:25], n_files=5, stem="other")
    a, b = tmp_path / "a", tmp_path / "b"
    assert run_cli(*base_args(corpus, a, "--num-shards", "2"))[0] == 0
    args = base_args(corpus, b, "--num-shards", "2")
    args[1] = str(tmp_path / "in" / "other-*.txt")
    code, output = run_cli(*args)
    assert code == 0, output
    assert shard_digests(a) == shard_digests(b)
    ma, mb = manifest_of(a), manifest_of(b)
    assert ma["input"]["fingerprint"] == mb["input"]["fingerprint"]
    assert mb["totals"]["duplicate_documents"] == 25 and ma["totals"]["duplicate_documents"] == 0
    assert ma["totals"]["documents"] == mb["totals"]["documents"] == 60


def test_seed_changes_the_data(corpus, tmp_path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    assert run_cli(*base_args(corpus, a, "--num-shards", "1"))[0] == 0
    assert run_cli(*base_args(corpus, b, "--num-shards", "1", "--random-seed", "7"))[0] == 0
    assert shard_digests(a) != shard_digests(b)


def test_target_shard_size_sets_the_shard_count(corpus, tmp_path) -> None:
    out = tmp_path / "o"
    code, output = run_cli(*base_args(corpus, out, "--target-shard-mb", "0.02"))
    assert code == 0, output
    manifest = manifest_of(out)
    shards = manifest["splits"]["train"]["shards"]
    total = manifest["splits"]["train"]["bytes"]
    exact = -(-total // int(0.02 * 2**20))
    # The count comes from an estimate made before the records exist: within a few of exact.
    assert len(shards) > 1 and abs(len(shards) - exact) <= max(2, exact // 4)


def test_existing_dataset_needs_overwrite(dataset, corpus, tmp_path) -> None:
    out = tmp_path / "o"
    assert run_cli(*base_args(corpus, out, "--num-shards", "4"))[0] == 0
    before = shard_digests(out)
    code, output = run_cli(*base_args(corpus, out, "--num-shards", "2"))
    assert code != 0 and "--overwrite" in output and str(out) in output
    assert shard_digests(out) == before
    code, output = run_cli(*base_args(corpus, out, "--num-shards", "2", "--overwrite"))
    assert code == 0, output
    assert sorted(shard_digests(out)) == [f"train/part-{i:05d}-of-00002.tfrecord" for i in range(2)]


# ---------------------------------------------------------------- bad input


def assert_no_dataset(out: Path) -> None:
    assert not (out / "manifest.json").exists()
    assert not list(out.glob("*/part-*.tfrecord")) if out.exists() else True


def test_glob_matching_nothing_names_the_pattern(corpus, tmp_path) -> None:
    out = tmp_path / "o"
    args = base_args(corpus, out)
    args[1] = str(tmp_path / "nothing-*.txt")
    code, output = run_cli(*args)
    assert code != 0 and "nothing-*.txt" in output and "no input file matches" in output
    assert_no_dataset(out)


def test_only_empty_documents_is_an_error(corpus, tmp_path) -> None:
    (tmp_path / "empty.txt").write_text("\n\n   \n\n\t\n")
    out = tmp_path / "o"
    args = base_args(corpus, out)
    args[1] = str(tmp_path / "empty.txt")
    code, output = run_cli(*args)
    assert code != 0 and "no documents" in output and "empty.txt" in output
    assert_no_dataset(out)


def test_binary_file_is_an_error_naming_it(corpus, tmp_path) -> None:
    (tmp_path / "good.txt").write_text(document_of_words())
    (tmp_path / "blob.txt").write_bytes(bytes(range(256)) * 64)
    out = tmp_path / "o"
    args = base_args(corpus, out)
    args[1] = str(tmp_path / "*.txt")
    code, output = run_cli(*args)
    assert code != 0 and "blob.txt" in output and "binary" in output
    assert "Traceback" not in output
    assert_no_dataset(out)


def test_unreadable_compressed_file_is_an_error_naming_it(corpus, tmp_path) -> None:
    (tmp_path / "bad.txt.gz").write_bytes(b"this is not gzip data at all")
    out = tmp_path / "o"
    args = base_args(corpus, out)
    args[1] = str(tmp_path / "bad.txt.gz")
    code, output = run_cli(*args)
    assert code != 0 and "bad.txt.gz" in output and "decompress" in output
    assert_no_dataset(out)


def document_of_words() -> str:
    return "\n\n".join(document_text_plain(d) for d in make_documents(8, seed=11)) + "\n"


def document_text_plain(doc: list[str]) -> str:
    return "\n".join(doc)


def test_invalid_utf8_is_counted_or_fails_with_strict(corpus, tmp_path) -> None:
    text = document_of_words().encode()
    (tmp_path / "bad.txt").write_bytes(text[:40] + b"\xff\xfe" + text[40:])
    args = base_args(corpus, tmp_path / "o")
    args[1] = str(tmp_path / "bad.txt")
    code, output = run_cli(*args)
    assert code == 0, output
    assert manifest_of(tmp_path / "o")["totals"]["decode_errors"] == 1
    args = base_args(corpus, tmp_path / "s", "--strict")
    args[1] = str(tmp_path / "bad.txt")
    code, output = run_cli(*args)
    assert code != 0 and "bad.txt" in output and "UTF-8" in output
    assert_no_dataset(tmp_path / "s")


def test_one_sentence_document_and_overlong_sentence_work(corpus, tmp_path) -> None:
    long_sentence = " ".join(["river"] * 400) + "."
    (tmp_path / "one.txt").write_text("The cat sat on the mat.\n\n" + long_sentence + "\n")
    out = tmp_path / "o"
    args = base_args(corpus, out, "--num-shards", "1")
    args[1] = str(tmp_path / "one.txt")
    code, output = run_cli(*args)
    assert code == 0, output
    manifest = manifest_of(out)
    assert manifest["totals"]["documents"] == 2 and manifest["totals"]["instances"] > 0
    data = (out / manifest["splits"]["train"]["shards"][0]["path"]).read_bytes()
    for payload in iter_tfrecords(io.BytesIO(data)):
        features = decode_example(payload)
        assert features["input_ids"].shape == (32,)
        assert int(np.sum(features["input_mask"])) <= 32


def test_one_document_corpus_works(corpus, tmp_path) -> None:
    (tmp_path / "one.txt").write_text(document_text_plain(make_documents(1, seed=5, max_sentences=6)[0]))
    out = tmp_path / "o"
    args = base_args(corpus, out, "--num-shards", "1")
    args[1] = str(tmp_path / "one.txt")
    code, output = run_cli(*args)
    assert code == 0, output
    assert manifest_of(out)["totals"]["documents"] == 1


def test_vocab_without_mask_is_an_error(corpus, tmp_path) -> None:
    vocab = tmp_path / "v.txt"
    vocab.write_text("\n".join(t for t in corpus["vocab"].read_text().split("\n") if t and t != "[MASK]") + "\n")
    args = base_args(corpus, tmp_path / "o")
    args[3] = str(vocab)
    code, output = run_cli(*args)
    assert code != 0 and "[MASK]" in output and "v.txt" in output
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize(
    ("option", "value", "message"),
    [
        ("--max-seq-length", "4", "--max-seq-length 4 is too small"),
        ("--masked-lm-prob", "0", "--masked-lm-prob 0.0 must be in (0, 1]"),
        ("--masked-lm-prob", "1.5", "--masked-lm-prob 1.5 must be in (0, 1]"),
        ("--max-predictions-per-seq", "0", "--max-predictions-per-seq 0 must be in [1, 100000]"),
        ("--mask-ratios", "0.5,0.5", "expected three numbers"),
        ("--sentence-splitter", "nope", "--sentence-splitter 'nope' is not one of"),
        ("--num-shards", "0", "--num-shards 0 must be >= 1"),
    ],
)
def test_bad_options_are_usage_errors(corpus, tmp_path, option: str, value: str, message: str) -> None:
    code, output = run_cli(*base_args(corpus, tmp_path / "o", option, value))
    assert code == 2 and message in output
    assert not (tmp_path / "o").exists()


def test_stray_positional_argument_is_rejected(corpus, tmp_path) -> None:
    code, output = run_cli(*base_args(corpus, tmp_path / "o", "oops"))
    assert code == 2 and "oops" in output
