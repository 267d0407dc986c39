"""A fine-tuning run's settings (RUN/finetune_config.json) and the recipe's per-task defaults."""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass
from typing import Any, ClassVar

from bert_datagen.contract.bounds import INT64_MAX
from bert_datagen.contract.loading.task_batches import BUCKETS  # noqa: F401 (re-exported: the CLI help states it)
from bert_datagen.trainer.errors import TrainConfigError
from bert_datagen.trainer.runtime.config import check_run_settings, check_seed

SPAN_METRICS = ("auto", "squad", "cmrc2018")
# RECIPE.md section 10: run_classifier.py and run_squad.py defaults (tagging follows the classifier).
TASK_DEFAULTS: dict[str, dict[str, float]] = {
    "classification": {"learning_rate": 5e-5, "epochs": 3, "batch_size": 32},
    "regression": {"learning_rate": 5e-5, "epochs": 3, "batch_size": 32},
    "tagging": {"learning_rate": 5e-5, "epochs": 3, "batch_size": 32},
    "span": {"learning_rate": 3e-5, "epochs": 2, "batch_size": 12},
}
# BUCKETS: padded lengths of length-grouped batches (contract/loading/task_batches.py, where the
# grouping is computed for every reader). The training step traces at most twice whatever the count
# (run/step.py).


@dataclass
class FinetuneConfig:
    """One fine-tuning run. Serialized into RUN/finetune_config.json."""

    data: str
    out: str
    init_from: str | None = None
    init_checkpoint: str | None = None
    bert_config: dict[str, Any] | None = None
    epochs: float = 3
    learning_rate: float = 5e-5
    batch_size: int = 32
    warmup_proportion: float = 0.1
    seed: int = 12345
    max_steps: int | None = None
    train_split: str = "train"
    eval_split: str | None = "dev"
    weight_decay: float = 0.01
    clip_norm: float = 1.0
    accumulation_steps: int = 1
    checkpoint_every: int = 0  # 0: at the end of each epoch only
    keep_checkpoints: int = 1
    log_every: int = 50
    eval_batch_size: int = 64
    null_score_diff_threshold: float = 0.0
    # The span metric (evaluate.SPAN_METRICS): auto is CMRC 2018's for unspaced data, else SQuAD's.
    span_metric: str = "auto"
    strategy: str = "auto"
    precision: str = "float32"
    jit: bool = False
    tpu: str | None = None
    allow_vocab_mismatch: bool = False
    # Length-grouped training batches (contract/loading/task_batches.py): other batches, so a setting
    # of the run, not resumable with the other value.
    group_by_length: bool = False
    backend: str = "tensorflow"  # the Keras backend (trainer/backends); a run may move between them

    RESUMABLE_CHANGES: ClassVar[frozenset[str]] = frozenset({
        "out", "checkpoint_every", "keep_checkpoints", "log_every", "eval_batch_size", "strategy", "jit", "tpu",
        "allow_vocab_mismatch", "span_metric", "backend"})  # span_metric: how evaluations score, not what trains

    def __post_init__(self) -> None:
        self.validate()

    @staticmethod
    def settings_of_record(recorded: dict[str, Any]) -> dict[str, Any]:
        """A recorded finetune_config.json as this version records the same run (no change so far)."""
        return recorded

    def validate(self) -> None:
        if (self.init_from is None) == (self.init_checkpoint is None):
            raise TrainConfigError("pass exactly one of --init-from and --init-checkpoint")
        for name in ("batch_size", "accumulation_steps", "keep_checkpoints", "log_every", "eval_batch_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise TrainConfigError(f"--{name.replace('_', '-')} must be a positive integer, got {value!r}")
        if self.batch_size % self.accumulation_steps:
            raise TrainConfigError(f"--batch-size {self.batch_size} is not a multiple of --accumulation-steps "
                                   f"{self.accumulation_steps}")
        check_seed(self.seed, "--seed")
        if self.max_steps is not None and self.max_steps <= 0:
            raise TrainConfigError(f"--max-steps must be positive, got {self.max_steps}")
        if not (math.isfinite(self.epochs) and self.epochs > 0):
            raise TrainConfigError(f"--epochs must be a positive number, got {self.epochs}")
        if not (math.isfinite(self.learning_rate) and self.learning_rate > 0):
            raise TrainConfigError(f"--learning-rate must be a positive number, got {self.learning_rate}")
        if not (math.isfinite(self.warmup_proportion) and 0 <= self.warmup_proportion < 1):
            raise TrainConfigError(f"--warmup-proportion must be in [0, 1), got {self.warmup_proportion}")
        if not math.isfinite(self.null_score_diff_threshold):
            raise TrainConfigError("--null-score-diff-threshold must be a finite number")
        if self.checkpoint_every < 0:
            raise TrainConfigError("--checkpoint-every must be >= 0")
        if self.span_metric not in SPAN_METRICS:
            raise TrainConfigError(f"--span-metric {self.span_metric!r} is not one of {', '.join(SPAN_METRICS)}")
        check_run_settings(strategy=self.strategy, precision=self.precision, backend=self.backend, tpu=self.tpu,
                           weight_decay=self.weight_decay, clip_norm=self.clip_norm)

    def total_steps(self, records: int) -> int:
        """The run's optimizer steps on a training split of ``records`` examples (whole batches of
        each epoch, --epochs of them, at most --max-steps). TrainConfigError when the positions they read
        in the global order would not fit in int64 (a huge --epochs; a float's inf would fail as an
        OverflowError that names nothing)."""
        per_epoch = records // self.batch_size
        if per_epoch == 0:
            return 1
        wanted = self.epochs * per_epoch  # a float: inf for the largest --epochs
        by_max = self.max_steps is not None and self.max_steps < wanted
        steps = self.max_steps if by_max else max(1, int(wanted)) if wanted <= INT64_MAX else None
        if steps is None or -(-steps // per_epoch) > INT64_MAX // records:
            option, value = ("--max-steps", self.max_steps) if by_max else ("--epochs", self.epochs)
            raise TrainConfigError(f"{option} {value:g}: {per_epoch:,} steps an epoch read past the positions the global "
                                   f"order can hold ({INT64_MAX:,}: 64-bit) in a split of {records:,} records")
        return steps

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True) + "\n"
