"""What a training step minimises, apart from how a backend computes the step.

Pre-training and fine-tuning differ only in their `Objective` (theirs are in
`trainer/pretrain/step.py` and `trainer/finetune/objective.py`); each backend's step
(`runtime/step.py` on TensorFlow, `backends/jax.py` through `runtime/jax_training.py`) wraps the
same one in accumulation, the sum over replicas, clipping and the update. Written in `keras.ops`
terms, so this module imports no backend.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

Batch = dict[str, Any]


@dataclass(frozen=True)
class Objective:
    """`whole_batch_total(batch, reduce)` runs once per step on each replica's (TensorFlow) or on the
    whole (JAX) batch and returns the normaliser of the whole global batch, passing each of its sums
    through `reduce` (the sum over replicas; the identity where the batch is whole);
    `micro_loss(part, total, dropout_seed)` returns one micro-batch's share of the whole batch's loss
    and its additive figures (summed over micro-batches and replicas into the step's result)."""

    whole_batch_total: Callable[[Batch, Callable], Any]
    micro_loss: Callable[[Batch, Any, Any], tuple[Any, dict[str, Any]]]
    dropout_salt: int  # keeps the dropout streams of different kinds of runs apart
    # True where a trained variable may take no part in the loss (pre-training without NSP data):
    # its gradient is then zero, not missing.
    unconnected_zero: bool = False
