"""The ranges integer values of the contract can take, and the one check of an API argument against
its range (the CLIs' integer options use the same bounds through `Int` of `cli/plumbing.py`).

Positions of the global order, steps and counts are int64 (NumPy arrays, TensorFlow's step counter,
JSON readers of other languages): a value past ``INT64_MAX`` fails deep inside, as an OverflowError
that names nothing. Global batch ``k`` of a batch size ``B`` holds positions ``[k*B, (k+1)*B)``, so
the batches an order can index are fewer than ``max_batches(B)``.
"""

from __future__ import annotations

INT64_MAX = 2**63 - 1
INT32_MAX = 2**31 - 1  # token ids, vocab sizes and sequence lengths: int32 in the model's inputs
# keras.utils.set_random_seed seeds NumPy too, whose seeds are unsigned 32-bit; a run's seed also
# keys the global order, so `bert-datagen batches` and the loaders take the seeds a run can take.
MAX_SEED = 2**32 - 1
# Python's longest wait (threading.TIMEOUT_MAX, whole seconds): faulthandler's watchdog and the
# waits of a multi-worker start-up refuse longer ones with an OverflowError.
MAX_TIMEOUT_S = 9_223_372_036


def max_batches(batch_size: int) -> int:
    """How many global batches of ``batch_size`` the order can index: batch ``k`` needs ``(k+1)*B``
    to fit in int64."""
    return INT64_MAX // batch_size


class ArgumentError(ValueError):
    """An argument outside its range; ``argument`` names it, so a CLI can name its option instead."""

    def __init__(self, argument: str, message: str) -> None:
        super().__init__(message)
        self.argument = argument


def check_int(value: object, name: str, low: int = 0, high: int = INT64_MAX, why: str = "") -> int:
    """``value`` when it is an integer (a Python or NumPy integer, never a bool) in [low, high];
    else ArgumentError naming ``name``, the value and the range (and ``why``, when the bound needs
    a reason)."""
    import numbers

    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ArgumentError(name, f"{name} must be an integer, got {value!r} ({type(value).__name__})")
    if not low <= int(value) <= high:
        raise ArgumentError(name, f"{name} {int(value)} is not in [{low}, {high}]{why}")
    return int(value)
