"""The optimizers' arithmetic, written once in `keras.ops` for every backend: the original
AdamWeightDecay and LAMB updates of one variable, global-norm clipping, the learning-rate schedule.

`optimizer.py` applies these to TensorFlow variables inside a distribution strategy; the JAX step
(`trainer/backends/jax.py`) applies them to arrays inside `jax.jit`. The formulas are in
`optimizer.py`'s docstring (RECIPE.md section 7); keeping the expressions here, in one order, is
what keeps the two backends' float32 updates equal.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import numpy as np
from keras import ops

EXCLUDE_FROM_WEIGHT_DECAY = ("LayerNorm", "layer_norm", "bias")


def learning_rate(step: int, init_lr: float, warmup_steps: int, total_steps: int) -> np.float32:
    """The original schedule at `step` (the value of global_step before the update), in float32.

    Linear decay to 0 at `total_steps` (polynomial decay, power 1), replaced by `init_lr * step /
    warmup` while `step < warmup`: the rate jumps from the warmup line to the decay line at the
    crossover, exactly like the original.
    """
    f32 = np.float32
    decayed = f32(init_lr) * (f32(1.0) - f32(min(step, total_steps)) / f32(total_steps))
    if warmup_steps and step < warmup_steps:
        return f32(init_lr) * (f32(step) / f32(warmup_steps))
    return f32(decayed)


def uses_weight_decay(name: str, exclude: Sequence[str] = EXCLUDE_FROM_WEIGHT_DECAY) -> bool:
    """Whether the variable called `name` (its TF1 name) is decayed: the original's regex search."""
    return not any(re.search(pattern, name) for pattern in exclude)


def adam_moments(g, m, v, beta_1: float, beta_2: float):
    """The next first and second moments (no bias correction)."""
    g = ops.cast(g, "float32")
    return beta_1 * m + (1.0 - beta_1) * g, beta_2 * v + (1.0 - beta_2) * ops.square(g)


def adamw_direction(w, next_m, next_v, epsilon: float, weight_decay: float, decay: bool):
    """u = m / (sqrt(v) + eps) (+ wd * w where decayed): the original's uncorrected Adam step."""
    update = next_m / (ops.sqrt(next_v) + epsilon)
    return update + weight_decay * w if decay else update


def lamb_corrections(updates_so_far, beta_1: float, beta_2: float):
    """(1 - b1^t, 1 - b2^t) with t = updates_so_far + 1 (this update counted)."""
    t = ops.cast(updates_so_far, "float32") + 1.0
    return 1.0 - ops.power(ops.cast(beta_1, "float32"), t), 1.0 - ops.power(ops.cast(beta_2, "float32"), t)


def lamb_direction(w, next_m, next_v, corrections, epsilon: float, weight_decay: float, decay: bool,
                   adapt: bool):
    """r * u: bias-corrected Adam plus decay, scaled by the trust ratio ||w|| / ||u|| where adapted."""
    update = (next_m / corrections[0]) / (ops.sqrt(next_v / corrections[1]) + epsilon)
    if decay:
        update = update + weight_decay * w
    if adapt:
        w_norm, u_norm = ops.norm(ops.reshape(w, (-1,))), ops.norm(ops.reshape(update, (-1,)))
        ratio = ops.where(w_norm > 0, ops.where(u_norm > 0, w_norm / u_norm, 1.0), 1.0)
        update = ratio * update
    return update


def global_norm(grads: Sequence) -> object:
    return ops.sqrt(sum(ops.sum(ops.square(ops.cast(g, "float32"))) for g in grads))


def clip_by_global_norm(grads: Sequence, clip_norm: float) -> tuple[list, object]:
    """TensorFlow's `clip_by_global_norm`, which the original calls: every gradient times
    clip_norm / max(norm, clip_norm); a non-finite norm makes every gradient NaN."""
    norm = global_norm(grads)
    finite_norm = ops.where(ops.isfinite(norm), norm, float("nan"))
    scale = clip_norm * ops.minimum(1.0 / finite_norm, 1.0 / clip_norm)
    return [g * scale for g in grads], norm


# Dynamic loss scaling (float16): the scale a run starts with, and how many finite steps in a row
# double it; a non-finite step halves it (not below 1) and is skipped.
LOSS_SCALE_INITIAL = 2.0**15
LOSS_SCALE_PERIOD = 2000


