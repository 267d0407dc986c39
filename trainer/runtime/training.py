"""The one choice of backend below the training loop: a run describes what it trains (a
`TrainingSpec`) and `start_training` builds it on the process's Keras backend, as a `TfTraining`
(`tf_training.py`) or a `JaxTraining` (`jax_training.py`). Both hold the model, its weights and
optimizer state and the compiled steps behind the same methods (`train_step`, `eval_step`,
`checkpoint_arrays`, `restore`, `reload_from_model`, `sync_model`), so `runtime/loop.py` and the
runs above it never name a backend. Each backend's module is imported only when chosen: a JAX run
imports no TensorFlow from here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from bert_datagen.trainer.errors import TrainConfigError
from bert_datagen.trainer.runtime import cluster
from bert_datagen.trainer.runtime.objective import Objective


@dataclass(frozen=True)
class TrainingSpec:
    """What a run trains. `settings` is the run's config (TrainConfig or FinetuneConfig: seed,
    batch_size, accumulation_steps, clip_norm, jit, strategy, tpu, precision, weight_decay, out)."""

    backend: str
    settings: Any
    build_model: Callable[[], Any]  # the model with its initial weights
    variable_map: Callable[[Any], dict]  # every weight of the model by its TF1 name (checkpoints)
    trained_map: Callable[[Any], dict]  # the weights the optimizer updates, by TF1 name
    objective: Callable[[Any], Objective]
    optimizer: str = "adamw"
    eval_sums: Callable[[Any, dict], dict] | None = None  # (model, batch) -> additive eval figures
    bad_record: Callable[[], str | None] | None = None  # names a corrupt training record, if any


def start_training(spec: TrainingSpec):
    """The model and its training state on `spec.backend` (a TfTraining or a JaxTraining)."""
    if spec.backend == "jax":
        from bert_datagen.trainer.runtime.jax_training import JaxTraining

        return JaxTraining(spec)
    if spec.backend == "tensorflow":
        from bert_datagen.trainer.runtime.tf_training import TfTraining

        return TfTraining(spec)
    raise TrainConfigError(f"unknown backend {spec.backend!r}")


def refuse_unported_on_jax(settings) -> None:
    """What the JAX backend does not run yet, refused before any work, each naming why (`settings` a
    TrainConfig or FinetuneConfig)."""
    if settings.backend != "jax":
        return
    if settings.strategy == "tpu":
        raise TrainConfigError("--strategy tpu runs on TensorFlow only so far (on JAX a TPU is one of the process's "
                               "devices: --strategy auto, or multi-worker over a pod's hosts)")
    if settings.strategy == "multi-worker" and cluster.joined_backend() != "jax":
        raise TrainConfigError("--strategy multi-worker: the cluster must be joined before anything runs on JAX "
                               "(bert-train joins the one TF_CONFIG describes at its start: runtime/cluster.join_for)")


def enable_determinism(seed: int, backend: str = "tensorflow") -> None:
    """On TensorFlow, Keras's seed and TensorFlow's deterministic kernels, so the same run repeats
    bitwise. On JAX nothing: every random draw of a run is ours (initial weights from `datagen/rng.py`,
    keyed dropout), JAX has no global random state, and XLA's CPU kernels are deterministic as
    they are. Keras's `set_random_seed` would also seed TensorFlow, importing it (9 s, and on a GPU
    machine TensorFlow takes the GPU's memory) wherever it is installed beside JAX."""
    if backend != "tensorflow":
        return
    import keras
    import tensorflow as tf

    keras.utils.set_random_seed(seed)
    tf.config.experimental.enable_op_determinism()
