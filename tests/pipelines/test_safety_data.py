"""Data problems: an empty train split is an error at
generation time, a small eval split, many [UNK] and more shards than records are warnings; `diff`
calls datasets with the same shards identical; `stats` fails on a corrupt shard; `--text-layout`
exists; garbled messages read right."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from bert_datagen.datagen.config import DatagenConfig
from bert_datagen.datagen.documents import document_id, document_sentences
from bert_datagen.datagen.readers import read_documents
from bert_datagen.pipelines.beam.outputs import MARK
from bert_datagen.pipelines.cli import main
from tests.support.pipeline_corpus import (
    document_text,
    make_documents,
    manifest_of,
    shard_digests,
    tree_snapshot,
    write_text_files,
    write_vocab,
)


def cli(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, list(args))
    return result.exit_code, result.output


def run_args(inputs: str, vocab: Path, out: Path, *extra: str) -> list[str]:
    return ["run", "--input", inputs, "--vocab", str(vocab), "--output", str(out), "--dupe-factor", "2",
            "--max-seq-length", "32", "--max-predictions-per-seq", "5", "--quiet", *extra]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("data")
    docs = make_documents(30, seed=3)
    write_text_files(root / "in", docs, n_files=2)
    (root / "gz").mkdir()
    (root / "gz" / "all.txt.gz").write_bytes(gzip.compress("\n".join(document_text(d) for d in docs).encode()))
    (root / "one.txt").write_text(document_text(make_documents(1, seed=5, max_sentences=6)[0]))
    return {"root": root, "vocab": write_vocab(root / "vocab.txt")}


def seed_putting_in_eval(path: Path, eval_fraction: float) -> int:
    """A seed under which the only document of ``path`` falls in the eval split."""
    from bert_datagen.datagen.placement import split_of

    config = DatagenConfig()
    raw = next(read_documents(str(path), path.read_bytes(), config, {}))
    doc_id = document_id(document_sentences(raw, config))
    return next(s for s in range(10_000)
                if split_of(doc_id, DatagenConfig(eval_fraction=eval_fraction, random_seed=s)) == "eval")


# ---------------------------------------------------------------- empty splits


def test_one_document_all_in_eval_is_an_error_and_changes_nothing(corpus, tmp_path) -> None:
    one = corpus["root"] / "one.txt"
    seed = seed_putting_in_eval(one, 0.1)
    out = tmp_path / "o"
    code, output = cli(*run_args(str(one), corpus["vocab"], out, "--eval-fraction", "0.1",
                                 "--random-seed", str(seed)))
    assert code == 1 and "--eval-fraction 0.1 put every one of the 1 document(s) in the eval split" in output
    assert "train split would be empty" in output
    assert not out.exists()  # nothing left: no dataset, no staging, not even the directory it made


def test_failed_empty_split_run_keeps_the_old_dataset(corpus, tmp_path) -> None:
    one = corpus["root"] / "one.txt"
    out = tmp_path / "o"
    assert cli(*run_args(str(one), corpus["vocab"], out))[0] == 0
    before = tree_snapshot(out)
    code, output = cli(*run_args(str(one), corpus["vocab"], out, "--eval-fraction", "0.1", "--overwrite",
                                 "--random-seed", str(seed_putting_in_eval(one, 0.1))))
    assert code == 1 and "train split would be empty" in output
    assert tree_snapshot(out) == before


# ---------------------------------------------------------------- warnings


def test_small_eval_split_is_a_loud_warning_with_the_counts(corpus, tmp_path) -> None:
    out = tmp_path / "o"
    code, output = cli(*run_args(str(corpus["root"] / "in" / "*.txt"), corpus["vocab"], out,
                                 "--eval-fraction", "0.2"))
    assert code == 0, output
    records = manifest_of(out)["splits"]["eval"]["records"]
    assert f"warning: the eval split has only {records:,} records" in output
    assert "of 30 documents, --eval-fraction 0.2" in output and "raise --eval-fraction" in output


def test_unknown_token_rate_above_one_percent_is_a_warning(corpus, tmp_path) -> None:
    # The vocab is lowercase: read cased, every capitalised sentence start is [UNK].
    code, output = cli(*run_args(str(corpus["root"] / "in" / "*.txt"), corpus["vocab"], tmp_path / "o",
                                 "--no-lower-case"))
    assert code == 0, output
    assert "are [UNK] (above 1%)" in output and "cased" in output
    code, output = cli(*run_args(str(corpus["root"] / "in" / "*.txt"), corpus["vocab"], tmp_path / "p"))
    assert code == 0 and "[UNK]" not in output


def test_more_shards_than_records_is_a_warning(corpus, tmp_path) -> None:
    code, output = cli(*run_args(str(corpus["root"] / "one.txt"), corpus["vocab"], tmp_path / "o",
                                 "--num-shards", "40"))
    records = manifest_of(tmp_path / "o")["splits"]["train"]["records"]
    assert code == 0 and records < 40
    assert f"warning: train: 40 shards for {records} records" in output


# ---------------------------------------------------------------- diff and stats


def test_diff_same_shards_from_gzip_and_split_input_is_identical(corpus, tmp_path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    assert cli(*run_args(str(corpus["root"] / "in" / "*.txt"), corpus["vocab"], a))[0] == 0
    assert cli(*run_args(str(corpus["root"] / "gz" / "*.gz"), corpus["vocab"], b))[0] == 0
    assert shard_digests(a) == shard_digests(b)
    assert manifest_of(a)["input"]["files"] != manifest_of(b)["input"]["files"]
    code, output = cli("diff", str(a), str(b))
    assert code == 0 and output.startswith("identical"), output
    assert "(informational) input.files: 2 -> 1" in output and "input.bytes" in output


def test_diff_still_sees_a_real_difference(corpus, tmp_path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    assert cli(*run_args(str(corpus["root"] / "in" / "*.txt"), corpus["vocab"], a))[0] == 0
    assert cli(*run_args(str(corpus["root"] / "in" / "*.txt"), corpus["vocab"], b, "--random-seed", "7"))[0] == 0
    code, output = cli("diff", str(a), str(b), "--no-records")
    assert code == 1 and "config.random_seed" in output


def test_stats_on_a_corrupt_shard_fails(corpus, tmp_path) -> None:
    out = tmp_path / "o"
    assert cli(*run_args(str(corpus["root"] / "in" / "*.txt"), corpus["vocab"], out))[0] == 0
    shard = next((out / "train").glob("part-*.tfrecord"))
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))
    code, output = cli("stats", str(out))
    assert code == 1 and "problem(s) while reading the records" in output and "verify" in output, output


# ---------------------------------------------------------------- --text-layout


def test_text_layout_overrides_the_detection_and_is_in_the_manifest(corpus, tmp_path) -> None:
    wiki = tmp_path / "wiki.txt"
    articles = [f" = Title {t} = \n \n {' '.join(d[0].split()[:30])} \n \n" for t, d in
                zip("abc", make_documents(3, seed=11), strict=True)]
    wiki.write_text("".join(articles))
    counts = {}
    for layout in ("auto", "plain", "book"):
        out = tmp_path / layout
        code, output = cli(*run_args(str(wiki), corpus["vocab"], out, "--text-layout", layout))
        assert code == 0, output
        counts[layout] = manifest_of(out)["totals"]["documents"]
        assert manifest_of(out)["config"]["extra"].get("text_layout", "auto") == layout  # manifests keep their old form
    assert counts == {"auto": 3, "plain": 6, "book": 1}


# ---------------------------------------------------------------- messages


def test_vocab_too_small_message_reads_right(corpus, tmp_path) -> None:
    code, output = cli("vocab", "--input", str(corpus["root"] / "in" / "*.txt"), "--output", str(tmp_path / "v.txt"),
                       "--vocab-size", "40")
    assert code == 1
    assert "single-character pieces (each character alone and" in output and "raise it, or lower --limit-alphabet" in output


def test_json_error_column_reads_right(corpus, tmp_path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "unterminated\n')
    code, output = cli(*run_args(str(bad), corpus["vocab"], tmp_path / "o", "--input-format", "jsonl"))
    assert code == 1 and "Unterminated string starting at column 10" in output and "at at" not in output


def test_inspect_does_not_claim_another_document_for_a_one_document_corpus(corpus, tmp_path) -> None:
    out = tmp_path / "o"
    assert cli(*run_args(str(corpus["root"] / "one.txt"), corpus["vocab"], out))[0] == 0
    code, output = cli("inspect", str(out), "-n", "50", "--json")
    views = [json.loads(line) for line in output.splitlines()]
    assert code == 0 and any(v["next_sentence_label"] == 1 for v in views)
    code, output = cli("inspect", str(out), "-n", "50")
    assert "comes from another document" not in output and "NotNext" in output
    assert not [p for p in tree_snapshot(out) if MARK in p]
