"""Packed pre-training rows: each sequence computes what it computes alone (no cross-contamination),
and a packed step's loss and gradient equal the unpacked step's over the same instances."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

from bert_datagen.trainer.model.bert import build_model  # noqa: E402
from bert_datagen.trainer.model.config import BertConfig  # noqa: E402
from bert_datagen.trainer.pretrain.objective import batch_sums, losses_from_sums  # noqa: E402
from bert_datagen.trainer.pretrain.step import packed_pretraining_objective, pretraining_objective  # noqa: E402
from bert_datagen.trainer.runtime.step import replica_sum  # noqa: E402
from tests.support.packed_rows import pack_instances, unbatch  # noqa: E402
from tests.support.synthetic import synthetic_batch  # noqa: E402

SEQ, PRED, VOCAB, ROW, MAX_SEQS = 32, 5, 200, 64, 4


@pytest.fixture(scope="module")
def setup():
    config = BertConfig.from_name("tiny", VOCAB, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    model = build_model(config, seed=3)
    batch = synthetic_batch(7, SEQ, PRED, VOCAB, seed=11)
    unpacked = {f.name: np.asarray(getattr(batch, f.name)) for f in dataclasses.fields(batch)
                if getattr(batch, f.name) is not None}
    unpacked["next_sentence_labels"] = unpacked["next_sentence_labels"].reshape(-1, 1)
    unpacked = {k: v.astype(np.float32 if k == "masked_lm_weights" else np.int32) for k, v in unpacked.items()}
    packed = pack_instances(unbatch(unpacked), ROW, MAX_SEQS, PRED)
    assert 1 < len(packed["input_ids"]) < 7  # several rows, several sequences in some
    return model, unpacked, packed


def test_every_packed_sequence_has_the_logits_it_has_alone(setup):
    model, unpacked, packed = setup
    alone = model({k: tf.constant(v) for k, v in unpacked.items()})
    together = model({k: tf.constant(v) for k, v in packed.items()})
    mlm_alone, nsp_alone = alone["mlm_logits"].numpy(), alone["nsp_logits"].numpy()
    mlm_packed, nsp_packed = together["mlm_logits"].numpy(), together["nsp_logits"].numpy()
    i = 0
    for r in range(len(packed["input_ids"])):
        slot = 0
        for k in range(MAX_SEQS):
            if packed["next_sentence_weights"][r, k] == 0:
                continue
            np.testing.assert_allclose(nsp_packed[r, k], nsp_alone[i], atol=1e-5)
            n = int(unpacked["masked_lm_weights"][i].sum())
            np.testing.assert_allclose(mlm_packed[r, slot:slot + n], mlm_alone[i, :n], atol=1e-5)
            slot += n
            i += 1
    assert i == len(unpacked["input_ids"])


def _loss_and_grads(model, objective, batch):
    batch = {k: tf.constant(v) for k, v in batch.items()}
    strategy = tf.distribute.get_strategy()

    def run():
        total = objective.whole_batch_total(batch, replica_sum)
        with tf.GradientTape() as tape:
            loss, sums = objective.micro_loss(batch, total, tf.constant([1, 2], tf.int64))
        return loss, sums, tape.gradient(loss, model.trainable_variables,
                                         unconnected_gradients=tf.UnconnectedGradients.ZERO)

    return strategy.extended.call_for_each_replica(run)


def _assert_same_step(model, expected: tuple, got: tuple, grad_atol: float) -> None:
    """The loss, the summed statistics and the gradient of two (objective, batch) pairs agree."""
    loss_e, sums_e, grads_e = _loss_and_grads(model, *expected)
    loss_g, sums_g, grads_g = _loss_and_grads(model, *got)
    np.testing.assert_allclose(float(loss_g), float(loss_e), rtol=1e-6)
    for name, value in losses_from_sums(sums_e).items():
        assert losses_from_sums(sums_g)[name] == pytest.approx(value, abs=1e-6)
    for var, ge, gg in zip(model.trainable_variables, grads_e, grads_g, strict=True):
        np.testing.assert_allclose(tf.convert_to_tensor(gg).numpy(), tf.convert_to_tensor(ge).numpy(),
                                   atol=grad_atol, err_msg=var.path)


def test_a_packed_step_has_the_loss_and_gradient_of_the_unpacked_step(setup):
    model, unpacked, packed = setup
    _assert_same_step(model, (pretraining_objective(model, len(unpacked["input_ids"])), unpacked),
                      (packed_pretraining_objective(model), packed), grad_atol=1e-5)


def test_compacted_prediction_slots_keep_the_loss_and_gradient(setup):
    from bert_datagen.datagen.packed import compact_predictions

    model, _, packed = setup
    compact = compact_predictions(packed, PRED)
    slots = compact["masked_lm_weights"].shape[1]
    assert slots % PRED == 0 and slots < packed["masked_lm_weights"].shape[1]  # fewer slots to compute
    assert compact["masked_lm_weights"].sum() == packed["masked_lm_weights"].sum()
    objective = packed_pretraining_objective(model)
    _assert_same_step(model, (objective, packed), (objective, compact), grad_atol=1e-6)


def test_packed_sums_count_sequences_not_rows(setup):
    model, unpacked, packed = setup
    sums = batch_sums(model({k: tf.constant(v) for k, v in packed.items()}), packed)
    assert float(sums["examples"]) == len(unpacked["input_ids"])
    assert float(sums["mlm_weight"]) == unpacked["masked_lm_weights"].sum()


def test_pretrain_reads_a_packed_dataset_and_trains(tmp_path):
    from bert_datagen.trainer.pretrain.config import TrainConfig
    from bert_datagen.trainer.pretrain.data import open_pretraining_data
    from bert_datagen.trainer.pretrain.train import pretrain
    from tests.support.packed_rows import write_packed_dataset

    data = write_packed_dataset(str(tmp_path / "packed"))
    info = open_pretraining_data(data)
    assert info.packed and info.sequences_per_row == MAX_SEQS
    assert info.features()["masked_lm_positions"] == ("int64", PRED * MAX_SEQS)
    cfg = TrainConfig(data=data, out=str(tmp_path / "run"), model="tiny", batch_size=4, steps=2, learning_rate=1e-3,
                      warmup_steps=1, seed=3, checkpoint_every=2, log_every=1, eval_batches=1, shuffle_buffer=8)
    result = pretrain(cfg, log=lambda _: None)
    assert result["step"] == 2 and np.isfinite(result["train"]["loss"])
    # Eval counts sequences: more than the rows of its batch.
    assert result["eval"]["examples"] > 4


@pytest.mark.integration
@pytest.mark.parametrize("objective", ["nsp", "doc-sentences"])
def test_pretrain_trains_on_what_bert_datagen_run_packing_writes(tmp_path, objective):
    """The two sides of the packed-row contract meet: rows written by the data pipeline (with their
    instance keys; without NSP, without NSP weights) are read and trained on by `bert-train pretrain`."""
    import dataclasses

    from bert_datagen.pipelines.pretraining.run import generate_dataset
    from bert_datagen.trainer.pretrain.config import TrainConfig
    from bert_datagen.trainer.pretrain.data import open_pretraining_data
    from bert_datagen.trainer.pretrain.train import pretrain
    from tests.support.pipeline_corpus import make_documents, write_sentence_files, write_vocab
    from tests.support.pipeline_golden import CONFIG

    write_sentence_files(tmp_path / "in", make_documents(30, seed=42, max_sentences=8), n_files=2)
    vocab = str(write_vocab(tmp_path / "vocab.txt"))
    extra = {} if objective == "nsp" else {"objective": objective, "masking_unit": "word"}
    config = dataclasses.replace(CONFIG, packing=True, **extra)
    data = str(tmp_path / "packed")
    generate_dataset(config, inputs=[str(tmp_path / "in" / "*.txt")], vocab_path=vocab, output_dir=data)
    info = open_pretraining_data(data)
    assert info.packed and info.sequences_per_row == config.max_sequences_per_row
    cfg = TrainConfig(data=data, out=str(tmp_path / "run"), model="tiny", batch_size=4, steps=2, learning_rate=1e-3,
                      warmup_steps=1, seed=3, checkpoint_every=2, log_every=1, eval_batches=1, shuffle_buffer=8)
    result = pretrain(cfg, log=lambda _: None)
    assert result["step"] == 2 and np.isfinite(result["train"]["loss"])
    assert result["eval"]["examples"] >= 4  # sequences, at least one per row
