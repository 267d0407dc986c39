"""No `bert-train` option is accepted and then ignored: a value the data contradicts, or an option
this run would not use, is refused before any work (a usage error, exit 2, where the options alone
show it; exit 1 where the data does), and what a run records is what ran."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

tf = pytest.importorskip("tensorflow")

from click.testing import CliRunner  # noqa: E402

from bert_datagen.trainer.cli import main  # noqa: E402
from bert_datagen.trainer.errors import TrainConfigError  # noqa: E402
from bert_datagen.trainer.finetune.config import FinetuneConfig  # noqa: E402
from bert_datagen.trainer.pretrain.config import TrainConfig  # noqa: E402
from bert_datagen.trainer.pretrain.earlier_runs_input import recorded_shuffle_buffer  # noqa: E402
from bert_datagen.trainer.pretrain.options import as_run  # noqa: E402
from bert_datagen.trainer.runtime import checkpoint as ckpt_lib  # noqa: E402
from tests.support.synthetic import write_synthetic_dataset  # noqa: E402
from tests.support.task_fixtures import classification_dataset, span_dataset  # noqa: E402

SMALL_BERT = {"vocab_size": 40, "hidden_size": 16, "num_hidden_layers": 1, "num_attention_heads": 2,
              "intermediate_size": 32, "max_position_embeddings": 16}


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> str:
    """A dataset whose manifest says 16 tokens, 3 predictions, a 40-token vocab and an eval split."""
    return write_synthetic_dataset(str(tmp_path_factory.mktemp("opts") / "data"), seq_len=16, max_pred=3,
                                   vocab_size=40, train_shards=1, records_per_shard=16, eval_records=8)


@pytest.fixture(scope="module")
def no_eval(tmp_path_factory) -> str:
    return write_synthetic_dataset(str(tmp_path_factory.mktemp("opts") / "no-eval"), seq_len=16, max_pred=3,
                                   vocab_size=40, train_shards=1, records_per_shard=16, eval_records=0)


@pytest.fixture(scope="module")
def bert_config(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("opts") / "bert_config.json"
    path.write_text(json.dumps(SMALL_BERT))
    return path


def cli(*args) -> tuple[int, str]:
    result = CliRunner().invoke(main, [str(a) for a in args])
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    assert "Traceback" not in result.output
    return result.exit_code, result.output


def pretrain_args(data: str, out: Path, bert_config: Path, *extra) -> list:
    return ["pretrain", "--data", data, "--out", out, "--bert-config", bert_config, "--steps", 1, "--batch-size", 8,
            "--warmup-steps", 0, "--eval-batches", 1, *extra]


@pytest.mark.parametrize(("option", "value", "states"), [("--max-seq-length", 64, 16),
                                                          ("--max-predictions-per-seq", 10, 3)])
def test_lengths_that_contradict_the_manifest_are_refused(data, bert_config, tmp_path, option, value, states):
    out = tmp_path / "run"
    code, output = cli(*pretrain_args(data, out, bert_config, option, value))
    assert code == 1, output
    assert f"Error: {option} {value} contradicts {data}/manifest.json, which says {states}" in output
    assert not out.exists()


def test_what_a_run_records_is_what_ran(data, bert_config, tmp_path):
    out = tmp_path / "run"
    code, output = cli(*pretrain_args(data, out, bert_config, "--max-seq-length", 16,
                                      "--max-predictions-per-seq", 3))
    assert code == 0, output
    recorded = json.loads((out / "train_config.json").read_text())
    assert (recorded["max_seq_length"], recorded["max_predictions_per_seq"]) == (16, 3)  # the manifest's
    assert recorded["shuffle_buffer"] is None  # the global order has no buffer
    assert recorded["model"] is None and recorded["bert_config"]["hidden_size"] == 16  # no size name ran
    # A run of an earlier version recorded the default size name beside its model config: it resumes.
    (out / "train_config.json").write_text(json.dumps({**recorded, "model": "tiny"}))
    code, output = cli(*pretrain_args(data, out, bert_config, "--max-seq-length", 16,
                                      "--max-predictions-per-seq", 3))
    assert code == 0 and "resumed from" in output, output
    code, output = cli("eval", "--run", out, "--data", data, "--max-predictions-per-seq", 5)
    assert code == 1 and "Error: --max-predictions-per-seq 5 contradicts" in output, output
    code, output = cli("eval", "--run", out, "--data", data, "--max-seq-length", 16, "--batch-size", 8)
    assert code == 0, output


def test_eval_data_and_vocab_size_against_a_manifest(data, bert_config, tmp_path):
    code, output = cli(*pretrain_args(data, tmp_path / "a", bert_config, "--eval-data", f"{data}/eval/*"))
    assert code == 1 and "Error: --eval-data" in output and "does not apply to a dataset with a manifest" in output
    code, output = cli("pretrain", "--data", data, "--out", tmp_path / "b", "--steps", 1, "--vocab-size", 30522)
    assert code == 1 and "Error: --vocab-size 30522 contradicts" in output and "40 tokens" in output
    # With a model config the vocab size is the config's: the option would change nothing.
    code, output = cli(*pretrain_args(data, tmp_path / "c", bert_config, "--vocab-size", 40))
    assert code == 2 and "--vocab-size does not apply with a model config" in output
    assert not any((tmp_path / name).exists() for name in "abc")


@pytest.mark.parametrize(("extra", "message"), [
    (["--model", "base"], "--model does not apply here: --bert-config gives the model"),
    (["--tpu", "grpc://10.0.0.2:8470"], "--tpu 'grpc://10.0.0.2:8470' applies only with --strategy tpu"),
    (["--cluster-timeout", "30"], "--cluster-timeout does not apply here: --strategy auto joins no cluster"),
])
def test_options_another_setting_makes_meaningless_are_usage_errors(data, bert_config, tmp_path, extra, message):
    code, output = cli(*pretrain_args(data, tmp_path / "run", bert_config, *extra))
    assert code == 2 and message in output, output
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("option", ["--eval-every", "--eval-batches"])
def test_eval_options_without_an_eval_split_are_refused(no_eval, bert_config, tmp_path, option):
    args = ["pretrain", "--data", no_eval, "--out", tmp_path / "run", "--bert-config", bert_config, "--steps", 1,
            "--batch-size", 8, option, 2]
    code, output = cli(*args)
    assert code == 2 and f"{option} does not apply here: {no_eval}/manifest.json has no eval split" in output


def test_a_shuffle_buffer_is_refused_where_it_reaches_nothing(data, bert_config, tmp_path, monkeypatch):
    """Only the tf.data input of a run started by an earlier version has a buffer
    (trainer/pretrain/earlier_runs_input.py); any other run reads the global order."""
    code, output = cli(*pretrain_args(data, tmp_path / "new", bert_config, "--shuffle-buffer", 50))
    assert code == 2, output
    assert ("--shuffle-buffer does not apply here: the run reads the global order (its shuffle is a pure "
            "function of --seed, with no buffer)") in output
    assert not (tmp_path / "new").exists()
    # A run of an earlier version reads through tf.data, with the buffer given (and records it).
    monkeypatch.setattr(ckpt_lib, "reads_through_tf_data", lambda run_dir: True)
    code, output = cli(*pretrain_args(data, tmp_path / "earlier", bert_config, "--shuffle-buffer", 50))
    assert code == 0, output
    assert json.loads((tmp_path / "earlier" / "train_config.json").read_text())["shuffle_buffer"] == 50


def test_a_run_of_tf_data_resumes_with_the_shuffle_buffer_it_recorded(tmp_path):
    (tmp_path / "train_config.json").write_text(json.dumps({"shuffle_buffer": 50}))
    assert recorded_shuffle_buffer(tmp_path, None) == 50 == recorded_shuffle_buffer(tmp_path, 50)
    with pytest.raises(TrainConfigError, match=r"--shuffle-buffer 16: .*train_config.json records 50"):
        recorded_shuffle_buffer(tmp_path, 16)
    (tmp_path / "train_config.json").write_text(json.dumps({"steps": 3}))  # recorded before the field
    assert recorded_shuffle_buffer(tmp_path, None) == 10000
    # Through the API too, a run of the global order records no buffer (and says so once).
    logged: list[str] = []
    cfg = TrainConfig(data="d", out="o", shuffle_buffer=50)
    assert as_run(cfg, False, logged.append).shuffle_buffer is None and len(logged) == 1
    assert as_run(cfg, True, logged.append) is cfg and len(logged) == 1


def test_configs_refuse_a_tpu_address_without_the_tpu_strategy():
    with pytest.raises(TrainConfigError, match="--tpu 'x' applies only with --strategy tpu"):
        TrainConfig(data="d", out="o", tpu="x")
    with pytest.raises(TrainConfigError, match="--tpu 'x' applies only with --strategy tpu"):
        FinetuneConfig(data="d", out="o", init_from="r", tpu="x", strategy="mirrored")
    assert TrainConfig(data="d", out="o", tpu="x", strategy="tpu").tpu == "x"


def test_eval_refuses_options_of_the_other_kind_of_run(data, bert_config, tmp_path):
    ckpt_lib.save_checkpoint(tmp_path / "pre", 1, {}, {}, {"step": 1, "bert_config": SMALL_BERT})
    for extra, message in ((["--allow-other-task"], "--allow-other-task does not apply here"),
                           (["--allow-vocab-mismatch"], "--allow-vocab-mismatch does not apply here"),
                           (["--bert-config", bert_config], "--bert-config does not apply here")):
        code, output = cli("eval", "--run", tmp_path / "pre", "--data", data, *extra)
        assert code == 2 and message in output, output
    ckpt_lib.save_checkpoint(tmp_path / "fine", 1, {}, {}, {"step": 1, "task": {"type": "classification"}})
    for extra in (["--max-batches", 2], ["--max-seq-length", 16], ["--max-predictions-per-seq", 3],
                  ["--init-checkpoint", tmp_path], ["--bert-config", bert_config]):
        code, output = cli("eval", "--run", tmp_path / "fine", "--data", data, *extra)
        assert code == 2 and f"{extra[0]} does not apply here" in output, output


def test_finetune_and_predict_refuse_what_the_task_or_run_does_not_use(bert_config, tmp_path):
    data = classification_dataset(str(tmp_path / "cls"))
    base = ["finetune", "--data", data, "--out", tmp_path / "run", "--max-steps", 1]
    cases = [
        (["--init-from", "RUN", "--bert-config", bert_config], "--bert-config does not apply here: --init-from's run"),
        (["--init-from", "RUN", "--null-score-diff-threshold", "1.5"],
         "--null-score-diff-threshold does not apply here: task "),
        (["--init-from", "RUN", "--cluster-timeout", "9"], "--cluster-timeout does not apply here"),
        (["--init-from", "RUN", "--seeds", "1,2", "--eval-split", "none"], "with --eval-split none there is none"),
    ]
    for extra, message in cases:
        code, output = cli(*base, *extra)
        assert code == 2 and message in output, output
    assert not (tmp_path / "run").exists()
    code, output = cli("predict", "--run", tmp_path / "none", "--data", data, "--split", "dev", "--out",
                       tmp_path / "pred", "--null-score-diff-threshold", "1.5")
    assert code == 2 and "--null-score-diff-threshold does not apply here" in output, output
    # SQuAD v2.0 reads it, unless nothing is evaluated.
    v2 = span_dataset(str(tmp_path / "v2"), v2=True)
    code, output = cli("finetune", "--data", v2, "--out", tmp_path / "run", "--init-from", "RUN",
                       "--null-score-diff-threshold", "1.5", "--eval-split", "none")
    assert code == 2 and "--eval-split none: nothing is predicted" in output, output


def test_export_refuses_casing_for_the_tf1_layout(tmp_path):
    for flag in ("--do-lower-case", "--no-do-lower-case"):
        code, output = cli("export", "--run", tmp_path / "run", "--format", "tf1", "--out", tmp_path / "x", flag)
        assert code == 2 and "does not apply here: the tf1 layout has no tokenizer settings" in output, output
