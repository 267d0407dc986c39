"""A run's weights, optimizer slots and compiled steps on the JAX backend: the twin of
`tf_training.py`, behind the same methods.

The same objective (`runtime/objective.py`), optimizer arithmetic (`runtime/updates.py`) and
keyed dropout as on TensorFlow, held as device arrays and stepped by `backends/jax.py`; checkpoint
arrays under the same names as TensorFlow's (`checkpoint.py`), so a run moves between backends.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import numpy as np

from bert_datagen.trainer.backends import jax as backend
from bert_datagen.trainer.backends import jax_cluster
from bert_datagen.trainer.errors import CheckpointError, TrainConfigError
from bert_datagen.trainer.model.dropout import dropout_key, run_key, step_key
from bert_datagen.trainer.runtime import cluster
from bert_datagen.trainer.runtime.checkpoint import (
    MODEL_FILE,
    OPTIMIZER_FILE,
    assign_named_weights,
    load_arrays,
)
from bert_datagen.trainer.runtime.updates import (
    LOSS_SCALE_INITIAL,
    UpdateRule,
    clip_by_global_norm,
    next_loss_scale,
)


class JaxTraining:
    """The model (`model`, its variables by TF1 name in `named`); during training its trained weights
    live as device arrays (`params`, in `trained` order) with the optimizer slots, and the model's
    Keras variables hold them only where `sync_model` put them."""

    backend = "jax"
    strategy = None  # evaluation takes whole NumPy batches (`pretrain/evaluate.py`)
    loss_scale = None  # "dynamic" for float16 runs (their state lives in the slots): not None, as on TensorFlow

    def __init__(self, spec) -> None:
        cfg = spec.settings
        self.model = spec.build_model()
        self.named = spec.variable_map(self.model)
        self.trained = list(spec.trained_map(self.model))
        self.variables = [self.named[n] for n in self.trained]
        self.rule = UpdateRule(spec.optimizer, self.trained, weight_decay=cfg.weight_decay)
        # Several processes (`--strategy multi-worker`): one global batch over all their devices,
        # each process placing the share it read.
        self.cluster = cfg.strategy == "multi-worker"
        self.run_dir = str(cfg.out)
        if self.cluster:
            self.sharding = jax_cluster.global_sharding()
        else:
            self.sharding = backend.data_sharding(1 if cfg.strategy == "one-device" else None)
        self.replicas = 1 if self.sharding is None else len(self.sharding.mesh.devices.flat)
        if cfg.batch_size % (self.replicas * cfg.accumulation_steps):  # as make_run_strategy on TensorFlow
            raise TrainConfigError(f"batch size {cfg.batch_size} is not a multiple of devices ({self.replicas}) x "
                                   f"accumulation steps ({cfg.accumulation_steps})")
        self.reload_from_model()
        scaled = cfg.precision == "mixed_float16"  # float16's gradients underflow without a loss scale
        self.loss_scale = "dynamic" if scaled else None
        self._set_slots(self._with_loss_scale(self.rule.init_slots([tuple(v.shape) for v in self.variables]), {}))
        objective = spec.objective(self.model)
        base = run_key(cfg.seed, objective.dropout_salt)

        def micro_key(step, first_row):
            return dropout_key(step_key(base, step), first_row)

        def clip(grads):
            return clip_by_global_norm(grads, cfg.clip_norm)

        self._train = backend.make_train_step(self.variables, objective.micro_loss, objective.whole_batch_total,
                                              micro_key, self.rule.apply, cfg.accumulation_steps, clip,
                                              next_loss_scale if scaled else None)
        self._eval = None
        if spec.eval_sums is not None:
            self._eval = backend.make_eval_step(self.variables, partial(spec.eval_sums, self.model))

    def _with_loss_scale(self, slots: dict, arrays: dict) -> dict:
        """`slots` plus a float16 run's loss-scale state: from checkpoint `arrays` where they hold it (as
        TensorFlow's `DynamicLossScale.load_state`), else the initial scale."""
        if self.loss_scale is None:
            return slots
        return {**slots, "loss_scale": np.asarray(arrays.get("loss_scale", LOSS_SCALE_INITIAL), np.float32),
                "loss_scale_good_steps": np.asarray(arrays.get("loss_scale_good_steps", 0), np.int32)}

    def _set_slots(self, slots: dict) -> None:
        placed = {"m": backend.replicate(slots["m"], self.sharding), "v": backend.replicate(slots["v"], self.sharding)}
        for name in ("updates", "loss_scale", "loss_scale_good_steps"):
            if name in slots:
                placed[name] = backend.replicate([slots[name]], self.sharding)[0]
        self.slots = placed

    def train_step(self, batch: dict[str, np.ndarray], lr: np.float32, step: int, workers: int = 1) -> dict[str, float]:
        """One optimizer step on the global batch (NumPy arrays; in a cluster, this process's share of
        it); its summed figures."""
        with self._lost_worker_named(f"training step {step + 1}"):
            placed = (backend.place_share(batch, self.sharding) if self.cluster
                      else backend.place_batch(batch, self.sharding))
            self.params, self.slots, figures = self._train(self.params, self.slots, placed, np.float32(lr),
                                                           np.int32(step))
            return {k: float(v) for k, v in figures.items()}

    def eval_step(self, batch: dict[str, np.ndarray]) -> dict[str, float]:
        """The figures of one whole global batch (every process of a cluster reads all of it)."""
        with self._lost_worker_named("evaluation"):
            return {k: float(v) for k, v in self._eval(self.params, backend.place_batch(batch, self.sharding)).items()}

    @contextlib.contextmanager
    def _lost_worker_named(self, when: str) -> Iterator[None]:
        """A collective that failed because a process of the cluster is gone, as one line (TrainingError)."""
        try:
            yield
        except (RuntimeError, ValueError) as exc:
            reason = jax_cluster.lost_process(exc) if self.cluster else None
            if reason is None:
                raise
            raise cluster.lost_worker_error(when, self.run_dir, reason) from exc

    def sync_model(self) -> None:
        """The trained weights into the model's Keras variables (before the model is read directly:
        fine-tuning's evaluation, an export)."""
        for variable, value in zip(self.variables, backend.to_numpy(self.params), strict=True):
            variable.assign(value)

    def checkpoint_arrays(self, step: int) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
        """(model arrays by TF1 name, optimizer arrays): what TensorFlow's runs write, by the same names.
        The model's Keras variables get the trained weights too, so the model object is current."""
        self.sync_model()
        model_arrays = {name: np.asarray(var.numpy()) for name, var in self.named.items()}
        slots = {"m": backend.to_numpy(self.slots["m"]), "v": backend.to_numpy(self.slots["v"])}
        if "updates" in self.slots:
            slots["updates"] = backend.to_numpy([self.slots["updates"]])[0]
        opt_arrays = self.rule.arrays(slots)
        opt_arrays["global_step"] = np.asarray(step, dtype=np.int64)
        if self.loss_scale is not None:  # under TensorFlow's names and dtypes
            scale, good = backend.to_numpy([self.slots["loss_scale"], self.slots["loss_scale_good_steps"]])
            opt_arrays["loss_scale"] = np.asarray(scale, np.float32)
            opt_arrays["loss_scale_good_steps"] = np.asarray(good, np.int64)
        return model_arrays, opt_arrays

    def restore(self, path: Path) -> None:
        """Weights and slots from checkpoint directory `path` (written on either backend)."""
        assign_named_weights(self.named, load_arrays(path, MODEL_FILE), str(path / MODEL_FILE))
        opt = load_arrays(path, OPTIMIZER_FILE)
        try:
            slots = self.rule.from_arrays(opt, str(path / OPTIMIZER_FILE))
        except KeyError as exc:
            raise CheckpointError(exc.args[0]) from exc
        self.reload_from_model()
        self._set_slots(self._with_loss_scale(slots, opt))

    def reload_from_model(self) -> None:
        """The weights again from the model's variables (after an --init-from / --init-checkpoint load)."""
        self.params = backend.replicate([np.asarray(v.numpy()) for v in self.variables], self.sharding)
