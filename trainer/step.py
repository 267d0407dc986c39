"""One optimizer step and one eval step as tf.functions, distributed over replicas.

One optimizer step = one global batch of `batch_size` sequences, split over replicas and then over
`accumulation_steps` micro-batches. Every part's loss is normalised by the WHOLE batch's MLM weight
sum and example count, so the summed gradient equals the gradient of the original loss on the whole
batch: distribution and accumulation change the arithmetic order, not what is computed. Dropout masks
are a pure function of (seed, step, micro-step, replica).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import tensorflow as tf

from trainer.config import TrainConfig
from trainer.model import BertPretrainer
from trainer.objective import MLM_DENOMINATOR_EPSILON, batch_sums
from trainer.optimizer import AdamWeightDecay, DynamicLossScale, clip_by_global_norm

SUM = tf.distribute.ReduceOp.SUM


@dataclass
class StepFunctions:
    train_step: Callable  # (global batch, lr, step) -> summed figures
    eval_step: Callable  # batch -> summed figures


def make_step_functions(model: BertPretrainer, optimizer: AdamWeightDecay, strategy: tf.distribute.Strategy,
                        cfg: TrainConfig, loss_scale: DynamicLossScale | None) -> StepFunctions:
    variables = optimizer.variables
    accum = cfg.accumulation_steps
    replicas = strategy.num_replicas_in_sync
    global_examples = float(cfg.batch_size)
    base_seed = tf.constant([cfg.seed & 0x7FFFFFFF, 0x5EED], dtype=tf.int64)

    def micro_grads(batch, weight_total, seed, scale):
        with tf.GradientTape() as tape:
            out = model(batch, training=True, dropout_seed=seed)
            sums = batch_sums(out, batch)
            # This part's share of the whole batch's loss (see module docstring).
            loss = sums["mlm_ce"] / (weight_total + MLM_DENOMINATOR_EPSILON) + sums["nsp_ce"] / global_examples
            scaled = loss * scale if scale is not None else loss
        # Without NSP data the pooler and NSP head take no part in the loss: zero gradients.
        grads = tape.gradient(scaled, [v.value for v in variables],
                              unconnected_gradients=tf.UnconnectedGradients.ZERO)
        # Embedding lookups give IndexedSlices; dense sums keep accumulation and all-reduce simple.
        return [tf.convert_to_tensor(g) for g in grads], sums

    micro_grads_fn = tf.function(micro_grads, jit_compile=True) if cfg.jit else micro_grads

    def replica_step(batch, lr, step):
        ctx = tf.distribute.get_replica_context()
        weight_total = ctx.all_reduce(SUM, tf.reduce_sum(batch["masked_lm_weights"]))
        scale = loss_scale.scale if loss_scale is not None else None
        seed = tf.random.experimental.stateless_fold_in(base_seed, step, alg="philox")
        seed = tf.random.experimental.stateless_fold_in(seed, ctx.replica_id_in_sync_group, alg="philox")
        local = tf.shape(batch["input_ids"])[0]
        micro = local // accum
        grads, totals = None, None
        for k in range(accum):  # unrolled: accumulation counts are small
            part = {name: value[k * micro:(k + 1) * micro] for name, value in batch.items()}
            part_seed = tf.random.experimental.stateless_fold_in(seed, k, alg="philox")
            g, sums = micro_grads_fn(part, weight_total, part_seed, scale)
            grads = g if grads is None else [a + b for a, b in zip(grads, g, strict=True)]
            totals = sums if totals is None else {n: totals[n] + sums[n] for n in totals}
        if replicas > 1:
            grads = ctx.all_reduce(SUM, grads)
        if scale is not None:
            grads = [g / scale for g in grads]
        finite = tf.reduce_all([tf.reduce_all(tf.math.is_finite(g)) for g in grads])
        clipped, norm = clip_by_global_norm(grads, cfg.clip_norm)
        optimizer.apply(clipped, lr, ok=finite if loss_scale is not None else None)
        if loss_scale is not None:
            loss_scale.update(finite)
        totals["grad_norm"] = norm / replicas  # summed over replicas below
        totals["finite"] = tf.cast(finite, tf.float32) / replicas
        return totals

    def train_step(batch, lr, step):
        per_replica = strategy.run(replica_step, args=(batch, lr, step))
        return {k: strategy.reduce(SUM, v, axis=None) for k, v in per_replica.items()}

    def replica_eval(batch):
        return batch_sums(model(batch, training=False), batch)

    def eval_step(batch):
        per_replica = strategy.run(replica_eval, args=(batch,))
        return {k: strategy.reduce(SUM, v, axis=None) for k, v in per_replica.items()}

    return StepFunctions(train_step=tf.function(train_step), eval_step=tf.function(eval_step))
