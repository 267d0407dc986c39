"""The optimizers: the original AdamWeightDecay and LAMB; global-norm clipping, warmup + linear decay.

Written as a plain update (not a `keras.optimizers.Optimizer` subclass) on purpose: the Keras base
class brings its own iteration counter, weight-decay order (decay applied before the Adam step),
gradient clipping and accumulation semantics and loss scaling, each of which would have to be
switched off or worked around to get the original arithmetic. Here the whole update is the ten
lines of RECIPE.md section 7, applied per variable through `strategy.extended.update` so it runs on
every replica's copy in place (one device, MirroredStrategy, TPUStrategy alike).

Update (no bias correction; decay skipped for LayerNorm and bias variables)::

    m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2
    u = m / (sqrt(v) + eps) + wd * w
    w = w - lr * u

`Lamb` (`--optimizer lamb`) is the layer-wise variant NVIDIA's and MLPerf's BERT use for large
batches: the same moments, bias-corrected with the count t of updates applied so far (this one
included, as NVIDIA's LAMB with its global step advanced first), and each variable's update scaled
by its trust ratio ||w|| / ||u|| (1 when either norm is 0)::

    u = (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps) + wd * w
    w = w - lr * r * u,   r = ||w|| / ||u||

Decay and trust ratio are both skipped for LayerNorm and bias variables (MLPerf's LAMB: its layer
adaptation exclusions default to the decay exclusions).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import keras
import numpy as np
import tensorflow as tf

from bert_datagen.trainer.errors import CheckpointError
from bert_datagen.trainer.runtime.config import OPTIMIZERS
from bert_datagen.trainer.runtime.updates import (
    EXCLUDE_FROM_WEIGHT_DECAY,
    LOSS_SCALE_INITIAL,
    LOSS_SCALE_PERIOD,
    adam_moments,
    adamw_direction,
    lamb_corrections,
    lamb_direction,
    next_loss_scale,
    uses_weight_decay,
)

LAMB_UPDATES_KEY = "lamb_updates"


class AdamWeightDecay:
    """Slots and update of the original AdamWeightDecay for a fixed, named list of variables.

    Create it inside the distribution strategy's scope (slots are mirrored like the weights).
    `names` are TF1 names; slots are exported as `NAME/adam_m`, `NAME/adam_v` like the original.
    """

    def __init__(self, variables: dict, weight_decay: float = 0.01, beta_1: float = 0.9,
                 beta_2: float = 0.999, epsilon: float = 1e-6,
                 exclude_from_weight_decay: Sequence[str] = EXCLUDE_FROM_WEIGHT_DECAY):
        self.names = list(variables)
        self.variables = [variables[n] for n in self.names]
        self.weight_decay = weight_decay
        self.beta_1, self.beta_2, self.epsilon = beta_1, beta_2, epsilon
        self.decay = [weight_decay > 0 and uses_weight_decay(n, exclude_from_weight_decay) for n in self.names]
        self.m = [tf.Variable(tf.zeros(v.shape, tf.float32), trainable=False, name=_slot_name(n, "m"))
                  for n, v in zip(self.names, self.variables, strict=True)]
        self.v = [tf.Variable(tf.zeros(v.shape, tf.float32), trainable=False, name=_slot_name(n, "v"))
                  for n, v in zip(self.names, self.variables, strict=True)]

    def apply(self, grads: Sequence[tf.Tensor], lr: tf.Tensor, ok: tf.Tensor | None = None) -> None:
        """Apply one update. In a replica context every replica must pass the same (all-reduced)
        gradients; `ok=False` leaves weights and slots unchanged (a skipped loss-scaled step)."""
        ctx = tf.distribute.get_replica_context()
        if ctx is None:  # cross-replica context
            self._apply_all(tf.distribute.get_strategy(), grads, lr, ok)
        else:
            ctx.merge_call(self._apply_all, args=(grads, lr, ok))

    def _apply_all(self, strategy, grads, lr, ok) -> None:
        step_terms = self._step_terms()
        for i, var in enumerate(self.variables):
            target = var.value if isinstance(var, keras.Variable) else var  # the tf.Variable behind it
            strategy.extended.update(
                target, self._update_one, args=(grads[i], self.m[i], self.v[i], lr, ok, step_terms),
                kwargs={"index": i}, group=False,
            )
        self._count_update(strategy, ok)

    def _update_one(self, w, g, m, v, lr, ok, step_terms, index: int):
        """The Adam moments (shared by every subclass), then the subclass's update direction."""
        next_m, next_v = adam_moments(tf.convert_to_tensor(g, tf.float32), m, v, self.beta_1, self.beta_2)
        next_w = w - lr * self._update_direction(w, next_m, next_v, step_terms, index)
        if ok is not None:
            next_w = tf.where(ok, next_w, w)
            next_m = tf.where(ok, next_m, m)
            next_v = tf.where(ok, next_v, v)
        w.assign(next_w)
        m.assign(next_m)
        v.assign(next_v)

    def _step_terms(self):
        """Values computed once per step for every variable's update (none here)."""
        return None

    def _update_direction(self, w, next_m, next_v, step_terms, index: int) -> tf.Tensor:
        """u of the module docstring: the original's uncorrected Adam step plus decoupled decay."""
        return adamw_direction(w, next_m, next_v, self.epsilon, self.weight_decay, self.decay[index])

    def _count_update(self, strategy, ok) -> None:
        """Hook after each step's updates (no state to count here)."""
        return  # a statement: AutoGraph cannot convert a body that is only a docstring

    # -- checkpointing: slot values by their original names

    def slot_arrays(self) -> dict[str, np.ndarray]:
        out = {}
        for name, m, v in zip(self.names, self.m, self.v, strict=True):
            out[name + "/adam_m"] = m.numpy()
            out[name + "/adam_v"] = v.numpy()
        return out

    def load_slot_arrays(self, arrays: dict[str, np.ndarray], source: str = "checkpoint") -> None:
        missing = [n for n in self.names if n + "/adam_m" not in arrays or n + "/adam_v" not in arrays]
        if missing:
            raise CheckpointError(f"{source}: optimizer slots missing for {missing[:5]} ({len(missing)} in all)")
        for name, m, v in zip(self.names, self.m, self.v, strict=True):
            m.assign(arrays[name + "/adam_m"])
            v.assign(arrays[name + "/adam_v"])


