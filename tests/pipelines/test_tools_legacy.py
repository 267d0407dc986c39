"""TFRecords without a manifest (the original tool's output) with --max-seq-length etc. (no TensorFlow)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

sys.path.insert(0, str(Path(__file__).resolve().parent.parent.parent))  # benchmarks/ holds the fixture writer

from benchmarks.bench_verify import fixture_instances, fixture_vocab  # noqa: E402
from bert_datagen.datagen.tfrecord import frame_records  # noqa: E402
from bert_datagen.pipelines.tools.cli import diff_command, inspect_command, stats_command, verify_command  # noqa: E402
from tests.support.record_encoding import encode_batch  # noqa: E402

SEQ, PREDS = 48, 8
VOCAB = fixture_vocab()


@pytest.fixture
def legacy(tmp_path: Path) -> Path:
    out = tmp_path / "orig"
    out.mkdir()
    for i in range(3):
        batch, _ = fixture_instances(5, 40 * i, 40, SEQ, PREDS, len(VOCAB))
        (out / f"wiki_{i:02d}.tfrecord").write_bytes(frame_records(encode_batch(batch)))
    (tmp_path / "vocab.txt").write_text("\n".join(VOCAB) + "\n")
    return out


def _opts(d: Path) -> list[str]:
    return ["--max-seq-length", str(SEQ), "--max-predictions-per-seq", str(PREDS), "--vocab",
            str(d.parent / "vocab.txt")]


def test_verify_glob_without_manifest(legacy: Path) -> None:
    result = CliRunner().invoke(verify_command, [str(legacy / "wiki_*.tfrecord"), *_opts(legacy)])
    assert result.exit_code == 0, result.output
    assert "no manifest" in result.output and "120 records" in result.output
    assert result.output.count("      40 records  ") == 3  # computed checksums are listed per file


def test_verify_directory_without_manifest_finds_damage(legacy: Path) -> None:
    shard = legacy / "wiki_01.tfrecord"
    data = bytearray(shard.read_bytes())
    data[200] ^= 0x10
    shard.write_bytes(bytes(data))
    result = CliRunner().invoke(verify_command, [str(legacy), *_opts(legacy)])
    assert result.exit_code == 1
    assert f"{shard}: record 0 at byte 0: payload CRC mismatch" in result.output


def test_wrong_shape_is_reported_per_record(legacy: Path) -> None:
    opts = _opts(legacy)
    opts[1] = "64"
    result = CliRunner().invoke(verify_command, [str(legacy), *opts, "--max-problems", "2"])
    assert result.exit_code == 1
    assert f"feature input_ids has {SEQ} values, expected 64" in result.output
    assert "more problems" in result.output


def test_missing_options_are_explained(legacy: Path) -> None:
    result = CliRunner().invoke(verify_command, [str(legacy)])
    assert result.exit_code != 0
    assert "no manifest" in result.output and "--max-seq-length" in result.output
    result = CliRunner().invoke(verify_command, [str(legacy / "nothing-*.tfrecord"), *_opts(legacy)])
    assert result.exit_code != 0 and "no input file matches" in result.output
    result = CliRunner().invoke(diff_command, [str(legacy), str(legacy)])
    assert result.exit_code != 0


def test_inspect_and_stats_without_manifest(legacy: Path) -> None:
    result = CliRunner().invoke(inspect_command, [str(legacy), "--shard", "2", "--index", "3", "-n", "1", "--json",
                                                  *_opts(legacy)])
    assert result.exit_code == 0, result.output
    view = json.loads(result.output)
    _, original = fixture_instances(5, 83, 1, SEQ, PREDS, len(VOCAB))
    assert view["shard"].endswith("wiki_02.tfrecord") and view["index"] == 3
    assert [t["token"] for t in view["tokens"]] == [VOCAB[i] for i in original[0, :view["length"]]]
    result = CliRunner().invoke(stats_command, [str(legacy / "*.tfrecord"), "--json", *_opts(legacy)])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["records"] == 120
