"""What every run's configuration checks the same way: seeds, strategies, precisions, optimizers, a
TPU address. Pre-training's config is `bert_datagen.trainer.pretrain.config.TrainConfig`, fine-tuning's
`bert_datagen.trainer.finetune.config.FinetuneConfig`; the model's own, `BertConfig`, is
`bert_datagen.trainer.model.config`.
"""

from __future__ import annotations

from bert_datagen.contract.bounds import MAX_SEED
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