class Lamb(AdamWeightDecay):
    """LAMB with the slots of AdamWeightDecay plus a count of applied updates (bias correction).

    A skipped loss-scaled step (`ok=False`) does not count, so t is the number of updates that
    really changed the weights; the count is checkpointed with the slots.
    """

    def __init__(self, variables: dict, weight_decay: float = 0.01, beta_1: float = 0.9,
                 beta_2: float = 0.999, epsilon: float = 1e-6,
                 exclude_from_weight_decay: Sequence[str] = EXCLUDE_FROM_WEIGHT_DECAY,
                 exclude_from_layer_adaptation: Sequence[str] | None = None):
        super().__init__(variables, weight_decay, beta_1, beta_2, epsilon, exclude_from_weight_decay)
        adaptation_exclusions = exclude_from_layer_adaptation or exclude_from_weight_decay
        self.adapt = [uses_weight_decay(n, adaptation_exclusions) for n in self.names]
        self.updates = tf.Variable(0, dtype=tf.int64, trainable=False, name=LAMB_UPDATES_KEY)

    def _step_terms(self):
        """The bias corrections (1 - b1^t, 1 - b2^t), t counting this update."""
        return lamb_corrections(tf.convert_to_tensor(self.updates), self.beta_1, self.beta_2)

    def _update_direction(self, w, next_m, next_v, step_terms, index: int) -> tf.Tensor:
        """r * u of the module docstring: bias-corrected Adam plus decay, scaled by the trust ratio."""
        return lamb_direction(w, next_m, next_v, step_terms, self.epsilon, self.weight_decay, self.decay[index],
                              self.adapt[index])

    def _count_update(self, strategy, ok) -> None:
        if ok is None:
            strategy.extended.update(self.updates, lambda u: u.assign_add(1), group=False)
        else:
            strategy.extended.update(self.updates, lambda u, ok: u.assign_add(tf.cast(ok, tf.int64)),
                                     args=(ok,), group=False)

    def slot_arrays(self) -> dict[str, np.ndarray]:
        out = super().slot_arrays()
        out[LAMB_UPDATES_KEY] = np.asarray(self.updates.numpy(), dtype=np.int64)
        return out

    def load_slot_arrays(self, arrays: dict[str, np.ndarray], source: str = "checkpoint") -> None:
        if LAMB_UPDATES_KEY not in arrays:
            raise CheckpointError(f"{source}: no {LAMB_UPDATES_KEY} (not a checkpoint of a LAMB run)")
        super().load_slot_arrays(arrays, source)
        self.updates.assign(int(arrays[LAMB_UPDATES_KEY]))


