"""The trainer on data without NSP and with dynamic masking: the input pipeline's masks are
`bert_datagen.datagen.dynamic.mask_records` of (run seed, record, epoch), new each epoch; a run stopped
mid-epoch resumes bitwise; no NSP loss or metrics."""

from __future__ import annotations

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

from bert_datagen.contract.fs import LOCAL_FS  # noqa: E402
from bert_datagen.contract.loading.source import masking_config  # noqa: E402
from bert_datagen.contract.vocab_io import load_vocab  # noqa: E402
from bert_datagen.datagen.dynamic import mask_records  # noqa: E402
from bert_datagen.datagen.example_exact import decode_example  # noqa: E402
from bert_datagen.datagen.tfrecord import iter_tfrecords  # noqa: E402
from bert_datagen.trainer.pretrain.config import TrainConfig  # noqa: E402
from bert_datagen.trainer.pretrain.data import open_pretraining_data  # noqa: E402
from bert_datagen.trainer.pretrain.earlier_runs_input import train_dataset  # noqa: E402
from bert_datagen.trainer.pretrain.train import pretrain  # noqa: E402
from bert_datagen.trainer.runtime import checkpoint as ckpt_lib  # noqa: E402
from tests.support.pipeline_corpus import write_dynamic_dataset  # noqa: E402


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> str:
    return write_dynamic_dataset(tmp_path_factory.mktemp("dynamic"), 40, "span")


def unmasked_records(files: list[str]) -> dict[int, dict[str, np.ndarray]]:
    out = {}
    for path in files:
        with open(path, "rb") as stream:
            for payload in iter_tfrecords(stream, name=path):
                features = decode_example(payload)
                out[int(features["instance_key"][0])] = features
    return out


def test_the_pipeline_masks_each_record_by_seed_identity_and_epoch(dataset):
    info = open_pretraining_data(dataset)
    assert (info.objective, info.masking) == ("doc-sentences", "dynamic")
    stored = unmasked_records(info.train_files)
    n = len(stored)
    config, vocab = masking_config(info.manifest), load_vocab(f"{dataset}/vocab.txt", LOCAL_FS)
    batch_size = 4
    seen: dict[tuple[int, int], np.ndarray] = {}
    batches = train_dataset(info, batch_size, seed=9, shuffle_buffer=8, keep_identity=True)
    for batch in batches.take(3 * n // batch_size):
        keys, epochs = batch["instance_key"].numpy(), batch["epoch"].numpy()
        ids = np.stack([stored[int(k)]["input_ids"] for k in keys])
        mask = np.stack([stored[int(k)]["input_mask"] for k in keys])
        expected = mask_records(ids, mask, keys, epochs, 9, config, vocab)
        assert np.array_equal(batch["input_ids"].numpy(), expected.input_ids)
        assert np.array_equal(batch["masked_lm_positions"].numpy(), expected.masked_lm_positions)
        assert np.array_equal(batch["masked_lm_ids"].numpy(), expected.masked_lm_ids)
        assert "next_sentence_labels" not in batch
        for k, e, row in zip(keys.tolist(), epochs.tolist(), batch["masked_lm_positions"].numpy(), strict=True):
            assert (k, e) not in seen  # each record once per epoch
            seen[(k, e)] = row
    epochs_seen = {e for _, e in seen}
    assert {0, 1} <= epochs_seen
    both = [k for k in stored if (k, 0) in seen and (k, 1) in seen]
    assert len(both) > n // 2
    changed = np.mean([not np.array_equal(seen[(k, 0)], seen[(k, 1)]) for k in both])
    assert changed > 0.8  # a new mask each epoch


def test_dynamic_run_resumes_bitwise_mid_epoch_without_nsp(dataset, tmp_path):
    def cfg(out: str, **kw) -> TrainConfig:
        return TrainConfig(data=dataset, out=str(tmp_path / out), batch_size=8, steps=14, learning_rate=1e-3,
                           warmup_steps=1, seed=4, checkpoint_every=5, log_every=7, eval_batches=1,
                           shuffle_buffer=16, **kw)

    logs: list[str] = []
    full = pretrain(cfg("a"), log=logs.append)
    pretrain(cfg("b"), log=lambda _: None, stop_at=5)  # an epoch is about 10 steps here
    pretrain(cfg("b"), log=lambda _: None)
    for file in (ckpt_lib.MODEL_FILE, ckpt_lib.OPTIMIZER_FILE):
        a = ckpt_lib.load_arrays(ckpt_lib.resolve_checkpoint(tmp_path / "a"), file)
        b = ckpt_lib.load_arrays(ckpt_lib.resolve_checkpoint(tmp_path / "b"), file)
        assert all(a[k].tobytes() == b[k].tobytes() for k in a), file
    assert "nsp_accuracy" not in full["eval"] and "nsp_loss" not in full["train"]
    assert full["eval"]["loss"] == pytest.approx(full["eval"]["mlm_loss"])
    assert not any("nsp_acc" in line for line in logs)


def test_accumulation_sees_the_same_masks(dataset, tmp_path):
    """Masks are drawn before a batch is cut into micro-steps: accumulation computes the same update
    (another mask would move the weights far more than the summation order does)."""
    from bert_datagen.trainer.model.config import BertConfig

    bert = BertConfig.from_name("tiny", json_vocab_size(dataset)).to_dict()  # dropout on

    def run(out: str, accumulation: int) -> dict:
        pretrain(TrainConfig(data=dataset, out=str(tmp_path / out), bert_config=bert, batch_size=8, steps=4,
                             learning_rate=1e-3, warmup_steps=1, seed=4, checkpoint_every=4, log_every=4,
                             eval_batches=1, shuffle_buffer=16, accumulation_steps=accumulation),
                 log=lambda _: None)
        return ckpt_lib.load_arrays(ckpt_lib.resolve_checkpoint(tmp_path / out), ckpt_lib.MODEL_FILE)

    full, acc = run("full", 1), run("acc", 2)
    for k in full:
        np.testing.assert_allclose(acc[k], full[k], atol=2e-6, rtol=1e-5, err_msg=k)


def json_vocab_size(dataset: str) -> int:
    import json
    from pathlib import Path

    return int(json.loads((Path(dataset) / "manifest.json").read_text())["vocab"]["size"])
