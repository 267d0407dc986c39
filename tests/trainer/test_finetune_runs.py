"""Fine-tuning runs on tiny task datasets: each task type end to end, reproducibility, exact resume,
--seeds, bad input."""

from __future__ import annotations

import json

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

pytestmark = pytest.mark.integration  # several short runs, ~1 min in all

from bert_datagen.trainer.errors import DataError, TrainingError  # noqa: E402
from bert_datagen.trainer.finetune.train import FinetuneConfig, finetune, finetune_seeds  # noqa: E402
from bert_datagen.trainer.runtime import checkpoint as ckpt_lib  # noqa: E402
from tests.support.task_fixtures import (  # noqa: E402
    classification_dataset,
    span_dataset,
    tagging_dataset,
    tiny_bert,
    write_pretrain_run,
)


@pytest.fixture(scope="module")
def init_run(tmp_path_factory):
    return write_pretrain_run(str(tmp_path_factory.mktemp("pre") / "run"))


def _cfg(data, out, init, **kw):
    base = {"epochs": 2, "learning_rate": 1e-3, "batch_size": 8, "log_every": 1000, "seed": 5}
    base.update(kw)
    return FinetuneConfig(data=str(data), out=str(out), init_from=init, **base)


def _weights(run_dir):
    ckpt = ckpt_lib.resolve_checkpoint(run_dir)
    return ckpt_lib.load_arrays(ckpt, ckpt_lib.MODEL_FILE)


def test_classification_run_files_reproducible_and_exact_resume(tmp_path, init_run):
    data = classification_dataset(str(tmp_path / "data"))
    a = finetune(_cfg(data, tmp_path / "a", init_run), log=lambda _: None)
    assert a["primary_metric"] == "accuracy" and len(a["history"]) == 2
    assert a["best_epoch"]["epoch"] in (1.0, 2.0)
    final = json.loads((tmp_path / "a" / "final_metrics.json").read_text())
    assert final["final"]["accuracy"] == a["history"][-1]["metrics"]["accuracy"]
    tsv = (tmp_path / "a" / "eval" / "predictions.tsv").read_text().splitlines()
    assert tsv[0] == "index\tprediction" and len(tsv) == 41 and tsv[1].split("\t")[1] in ("neg", "pos")
    assert (tmp_path / "a" / "tensorboard" / "eval").is_dir()
    # The head is named as the original's; the encoder came from the run, its MLM heads did not.
    w = _weights(tmp_path / "a")
    assert w["output_weights"].shape == (2, 16) and "cls/predictions/output_bias" not in w

    b = finetune(_cfg(data, tmp_path / "b", init_run), log=lambda _: None)
    wb = _weights(tmp_path / "b")
    assert all(np.array_equal(w[k], wb[k]) for k in w)
    assert a["history"] == b["history"]

    # Interrupted after 5 steps (mid-epoch, checkpoint every 5), resumed: bitwise the same.
    c_cfg = _cfg(data, tmp_path / "c", init_run, checkpoint_every=5)
    finetune(c_cfg, log=lambda _: None, stop_at=5)
    assert ckpt_lib.list_checkpoints(tmp_path / "c")[-1][0] == 5
    c = finetune(c_cfg, log=lambda _: None)
    wc = _weights(tmp_path / "c")
    assert all(np.array_equal(w[k], wc[k]) for k in w)
    assert c["history"] == a["history"]

    # Another seed gives other weights.
    d = finetune(_cfg(data, tmp_path / "d", init_run, seed=6, max_steps=3), log=lambda _: None)
    assert d["step"] == 3 and not np.array_equal(_weights(tmp_path / "d")["output_weights"], w["output_weights"])


def test_seeds_summary(tmp_path, init_run):
    data = classification_dataset(str(tmp_path / "data"))
    lines = []
    summary = finetune_seeds(_cfg(data, tmp_path / "run", init_run, max_steps=4), [1, 2], log=lines.append)
    assert [r["seed"] for r in summary["seeds"]] == [1, 2]
    acc = [r["metrics"]["accuracy"] for r in summary["seeds"]]
    stats = summary["metrics"]["accuracy"]
    assert stats["mean"] == pytest.approx(np.mean(acc)) and stats["std"] == pytest.approx(np.std(acc, ddof=1))
    assert stats["min"] == min(acc) and stats["max"] == max(acc)
    assert json.loads((tmp_path / "run" / "summary.json").read_text()) == summary
    assert any(line.startswith("mean") for line in lines[-1].splitlines())
    for seed in (1, 2):
        assert (tmp_path / "run" / f"seed-{seed}" / "final_metrics.json").is_file()


