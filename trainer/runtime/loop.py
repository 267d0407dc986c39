"""The one training loop of pre-training and fine-tuning (like nanoGPT's one `train.py`): step,
stop on a non-finite loss, log a window of steps, evaluate and checkpoint when the run says so,
and stop between steps on SIGINT with a checkpoint of the last one.

A run (`pretrain/train.py`'s `PretrainRun`, `finetune/train.py`'s `FinetuneRun`) subclasses
`TrainingLoop` and says only what differs: its learning rate, its next batch, how a window's
figures read, when it evaluates and checkpoints, and what a checkpoint records. The step itself is
the backend's (`runtime/training.py`): this module names no backend.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from functools import partial
from pathlib import Path

import numpy as np

from bert_datagen.trainer.runtime.ordered_input import input_closed
from bert_datagen.trainer.runtime.stopping import (
    interrupts_between_steps,
    stop_interrupted,
    stop_on_non_finite_loss,
)


class TrainingLoop(ABC):
    """The loop's state and the steps every run takes; subclasses fill in the hooks below."""

    run_dir: Path
    log: Callable[[str], None]
    training: object  # a TfTraining or JaxTraining
    step: int = 0
    saved_step: int | None = None
    input = None  # an OrderedInput, closed when the loop ends
    workers: int = 1  # how many workers the batch is shared over (each reads its share)

    # -- hooks

    @abstractmethod
    def learning_rate(self, step: int) -> float:
        ...

    @abstractmethod
    def next_batch(self) -> dict:
        ...

    @abstractmethod
    def loss_of(self, sums: dict[str, float]) -> float:
        """The mean loss of one step's summed figures (stops the run when not finite)."""
        ...

    @abstractmethod
    def window_figures(self, sums: dict[str, float], steps: int, seconds: float, lr: float) -> dict[str, float]:
        """What a log line reports of a window of `steps` steps with these summed figures."""
        ...

    @abstractmethod
    def report(self, figures: dict[str, float]) -> None:
        ...

    @abstractmethod
    def after_step(self, end: int, figures: dict[str, float]) -> None:
        """Evaluate and checkpoint where due (after `self.step` was taken; `figures` the last window's)."""
        ...

    @abstractmethod
    def save(self, figures: dict | None = None):
        ...

    # -- the loop

    def train_steps(self, end: int) -> dict[str, float]:
        """Train from `self.step` up to step `end`; the last window's figures."""
        window: dict[str, float] = {}
        started, steps = time.perf_counter(), 0
        last: dict[str, float] = {}
        with interrupts_between_steps() as interrupted, input_closed(self):
            while self.step < end:
                if interrupted():
                    stop_interrupted(self.run_dir, self.step, self.saved_step, partial(self.save, last), self.log)
                lr = np.float32(self.learning_rate(self.step))
                sums = self.training.train_step(self.next_batch(), lr, self.step, self.workers)
                stop_on_non_finite_loss(self.loss_of(sums), self.step, self.run_dir, self.training.loss_scale)
                self.step += 1
                steps += 1
                for name, value in sums.items():
                    window[name] = window.get(name, 0.0) + value
                if self.step % self.log_every == 0 or self.step == end:
                    last = self.window_figures(window, steps, time.perf_counter() - started, float(lr))
                    self.report(last)
                    window, started, steps = {}, time.perf_counter(), 0
                self.after_step(end, last)
        return last

    @property
    def log_every(self) -> int:
        return self.cfg.log_every
