"""The Keras trainer reads the global sample order (docs/loading.md): its batch k is the NumPy
reader's and the PyTorch adapter's batch k byte for byte, each worker of a cluster reads only its
share, `--skip-batches` leaves out global batches deterministically, fine-tuning epochs are whole
shuffles, and runs of earlier versions (tf.data iterator state in their checkpoints) resume as
they started."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

from click.testing import CliRunner  # noqa: E402

from bert_datagen.contract.loading.batches import NumpyBatches  # noqa: E402
from bert_datagen.contract.loading.source import open_source  # noqa: E402
from bert_datagen.contract.loading.task_batches import bucket_lengths  # noqa: E402
from bert_datagen.trainer.errors import TrainConfigError  # noqa: E402
from bert_datagen.trainer.finetune.ordered import FinetuneBatches  # noqa: E402
from bert_datagen.trainer.pretrain import train as train_mod  # noqa: E402
from bert_datagen.trainer.pretrain.config import TrainConfig  # noqa: E402
from bert_datagen.trainer.pretrain.train import PretrainRun, pretrain  # noqa: E402
from bert_datagen.trainer.runtime import checkpoint as ckpt_lib  # noqa: E402
from bert_datagen.trainer.runtime import cluster  # noqa: E402
from tests.support.synthetic import write_synthetic_dataset  # noqa: E402
from tests.support.task_fixtures import classification_dataset  # noqa: E402

B = 8


def _dataset(tmp_path_factory, masking: str) -> str:
    return write_synthetic_dataset(str(tmp_path_factory.mktemp("data") / "ds"), seq_len=32, max_pred=5,
                                   vocab_size=120, train_shards=3, records_per_shard=40, eval_records=16,
                                   masking=masking)


@pytest.fixture(scope="module")
def static(tmp_path_factory) -> str:
    return _dataset(tmp_path_factory, "static")


@pytest.fixture(scope="module", params=["static", "dynamic"])
def dataset(request, tmp_path_factory, static) -> str:
    return static if request.param == "static" else _dataset(tmp_path_factory, "dynamic")


def config(data: str, out: Path, **kw) -> TrainConfig:
    base = dict(data=data, out=str(out), model="tiny", batch_size=B, steps=4, learning_rate=2e-3,
                warmup_steps=1, seed=3, checkpoint_every=2, keep_checkpoints=3, log_every=2, eval_batches=1)
    base.update(kw)
    return TrainConfig(**base)


def as_numpy(batch: dict) -> dict[str, np.ndarray]:
    return {k: np.asarray(v) for k, v in batch.items()}


def assert_same(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for k in a:
        assert a[k].dtype == b[k].dtype and a[k].tobytes() == b[k].tobytes(), k


def trainer_batch(run: PretrainRun, step: int) -> dict[str, np.ndarray]:
    return as_numpy(train_mod.with_sequence_weights(run._batch_for_step(step)))


def test_each_workers_trainer_input_is_its_share_of_the_loaders_global_batch(dataset, tmp_path, monkeypatch):
    reference = NumpyBatches(open_source(dataset), seed=3, batch_size=B)
    steps = (0, 6, 17)  # 15 batches an epoch: 17 is in the second
    one = PretrainRun(config(dataset, tmp_path / "r"), log=lambda _: None)
    for step in steps:
        ref = reference.batch_at(step)
        ref.pop("instance_key", None)  # dynamic data: the masks are made from it, the model does not read it
        assert_same(trainer_batch(one, step), ref)
    dynamic = json.loads(Path(dataset, "manifest.json").read_text())["config"].get("masking") == "dynamic"
    for world in (2,) if dynamic else (4,):  # one split of each kind of data is enough
        runs = []
        for rank in range(world):
            monkeypatch.setitem(cluster._joined, "task", cluster.ClusterTask([f"h:{p}" for p in range(world)], rank))
            runs.append(PretrainRun(config(dataset, tmp_path / "r"), log=lambda _: None))
        for step in steps:
            shares = [trainer_batch(run, step) for run in runs]
            assert all(len(s["input_ids"]) == B // world for s in shares)
            whole = {k: np.concatenate([s[k] for s in shares]) for k in shares[0]}
            assert_same(whole, trainer_batch(one, step))


def test_the_pytorch_adapter_gives_the_trainers_batches(dataset, tmp_path):
    torch = pytest.importorskip("torch")
    from bert_datagen.contract.loading.torch_adapter import torch_batches

    run = PretrainRun(config(dataset, tmp_path / "r"), log=lambda _: None)
    adapter = torch_batches(open_source(dataset), seed=3, batch_size=B, world_size=1, rank=0, start=5)
    for step, batch in zip(range(5, 8), adapter.loader(num_workers=0), strict=False):
        batch = {k: v.numpy() for k, v in batch.items() if k != "instance_key"}
        assert_same(batch, trainer_batch(run, step))
    assert isinstance(torch.__version__, str)


def test_skip_batches_on_resume_equals_skipping_from_the_start_and_is_recorded(static, tmp_path):
    dataset = static
    pretrain(config(dataset, tmp_path / "a", skip_batches=[[2, 3]]), log=lambda _: None)
    pretrain(config(dataset, tmp_path / "b"), stop_at=2, log=lambda _: None)
    lines: list[str] = []
    pretrain(config(dataset, tmp_path / "b", skip_batches=[[2, 3]]), log=lines.append)
    assert any("skipping global batches 2-3" in line for line in lines)
    a, b = (ckpt_lib.resolve_checkpoint(tmp_path / r) for r in "ab")
    assert ckpt_lib.load_state(b)["input"]["skip_batches"] == [[2, 3]]
    for name, value in ckpt_lib.load_arrays(a, ckpt_lib.MODEL_FILE).items():
        assert value.tobytes() == ckpt_lib.load_arrays(b, ckpt_lib.MODEL_FILE)[name].tobytes(), name
    # Steps 2 and 3 read global batches 4 and 5.
    run = PretrainRun(config(dataset, tmp_path / "c", skip_batches=[[2, 3]]), log=lambda _: None)
    run.restore_or_initialise()
    assert_same(trainer_batch(run, 3), as_numpy(NumpyBatches(open_source(dataset), seed=3, batch_size=B).batch_at(5)))
    # The same command again is fine; skipping what the run has trained on is refused.
    pretrain(config(dataset, tmp_path / "b", skip_batches=[[2, 3]]), log=lambda _: None)
    with pytest.raises(TrainConfigError, match=r"--skip-batches batches 1-1: the run has already trained on global "
                                          r"batches up to 5"):
        pretrain(config(dataset, tmp_path / "b", skip_batches=[[1, 1]]), log=lambda _: None)


@pytest.mark.parametrize("value", ["5-2", "x", "-3"])
def test_a_malformed_skip_range_is_a_usage_error(value, tmp_path):
    from bert_datagen.trainer.cli import main

    result = CliRunner().invoke(main, ["pretrain", "--data", str(tmp_path), "--out", str(tmp_path / "r"),
                                       "--steps", "2", "--skip-batches", value])
    assert result.exit_code == 2 and "--skip-batches" in result.output and "Traceback" not in result.output


def test_a_run_of_an_earlier_version_resumes_through_tf_data(static, tmp_path, monkeypatch):
    dataset = static
    with monkeypatch.context() as m:  # runs as an earlier version did: tf.data, iterator state saved
        m.setattr(ckpt_lib, "reads_through_tf_data", lambda run_dir: True)
        pretrain(config(dataset, tmp_path / "whole", shuffle_buffer=50), log=lambda _: None)
        pretrain(config(dataset, tmp_path / "resumed", shuffle_buffer=50), stop_at=2, log=lambda _: None)
    assert any(p.name.startswith("input.") for p in ckpt_lib.resolve_checkpoint(tmp_path / "resumed").iterdir())
    pretrain(config(dataset, tmp_path / "resumed", shuffle_buffer=50), log=lambda _: None)
    whole, resumed = (ckpt_lib.resolve_checkpoint(tmp_path / r) for r in ("whole", "resumed"))
    assert "input" not in ckpt_lib.load_state(resumed)
    for name, value in ckpt_lib.load_arrays(whole, ckpt_lib.MODEL_FILE).items():
        assert value.tobytes() == ckpt_lib.load_arrays(resumed, ckpt_lib.MODEL_FILE)[name].tobytes(), name


@pytest.mark.parametrize("grouped", [False, True])
def test_finetuning_epochs_are_whole_shuffles_and_workers_share_each_batch(tmp_path, grouped):
    data = classification_dataset(str(tmp_path / "d"), n_train=250)
    per_epoch = 250 // 4
    one = FinetuneBatches(data, "train", 5, 4, per_epoch, 1, 0, grouped)
    epoch = [one.batch(s) for s in range(per_epoch)]
    keys = Counter(tuple(row[row > 0]) for b in epoch for row in b["input_ids"])
    split = one.batches.source
    records = [split.read(i, 0, n)["input_ids"] for i, n in enumerate(split.counts)]
    every = Counter(tuple(row[row > 0]) for shard in records for row in shard)
    assert sum(keys.values()) == 248 and keys <= every  # no example more often than the split has it
    if grouped:
        lengths = {b["input_ids"].shape[1] for b in epoch}
        assert lengths <= set(bucket_lengths(16)) and len(lengths) == 2
    again = FinetuneBatches(data, "train", 5, 4, per_epoch, 1, 0, grouped)
    for step in (per_epoch + 3, 7):  # any step, in any order: a resume recomputes it
        assert_same(again.batch(step), one.batch(step))
    second = [one.batch(per_epoch + s)["input_ids"] for s in range(3)]
    assert any(a.shape != b["input_ids"].shape or (a != b["input_ids"]).any() for a, b in zip(second, epoch, strict=False))
    shares = [FinetuneBatches(data, "train", 5, 4, per_epoch, 2, r, grouped) for r in range(2)]
    for step in (0, 9, per_epoch + 1):
        parts = [s.batch(step) for s in shares]
        assert_same({k: np.concatenate([p[k] for p in parts]) for k in parts[0]}, one.batch(step))