def test_regression_span_tagging_runs(tmp_path, init_run):
    reg = finetune(_cfg(classification_dataset(str(tmp_path / "reg"), regression=True), tmp_path / "r", init_run,
                        epochs=1), log=lambda _: None)
    assert set(reg["final"]) == {"pearson", "spearman"} and reg["primary_metric"] == "spearman"

    span = finetune(_cfg(span_dataset(str(tmp_path / "span")), tmp_path / "s", init_run, epochs=1),
                    log=lambda _: None)
    assert set(span["final"]) == {"exact_match", "f1"}
    files = sorted(p.name for p in (tmp_path / "s" / "eval").iterdir())
    assert files == ["logits.npz", "metrics.json", "nbest_predictions.json", "predictions.json"]
    span2 = finetune(_cfg(span_dataset(str(tmp_path / "span2"), v2=True), tmp_path / "s2", init_run, epochs=1),
                     log=lambda _: None)
    assert "HasAns_f1" in span2["details"] and "best_f1_thresh" in span2["details"]
    assert (tmp_path / "s2" / "eval" / "null_odds.json").is_file()

    tag = finetune(_cfg(tagging_dataset(str(tmp_path / "tag")), tmp_path / "t", init_run, epochs=1),
                   log=lambda _: None)
    assert set(tag["final"]) == {"precision", "recall", "f1", "token_accuracy"}
    conll = (tmp_path / "t" / "eval" / "predictions.conll").read_text().split("\n\n")[0].splitlines()
    assert all(len(line.split("\t")) == 3 for line in conll)


def test_bad_input(tmp_path, init_run):
    data = classification_dataset(str(tmp_path / "data"))
    with pytest.raises(DataError, match="unlabelled"):
        finetune(_cfg(data, tmp_path / "x", init_run, eval_split="test"), log=lambda _: None)
    with pytest.raises(DataError, match="no split 'nope'"):
        finetune(_cfg(data, tmp_path / "x", init_run, eval_split="nope"), log=lambda _: None)
    other = write_pretrain_run(str(tmp_path / "big"), tiny_bert(vocab_size=41))
    with pytest.raises(DataError, match="vocab has 40 tokens .* vocab_size 41"):
        finetune(_cfg(data, tmp_path / "x", other), log=lambda _: None)
    from tests.support.synthetic import write_synthetic_dataset

    pre = write_synthetic_dataset(str(tmp_path / "pre"), vocab_size=40)
    with pytest.raises(DataError, match="pre-training dataset"):
        finetune(_cfg(pre, tmp_path / "x", init_run), log=lambda _: None)
    # Resuming on a dataset whose labels differ from the fine-tuned head's, at the same path or
    # another: not the dataset the run was started on (its record in RUN/dataset.json).
    finetune(_cfg(data, tmp_path / "run", init_run, max_steps=4, checkpoint_every=2), log=lambda _: None, stop_at=2)
    tags = tagging_dataset(str(tmp_path / "tags"))
    manifest = json.loads((tmp_path / "data" / "manifest.json").read_text())
    manifest["task"]["labels"] = ["a", "b", "c"]
    (tmp_path / "data" / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(TrainingError, match="not the dataset this run was started on"):
        finetune(_cfg(data, tmp_path / "run", init_run, max_steps=4, checkpoint_every=2), log=lambda _: None)
    with pytest.raises(TrainingError, match="not the dataset this run was started on"):
        finetune(_cfg(tags, tmp_path / "run", init_run, max_steps=4, checkpoint_every=2), log=lambda _: None)
    with pytest.raises(TrainingError, match="other settings"):
        finetune(_cfg(data, tmp_path / "run", init_run, max_steps=5, checkpoint_every=2), log=lambda _: None)


def test_nan_loss_stops_and_keeps_last_good_checkpoint(tmp_path, init_run):
    data = classification_dataset(str(tmp_path / "data"))
    cfg = _cfg(data, tmp_path / "run", init_run, checkpoint_every=2, learning_rate=1e30, epochs=12)
    with pytest.raises(TrainingError, match=r"loss is nan; stopped \(last good checkpoint: .*ckpt-"):
        finetune(cfg, log=lambda _: None)
    for _, path in ckpt_lib.list_checkpoints(tmp_path / "run"):
        assert all(np.isfinite(v).all() for v in ckpt_lib.load_arrays(path, ckpt_lib.MODEL_FILE).values())


def test_task_dataset_given_to_pretraining_is_refused(tmp_path):
    from bert_datagen.trainer.pretrain.data import open_pretraining_data

    data = classification_dataset(str(tmp_path / "data"))
    with pytest.raises(DataError, match="a .task. dataset, not a pre-training dataset.*`bert-train finetune`"):
        open_pretraining_data(data)


def test_init_from_tf1_checkpoint_prefix(tmp_path):
    from bert_datagen.trainer.interop.tf1 import write_tf1_checkpoint
    from bert_datagen.trainer.model.bert import build_model
    from bert_datagen.trainer.model.heads import encoder_variable_map
    from bert_datagen.trainer.model.weights import model_tf1_arrays

    bert = tiny_bert()
    pre = build_model(bert, seed=9)
    arrays = model_tf1_arrays(pre)
    write_tf1_checkpoint(str(tmp_path / "bert_model.ckpt"), arrays)
    (tmp_path / "bert_config.json").write_text(bert.to_json())
    data = classification_dataset(str(tmp_path / "data"))
    cfg = FinetuneConfig(data=data, out=str(tmp_path / "run"), init_checkpoint=str(tmp_path / "bert_model.ckpt"),
                         max_steps=1, batch_size=8)
    from bert_datagen.trainer.finetune.train import FinetuneRun

    run = FinetuneRun(cfg, log=lambda _: None)
    summary = run.restore_or_initialise()
    assert "dropped 7 pre-training head weights" in summary
    for name, var in encoder_variable_map(run.model).items():
        assert np.array_equal(var.numpy(), arrays[name]), name
