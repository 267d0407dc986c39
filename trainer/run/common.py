"""What the pre-training run (trainer/pretrain/train.py) and the fine-tuning run (trainer/finetune/run.py) share
around their step: where they compute, the loss scale of their precision, a global batch cut into
replica slices, the arrays a checkpoint holds and how they are restored, TensorBoard writers and
scalars, the stop on a non-finite loss, and the stop on SIGINT (or SIGTERM, which `bert-train`
turns into a SIGINT) between steps with a checkpoint of the last one. One implementation each, so the two runs cannot drift
apart in how they distribute, save or resume.
"""

from __future__ import annotations

import contextlib
import math
import re
import signal
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from types import FrameType

import numpy as np
import tensorflow as tf

from bert_datagen.contract.cli.plumbing import interrupt_requested
from bert_datagen.trainer.errors import ConfigError, TrainingError
from bert_datagen.trainer.run import checkpoint as ckpt_lib
from bert_datagen.trainer.run.devices import make_strategy
from bert_datagen.trainer.run.optimizer import AdamWeightDecay, DynamicLossScale


def make_run_strategy(name: str, tpu: str | None, batch_size: int, accumulation_steps: int) -> tf.distribute.Strategy:
    """The strategy called `name`, refused (before any work) when the global batch does not split
    evenly over its replicas and their micro-batches."""
    strategy = make_strategy(name, tpu)
    replicas = strategy.num_replicas_in_sync
    if batch_size % (replicas * accumulation_steps):
        raise ConfigError(f"batch size {batch_size} is not a multiple of replicas ({replicas}) x "
                          f"accumulation steps ({accumulation_steps})")
    return strategy


def loss_scale_for(precision: str) -> DynamicLossScale | None:
    """A dynamic loss scale for float16 (its gradients underflow without one); none otherwise
    (bfloat16 has float32's exponent range). Create it inside the strategy's scope."""
    return DynamicLossScale() if precision == "mixed_float16" else None


def replica_slices(strategy: tf.distribute.Strategy, batch: dict[str, tf.Tensor],
                   batch_size: int, workers: int = 1) -> dict[str, tf.Tensor]:
    """``batch`` cut into consecutive per-replica slices of ``batch_size / replicas`` rows: the global
    batch (``workers`` 1), or this worker's share of it when each of ``workers`` workers reads its own
    (`ordered_input`). A tf.distribute iterator is not used: its position cannot be checkpointed."""
    replicas = strategy.num_replicas_in_sync
    if replicas == 1:
        return batch
    local = batch_size // replicas
    per_worker = replicas // workers

    def replica_slice(ctx):
        start = ctx.replica_id_in_sync_group % per_worker * local
        return {name: value[start:start + local] for name, value in batch.items()}

    return strategy.experimental_distribute_values_from_function(replica_slice)


# What a collective raises when another worker of the cluster is gone (killed, lost, timed out).
LOST_WORKER_ERRORS = (tf.errors.UnavailableError, tf.errors.AbortedError, tf.errors.DeadlineExceededError,
                      tf.errors.CancelledError)
_TASK = re.compile(r"/job:(\w+)/replica:\d+/task:(\d+)")


def lost_worker_error(exc: Exception, step: int, run_dir: Path) -> TrainingError:
    """One line for a step of a cluster that failed because a worker is gone: which (as TensorFlow
    names it), and the checkpoint the relaunched workers resume from."""
    message = str(getattr(exc, "message", exc))
    named = sorted({f"{job} {task}" for job, task in _TASK.findall(message)})
    who = ", ".join(named) if named else "another worker"
    kept = ckpt_lib.list_checkpoints(run_dir)
    where = f"from {kept[-1][1]}" if kept else "from the start (no checkpoint yet)"
    return TrainingError(f"training step {step}: lost {who} of the cluster ({type(exc).__name__}); the run can "
                         f"be resumed {where}: start every worker's command again")


def checkpoint_arrays(named: dict, optimizer: AdamWeightDecay, loss_scale: DynamicLossScale | None,
                      step: int) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """(model arrays by TF1 name, optimizer arrays: slots, global_step and the loss-scale state)."""
    model_arrays = {name: var.numpy() for name, var in named.items()}
    opt_arrays = optimizer.slot_arrays()
    opt_arrays["global_step"] = np.asarray(step, dtype=np.int64)
    if loss_scale is not None:
        opt_arrays.update(loss_scale.state())
    return model_arrays, opt_arrays


def restore_checkpoint_arrays(path: Path, named: dict, optimizer: AdamWeightDecay,
                              loss_scale: DynamicLossScale | None) -> None:
    """Weights, optimizer slots and loss-scale state from checkpoint directory `path`."""
    ckpt_lib.assign_named_weights(named, ckpt_lib.load_arrays(path, ckpt_lib.MODEL_FILE),
                                  str(path / ckpt_lib.MODEL_FILE))
    opt = ckpt_lib.load_arrays(path, ckpt_lib.OPTIMIZER_FILE)
    optimizer.load_slot_arrays(opt, str(path / ckpt_lib.OPTIMIZER_FILE))
    if loss_scale is not None:
        loss_scale.load_state(opt)


def stop_on_non_finite_loss(loss: float, step: int, run_dir: Path, loss_scale: DynamicLossScale | None) -> None:
    """Stop the run on a non-finite loss, naming the last good checkpoint. Under a loss scale such a
    step was skipped and the scale lowered: expected, not a failure."""
    if math.isfinite(loss) or loss_scale is not None:
        return
    good = ckpt_lib.list_checkpoints(run_dir)
    kept = f"last good checkpoint: {good[-1][1]}" if good else "no checkpoint was written"
    raise TrainingError(f"step {step}: loss is {loss}; stopped ({kept})")


def tensorboard_writers(run_dir: Path, chief: bool = True) -> tuple[tf.summary.SummaryWriter, tf.summary.SummaryWriter]:
    """The (train, eval) writers of RUN/tensorboard/; writers that write nothing on a non-chief worker."""
    if not chief:
        return tf.summary.create_noop_writer(), tf.summary.create_noop_writer()
    return (tf.summary.create_file_writer(str(run_dir / "tensorboard" / "train")),
            tf.summary.create_file_writer(str(run_dir / "tensorboard" / "eval")))


def write_scalar(name: str, value: float) -> None:
    """A TensorBoard scalar event without needing the tensorboard package (tf.summary.scalar does):
    the low-level summary op with the metadata of TensorBoard's scalars plugin."""
    from tensorflow.core.framework import summary_pb2

    metadata = summary_pb2.SummaryMetadata(plugin_data=summary_pb2.SummaryMetadata.PluginData(plugin_name="scalars"))
    tf.summary.write(name, tf.constant(value, tf.float32), metadata=metadata)


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
