"""A model's inference (dropout off) on NumPy batches, compiled the way of the run's backend and
kept for every later call: fine-tuning's evaluations, `bert-train eval` and `predict`.

One traced function per model (and, on TensorFlow, per sequence length, the batch dimension left
open so full and short batches share a trace): a function made per call traced the model again at
each evaluation. Weak keys: a model no longer used takes its functions with it.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable

import numpy as np

MODEL_INPUTS = ("input_ids", "input_mask", "segment_ids")

Predictor = Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]]

_PREDICTORS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def model_predictor(model, backend: str) -> Predictor:
    """`predict(inputs)`: the model's outputs (NumPy) on a batch of MODEL_INPUTS (int32 arrays)."""
    found = _PREDICTORS.get(model)
    if found is None:
        found = _jax_predictor(model) if backend == "jax" else _TfPredictor(model)
        _PREDICTORS[model] = found
    return found


class _TfPredictor:
    """Traced once per sequence length (`functions`), the batch dimension left open."""

    def __init__(self, model) -> None:
        self._owner = weakref.ref(model)  # a strong reference here would keep the cache's key alive
        self.functions: dict[int, Callable] = {}

    def __call__(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        import tensorflow as tf

        length = int(inputs["input_ids"].shape[1])
        if length not in self.functions:
            spec = {k: tf.TensorSpec([None, length], tf.int32, name=k) for k in MODEL_INPUTS}
            owner = self._owner
            self.functions[length] = tf.function(lambda batch: owner()(batch, training=False),
                                                 input_signature=[spec])
        return {k: v.numpy() for k, v in self.functions[length](inputs).items()}


def _jax_predictor(model) -> Predictor:
    from bert_datagen.trainer.backends import jax as backend

    owner = weakref.ref(model)
    variables = list(model.variables)
    step = backend.make_eval_step(variables, lambda batch: owner()(batch, training=False))

    def predict(inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        out = step([v.value for v in variables], {k: np.asarray(v) for k, v in inputs.items()})
        return dict(zip(out, backend.to_numpy(list(out.values())), strict=True))

    return predict


def compiled_figures(model, figures: Callable[[dict], dict], backend: str) -> Callable[[dict[str, np.ndarray]], dict[str, float]]:
    """`figures(batch)` (the model read in eval mode inside it; additive sums) compiled the way of
    `backend`, on NumPy batches: the evaluation of a restored model (`bert-train eval`)."""
    if backend == "jax":
        from bert_datagen.trainer.backends import jax as backend_jax

        variables = list(model.variables)
        step = backend_jax.make_eval_step(variables, figures)
        return lambda batch: {k: float(v) for k, v in step([v.value for v in variables], batch).items()}
    import tensorflow as tf

    traced = tf.function(figures)
    return lambda batch: {k: float(v) for k, v in traced(batch).items()}
