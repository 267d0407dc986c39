"""What every run's configuration checks the same way: seeds, strategies, precisions, optimizers, a
TPU address. Pre-training's config is `bert_datagen.trainer.pretrain.config.TrainConfig`, fine-tuning's
`bert_datagen.trainer.finetune.config.FinetuneConfig`; the model's own, `BertConfig`, is
`bert_datagen.trainer.model.config`.
"""

from __future__ import annotations

import math

from bert_datagen.contract.bounds import MAX_SEED
from bert_datagen.trainer.backends import BACKENDS
from bert_datagen.trainer.errors import TrainConfigError


def check_seed(value: object, option: str) -> None:
    """Raise TrainConfigError naming `option` unless `value` is a seed every RNG we seed accepts."""
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= MAX_SEED:
        raise TrainConfigError(f"{option} must be an integer in [0, {MAX_SEED}], got {value!r}")


STRATEGIES = ("auto", "one-device", "mirrored", "tpu", "multi-worker")
PRECISIONS = ("float32", "mixed_bfloat16", "mixed_float16")
OPTIMIZERS = ("adamw", "lamb")  # the original AdamWeightDecay; LAMB (trainer/runtime/optimizer.py)


def check_tpu(tpu: str | None, strategy: str) -> None:
    """A TPU address only means something to the tpu strategy (auto never picks a TPU)."""
    if tpu is not None and strategy != "tpu":
        raise TrainConfigError(f"--tpu {tpu!r} applies only with --strategy tpu, not --strategy {strategy}")


def check_run_settings(*, strategy: str, precision: str, backend: str, tpu: str | None, weight_decay: float,
                       clip_norm: float) -> None:
    """What pre-training and fine-tuning check alike: where and how the run computes, and the update's
    weight decay and clipping norm (finite: a NaN would pass any comparison)."""
    if not (math.isfinite(weight_decay) and weight_decay >= 0):
        raise TrainConfigError(f"--weight-decay must be >= 0 and finite, got {weight_decay}")
    if not (math.isfinite(clip_norm) and clip_norm > 0):
        raise TrainConfigError(f"clip_norm must be positive and finite, got {clip_norm}")
    if strategy not in STRATEGIES:
        raise TrainConfigError(f"strategy {strategy!r} not in {STRATEGIES}")
    if precision not in PRECISIONS:
        raise TrainConfigError(f"precision {precision!r} not in {PRECISIONS}")
    if backend not in BACKENDS:
        raise TrainConfigError(f"backend {backend!r} not in {BACKENDS}")
    check_tpu(tpu, strategy)
