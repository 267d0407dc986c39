"""A run's weights, optimizer slots and compiled steps on the JAX backend.

The same objective (`runtime/step.Objective`), optimizer arithmetic (`runtime/updates.py`) and
keyed dropout as on TensorFlow, held as device arrays and stepped by `backends/jax.py`; checkpoint
arrays under the same names as TensorFlow's (`checkpoint.py`), so a run moves between backends.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from bert_datagen.trainer.backends import jax as backend
from bert_datagen.trainer.errors import CheckpointError
from bert_datagen.trainer.model.dropout import dropout_key, run_key, step_key
from bert_datagen.trainer.runtime.checkpoint import (
    MODEL_FILE,
    OPTIMIZER_FILE,
    assign_named_weights,
    load_arrays,
)
from bert_datagen.trainer.runtime.updates import UpdateRule, clip_by_global_norm


class JaxTraining:
    """Weights (`params`, the trained variables in `trained` order) and slots on the devices; the
    model's Keras variables hold the weights only where `sync_model` put them."""

    def __init__(self, named: dict, trained: Sequence[str], objective, eval_sums: Callable, settings,
                 optimizer: str, weight_decay: float, devices: int | None = None):
        self.named = named
        self.trained = list(trained)
        self.variables = [named[n] for n in self.trained]
        self.rule = UpdateRule(optimizer, self.trained, weight_decay=weight_decay)
        self.sharding = backend.data_sharding(devices)
        self.devices = 1 if self.sharding is None else len(self.sharding.mesh.devices.flat)
        self.reload_from_model()
        self._set_slots(self.rule.init_slots([tuple(v.shape) for v in self.variables]))
        base = run_key(settings.seed, objective.dropout_salt)

        def micro_key(step, first_row):
            return dropout_key(step_key(base, step), first_row)

        def clip(grads):
            return clip_by_global_norm(grads, settings.clip_norm)

        self._train = backend.make_train_step(self.variables, objective.micro_loss, objective.whole_batch_total,
                                              micro_key, self.rule.apply, settings.accumulation_steps, clip)
        self._eval = backend.make_eval_step(self.variables, eval_sums)

    def _set_slots(self, slots: dict) -> None:
        placed = {"m": backend.replicate(slots["m"], self.sharding), "v": backend.replicate(slots["v"], self.sharding)}
        if "updates" in slots:
            placed["updates"] = backend.replicate([slots["updates"]], self.sharding)[0]
        self.slots = placed

    def train_step(self, batch: dict[str, np.ndarray], lr: np.float32, step: int) -> dict[str, float]:
        placed = backend.place_batch(batch, self.sharding)
        self.params, self.slots, figures = self._train(self.params, self.slots, placed, np.float32(lr),
                                                       np.int32(step))
        return {k: float(v) for k, v in figures.items()}

    def eval_sums(self, batch: dict[str, np.ndarray]) -> dict[str, float]:
        return {k: float(v) for k, v in self._eval(self.params, backend.place_batch(batch, self.sharding)).items()}

    def checkpoint_arrays(self, step: int) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
        """(model arrays by TF1 name, optimizer arrays): what TensorFlow's runs write, by the same names.
        The model's Keras variables get the trained weights too, so the model object is current."""
        trained = dict(zip(self.trained, backend.to_numpy(self.params), strict=True))
        for name, value in trained.items():
            self.named[name].assign(value)
        model_arrays = {name: trained[name] if name in trained else np.asarray(var.numpy())
                        for name, var in self.named.items()}
        slots = {"m": backend.to_numpy(self.slots["m"]), "v": backend.to_numpy(self.slots["v"])}
        if "updates" in self.slots:
            slots["updates"] = backend.to_numpy([self.slots["updates"]])[0]
        opt_arrays = self.rule.arrays(slots)
        opt_arrays["global_step"] = np.asarray(step, dtype=np.int64)
        return model_arrays, opt_arrays

    def restore(self, path) -> None:
        """Weights and slots from checkpoint directory `path` (written on either backend)."""
        assign_named_weights(self.named, load_arrays(path, MODEL_FILE), str(path / MODEL_FILE))
        opt = load_arrays(path, OPTIMIZER_FILE)
        if "loss_scale" in opt:
            raise CheckpointError(f"{path}: a float16 run (loss scaling), which the JAX backend does not run yet")
        try:
            slots = self.rule.from_arrays(opt, str(path / OPTIMIZER_FILE))
        except KeyError as exc:
            raise CheckpointError(exc.args[0]) from exc
        self.reload_from_model()
        self._set_slots(slots)

    def reload_from_model(self) -> None:
        """The weights again from the model's variables (after an --init-from / --init-checkpoint load)."""
        self.params = backend.replicate([np.asarray(v.numpy()) for v in self.variables], self.sharding)
