"""CMRC 2018 end to end: trial slice -> `bert-datagen task` -> a tiny model fine-tuned a few steps ->
`predict`, scored with CMRC 2018's metric, answers that are exact characters of their contexts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

tf = pytest.importorskip("tensorflow")

from click.testing import CliRunner  # noqa: E402

from bert_datagen.contract.fs import LOCAL_FS  # noqa: E402
from bert_datagen.contract.vocab_io import write_vocab  # noqa: E402
from bert_datagen.trainer.cli import main  # noqa: E402
from bert_datagen.trainer.model.config import BertConfig  # noqa: E402
from bert_datagen.vocab.train import train_vocab  # noqa: E402
from tests.support.task_fixtures import write_pretrain_run  # noqa: E402

pytestmark = pytest.mark.integration

TRIAL = Path(__file__).resolve().parents[2] / ".." / "shared" / "tasks" / "cmrc2018" / "trial.json"


def _invoke(args):
    return CliRunner().invoke(main, args, catch_exceptions=False)


def test_cmrc_trial_finetunes_and_predicts_exact_characters(tmp_path):
    if not TRIAL.is_file():
        pytest.skip(f"CMRC 2018 trial not found at {TRIAL}")
    data = json.loads(TRIAL.read_text(encoding="utf-8"))
    data["data"] = data["data"][:3]
    (tmp_path / "cmrc.json").write_text(json.dumps(data, ensure_ascii=False), encoding="utf-8")
    contexts = [p["context"] for a in data["data"] for p in a["paragraphs"]]
    vocab = write_vocab(train_vocab(contexts, vocab_size=2000, do_lower_case=True, layout="google-chinese"),
                        str(tmp_path / "vocab.txt"),
                        LOCAL_FS)
    from bert_datagen.datagen.tasks.config import TaskConfig
    from bert_datagen.pipelines.tasks.run import generate_task_dataset

    written = generate_task_dataset(TaskConfig(kind="squad", max_seq_length=96, doc_stride=48),
                                    splits=[f"train={tmp_path / 'cmrc.json'}", f"dev={tmp_path / 'cmrc.json'}"],
                                    vocab_path=str(tmp_path / "vocab.txt"), output_dir=str(tmp_path / "cmrc"))
    assert written.manifest.splits["dev"].counts["character_word_contexts"] > 0
    bert = BertConfig(vocab_size=vocab.size, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                      intermediate_size=32, max_position_embeddings=128)
    init = write_pretrain_run(str(tmp_path / "pre"), bert)
    run = tmp_path / "run"
    result = _invoke(["finetune", "--data", str(tmp_path / "cmrc"), "--out", str(run), "--init-from", init,
                      "--max-steps", "3", "--batch-size", "8", "--log-every", "1000"])
    assert result.exit_code == 0, result.output
    assert set(json.loads((run / "final_metrics.json").read_text())["final"]) == {"exact_match", "f1"}
    result = _invoke(["predict", "--run", str(run), "--data", str(tmp_path / "cmrc"), "--split", "dev",
                      "--out", str(tmp_path / "pred-auto")])
    assert result.exit_code == 0, result.output
    scored = json.loads((tmp_path / "pred-auto" / "metrics.json").read_text())
    assert scored["details"]["metric"] == "cmrc2018" and "average" in scored["details"]
    predictions = json.loads((tmp_path / "pred-auto" / "predictions.json").read_text())
    context_of = {qa["id"]: p["context"] for a in data["data"] for p in a["paragraphs"] for qa in p["qas"]}
    assert set(predictions) == set(context_of)
    # Every answer is a run of its context's own characters (no spaces put between characters).
    assert all(text in context_of[qid] for qid, text in predictions.items())


def test_span_metric_choice():
    from bert_datagen.trainer.errors import DataError
    from bert_datagen.trainer.finetune.evaluate import span_metric_of

    chinese, english = [{"words": ["北"], "word_starts": [0], "context": "北"}], [{"words": ["a"]}]
    assert span_metric_of(chinese, False) == "cmrc2018" and span_metric_of(english, False) == "squad"
    assert span_metric_of(chinese, False, "squad") == "squad" and span_metric_of(english, False, "cmrc2018") == "cmrc2018"
    assert span_metric_of(chinese, True) == "squad"
    with pytest.raises(DataError, match="SQuAD v2.0"):
        span_metric_of(english, True, "cmrc2018")
