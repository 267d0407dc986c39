"""How a run stops between steps and says where it resumes: on a non-finite loss, on a lost worker of
a cluster (`tf_training.py` names it), on SIGINT (or SIGTERM, which `bert-train` turns into a SIGINT) with a checkpoint of the last
step. One implementation for the pre-training and the fine-tuning run."""

from __future__ import annotations

import contextlib
import math
import signal
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING

from bert_datagen.cli.plumbing import interrupt_requested
from bert_datagen.trainer.errors import TrainingError
from bert_datagen.trainer.runtime import checkpoint as ckpt_lib

if TYPE_CHECKING:
    from bert_datagen.trainer.runtime.optimizer import DynamicLossScale


def stop_on_non_finite_loss(loss: float, step: int, run_dir: Path, loss_scale: DynamicLossScale | None) -> None:
    """Stop the run on a non-finite loss, naming the last good checkpoint. Under a loss scale such a
    step was skipped and the scale lowered: expected, not a failure."""
    if math.isfinite(loss) or loss_scale is not None:
        return
    good = ckpt_lib.list_checkpoints(run_dir)
    kept = f"last good checkpoint: {good[-1][1]}" if good else "no checkpoint was written"
    raise TrainingError(f"step {step}: loss is {loss}; stopped ({kept})")


@contextlib.contextmanager
def interrupts_between_steps() -> Iterator[Callable[[], bool]]:
    """Hold a first SIGINT until the current step is done (the loop then saves a consistent checkpoint
    and raises KeyboardInterrupt: `stop_interrupted`); a second SIGINT goes to the handler that was
    there before, at once. Only in the main thread, and only where SIGINT has a Python handler (not
    ignored). A SIGINT the start-up already received (and an import may have swallowed) stops the
    loop before its first step."""
    pending: list[int] = [signal.SIGINT] if interrupt_requested() else []
    previous = signal.getsignal(signal.SIGINT)
    if threading.current_thread() is not threading.main_thread() or not callable(previous):
        yield lambda: False
        return

    def hold(signum: int, frame: FrameType | None) -> None:
        if pending:
            previous(signum, frame)
        pending.append(signum)

    signal.signal(signal.SIGINT, hold)
    try:
        yield lambda: bool(pending)
    finally:
        signal.signal(signal.SIGINT, previous)


def stop_interrupted(run_dir: Path, step: int, saved_step: int | None, save: Callable[[], object],
                     log: Callable[[str], None]) -> None:
    """Between steps the state is consistent: save it (unless step `step` is saved already), say
    where, and raise KeyboardInterrupt, so a rerun resumes exactly here."""
    if step and saved_step != step:
        save()
    kept = ckpt_lib.list_checkpoints(run_dir)
    where = f"checkpoint {kept[-1][1]}" if kept else "no checkpoint yet"
    log(f"interrupted at step {step} ({where}); rerun the same command to resume")
    raise KeyboardInterrupt
