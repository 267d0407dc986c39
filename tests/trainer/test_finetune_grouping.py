"""Length-grouped fine-tuning batches and trimmed prediction batches: a bounded set of shapes, a
deterministic order, exact resume, and predictions equal to padded-to-max ones."""

from __future__ import annotations

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

from bert_datagen.contract.loading.task_batches import bucket_lengths  # noqa: E402
from bert_datagen.trainer.finetune.data import open_task_dataset  # noqa: E402
from bert_datagen.trainer.finetune.evaluate import evaluate_split, predict_arrays  # noqa: E402
from bert_datagen.trainer.finetune.tf_data import ordered_batches, train_batches  # noqa: E402
from bert_datagen.trainer.model import heads  # noqa: E402
from tests.support.task_fixtures import classification_dataset, tagging_dataset, tiny_bert  # noqa: E402


def test_bucket_lengths_are_few_and_end_at_the_maximum():
    assert bucket_lengths(128) == [16, 32, 48, 64, 80, 96, 112, 128]
    assert bucket_lengths(384) == [48, 96, 144, 192, 240, 288, 336, 384]
    assert bucket_lengths(100) == [16, 32, 40, 56, 64, 80, 88, 100]
    assert bucket_lengths(16) == [8, 16]


def test_finetune_help_states_the_lengths_grouping_uses():
    """`--group-by-length`'s help once said 4 lengths while the code used 8."""
    import re

    from click.testing import CliRunner

    from bert_datagen.trainer.cli import main

    help_text = " ".join(CliRunner().invoke(main, ["finetune", "--help"], terminal_width=1000).output.split())
    stated = re.search(r"pad each batch to one of at most (\d+) lengths \(k/(\d+) of", help_text)
    assert stated is not None, help_text
    most = max(len(bucket_lengths(n)) for n in range(8, 1025, 8))
    assert int(stated.group(1)) == int(stated.group(2)) == most == len(bucket_lengths(128))


def _epoch(split, seed, epoch, skip=0):
    ds = train_batches(split, 4, seed, epoch, group_by_length=True)
    return [{k: v.numpy() for k, v in b.items()} for b in (ds.skip(skip) if skip else ds)]


def test_grouped_batches_are_a_pure_function_of_seed_and_epoch(tmp_path):
    split = open_task_dataset(classification_dataset(str(tmp_path / "d"), n_train=250)).split("train")
    first = _epoch(split, 5, 0)
    assert len(first) == 250 // 4  # as many steps per epoch as without grouping
    lengths = {b["input_ids"].shape[1] for b in first}
    assert lengths <= set(bucket_lengths(16)) and len(lengths) == 2
    for b in first:  # cut to the batch's bucket, never below its longest example
        longest = int(b["input_mask"].sum(axis=1).max())
        assert b["input_ids"].shape[1] == min(n for n in bucket_lengths(16) if n >= longest)
    ids = [tuple(row[row > 0]) for b in first for row in b["input_ids"]]
    assert len(ids) == 248
    again = _epoch(split, 5, 0)
    for a, b in zip(first, again, strict=True):
        for k in a:
            np.testing.assert_array_equal(a[k], b[k])
    # Resuming at step 7 of the epoch reads exactly the batches from 7 on.
    for a, b in zip(first[7:], _epoch(split, 5, 0, skip=7), strict=True):
        np.testing.assert_array_equal(a["input_ids"], b["input_ids"])
    other = _epoch(split, 5, 1)
    assert any(a["input_ids"].shape != b["input_ids"].shape or (a["input_ids"] != b["input_ids"]).any()
               for a, b in zip(first, other, strict=True))


@pytest.mark.parametrize("kind", ["classification", "tagging"])
def test_trimmed_predictions_equal_padded_to_max(tmp_path, kind):
    if kind == "classification":
        data = open_task_dataset(classification_dataset(str(tmp_path / "d"), n_dev=40))
        model = heads.build_finetune_model(tiny_bert(), "classification", 2, seed=1)
    else:
        data = open_task_dataset(tagging_dataset(str(tmp_path / "d"), n_dev=24))
        model = heads.build_finetune_model(tiny_bert(), "tagging", data.num_labels, seed=1)
    split = data.split("dev")
    full = predict_arrays(model, split, 2, trim=False)
    trimmed = predict_arrays(model, split, 2, trim=True)
    assert trimmed["logits"].shape == full["logits"].shape
    from bert_datagen.trainer.finetune import evaluate as ev
    from bert_datagen.trainer.runtime.inference import model_predictor

    assert set(model_predictor(model, "tensorflow").functions) == {8, 16}  # some batches ran at 8 tokens
    if kind == "classification":
        np.testing.assert_allclose(trimmed["logits"], full["logits"], atol=1e-5)
        np.testing.assert_array_equal(trimmed["logits"].argmax(-1), full["logits"].argmax(-1))
    else:  # padding positions are never read (their logits come back as zeros)
        real = np.concatenate([b["input_mask"].numpy() for b in ordered_batches(split, 2)]).astype(bool)
        np.testing.assert_allclose(trimmed["logits"][real], full["logits"][real], atol=1e-5)
        np.testing.assert_array_equal(trimmed["logits"][real].argmax(-1), full["logits"][real].argmax(-1))
    # evaluate_split trims these task types; its metrics are the padded-to-max ones.
    result = evaluate_split(model, data, "dev", 2, need_labels=True)
    assert result.metrics  # computed from the trimmed run
    ev_full = ev.SplitPredictions(data.task_type, full)
    (ev._classification if kind == "classification" else ev._tagging)(ev_full, data, split)
    assert ev_full.metrics == result.metrics


@pytest.mark.integration
def test_a_grouped_run_resumes_exactly(tmp_path):
    from bert_datagen.trainer.finetune.train import FinetuneConfig, finetune
    from bert_datagen.trainer.runtime import checkpoint as ckpt_lib
    from tests.support.task_fixtures import write_pretrain_run

    init = write_pretrain_run(str(tmp_path / "pre"))
    data = classification_dataset(str(tmp_path / "data"))

    def cfg(out, **kw):
        return FinetuneConfig(data=data, out=str(tmp_path / out), init_from=init, epochs=2, learning_rate=1e-3,
                              batch_size=4, log_every=1000, seed=5, group_by_length=True, **kw)

    def weights(out):
        return ckpt_lib.load_arrays(ckpt_lib.resolve_checkpoint(tmp_path / out), ckpt_lib.MODEL_FILE)

    a = finetune(cfg("a"), log=lambda _: None)
    finetune(cfg("b", checkpoint_every=7), log=lambda _: None, stop_at=31)  # mid-epoch 2
    b = finetune(cfg("b", checkpoint_every=7), log=lambda _: None)
    wa, wb = weights("a"), weights("b")
    assert all(np.array_equal(wa[k], wb[k]) for k in wa)
    assert a["history"] == b["history"]
