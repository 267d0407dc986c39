"""`make ablation` (benchmarks/ablation.py): row selection, and a miniature end-to-end run with both
columns (held-out MLM and SST-2 dev accuracy), its outputs and its cache."""

import json
import os
from pathlib import Path

import pytest

from benchmarks import ablation

SHARED = Path(__file__).resolve().parents[2] / ".." / "shared"
CORPUS = SHARED / "corpora" / "enwiki_extract_2015"
SST2 = SHARED / "tasks" / "sst2"


def test_rows_are_picked_by_name_or_slug_and_always_keep_the_original():
    assert ablation.select_rows([]) == ablation.ROWS
    picked = ablation.select_rows(["Dynamic Masking", "masking_unit=span"])
    assert [r.name for r in picked] == ["80/10/10 (original)", "dynamic masking", "span masking"]
    with pytest.raises(ValueError, match="'no such row' is not a row"):
        ablation.select_rows(["no such row"])


@pytest.mark.parametrize("argv, message", [
    (["--row", "nope"], "is not a row"),
    (["--steps", "0"], "--steps must be positive"),
    (["--sst2-steps", "-1"], "--sst2-steps must be >= 0"),
    (["--learning-rate", "nan"], "--learning-rate must be a positive number"),
    (["--sst2-learning-rate", "0"], "--sst2-learning-rate must be a positive number"),
    (["--sst2-max-seq-length", "4"], "--sst2-max-seq-length must be in 8..512"),
])
def test_bad_options_exit_2_before_any_work(tmp_path, capsys, argv, message):
    assert ablation.main(["--out", str(tmp_path / "out"), *argv]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_a_missing_sst2_folder_is_named(tmp_path, capsys):
    if not CORPUS.is_dir():
        pytest.skip(f"no corpus at {CORPUS} (../shared is absent)")
    assert ablation.main(["--out", str(tmp_path / "out"), "--sst2", str(tmp_path / "nowhere")]) == 1
    assert "no SST-2 train.tsv and dev.tsv in" in capsys.readouterr().err


@pytest.mark.integration
@pytest.mark.heavy  # 45 s: `make test-heavy`; the row and option tests above stay in the timed suite
def test_a_miniature_ablation_reports_both_columns_and_resumes_from_its_cache(tmp_path):
    if not (CORPUS.is_dir() and (SST2 / "train.tsv").is_file()):
        pytest.skip(f"needs {CORPUS} and {SST2} (../shared is absent)")
    sst2 = tmp_path / "sst2"  # a few hundred sentences keep the test fast; read from ../shared, not copied to the repo
    sst2.mkdir()
    for name, lines in (("train.tsv", 257), ("dev.tsv", 101)):
        with open(SST2 / name, encoding="utf-8") as f:
            (sst2 / name).write_text("".join(next(f) for _ in range(lines)), encoding="utf-8")
    out = tmp_path / "ablation"
    argv = ["--out", str(out), "--files", "1", "--steps", "3", "--batch-size", "2", "--seeds", "2",
            "--vocab-size", "1500", "--row", "dynamic masking", "--sst2", str(sst2), "--sst2-steps", "3"]
    assert ablation.main(argv) == 0
    report = json.loads((out / "ablation.json").read_text())
    assert [r["row"] for r in report["rows"]] == ["80/10/10 (original)", "dynamic masking"]
    for row in report["rows"]:
        for metric in ("mlm", "sst2"):
            stats = row[metric]
            assert stats["seeds"] == 2 and len(stats["values"]) == 2
            assert 0.0 <= stats["min"] <= stats["mean"] <= stats["max"] <= 1.0
    assert report["rows"][0]["sst2"]["delta_vs_original"] == 0.0
    assert all(len(runs) == 2 and "accuracy" in runs[0]["sst2"] for runs in report["runs"].values())
    dev_labels = [line.split("\t")[-1] for line in (sst2 / "dev.tsv").read_text().splitlines()[1:]]
    majority = max(dev_labels.count("0"), dev_labels.count("1")) / len(dev_labels)
    assert len(dev_labels) == 100 and report["majority_class"]["sst2"] == pytest.approx(majority)
    assert (out / "ablation.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not list(out.glob("*.tmp*"))
    # A second call finds every run in the cache: same figures, no training.
    marks = {p: os.path.getmtime(p) for p in out.glob("runs/*/ablation_eval.json")}
    assert ablation.main(argv) == 0
    again = json.loads((out / "ablation.json").read_text())
    assert again["rows"] == report["rows"] and again["run_seconds"] == report["run_seconds"] > 0
    assert {p: os.path.getmtime(p) for p in out.glob("runs/*/ablation_eval.json")} == marks
