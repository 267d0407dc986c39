"""What pre-training trains: the original MLM + NSP loss (`objective.py`) as the `Objective` each
backend's step minimises (`runtime/objective.py`), unpacked or over packed rows, the eval figures
beside it, and the run's `TrainingSpec` (`runtime/training.py`)."""

from __future__ import annotations

from collections.abc import Callable

from keras import ops

from bert_datagen.trainer.interop.restore import dtype_policy
from bert_datagen.trainer.model.bert import BertPretrainer, build_model, tf1_variable_map
from bert_datagen.trainer.model.config import BertConfig
from bert_datagen.trainer.pretrain.config import TrainConfig
from bert_datagen.trainer.pretrain.objective import MLM_DENOMINATOR_EPSILON, batch_sums
from bert_datagen.trainer.runtime.objective import Objective
from bert_datagen.trainer.runtime.training import TrainingSpec

PRETRAINING_DROPOUT_SALT = 0x5EED


def pretraining_objective(model: BertPretrainer, batch_size: int) -> Objective:
    """The original MLM + NSP loss: MLM cross-entropy over the batch's MLM weight sum, NSP over its
    example count."""
    global_examples = float(batch_size)

    def whole_batch_total(batch, reduce):
        return reduce(ops.sum(ops.cast(batch["masked_lm_weights"], "float32")))

    def micro_loss(part, weight_total, seed):
        out = model(part, training=True, dropout_seed=seed)
        sums = batch_sums(out, part)
        # This part's share of the whole batch's loss (trainer/runtime/step.py says why).
        return sums["mlm_ce"] / (weight_total + MLM_DENOMINATOR_EPSILON) + sums["nsp_ce"] / global_examples, sums

    # Without NSP data the pooler and NSP head take no part in the loss: zero gradients.
    return Objective(whole_batch_total, micro_loss, PRETRAINING_DROPOUT_SALT, unconnected_zero=True)


def packed_pretraining_objective(model: BertPretrainer) -> Objective:
    """The same loss over packed rows: MLM over the batch's MLM weight sum, NSP over the number of
    sequences in the batch (not rows), so a packed step equals the unpacked step over the same
    instances."""

    def whole_batch_total(batch, reduce):
        return ops.stack([reduce(ops.sum(ops.cast(batch["masked_lm_weights"], "float32"))),
                          reduce(ops.sum(ops.cast(batch["next_sentence_weights"], "float32")))])

    def micro_loss(part, totals, seed):
        out = model(part, training=True, dropout_seed=seed)
        sums = batch_sums(out, part)
        return (sums["mlm_ce"] / (totals[0] + MLM_DENOMINATOR_EPSILON)
                + sums["nsp_ce"] / ops.maximum(totals[1], 1.0)), sums

    return Objective(whole_batch_total, micro_loss, PRETRAINING_DROPOUT_SALT, unconnected_zero=True)


def eval_sums(model: BertPretrainer, batch: dict) -> dict:
    """The additive eval figures of one batch (dropout off), on either backend."""
    return batch_sums(model(batch, training=False), batch)


def pretraining_spec(cfg: TrainConfig, bert: BertConfig, packed: bool,
                     bad_record: Callable[[], str | None] | None = None) -> TrainingSpec:
    """The model, loss and optimizer of a pre-training run, for `runtime.training.start_training`."""

    def objective(model):
        return packed_pretraining_objective(model) if packed else pretraining_objective(model, cfg.batch_size)

    return TrainingSpec(
        backend=cfg.backend, settings=cfg, optimizer=cfg.optimizer, objective=objective, eval_sums=eval_sums,
        build_model=lambda: build_model(bert, seed=cfg.seed, dtype=dtype_policy(cfg.precision)),
        variable_map=tf1_variable_map, trained_map=tf1_variable_map, bad_record=bad_record)

