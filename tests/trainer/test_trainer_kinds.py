"""A PyTorch or NumPy loop reads exactly the trainer's batches on every dataset kind (issue #31
point 1): fine-tuning's batches (epochs, length groups) as `bert-train finetune` reads them, and
packed pre-training rows as `bert-train pretrain` reads them, bitwise."""

from __future__ import annotations

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

from bert_datagen.contract.loading.kinds import batches_for  # noqa: E402
from bert_datagen.contract.loading.source import open_source  # noqa: E402
from bert_datagen.datagen.packed import compact_predictions  # noqa: E402
from bert_datagen.trainer.pretrain.config import TrainConfig  # noqa: E402
from bert_datagen.trainer.pretrain.train import PretrainRun  # noqa: E402
from tests.support.task_fixtures import classification_dataset, write_pretrain_run  # noqa: E402


def _same(a: dict, b: dict, where: object) -> None:
    assert sorted(a) == sorted(b), where
    for k in a:
        x, y = np.asarray(a[k]), np.asarray(b[k])
        assert x.dtype == y.dtype and x.shape == y.shape and x.tobytes() == y.tobytes(), (where, k)


@pytest.mark.parametrize("grouped", [False, True])
def test_pytorch_loop_sees_bert_train_finetunes_batches(tmp_path, grouped):
    torch = pytest.importorskip("torch")
    from bert_datagen.contract.loading.torch_adapter import torch_batches
    from bert_datagen.trainer.finetune.train import FinetuneConfig, FinetuneRun

    data = classification_dataset(str(tmp_path / "data"), n_train=110)  # 27 batches an epoch, 2 left over
    cfg = FinetuneConfig(data=data, out=str(tmp_path / "run"), init_from=write_pretrain_run(str(tmp_path / "pre")),
                         epochs=2, batch_size=4, seed=5, group_by_length=grouped, log_every=1000)
    run = FinetuneRun(cfg, log=lambda _: None)
    next_batch = run._train_input()
    try:
        trainer = [next_batch() for _ in range(run.steps_per_epoch + 4)]
    finally:
        run.input.close()
    adapter = torch_batches(open_source(data), seed=5, batch_size=4, group_by_length=grouped)
    ours = [{k: v.numpy() for k, v in b.items()} for b, _ in zip(adapter, trainer, strict=False)]
    for step, (a, b) in enumerate(zip(trainer, ours, strict=True)):
        _same(a, b, step)
    assert isinstance(ours[0]["input_ids"], np.ndarray) and torch.is_tensor(next(iter(adapter))["input_ids"])
    if grouped:
        assert len({b["input_ids"].shape[1] for b in trainer}) > 1


def test_numpy_reader_sees_bert_train_pretrains_packed_rows(tmp_path):
    from tests.support.packed_rows import write_packed_dataset

    data = write_packed_dataset(str(tmp_path / "packed"))
    cfg = TrainConfig(data=data, out=str(tmp_path / "run"), model="tiny", batch_size=4, steps=2, learning_rate=1e-3,
                      warmup_steps=1, seed=3, log_every=1, eval_batches=1)
    run = PretrainRun(cfg, log=lambda _: None)
    reader = batches_for(open_source(data), seed=3, batch_size=4)
    for step in (0, 7, 30):  # 30: past the first epoch
        ours = reader.batch_at(step)
        _same(run.batches.batch_at(step), ours, step)  # what the trainer reads
        # ... and what its step takes: the MLM slots no row of the batch uses cut off
        _same(run._batch_for_step(step), compact_predictions(ours, run.info.max_predictions_per_seq), step)
