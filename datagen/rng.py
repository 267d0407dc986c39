"""Counter-based random numbers that this project owns.

Every random choice in data generation is a pure function of
``(seed, purpose, identities..., counter)``.  Keys are derived with BLAKE2b and
draws come from the SplitMix64 finaliser applied to ``key + counter * GOLDEN``.
Both are fixed algorithms written down here, so a dataset does not change when
Python's ``random`` or NumPy's ``Generator`` change their internals, and any
worker can reproduce any draw without seeing the draws before it.
"""

from __future__ import annotations

import hashlib
from collections.abc import MutableSequence
from typing import Any

import numpy as np

MASK64 = (1 << 64) - 1
GOLDEN = 0x9E3779B97F4A7C15
_M1 = 0xBF58476D1CE4E5B9
_M2 = 0x94D049BB133111EB
_INV_2_53 = 1.0 / (1 << 53)


def mix64(z: int) -> int:
    """SplitMix64 finaliser on one 64-bit integer."""
    z &= MASK64
    z = ((z ^ (z >> 30)) * _M1) & MASK64
    z = ((z ^ (z >> 27)) * _M2) & MASK64
    return z ^ (z >> 31)


def mix64_array(z: np.ndarray) -> np.ndarray:
    """SplitMix64 finaliser, element-wise on a uint64 array (wraps mod 2**64)."""
    return _mix64_inplace(np.array(z, dtype=np.uint64, copy=True))


def _mix64_inplace(z: np.ndarray) -> np.ndarray:
    # In place with one scratch buffer: the hot loops of masking call this on
    # millions of values, where temporaries cost more than the arithmetic.
    tmp = np.empty_like(z)
    for shift, mult in ((30, _M1), (27, _M2)):
        np.right_shift(z, np.uint64(shift), out=tmp)
        np.bitwise_xor(z, tmp, out=z)
        np.multiply(z, np.uint64(mult), out=z)
    np.right_shift(z, np.uint64(31), out=tmp)
    np.bitwise_xor(z, tmp, out=z)
    return z


def _encode_part(part: Any) -> bytes:
    # Type-tagged, length-prefixed, so ("ab", "c") and ("a", "bc") differ.
    if isinstance(part, bool):
        raise TypeError("bool is ambiguous as an RNG key part; use int")
    if isinstance(part, int):
        raw, tag = part.to_bytes(16, "little", signed=True), b"i"
    elif isinstance(part, str):
        raw, tag = part.encode("utf-8"), b"s"
    elif isinstance(part, bytes):
        raw, tag = part, b"b"
    else:
        raise TypeError(f"unsupported RNG key part {type(part).__name__}")
    return tag + len(raw).to_bytes(8, "little") + raw


def derive_key(seed: int, *parts: int | str | bytes) -> int:
    """A 64-bit key for the stream of ``(seed, *parts)``."""
    h = hashlib.blake2b(digest_size=8, person=b"bertdgen-rng-v1")
    h.update(_encode_part(int(seed)))
    for part in parts:
        h.update(_encode_part(part))
    return int.from_bytes(h.digest(), "little")


def hash64(*parts: int | str | bytes) -> int:
    """A stable 64-bit hash of the parts (no seed): identities, shard keys."""
    h = hashlib.blake2b(digest_size=8, person=b"bertdgen-id-v1")
    for part in parts:
        h.update(_encode_part(part))
    return int.from_bytes(h.digest(), "little")


class Stream:
    """A sequence of 64-bit draws; the i-th draw is ``mix64(key + i * GOLDEN)``."""

    __slots__ = ("key", "counter")

    def __init__(self, key: int, counter: int = 0) -> None:
        self.key = key & MASK64
        self.counter = counter

    @classmethod
    def for_purpose(cls, seed: int, *parts: int | str | bytes) -> Stream:
        return cls(derive_key(seed, *parts))

    def next_u64(self) -> int:
        self.counter += 1
        return mix64(self.key + self.counter * GOLDEN)

    def uniform(self) -> float:
        """A float in [0, 1) with 53 random bits."""
        return (self.next_u64() >> 11) * _INV_2_53

    def randint(self, low: int, high: int) -> int:
        """An integer in [low, high], both inclusive (modulo bias < 2**-40)."""
        if high < low:
            raise ValueError(f"empty range [{low}, {high}]")
        return low + self.next_u64() % (high - low + 1)

    def shuffle(self, seq: MutableSequence[Any]) -> None:
        """Fisher-Yates in place, last element first."""
        for i in range(len(seq) - 1, 0, -1):
            j = self.randint(0, i)
            seq[i], seq[j] = seq[j], seq[i]

    def u64_array(self, n: int) -> np.ndarray:
        """The next ``n`` draws at once, equal to ``n`` calls of ``next_u64``."""
        counters = np.arange(self.counter + 1, self.counter + 1 + n, dtype=np.uint64)
        self.counter += n
        return mix64_array(np.uint64(self.key) + counters * np.uint64(GOLDEN))

    def uniform_array(self, n: int) -> np.ndarray:
        return (self.u64_array(n) >> np.uint64(11)).astype(np.float64) * _INV_2_53


def u64_for_keys(keys: np.ndarray, counters: np.ndarray) -> np.ndarray:
    """Draw ``counters[i]`` of stream ``keys[i]``, for many streams at once."""
    keys = np.asarray(keys, dtype=np.uint64)
    counters = np.asarray(counters, dtype=np.uint64)
    z = counters * np.uint64(GOLDEN)
    if z.shape == np.broadcast_shapes(z.shape, keys.shape):
        np.add(z, keys, out=z)
    else:
        z = z + keys
    return _mix64_inplace(z)
