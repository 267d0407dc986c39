"""`make finetune` (examples/finetune_demo.py) end to end at a tiny size: its `main` builds the task
dataset with `bert-datagen task`, fine-tunes a tiny pre-training run and writes predictions.

The pre-training run is a freshly initialised tiny model (tests/support/task_fixtures.py) over a WordPiece
vocab learned from the demo's own paragraphs, so the test needs no `make pretrain`. From an
untrained encoder and a few steps the demo reliably reaches only the majority class (measured: dev
accuracy 0.5000 = majority at 40 and 80 paragraphs per class), so accuracy is not asserted; the
files, finite metrics and a bitwise-identical rerun are.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("tensorflow")

from bert_datagen.trainer.runtime import checkpoint as ckpt_lib  # noqa: E402
from bert_datagen.vocab.train import train_vocab  # noqa: E402
from examples.finetune_demo import LABELS, main, write_tsvs  # noqa: E402
from tests.support.task_fixtures import tiny_bert, write_pretrain_run  # noqa: E402

pytestmark = pytest.mark.integration  # a `bert-datagen task` run and two fine-tuning runs, ~20 s

SEED, PER_CLASS, SEQ = 12345, 40, 32
REPO = Path(__file__).resolve().parent.parent.parent


@pytest.fixture(scope="module")
def demo_inputs(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("demo")
    # The TSVs main would write for (SEED, PER_CLASS), written once: reading the standard library's
    # docstrings takes seconds, and main reuses TSVs it finds in its --out.
    train_tsv, dev_tsv = write_tsvs(str(root / "tsv"), SEED, PER_CLASS)
    texts = [line.split("\t")[0] for path in (train_tsv, dev_tsv)
             for line in Path(path).read_text(encoding="utf-8").splitlines()[1:]]
    tokens = train_vocab(texts, 800, do_lower_case=True, num_unused=0)
    pre = root / "pretrain"
    pre.mkdir()
    (pre / "vocab.txt").write_text("\n".join(tokens) + "\n", encoding="utf-8")
    write_pretrain_run(str(pre / "phase1"), tiny_bert(vocab_size=len(tokens)))
    return {"pretrain": pre, "tsv": root / "tsv"}


def _args(demo_inputs: dict[str, Path], out: Path) -> list[str]:
    return ["--pretrain", str(demo_inputs["pretrain"]), "--out", str(out), "--per-class", str(PER_CLASS),
            "--max-seq-length", str(SEQ), "--epochs", "2", "--learning-rate", "1e-3", "--seed", str(SEED)]


def _run_main(demo_inputs: dict[str, Path], out: Path) -> int:
    shutil.copytree(demo_inputs["tsv"], out / "tsv")
    return main(_args(demo_inputs, out))


def test_demo_writes_predictions_and_metrics_and_reruns_identically(demo_inputs, tmp_path, capsys):
    out = tmp_path / "a"
    assert _run_main(demo_inputs, out) == 0
    printed = capsys.readouterr().out

    manifest = json.loads((out / "data" / "manifest.json").read_text())
    assert manifest["kind"] == "task" and manifest["task"]["labels"] == list(LABELS)
    dev_rows = (out / "tsv" / "dev.tsv").read_text(encoding="utf-8").splitlines()[1:]
    dev_labels = [row.split("\t")[1] for row in dev_rows]
    assert len(dev_rows) == 2 * (PER_CLASS - int(PER_CLASS * 0.8)) and set(dev_labels) == set(LABELS)

    predictions = (out / "predictions" / "predictions.tsv").read_text().splitlines()
    assert predictions[0] == "index\tprediction" and len(predictions) == len(dev_rows) + 1
    assert {row.split("\t")[1] for row in predictions[1:]} <= set(LABELS)
    final = json.loads((out / "run" / "final_metrics.json").read_text())
    accuracy = final["final"]["accuracy"]
    assert math.isfinite(accuracy) and 0.0 <= accuracy <= 1.0 and len(final["history"]) == 2
    # The prediction files score what the run's last evaluation scored.
    assert json.loads((out / "predictions" / "metrics.json").read_text())["metrics"]["accuracy"] == accuracy
    majority = max(dev_labels.count(label) for label in LABELS) / len(dev_labels)
    assert f"dev accuracy {accuracy:.4f} (majority class {majority:.4f})" in printed

    # The same inputs again (task dataset reused), as `make finetune` runs it: bitwise the same model,
    # metrics and predictions, and nothing on stderr (TensorFlow's start-up lines, the retracing
    # warnings of the evaluations).
    again = tmp_path / "b"
    shutil.copytree(out / "data", again / "data")
    shutil.copytree(demo_inputs["tsv"], again / "tsv")
    environ = {k: v for k, v in os.environ.items() if k not in ("TF_CPP_MIN_LOG_LEVEL", "BERT_DATAGEN_DEBUG")}
    proc = subprocess.run([sys.executable, "-m", "examples.finetune_demo", *_args(demo_inputs, again)],
                          capture_output=True, text=True, timeout=300, cwd=tmp_path,
                          env={**environ, "PYTHONPATH": str(REPO)})
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    assert f"dev accuracy {accuracy:.4f}" in proc.stdout
    assert (again / "run" / "final_metrics.json").read_bytes() == (out / "run" / "final_metrics.json").read_bytes()
    assert (again / "predictions" / "predictions.tsv").read_bytes() == (out / "predictions" / "predictions.tsv").read_bytes()
    a = ckpt_lib.load_arrays(ckpt_lib.resolve_checkpoint(out / "run"), ckpt_lib.MODEL_FILE)
    b = ckpt_lib.load_arrays(ckpt_lib.resolve_checkpoint(again / "run"), ckpt_lib.MODEL_FILE)
    assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)
    start = ckpt_lib.load_arrays(ckpt_lib.resolve_checkpoint(demo_inputs["pretrain"] / "phase1"), ckpt_lib.MODEL_FILE)
    assert not np.array_equal(a["bert/pooler/dense/kernel"], start["bert/pooler/dense/kernel"])


def test_demo_without_a_pretraining_run_is_one_clear_error(tmp_path, capsys):
    assert main(["--pretrain", str(tmp_path / "nothing"), "--out", str(tmp_path / "out")]) == 1
    assert "no pre-training run here; run `make pretrain` first" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