def make_optimizer(name: str, variables: dict, weight_decay: float = 0.01) -> AdamWeightDecay:
    """The optimizer called `name` (one of OPTIMIZERS) for `variables` (TF1 name -> variable)."""
    if name == "adamw":
        return AdamWeightDecay(variables, weight_decay=weight_decay)
    if name == "lamb":
        return Lamb(variables, weight_decay=weight_decay)
    raise ValueError(f"unknown optimizer {name!r}; choose one of {', '.join(OPTIMIZERS)}")


def _slot_name(name: str, kind: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.\-]", "_", name) + "_adam_" + kind


def clip_by_global_norm(grads: Sequence[tf.Tensor], clip_norm: float) -> tuple[list[tf.Tensor], tf.Tensor]:
    """The original's `tf.clip_by_global_norm` (a non-finite norm makes every gradient NaN)."""
    clipped, norm = tf.clip_by_global_norm(list(grads), clip_norm)
    return clipped, norm


class DynamicLossScale:
    """Loss scaling for float16: halve on a non-finite gradient (the step is skipped), double after
    `period` finite steps in a row. Its state is checkpointed with the run."""

    def __init__(self, initial: float = LOSS_SCALE_INITIAL, period: int = LOSS_SCALE_PERIOD):
        self.period = period
        self.scale = tf.Variable(initial, dtype=tf.float32, trainable=False, name="loss_scale")
        self.good_steps = tf.Variable(0, dtype=tf.int64, trainable=False, name="loss_scale_good_steps")

    def update(self, finite: tf.Tensor) -> None:
        ctx = tf.distribute.get_replica_context()
        if ctx is None:
            self._update(tf.distribute.get_strategy(), finite)
        else:
            ctx.merge_call(self._update, args=(finite,))

    def _update(self, strategy, finite) -> None:
        finite = strategy.experimental_local_results(finite)[0] if strategy.num_replicas_in_sync > 1 else finite
        new_scale, new_good = next_loss_scale(self.scale, self.good_steps, finite, self.period)
        self.scale.assign(new_scale)
        self.good_steps.assign(new_good)

    def state(self) -> dict[str, np.ndarray]:
        return {"loss_scale": np.asarray(self.scale.numpy()), "loss_scale_good_steps": np.asarray(self.good_steps.numpy())}

    def load_state(self, arrays: dict[str, np.ndarray]) -> None:
        if "loss_scale" in arrays:
            self.scale.assign(arrays["loss_scale"])
            self.good_steps.assign(arrays["loss_scale_good_steps"])


def loss_scale_for(precision: str) -> DynamicLossScale | None:
    """A dynamic loss scale for float16 (its gradients underflow without one); none otherwise
    (bfloat16 has float32's exponent range). Create it inside the strategy's scope."""
    return DynamicLossScale() if precision == "mixed_float16" else None