def next_loss_scale(scale, good_steps, finite, period: int = LOSS_SCALE_PERIOD):
    """(scale, good steps) after a step whose unscaled gradients were `finite` (or not)."""
    grow = ops.logical_and(finite, good_steps + 1 >= period)
    new_scale = ops.where(finite, ops.where(grow, scale * 2.0, scale), ops.maximum(scale / 2.0, 1.0))
    zero = ops.zeros_like(good_steps)
    new_good = ops.where(finite, ops.where(grow, zero, good_steps + 1), zero)
    return new_scale, new_good


class UpdateRule:
    """AdamWeightDecay or LAMB as a pure function of arrays, for backends whose step is a function
    of the weights (JAX): `apply(params, grads, slots, lr)` -> (params, slots). Slots are
    {"m": [...], "v": [...]} plus "updates" (LAMB's count); `arrays`/`from_arrays` give and take them
    under the checkpoint names `optimizer.py` writes, so a checkpoint moves between backends."""

    def __init__(self, name: str, names: Sequence[str], weight_decay: float = 0.01, beta_1: float = 0.9,
                 beta_2: float = 0.999, epsilon: float = 1e-6):
        if name not in ("adamw", "lamb"):
            raise ValueError(f"unknown optimizer {name!r}; choose one of adamw, lamb")
        self.name, self.names = name, list(names)
        self.weight_decay, self.beta_1, self.beta_2, self.epsilon = weight_decay, beta_1, beta_2, epsilon
        self.decay = [weight_decay > 0 and uses_weight_decay(n) for n in self.names]
        self.adapt = [uses_weight_decay(n) for n in self.names]

    def init_slots(self, shapes: Sequence[tuple[int, ...]]) -> dict:
        slots = {"m": [np.zeros(s, np.float32) for s in shapes], "v": [np.zeros(s, np.float32) for s in shapes]}
        if self.name == "lamb":
            slots["updates"] = np.zeros((), np.int32)
        return slots

    def apply(self, params: list, grads: list, slots: dict, lr) -> tuple[list, dict]:
        corrections = (lamb_corrections(slots["updates"], self.beta_1, self.beta_2)
                       if self.name == "lamb" else None)
        new_params, new_m, new_v = [], [], []
        for i, (w, g) in enumerate(zip(params, grads, strict=True)):
            m, v = adam_moments(g, slots["m"][i], slots["v"][i], self.beta_1, self.beta_2)
            if self.name == "lamb":
                u = lamb_direction(w, m, v, corrections, self.epsilon, self.weight_decay, self.decay[i],
                                   self.adapt[i])
            else:
                u = adamw_direction(w, m, v, self.epsilon, self.weight_decay, self.decay[i])
            new_params.append(w - lr * u)
            new_m.append(m)
            new_v.append(v)
        out = {"m": new_m, "v": new_v}
        if self.name == "lamb":
            out["updates"] = slots["updates"] + 1
        return new_params, out

    def arrays(self, slots: dict) -> dict[str, np.ndarray]:
        out = {}
        for name, m, v in zip(self.names, slots["m"], slots["v"], strict=True):
            out[name + "/adam_m"] = np.asarray(m)
            out[name + "/adam_v"] = np.asarray(v)
        if self.name == "lamb":
            out["lamb_updates"] = np.asarray(slots["updates"], dtype=np.int64)
        return out

    def from_arrays(self, arrays: dict[str, np.ndarray], source: str) -> dict:
        missing = [n for n in self.names if n + "/adam_m" not in arrays or n + "/adam_v" not in arrays]
        if missing:
            raise KeyError(f"{source}: optimizer slots missing for {missing[:5]} ({len(missing)} in all)")
        slots = {"m": [np.asarray(arrays[n + "/adam_m"], np.float32) for n in self.names],
                 "v": [np.asarray(arrays[n + "/adam_v"], np.float32) for n in self.names]}
        if self.name == "lamb":
            if "lamb_updates" not in arrays:
                raise KeyError(f"{source}: no lamb_updates (not a checkpoint of a LAMB run)")
            slots["updates"] = np.asarray(arrays["lamb_updates"], np.int32)
        return slots
