"""A run's weights, optimizer and compiled steps on the TensorFlow backend: the twin of
`jax_training.py`, behind the same methods, so the one loop (`runtime/loop.py`) drives either.

The model is built inside the run's tf.distribute strategy; the step is `runtime/step.py`'s for the
run's `Objective`. A step's failure is named here, in TensorFlow's terms: a lost worker of a
cluster, a corrupt record the input let through, or the step's own error in one line.
"""

from __future__ import annotations

import re
from functools import partial
from pathlib import Path

import numpy as np
import tensorflow as tf

from bert_datagen.trainer.errors import DataError, TrainingError
from bert_datagen.trainer.runtime import checkpoint as ckpt_lib
from bert_datagen.trainer.runtime.checkpoint import checkpoint_arrays, restore_checkpoint_arrays
from bert_datagen.trainer.runtime.devices import make_run_strategy, replica_slices
from bert_datagen.trainer.runtime.optimizer import loss_scale_for, make_optimizer
from bert_datagen.trainer.runtime.step import make_train_step, summed_over_replicas

# What a step raises on input it cannot read or parse (a failed CRC, a wrong length).
TF_DATA_ERRORS = (tf.errors.DataLossError, tf.errors.InvalidArgumentError)

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


class TfTraining:
    """The model (`model`, its variables by TF1 name in `named`), its optimizer and loss scale, and
    the compiled train and eval steps, built in the strategy `spec.strategy` names."""

    backend = "tensorflow"

    def __init__(self, spec) -> None:
        cfg = spec.settings
        self.strategy = make_run_strategy(cfg.strategy, cfg.tpu, cfg.batch_size, cfg.accumulation_steps)
        self.replicas = self.strategy.num_replicas_in_sync
        with self.strategy.scope():
            self.model = spec.build_model()
            self.named = spec.variable_map(self.model)
            trained = spec.trained_map(self.model)
            self.optimizer = make_optimizer(spec.optimizer, trained, weight_decay=cfg.weight_decay)
            self.loss_scale = loss_scale_for(cfg.precision)
        self.batch_size = cfg.batch_size
        self.run_dir = Path(cfg.out)
        self._bad_record = spec.bad_record
        self.step_function = make_train_step(spec.objective(self.model), self.optimizer, self.strategy, cfg,
                                      self.loss_scale)
        sums = spec.eval_sums
        self._eval = None if sums is None else tf.function(
            partial(summed_over_replicas, self.strategy, partial(sums, self.model)))

    def train_step(self, batch: dict, lr: np.float32, step: int, workers: int = 1) -> dict[str, float]:
        """One optimizer step on this worker's `batch` (NumPy arrays or tensors); its summed figures."""
        batch = replica_slices(self.strategy, {k: tf.convert_to_tensor(v) for k, v in batch.items()},
                               self.batch_size, workers)
        try:
            sums = self.step_function(batch, tf.constant(lr, tf.float32), tf.constant(step, tf.int64))
        except LOST_WORKER_ERRORS as exc:
            raise lost_worker_error(exc, step + 1, self.run_dir) from exc
        except TF_DATA_ERRORS as exc:
            # The step can fail on input the pipeline let through, or for reasons of its own (e.g. a
            # collective of another strategy in this process): blame the data only when a record is bad.
            where = self._bad_record() if self._bad_record is not None else None
            if where:
                raise DataError(f"corrupt input: {where}") from exc
            # TensorFlow's message goes on with the graph's stack trace: its first line is the reason.
            reason = str(getattr(exc, "message", exc)).strip().splitlines()[0]
            raise TrainingError(f"training step {step + 1} failed: {type(exc).__name__}: {reason}") from exc
        return {k: float(v) for k, v in sums.items()}

    def eval_step(self, batch: dict[str, np.ndarray]) -> dict[str, float]:
        """The eval figures of one global batch, summed over the replicas its slices ran on."""
        # Every replica takes its slice of the one global batch, as in training: a tf.distribute
        # dataset would shard it per worker, and a worker left without a batch stops the others.
        sliced = replica_slices(self.strategy, {k: tf.constant(v) for k, v in batch.items()}, self.batch_size)
        return {k: float(v) for k, v in self._eval(sliced).items()}

    def checkpoint_arrays(self, step: int) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
        return checkpoint_arrays(self.named, self.optimizer, self.loss_scale, step)

    def restore(self, path: Path) -> None:
        restore_checkpoint_arrays(path, self.named, self.optimizer, self.loss_scale)

    def reload_from_model(self) -> None:
        """Nothing to do: the step reads the model's own variables."""

    def sync_model(self) -> None:
        """Nothing to do: the model's variables are the trained weights."""

