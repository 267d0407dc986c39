"""The pre-training step: the original MLM + NSP loss (`objective.py`) as the `Objective` the generic
step minimises (`trainer/runtime/step.py`), unpacked or over packed rows, and the eval step beside it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import tensorflow as tf
from keras import ops

from bert_datagen.trainer.errors import ConfigError
from bert_datagen.trainer.model.bert import BertPretrainer
from bert_datagen.trainer.pretrain.objective import MLM_DENOMINATOR_EPSILON, batch_sums
from bert_datagen.trainer.runtime.config import TrainConfig
from bert_datagen.trainer.runtime.optimizer import AdamWeightDecay, DynamicLossScale
from bert_datagen.trainer.runtime.step import Objective, make_train_step, summed_over_replicas

PRETRAINING_DROPOUT_SALT = 0x5EED


@dataclass
class StepFunctions:
    train_step: Callable  # (global batch, lr, step) -> summed figures
    eval_step: Callable  # batch -> summed figures


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
    return Objective(whole_batch_total, micro_loss, PRETRAINING_DROPOUT_SALT, tf.UnconnectedGradients.ZERO)


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

    return Objective(whole_batch_total, micro_loss, PRETRAINING_DROPOUT_SALT, tf.UnconnectedGradients.ZERO)


def make_step_functions(model: BertPretrainer, optimizer: AdamWeightDecay, strategy: tf.distribute.Strategy,
                        cfg: TrainConfig, loss_scale: DynamicLossScale | None, packed: bool = False) -> StepFunctions:
    objective = packed_pretraining_objective(model) if packed else pretraining_objective(model, cfg.batch_size)
    train_step = make_train_step(objective, optimizer, strategy, cfg, loss_scale)

    def eval_step(batch):
        return summed_over_replicas(strategy, partial(eval_sums, model), batch)

    return StepFunctions(train_step=train_step, eval_step=tf.function(eval_step))


def eval_sums(model: BertPretrainer, batch: dict) -> dict:
    """The additive eval figures of one batch (dropout off), on either backend."""
    return batch_sums(model(batch, training=False), batch)


def refuse_unported_on_jax(cfg: TrainConfig) -> None:
    """What the JAX backend does not run yet, refused before any work, each naming why."""
    if cfg.strategy in ("multi-worker", "tpu"):
        raise ConfigError(f"--strategy {cfg.strategy} runs on TensorFlow only so far (the JAX backend runs on "
                          "this process's devices: --strategy auto, one-device or mirrored)")
    if cfg.precision == "mixed_float16":
        raise ConfigError("--precision mixed_float16 needs loss scaling, which the JAX backend does not have yet: "
                          "use mixed_bfloat16 or float32, or --backend tensorflow")


def jax_pretraining(model: BertPretrainer, named: dict, cfg: TrainConfig, packed: bool):
    """The run's weights, slots and compiled steps on JAX (a `JaxTraining`), for the same objective as
    TensorFlow's."""
    from bert_datagen.trainer.runtime.jax_training import JaxTraining  # imports JAX: only on its backend

    objective = packed_pretraining_objective(model) if packed else pretraining_objective(model, cfg.batch_size)

    devices = 1 if cfg.strategy == "one-device" else None
    training = JaxTraining(named, list(named), objective, partial(eval_sums, model), cfg, cfg.optimizer, cfg.weight_decay, devices)
    if cfg.batch_size % (training.devices * cfg.accumulation_steps):  # as make_run_strategy on TensorFlow
        raise ConfigError(f"batch size {cfg.batch_size} is not a multiple of devices ({training.devices}) x "
                          f"accumulation steps ({cfg.accumulation_steps})")
    return training
