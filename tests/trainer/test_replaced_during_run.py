"""Issue #43 point 1: `bert-train pretrain` and `finetune` whose --data is replaced mid-run (as `run
--overwrite` and `task --overwrite` replace it) stop with exit 1 and one error line before they use a
record of the new dataset: no checkpoint from mixed data, no figures of an eval split read across
the replacement. Locally and in a bucket (moto's S3 server on 127.0.0.1)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

from click.testing import CliRunner  # noqa: E402

from bert_datagen.contract.loading.batches import NumpyBatches  # noqa: E402
from bert_datagen.contract.loading.task_batches import TaskBatches  # noqa: E402
from bert_datagen.trainer.cli import main  # noqa: E402
from bert_datagen.trainer.errors import DataError  # noqa: E402
from bert_datagen.trainer.finetune.data import open_task_dataset  # noqa: E402
from bert_datagen.trainer.finetune.tf_data import ordered_batches, split_data_error  # noqa: E402
from bert_datagen.trainer.pretrain.data import open_pretraining_data  # noqa: E402
from bert_datagen.trainer.pretrain.evaluate import evaluate_model  # noqa: E402
from bert_datagen.trainer.runtime.ordered_input import OrderedInput  # noqa: E402
from tests.support.replacing import replace_dataset  # noqa: E402
from tests.support.servers import upload_tree  # noqa: E402
from tests.support.synthetic import write_synthetic_dataset  # noqa: E402
from tests.support.task_fixtures import classification_dataset, tiny_bert, write_pretrain_run  # noqa: E402

pytestmark = pytest.mark.timeout(300)

SMALL_BERT = {"vocab_size": 40, "hidden_size": 16, "num_hidden_layers": 1, "num_attention_heads": 2,
              "intermediate_size": 32, "max_position_embeddings": 16}
B = 8  # pre-training: a window of the global order is B * 64 records, 64 steps
REPLACED = "the dataset was replaced while this command read it"


def _pretraining(directory: str, seed: int) -> str:
    # 640 records: a full window of 512 (steps 1-64), then the epoch's tail.
    return write_synthetic_dataset(directory, seq_len=16, max_pred=3, vocab_size=40, train_shards=4,
                                   records_per_shard=160, eval_records=16, seed=seed)


def _task(directory: str, seed: int) -> str:
    return classification_dataset(directory, n_train=120, n_dev=8, seed=seed)  # 60 steps of 2, windows of 50


def _placed(tmp_path: Path, bucket: str | None, make) -> str:
    """A dataset ``make`` writes, locally or in a bucket (the S3 server of tests/conftest.py)."""
    local = make(str(tmp_path / "data"), 1)
    if bucket is None:
        return local
    upload_tree(Path(local), f"{bucket}/data")
    return f"{bucket}/data"


def _replace_at(monkeypatch, reader: type, at: int, target: str, make) -> list[int]:
    """Replace ``target`` by ``make(dir, 2)`` as the run's input asks ``reader`` for step ``at`` (after
    that batch is read): the steps it asked for are listed."""
    asked: list[int] = []
    original = reader.batch_at

    def batch_at(self, step: int):
        batch = original(self, step)
        asked.append(step)
        if step == at:
            replace_dataset(target, lambda d: make(d, 2))
        return batch

    monkeypatch.setattr(reader, "batch_at", batch_at)
    return asked


def _one_error_line(result) -> str:
    assert result.exit_code == 1, result.output
    errors = [line for line in result.output.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1 and "Traceback" not in result.output, result.output
    return errors[0]


def _checkpoints(run: Path) -> list[int]:
    return sorted(int(p.name.split("-")[1]) for p in run.glob("ckpt-*"))


def test_pretraining_stops_before_its_first_batch_of_a_replacing_dataset(tmp_path, monkeypatch):
    _pretrain_across_a_replacement(tmp_path, monkeypatch, None)


@pytest.mark.parametrize("bucket", ["s3"], indirect=True)
def test_pretraining_on_a_bucket_stops_before_its_first_batch_of_a_replacing_dataset(tmp_path, monkeypatch, bucket):
    _pretrain_across_a_replacement(tmp_path, monkeypatch, bucket)


def _pretrain_across_a_replacement(tmp_path: Path, monkeypatch, bucket: str | None) -> None:
    data = _placed(tmp_path, bucket, _pretraining)
    config = tmp_path / "bert.json"
    config.write_text(json.dumps(SMALL_BERT))
    asked = _replace_at(monkeypatch, NumpyBatches, 1, data, _pretraining)
    run = tmp_path / "run"
    result = CliRunner().invoke(main, ["pretrain", "--data", data, "--out", str(run), "--bert-config", str(config),
                                       "--batch-size", str(B), "--steps", "80", "--warmup-steps", "1",
                                       "--checkpoint-every", "10", "--log-every", "10", "--eval-batches", "1"])
    line = _one_error_line(result)
    assert REPLACED in line and "manifest.json" in line
    assert max(asked) == 63  # the first window's 64 batches; the next window's was refused
    # Steps 1-64 trained on the first window, read before the replacement: no checkpoint after them,
    # no final figures of an eval split read across it.
    assert _checkpoints(run) and max(_checkpoints(run)) <= 64
    assert not (run / "final_metrics.json").exists()


def test_pretraining_eval_read_across_a_replacement_gives_no_figures(tmp_path):
    data = _pretraining(str(tmp_path / "data"), 1)
    info = open_pretraining_data(data)
    calls = []

    def eval_step(batch):  # the model's sums, as evaluate_model adds them up
        if not calls:
            replace_dataset(data, lambda d: _pretraining(d, 2))
        calls.append(len(batch["input_ids"]))
        return {"mlm_ce": 1.0, "mlm_weight": 1.0, "mlm_correct": 1.0, "examples": 4.0, "nsp_ce": 1.0,
                "nsp_correct": 1.0}

    with pytest.raises(DataError, match=REPLACED):
        evaluate_model(eval_step, info, 4, None)
    assert calls  # it read eval batches, then refused their figures


def test_finetuning_stops_before_its_first_batch_of_a_replacing_dataset(tmp_path, monkeypatch):
    _finetune_across_a_replacement(tmp_path, monkeypatch, None)


@pytest.mark.parametrize("bucket", ["s3"], indirect=True)
def test_finetuning_on_a_bucket_stops_before_its_first_batch_of_a_replacing_dataset(tmp_path, monkeypatch, bucket):
    _finetune_across_a_replacement(tmp_path, monkeypatch, bucket)


def _finetune_across_a_replacement(tmp_path: Path, monkeypatch, bucket: str | None) -> None:
    data = _placed(tmp_path, bucket, _task)
    init = write_pretrain_run(str(tmp_path / "pre"), tiny_bert())
    asked = _replace_at(monkeypatch, TaskBatches, 1, data, _task)
    run = tmp_path / "run"
    result = CliRunner().invoke(main, ["finetune", "--data", data, "--out", str(run), "--init-from", init,
                                       "--epochs", "1", "--batch-size", "2", "--learning-rate", "1e-3",
                                       "--checkpoint-every", "10", "--keep-checkpoints", "10", "--seed", "5"])
    line = _one_error_line(result)
    assert REPLACED in line and "manifest.json" in line
    assert max(asked) == 49  # the first window's 50 batches; the next window's was refused
    assert _checkpoints(run) and max(_checkpoints(run)) <= 50


def test_finetuning_eval_split_replaced_after_training_writes_no_checkpoint_of_it(tmp_path, monkeypatch):
    data = _task(str(tmp_path / "data"), 1)
    init = write_pretrain_run(str(tmp_path / "pre"), tiny_bert())
    _replace_at(monkeypatch, TaskBatches, 59, data, _task)  # the last step's batch: training ends on old data
    run = tmp_path / "run"
    result = CliRunner().invoke(main, ["finetune", "--data", data, "--out", str(run), "--init-from", init,
                                       "--epochs", "1", "--batch-size", "2", "--learning-rate", "1e-3",
                                       "--checkpoint-every", "50", "--keep-checkpoints", "10", "--seed", "5"])
    line = _one_error_line(result)
    assert REPLACED in line
    # The epoch's evaluation (before its checkpoint) read the new dev split and stopped: no step-60
    # checkpoint, no figures.
    assert _checkpoints(run) == [50] and not (run / "final_metrics.json").exists()


def test_a_task_split_read_through_tf_data_stops_at_a_replacement(tmp_path):
    data = _task(str(tmp_path / "data"), 1)
    split = open_task_dataset(data).split("dev")
    before = [b["input_ids"].numpy() for b in ordered_batches(split, 2)]
    assert len(before) == 4
    replace_dataset(data, lambda d: _task(d, 2))
    with pytest.raises(tf.errors.InvalidArgumentError) as raised:
        for _ in ordered_batches(split, 2):
            pass
    error = split_data_error(split, raised.value)
    assert REPLACED in str(error) and str(error).count("\n") == 0
    assert np.concatenate(before).size  # (the old dataset's batches came out whole before)


def test_a_task_split_replaced_since_the_run_opened_it_gives_no_batch(tmp_path):
    from bert_datagen.trainer.finetune.data import read_split
    from bert_datagen.trainer.finetune.ordered import FinetuneBatches

    data = _task(str(tmp_path / "data"), 1)
    dataset = open_task_dataset(data)
    assert [len(b["input_ids"]) for b in read_split(dataset.split("dev"), 3)] == [3, 3, 2]
    replace_dataset(data, lambda d: _task(d, 2))
    with pytest.raises(DataError, match=REPLACED):
        next(read_split(dataset.split("dev"), 3))
    train = dataset.split("train")
    batches = FinetuneBatches(data, "train", 5, 2, 60, 1, 0, False, version=train.manifest_version)
    ordered = OrderedInput(batches.batch, 0)  # the run's input: the loader's error as its own
    try:
        with pytest.raises(DataError, match=REPLACED):
            ordered.next()
    finally:
        ordered.close()
