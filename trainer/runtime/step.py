"""One optimizer step as a tf.function, distributed over replicas, for any `Objective`.

One optimizer step = one global batch of `batch_size` sequences, split over replicas and then over
`accumulation_steps` micro-batches. Every part's loss is normalised by a total of the WHOLE batch
(pre-training: its MLM weight sum and example count; fine-tuning: its examples, or labelled
positions for tagging), so the summed gradient equals the gradient of the original loss on the
whole batch: distribution and accumulation change the arithmetic order, not what is computed.
Dropout masks are too: each row's mask is a pure function of (seed, step, the row's position in the
global batch) (`model/dropout.py`), never of the replica, worker, micro-batch or `--jit`, so
one process, N mirrored replicas, N workers and K accumulation steps draw the same masks.

Pre-training and fine-tuning differ only in their `Objective` (`runtime/objective.py`); the step
around it (accumulation, all-reduce, loss-scale unscaling, skipped non-finite steps, clipping, the
update) is the one `make_train_step` builds, so both keep the same numerics by construction.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import tensorflow as tf

from bert_datagen.trainer.model.dropout import dropout_key, run_key, step_key
from bert_datagen.trainer.runtime.objective import Objective
from bert_datagen.trainer.runtime.optimizer import AdamWeightDecay, DynamicLossScale, clip_by_global_norm

SUM = tf.distribute.ReduceOp.SUM

Batch = dict[str, tf.Tensor]


class StepSettings(Protocol):
    """The settings a step reads; TrainConfig and FinetuneConfig both have them."""

    seed: int
    accumulation_steps: int
    clip_norm: float
    jit: bool


def replica_sum(value: tf.Tensor) -> tf.Tensor:
    """`value` summed over all replicas (call it in a replica context)."""
    return tf.distribute.get_replica_context().all_reduce(SUM, value)


def make_train_step(objective: Objective, optimizer: AdamWeightDecay, strategy: tf.distribute.Strategy,
                    settings: StepSettings, loss_scale: DynamicLossScale | None) -> Callable:
    """A tf.function (global batch, lr, step) -> the objective's figures summed over the batch, plus
    `grad_norm` (before clipping) and `finite` (1.0 when the update was applied)."""
    variables = optimizer.variables
    accum = settings.accumulation_steps
    replicas = strategy.num_replicas_in_sync
    base_key = tf.constant(run_key(settings.seed, objective.dropout_salt))
    unconnected = tf.UnconnectedGradients.ZERO if objective.unconnected_zero else tf.UnconnectedGradients.NONE

    def micro_grads(part, total, seed, scale):
        with tf.GradientTape() as tape:
            loss, sums = objective.micro_loss(part, total, seed)
            scaled = loss * scale if scale is not None else loss
        grads = tape.gradient(scaled, [v.value for v in variables], unconnected_gradients=unconnected)
        # Embedding lookups give IndexedSlices; dense sums keep accumulation and all-reduce simple.
        return [tf.convert_to_tensor(g) for g in grads], sums

    micro_grads_fn = tf.function(micro_grads, jit_compile=True) if settings.jit else micro_grads

    def accumulated_grads(batch, total, seed, first_row, scale):
        micro = tf.shape(batch["input_ids"])[0] // accum
        grads, totals = None, None
        for k in range(accum):  # unrolled: accumulation counts are small
            part = {name: value[k * micro:(k + 1) * micro] for name, value in batch.items()}
            part_key = dropout_key(seed, first_row + tf.cast(k * micro, tf.int64))
            g, sums = micro_grads_fn(part, total, part_key, scale)
            grads = g if grads is None else [a + b for a, b in zip(grads, g, strict=True)]
            totals = sums if totals is None else {n: totals[n] + sums[n] for n in totals}
        return grads, totals

    def replica_step(batch, lr, step):
        ctx = tf.distribute.get_replica_context()
        total = objective.whole_batch_total(batch, replica_sum)
        scale = loss_scale.scale if loss_scale is not None else None
        seed = step_key(base_key, step)
        # Replica r holds rows [r*n, (r+1)*n) of the global batch (`devices.replica_slices`, the
        # workers' shares of the global order), so its rows keep their global positions' masks.
        rows = tf.cast(tf.shape(batch["input_ids"])[0], tf.int64)
        first_row = tf.cast(ctx.replica_id_in_sync_group, tf.int64) * rows
        grads, totals = accumulated_grads(batch, total, seed, first_row, scale)
        if replicas > 1:
            grads = ctx.all_reduce(SUM, grads)
        finite, norm = _unscale_clip_apply(grads, scale, lr, optimizer, loss_scale, settings.clip_norm)
        totals["grad_norm"] = norm / replicas  # summed over replicas below
        totals["finite"] = tf.cast(finite, tf.float32) / replicas
        return totals

    def train_step(batch, lr, step):
        return summed_over_replicas(strategy, replica_step, batch, lr, step)

    # Length-grouped fine-tuning batches come at several lengths (contract/loading/task_batches.py's bucket_lengths):
    # the second length traces once more with the length left open, and every later one reuses that
    # trace (two traces in all, no retracing warning). Fixed-shape batches keep their one trace.
    return tf.function(train_step, reduce_retracing=True)


def _unscale_clip_apply(grads: list[tf.Tensor], scale: tf.Tensor | None, lr: tf.Tensor, optimizer: AdamWeightDecay,
                        loss_scale: DynamicLossScale | None, clip_norm: float) -> tuple[tf.Tensor, tf.Tensor]:
    """Apply the all-reduced gradients; returns (all finite, global norm before clipping).

    With a loss scale a non-finite gradient skips the update (and halves the scale) instead of
    poisoning the weights; without one the loop stops on the non-finite loss."""
    if scale is not None:
        grads = [g / scale for g in grads]
    finite = tf.reduce_all([tf.reduce_all(tf.math.is_finite(g)) for g in grads])
    clipped, norm = clip_by_global_norm(grads, clip_norm)
    optimizer.apply(clipped, lr, ok=finite if loss_scale is not None else None)
    if loss_scale is not None:
        loss_scale.update(finite)
    return finite, norm


def summed_over_replicas(strategy: tf.distribute.Strategy, fn: Callable, *args) -> dict[str, tf.Tensor]:
    """`fn(*args)` run on every replica, each of its figures summed over them."""
    per_replica = strategy.run(fn, args=args)
    return {k: strategy.reduce(SUM, v, axis=None) for k, v in per_replica.items()}
