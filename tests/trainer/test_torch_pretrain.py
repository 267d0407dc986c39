"""Hugging Face `BertForPreTraining` trained through the package's PyTorch glue (examples/torch_pretrain.py):
from the weights our Keras trainer starts with, its loss on the loaders' first batch equals the
Keras model's (no dropout), and its training loop runs."""

from __future__ import annotations

import math

import pytest

pytest.importorskip("tensorflow")
torch = pytest.importorskip("torch", reason="torch is not installed (the interop-test extra)")
pytest.importorskip("transformers", reason="transformers is not installed (the interop-test extra)")

from bert_datagen.contract.loading.batches import NumpyBatches  # noqa: E402
from bert_datagen.contract.loading.source import open_source  # noqa: E402
from bert_datagen.contract.loading.torch_shares import share_loader  # noqa: E402
from examples.torch_pretrain import TOLERANCE, export_to_hf, hf_loss, keras_loss, keras_model, train  # noqa: E402
from tests.support.synthetic import write_synthetic_dataset  # noqa: E402

pytestmark = pytest.mark.integration
SEED, BATCH = 7, 8


def test_first_batch_loss_matches_keras_and_training_runs(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    data = write_synthetic_dataset(str(tmp_path / "data"), train_shards=2, records_per_shard=24, eval_records=0)
    source = open_source(data)
    first = NumpyBatches(source, seed=SEED, batch_size=BATCH).batch_at(0)

    keras = keras_model(200, SEED)
    ours = keras_loss(keras, first)
    hf = export_to_hf(keras, str(tmp_path / "hf"))
    theirs = hf_loss(hf, first)
    assert math.isfinite(ours) and ours > 1.0  # an untrained model: about ln(200) + ln(2)
    assert abs(ours - theirs) <= TOLERANCE, (ours, theirs)

    torch.manual_seed(SEED)
    before = hf.cls.predictions.bias.detach().clone()
    losses = train(hf, share_loader(source, seed=SEED, batch_size=BATCH, stop=4), steps=4, lr=1e-3,
                   log_every=1, log=lambda _: None)
    assert len(losses) == 4 and all(math.isfinite(x) for x in losses)
    assert not torch.equal(before, hf.cls.predictions.bias)
