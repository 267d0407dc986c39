"""The JAX backend's part of training: placement, the compiled step, nothing else.

The model, its losses and the optimizers' arithmetic are the same Keras code as on TensorFlow
(`keras.ops`); this module only runs it the JAX way. The weights are arrays outside the Keras
variables during training (a Keras model read inside `keras.StatelessScope` computes with the
arrays it is given), the whole step (gradients of each accumulation micro-batch, clipping, the
update) is one `jax.jit` function of (weights, optimizer slots, global batch, learning rate, step),
and several devices of this process split the global batch along its first axis (a `data` mesh
axis): XLA inserts the gradient sum over devices, so the program is written for the whole batch
and one device and N devices compute the same update (rows keep their global positions, which is
all keyed dropout reads). The same holds for the devices of several processes (`jax_cluster.py`):
each places its share of the global batch (`place_share`), the program is unchanged.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import keras
import numpy as np

Batch = dict[str, Any]


def data_sharding(devices: int | None = None) -> jax.sharding.NamedSharding | None:
    """How a global batch is laid over this process's devices (split along its first axis), or None
    for one device (then arrays simply live on it)."""
    local = jax.local_devices()
    count = len(local) if devices is None else devices
    if count > len(local):
        raise ValueError(f"{count} devices asked for, this process has {len(local)}")
    if count <= 1:
        return None
    mesh = jax.sharding.Mesh(np.array(local[:count]), ("data",))
    return jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("data"))


def place_batch(batch: Batch, sharding: jax.sharding.NamedSharding | None) -> Batch:
    """The host's NumPy batch, the whole global batch, on the devices (split over them where
    `sharding` says; over several processes, each places the rows of its own devices)."""
    if sharding is None:
        return {k: jnp.asarray(v) for k, v in batch.items()}
    if not sharding.is_fully_addressable:
        return {k: _from_whole(np.asarray(v), sharding) for k, v in batch.items()}
    return {k: jax.device_put(v, sharding) for k, v in batch.items()}


def place_share(batch: Batch, sharding: jax.sharding.NamedSharding) -> Batch:
    """This process's share of a global batch (its devices' consecutive rows) as the global array
    over every process's devices: `sharding` spans several processes."""
    processes = len(sharding.device_set) // len(sharding.addressable_devices)
    return {k: jax.make_array_from_process_local_data(sharding, v, (v.shape[0] * processes, *v.shape[1:]))
            for k, v in batch.items()}


def replicate(arrays: Sequence, sharding: jax.sharding.NamedSharding | None) -> list:
    """Weights or slots as device arrays, a full copy on every device of the mesh (every process
    passes the same arrays)."""
    if sharding is None:
        return [jnp.asarray(a) for a in arrays]
    whole = jax.sharding.NamedSharding(sharding.mesh, jax.sharding.PartitionSpec())
    if not whole.is_fully_addressable:
        return [_from_whole(np.asarray(a), whole) for a in arrays]
    return [jax.device_put(np.asarray(a), whole) for a in arrays]


def _from_whole(value: np.ndarray, sharding: jax.sharding.Sharding) -> jax.Array:
    """A global array from a host copy of all of it, each process placing its devices' parts."""
    return jax.make_array_from_callback(value.shape, sharding, lambda index: value[index])


def stateless(variables: Sequence[keras.Variable], fn: Callable) -> Callable:
    """`fn(*args)` computed with `variables` read as the arrays passed first: `g(params, *args)`."""

    def with_params(params, *args):
        with keras.StatelessScope(state_mapping=list(zip(variables, params, strict=True))):
            return fn(*args)

    return with_params


def make_train_step(variables: Sequence[keras.Variable], micro_loss: Callable, whole_batch_total: Callable,
                    micro_key: Callable, apply_update: Callable, accumulation_steps: int,
                    clip: Callable, next_loss_scale: Callable | None = None) -> Callable:
    """A jitted (params, slots, batch, lr, step) -> (params, slots, figures) step.

    `micro_loss(part, total, key)` -> (loss share, additive figures) of one micro-batch;
    `whole_batch_total(batch, reduce)` its normaliser; `micro_key(step, first_row)` the dropout key
    of a micro-batch starting at that global row; `clip(grads)` -> (clipped, norm);
    `apply_update(params, grads, slots, lr)` -> (params, slots).

    With `next_loss_scale(scale, good_steps, finite)` (float16), slots also hold "loss_scale" and
    "loss_scale_good_steps": each micro-batch's loss is multiplied by the scale, the gradients
    divided by it, and a step whose gradients are not all finite leaves weights and slots as they
    were (only the scale moves), as TensorFlow's step does."""

    def scaled_loss(part, total, key, scale):
        loss, sums = micro_loss(part, total, key)
        return loss * scale, sums

    grad_of = jax.grad(stateless(variables, micro_loss if next_loss_scale is None else scaled_loss), has_aux=True)

    def step(params, slots, batch, lr, step_number):
        total = whole_batch_total(batch, lambda value: value)
        rows = batch["input_ids"].shape[0]
        micro = rows // accumulation_steps
        grads, figures = None, None
        scale = () if next_loss_scale is None else (slots["loss_scale"],)
        for k in range(accumulation_steps):  # unrolled: accumulation counts are small
            part = {name: value[k * micro:(k + 1) * micro] for name, value in batch.items()}
            g, sums = grad_of(params, part, total, micro_key(step_number, k * micro), *scale)
            grads = g if grads is None else [a + b for a, b in zip(grads, g, strict=True)]
            figures = sums if figures is None else {n: figures[n] + sums[n] for n in figures}
        if scale:
            grads = [g / scale[0] for g in grads]
        finite = jnp.all(jnp.stack([jnp.all(jnp.isfinite(g)) for g in grads]))
        clipped, norm = clip(grads)
        new_params, new_slots = apply_update(params, clipped, slots, lr)
        if scale:  # a skipped step: weights and optimizer slots stay; the scale halves
            new_params = [jnp.where(finite, n, o) for n, o in zip(new_params, params, strict=True)]
            new_slots = jax.tree_util.tree_map(lambda n, o: jnp.where(finite, n, o), new_slots,
                                               {k: slots[k] for k in new_slots})
            new_slots["loss_scale"], new_slots["loss_scale_good_steps"] = next_loss_scale(
                slots["loss_scale"], slots["loss_scale_good_steps"], finite)
        figures = dict(figures)
        figures["grad_norm"] = norm
        figures["finite"] = finite.astype(jnp.float32)
        return new_params, new_slots, figures

    return jax.jit(step, donate_argnums=(0, 1))


def make_eval_step(variables: Sequence[keras.Variable], sums: Callable) -> Callable:
    """A jitted (params, batch) -> additive figures step (`sums(batch)` with the model in eval mode)."""
    return jax.jit(stateless(variables, sums))


def to_numpy(arrays: Sequence) -> list[np.ndarray]:
    """Device arrays back on the host (for checkpoints and exports); a replicated array over several
    processes from this process's own copy."""
    return [np.asarray(jax.device_get(_addressable(a))) for a in arrays]


def _addressable(a):
    if not isinstance(a, jax.Array) or a.is_fully_addressable:
        return a
    if not a.sharding.is_fully_replicated:
        raise ValueError(f"an array of shape {a.shape} split over several processes has no copy here")
    return a.addressable_data(0)
