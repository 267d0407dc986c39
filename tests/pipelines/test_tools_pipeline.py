"""The tools on datasets made by `bert-datagen run` from real text (end to end)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from bert_datagen.pipelines.tools.cli import diff_command, inspect_command, stats_command, verify_command

pytestmark = pytest.mark.integration


def _vocab_for(text: str, path: Path) -> Path:
    """A vocab that covers the text: every basic token, every character and its ## piece."""
    from bert_datagen.vocab.basic import basic_tokenize

    words = sorted(set(basic_tokenize(text, True)))
    chars = sorted({c for w in words for c in w})
    tokens = ["[PAD]"] + [f"[unused{i}]" for i in range(5)] + ["[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    tokens += words + [c for c in chars if c not in words] + ["##" + c for c in chars]
    path.write_text("\n".join(dict.fromkeys(tokens)) + "\n", encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def generated(shared_corpora: Path, tmp_path_factory) -> dict[str, Path]:
    from bert_datagen.pipelines.pretraining.cli import run_command

    corpus = shared_corpora / "bert_sample_text" / "sample_text.txt"
    root = tmp_path_factory.mktemp("gen")
    vocab = _vocab_for(corpus.read_text(encoding="utf-8"), root / "vocab.txt")
    out = {"corpus": corpus}
    for name, seed in (("a", 12345), ("a2", 12345), ("b", 4242)):
        out[name] = root / name
        result = CliRunner().invoke(run_command, [
            "--input", str(corpus), "--vocab", str(vocab), "--output", str(out[name]), "--quiet",
            "--max-seq-length", "64", "--max-predictions-per-seq", "10", "--dupe-factor", "2",
            "--num-shards", "2", "--eval-fraction", "0.2", "--random-seed", str(seed)])
        assert result.exit_code == 0, result.output
    return out


def test_generated_dataset_verifies(generated) -> None:
    # One worker: this process ran Beam (gRPC threads); do not fork it.
    result = CliRunner().invoke(verify_command, [str(generated["a"]), "--json", "--workers", "1"])
    report = json.loads(result.output)
    assert result.exit_code == 0 and report["ok"], report["problems"]
    assert report["records"] > 0 and report["manifest"]


def test_generated_dataset_damage_is_found(generated, tmp_path: Path) -> None:
    import shutil

    d = tmp_path / "copy"
    shutil.copytree(generated["a"], d)
    manifest = json.loads((d / "manifest.json").read_text())
    shard = manifest["splits"]["train"]["shards"][0]["path"]
    data = bytearray((d / shard).read_bytes())
    data[len(data) // 3] ^= 0x01
    (d / shard).write_bytes(bytes(data))
    result = CliRunner().invoke(verify_command, [str(d), "--workers", "1"])
    assert result.exit_code == 1 and f"{shard}: sha256 is" in result.output


def _words(line: str) -> list[str]:
    """An inspect A:/B: line back to words: labels put back at masked positions, ## pieces joined."""
    tokens = re.sub(r"\{(?:MASK|kept|random \S+):(\S+?)\}", r"\1", line).split()
    words: list[str] = []
    for t in tokens:
        if t.startswith("##") and words:
            words[-1] += t[2:]
        else:
            words.append(t)
    return words


def test_inspect_round_trips_to_the_corpus_text(generated) -> None:
    from bert_datagen.vocab.basic import basic_tokenize

    corpus = " " + " ".join(basic_tokenize(generated["corpus"].read_text(encoding="utf-8"), True)) + " "
    result = CliRunner().invoke(inspect_command, [str(generated["a"]), "-n", "40"])
    assert result.exit_code == 0, result.output
    checked = 0
    for block in result.output.strip().split("\n\n"):
        lines = block.split("\n")
        for line in lines[1:3]:
            # Truncation may cut a word at either end of a segment: compare the words inside.
            inner = _words(line[len("  A: "):])[1:-1]
            if len(inner) >= 2:
                assert " " + " ".join(inner) + " " in corpus, line
                checked += 1
    assert checked >= 20


def test_diff_same_seed_identical_other_seed_different(generated) -> None:
    same = CliRunner().invoke(diff_command, [str(generated["a"]), str(generated["a2"])])
    assert same.exit_code == 0, same.output
    other = CliRunner().invoke(diff_command, [str(generated["a"]), str(generated["b"])])
    assert other.exit_code == 1
    assert "config.random_seed: 12345 -> 4242" in other.output and "first differing record" in other.output


def test_stats_agree_with_the_manifest(generated) -> None:
    st = json.loads(CliRunner().invoke(stats_command, [str(generated["a"]), "--json", "--workers", "1"]).output)
    manifest = json.loads((generated["a"] / "manifest.json").read_text())
    assert st["records"] == manifest["totals"]["instances"]
    assert st["notnext_share"] == pytest.approx(manifest["totals"]["notnext_fraction"], abs=1e-6)
    assert st["unk_rate"] == 0.0
