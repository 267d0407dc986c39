"""Keyed dropout with bits of our own, equal on every Keras backend.

A dropout mask must not depend on the backend, the device, XLA, or how the global batch is cut
over devices, processes and accumulation micro-batches: then a run resumes bitwise, N devices
equal one, and a run started on TensorFlow continues on JAX with the same masks. Neither backend's
random ops promise that (TensorFlow's Philox words and JAX's threefry keys are different streams,
and their float conversions differ under XLA), so the bits come from a hash written here in
`keras.ops` on uint32 words, which both backends compute exactly (wrapping add and multiply,
xor, shifts).

The bits of element j of global row r at dropout site s in step t::

    (k0, k1) = fold(fold(run_key, t), s)          # run_key: two words from the run's seed (rng.py)
    bits     = mix(mix(r ^ k1) ^ mix(j + k0))     # mix: a 32-bit avalanche finaliser

and an element is kept where its top 24 bits, as an integer, are at least rate * 2^24 (compared on
integers, so no float conversion can differ). A `dropout_key` carries (k0 before the site fold, k1,
first global row of the call) as three uint32 words.
"""

from __future__ import annotations

import numpy as np
from keras import ops

from bert_datagen.datagen.rng import derive_key

# Chris Wellons' "lowbias32" finaliser constants: a bijection on 32-bit words with good avalanche.
_MIX_1 = np.uint32(0x7FEB352D)
_MIX_2 = np.uint32(0x846CA68B)
_GOLDEN = np.uint32(0x9E3779B9)
_KEEP_BITS = 24


def _u32(value) -> object:
    return ops.cast(value, "uint32")


def mix32(x):
    """The avalanche finaliser on uint32 words (element-wise)."""
    x = ops.bitwise_xor(x, ops.right_shift(x, 16))
    x = ops.multiply(x, _MIX_1)
    x = ops.bitwise_xor(x, ops.right_shift(x, 15))
    x = ops.multiply(x, _MIX_2)
    return ops.bitwise_xor(x, ops.right_shift(x, 16))


def fold(key, value):
    """A new [2] uint32 key from `key` ([2] uint32) and a uint32 scalar `value`."""
    value = _u32(value)
    a = mix32(ops.bitwise_xor(key[0], mix32(ops.add(value, _GOLDEN))))
    b = mix32(ops.bitwise_xor(key[1], ops.add(a, _GOLDEN)))
    return ops.stack([a, b])


def run_key(seed: int, salt: int) -> np.ndarray:
    """The two words every dropout key of a run starts from, derived from its seed and the kind of
    run (`salt`) through the project's one RNG (`datagen/rng.py`)."""
    k = derive_key(seed, "dropout", salt)
    return np.array([k & 0xFFFFFFFF, (k >> 32) & 0xFFFFFFFF], dtype=np.uint32)


def step_key(base, step):
    """The [2] uint32 key of training step `step` (a scalar, traced or not) from `run_key`'s words."""
    return fold(_u32(base), step)


def dropout_key(seed, first_row=0):
    """The [3] uint32 `dropout_seed` of a call whose first row is row `first_row` of the step's
    global batch: (step key, first_row). A [2] key alone means first_row 0."""
    seed = _u32(seed)
    return ops.concatenate([seed[:2], ops.reshape(_u32(first_row), [1])], axis=0)


def dropout_bits(shape, seed, site: int):
    """uint32 bits of a tensor of `shape` ([rows, ...]) under `dropout_key` `seed` at `site`."""
    seed = _u32(seed)
    first_row = seed[2] if seed.shape[0] == 3 else _u32(0)
    k0, k1 = ops.unstack(fold(seed[:2], site))
    rows = ops.add(_u32(ops.arange(shape[0], dtype="int32")), first_row)
    per_row = 1
    for size in shape[1:]:
        per_row = per_row * size
    columns = _u32(ops.arange(per_row, dtype="int32"))
    row_words = mix32(ops.bitwise_xor(rows, k1))  # [rows]
    column_words = mix32(ops.add(columns, k0))  # [per_row]
    bits = mix32(ops.bitwise_xor(ops.expand_dims(row_words, 1), ops.expand_dims(column_words, 0)))
    return ops.reshape(bits, shape)


def dropout(x, rate: float, seed, site: int):
    """Inverted dropout whose mask depends only on (key, site, each row's global position)."""
    if seed is None or rate == 0.0:
        return x
    bits = dropout_bits(ops.shape(x), seed, site)
    threshold = np.uint32(int(round(rate * (1 << _KEEP_BITS))))
    keep = ops.greater_equal(ops.right_shift(bits, 32 - _KEEP_BITS), threshold)
    scale = ops.cast(1.0 / (1.0 - rate), x.dtype)
    return ops.where(keep, ops.multiply(x, scale), ops.zeros_like(x))
