"""Dynamic masking of a word segmenter's data (`run --masking dynamic --word-segmenter jieba`): the
Keras trainer's inputs (the tf.data input and the global order it reads now) mask each record of
each epoch exactly as the NumPy reader does, from the words the records carry, and a run trains on it."""

from __future__ import annotations

import math

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
pytest.importorskip("jieba")

from bert_datagen.contract.loading.batches import NumpyBatches  # noqa: E402
from bert_datagen.contract.loading.source import open_source  # noqa: E402
from bert_datagen.datagen.config import DatagenConfig  # noqa: E402
from bert_datagen.datagen.record_layout import INSTANCE_KEY, WORD_BITS  # noqa: E402
from bert_datagen.pipelines.pretraining.run import generate_dataset  # noqa: E402
from bert_datagen.trainer.pretrain.config import TrainConfig  # noqa: E402
from bert_datagen.trainer.pretrain.data import open_pretraining_data, training_source  # noqa: E402
from bert_datagen.trainer.pretrain.earlier_runs_input import train_dataset  # noqa: E402
from bert_datagen.trainer.pretrain.train import pretrain  # noqa: E402
from tests.support.wwm import write_zh_corpus  # noqa: E402

MASKED = ("input_ids", "masked_lm_positions", "masked_lm_ids", "masked_lm_weights")


@pytest.fixture(scope="module")
def dataset(shared_corpora, tmp_path_factory) -> str:
    root = tmp_path_factory.mktemp("zh-dynamic")
    path, vocab = write_zh_corpus(shared_corpora, root, 3)
    config = DatagenConfig(max_seq_length=64, max_predictions_per_seq=10, dupe_factor=1, masking="dynamic",
                           whole_word_mask=True, word_segmenter="jieba", input_format="wikiextractor",
                           eval_fraction=0.2)
    generate_dataset(config, inputs=[path], vocab_path=vocab, output_dir=str(root / "data"))
    return str(root / "data")


def numpy_masks(reader: NumpyBatches, steps: int) -> dict[tuple[int, int], dict[str, np.ndarray]]:
    """(instance key, epoch) -> the record's masked features, as the NumPy reader gives them."""
    out = {}
    total = reader.order.total
    for step in range(steps):
        batch = reader.batch_at(step)
        epochs = reader.order.batch_positions(step, 1, 0) // total
        for i, (key, epoch) in enumerate(zip(batch[INSTANCE_KEY][:, 0].tolist(), epochs.tolist(), strict=True)):
            out[(key, epoch)] = {name: batch[name][i] for name in MASKED}
    return out


def test_keras_inputs_mask_as_the_numpy_reader_does(dataset):
    info = open_pretraining_data(dataset)
    assert info.word_segmented and info.features()[WORD_BITS] == ("int64", 3)
    reader = NumpyBatches(open_source(dataset), seed=9, batch_size=4)
    n = reader.order.total
    expected = numpy_masks(reader, 2 * n // 4)
    # The global order the trainer reads (trainer/runtime/ordered_input.py): the same batches.
    ordered = NumpyBatches(training_source(info), seed=9, batch_size=4)
    for step in (0, n // 4 + 1):
        got, want = ordered.batch_at(step), reader.batch_at(step)
        assert sorted(got) == sorted(want) and all(np.array_equal(got[k], want[k]) for k in want)
    # The tf.data input (runs started by earlier versions, and the eval split).
    compared = 0
    for batch in train_dataset(info, 4, seed=9, shuffle_buffer=8, keep_identity=True).take(2 * n // 4):
        assert WORD_BITS not in batch  # the words are for the masks, not the model
        keys, epochs = batch[INSTANCE_KEY].numpy(), batch["epoch"].numpy()
        for i, (key, epoch) in enumerate(zip(keys.tolist(), epochs.tolist(), strict=True)):
            if (key, epoch) in expected:
                compared += 1
                for name in MASKED:
                    assert np.array_equal(batch[name].numpy()[i], expected[(key, epoch)][name]), name
    assert compared > n // 2
    both = [k for k, e in expected if e == 0 and (k, 1) in expected]
    changed = np.mean([not np.array_equal(expected[(k, 0)]["masked_lm_positions"],
                                          expected[(k, 1)]["masked_lm_positions"]) for k in both])
    assert changed > 0.8


def test_a_run_trains_and_evaluates_on_segmented_dynamic_data(dataset, tmp_path):
    result = pretrain(TrainConfig(data=dataset, out=str(tmp_path / "run"), batch_size=4, steps=2, learning_rate=1e-3,
                                  warmup_steps=1, seed=4, checkpoint_every=2, log_every=1, eval_batches=1),
                      log=lambda _: None)
    assert math.isfinite(result["train"]["mlm_loss"]) and math.isfinite(result["eval"]["mlm_loss"])
