"""Pre-training's run configuration: `TrainConfig` is everything one `bert-train pretrain` run needs;
the CLI builds it and the run directory keeps a copy (`train_config.json`) so a rerun can check it
resumes the same run. What every run checks the same way (seeds, strategies, precisions, optimizers)
is `bert_datagen.trainer.runtime.config`.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass
from typing import Any, ClassVar

from bert_datagen.contract.bounds import max_batches
from bert_datagen.trainer.errors import TrainConfigError
from bert_datagen.trainer.model.config import MODEL_SIZES
from bert_datagen.trainer.runtime.config import OPTIMIZERS, check_run_settings, check_seed


@dataclass
class TrainConfig:
    """One pre-training run. Serialized into RUN/train_config.json."""

    data: str  # dataset directory (manifest.json) or a TFRecord glob of the original tool
    out: str
    model: str | None = "tiny"  # a size name; None (as recorded) when bert_config gives the model
    bert_config: dict[str, Any] | None = None  # explicit model (from --bert-config FILE)
    batch_size: int = 32  # global batch (sequences per optimizer step, all replicas, all micro-steps)
    accumulation_steps: int = 1
    steps: int = 1000
    learning_rate: float = 1e-4
    warmup_steps: int = 100
    weight_decay: float = 0.01
    optimizer: str = "adamw"
    clip_norm: float = 1.0
    seed: int = 12345
    # Only for TFRecord globs (a manifest states them).
    max_seq_length: int | None = None
    max_predictions_per_seq: int | None = None
    vocab_size: int | None = None
    eval_data: str | None = None  # eval TFRecord glob for --data globs
    # Only runs started by an earlier version, which read through tf.data, use a shuffle buffer; they
    # resume with the one they recorded (`recorded_shuffle_buffer`). None: the global order (no buffer).
    shuffle_buffer: int | None = None
    checkpoint_every: int = 1000
    keep_checkpoints: int = 3
    eval_every: int = 0  # 0: only at the end
    eval_batches: int = 20
    log_every: int = 50
    strategy: str = "auto"
    backend: str = "tensorflow"  # the Keras backend (trainer/backends); a run may move between them
    precision: str = "float32"
    jit: bool = False
    init_from: str | None = None  # phase 2: weights from a run or a checkpoint of ours
    init_checkpoint: str | None = None  # original TF1 checkpoint / Hugging Face dir (bert_datagen.trainer.interop.restore)
    tpu: str | None = None  # TPU address for --strategy tpu
    # Global batches to leave out from here on ([first, last] inclusive; contract/loading/skips.py);
    # the run keeps the ranges it skipped in its checkpoints, so a resume need not repeat them.
    skip_batches: list[list[int]] = dataclasses.field(default_factory=list)
    # A weighted mixture (contract/loading/mixture.py): datasets read with `data`, and one weight per
    # dataset, `data`'s first. Empty: `data` alone.
    mix: list[str] = dataclasses.field(default_factory=list)
    mix_weights: list[float] = dataclasses.field(default_factory=list)
    mix_window: int = 4096

    def __post_init__(self) -> None:
        if self.bert_config is not None:
            self.model = None  # the record says what ran: the config's model, not a size
        self.validate()

    @staticmethod
    def settings_of_record(recorded: dict[str, Any]) -> dict[str, Any]:
        """A recorded train_config.json as this version records the same run (runs of earlier versions
        recorded a size name beside the model config that replaced it)."""
        if recorded.get("bert_config") is not None:
            return {**recorded, "model": None}
        return recorded

    def validate(self) -> None:
        positive = ("batch_size", "accumulation_steps", "steps", "checkpoint_every", "keep_checkpoints",
                    "eval_batches", "log_every", "shuffle_buffer")
        for name in positive:
            value = getattr(self, name)
            if value is None and name == "shuffle_buffer":
                continue
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise TrainConfigError(f"{name} must be a positive integer, got {value!r}")
        check_seed(self.seed, "seed")
        for r in self.skip_batches:
            if (len(r) != 2 or not all(isinstance(x, int) and not isinstance(x, bool) for x in r)
                    or not 0 <= r[0] <= r[1]):
                raise TrainConfigError(f"skip_batches: {r!r} is not a range [first, last] with 0 <= first <= last")
        if self.warmup_steps < 0 or self.eval_every < 0:
            raise TrainConfigError("warmup_steps and eval_every must be >= 0")
        self._check_order_fits()
        if self.batch_size % self.accumulation_steps:
            raise TrainConfigError(
                f"batch_size {self.batch_size} is not a multiple of accumulation_steps {self.accumulation_steps}"
            )
        if not (math.isfinite(self.learning_rate) and self.learning_rate > 0):
            raise TrainConfigError(f"learning_rate must be positive and finite, got {self.learning_rate}")
        check_run_settings(strategy=self.strategy, precision=self.precision, backend=self.backend, tpu=self.tpu,
                           weight_decay=self.weight_decay, clip_norm=self.clip_norm)
        if self.optimizer not in OPTIMIZERS:
            raise TrainConfigError(f"optimizer {self.optimizer!r} not in {OPTIMIZERS}")
        if self.model not in MODEL_SIZES and self.bert_config is None:
            raise TrainConfigError(f"unknown model size {self.model!r}; choose one of {', '.join(MODEL_SIZES)}")
        if self.init_from and self.init_checkpoint:
            raise TrainConfigError("--init-from and --init-checkpoint are exclusive")
        if self.bert_config is not None and self.vocab_size is not None:
            raise TrainConfigError(f"--vocab-size does not apply with a model config (--bert-config, --init-checkpoint): "
                                   f"its vocab size {self.bert_config.get('vocab_size')} is the model's")
        self._check_mix()

    def _check_mix(self) -> None:
        if not self.mix and not self.mix_weights:
            return
        if len(self.mix_weights) != len(self.mix) + 1:
            raise TrainConfigError(f"--weights: {len(self.mix_weights)} weights for {len(self.mix) + 1} datasets "
                                   "(--data and each --mix): give one per dataset, --data's first")
        if not all(isinstance(w, (int, float)) and math.isfinite(w) and w > 0 for w in self.mix_weights):
            raise TrainConfigError(f"--weights must be finite and > 0, got {self.mix_weights}")
        if not isinstance(self.mix_window, int) or isinstance(self.mix_window, bool) or self.mix_window < 1:
            raise TrainConfigError(f"mix_window must be a positive integer, got {self.mix_window!r}")

    def _check_order_fits(self) -> None:
        """The batches the run reads are ones the global order can index (their positions fit in
        int64). A resume adds --skip-batches to the ranges its checkpoints recorded, all checked
        here against the same steps and batch size (neither may change on resume): the last batch
        read is at most the last skipped one plus ``steps``, so that bound covers their union."""
        limit = max_batches(self.batch_size)
        if self.steps > limit:
            raise TrainConfigError(f"steps {self.steps} at batch_size {self.batch_size}: the global order holds "
                                   f"{limit} batches of that size (positions are 64-bit)")
        last = max((r[1] for r in self.skip_batches), default=None)
        if last is not None and last + self.steps >= limit:
            raise TrainConfigError(f"skip_batches: batch {last} is past what a run of steps {self.steps} at batch_size "
                                   f"{self.batch_size} can skip: the last batch it would read is past the "
                                   f"{limit} batches the global order holds (positions are 64-bit)")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def field_defaults(cls) -> dict[str, Any]:
        """Each option that has a plain default, with it."""
        return {f.name: f.default for f in dataclasses.fields(cls) if f.default is not dataclasses.MISSING}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True) + "\n"

    # Options that may change between invocations of the same run without changing what it
    # computes (how often it reports, which devices run it). `steps` is not one: it sets the
    # learning-rate decay. `extra` is a field that runs of earlier versions recorded. A run of an
    # earlier version reads with the shuffle buffer it recorded, whatever is given
    # (`recorded_shuffle_buffer` refuses another); other runs have none.
    RESUMABLE_CHANGES: ClassVar[frozenset[str]] = frozenset({"out", "checkpoint_every", "keep_checkpoints", "eval_every",
                                   "eval_batches", "log_every", "strategy", "jit", "tpu", "extra", "backend",
                                   "skip_batches", "shuffle_buffer"})
