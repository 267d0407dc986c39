"""The training input of both runs: this worker's share of the global sample order
(`bert_datagen.contract.loading`, docs/loading.md), read a few batches ahead on one thread.

The position is the step. Pre-training step ``s`` reads global batch ``batch_of_step(s, skipped)``;
fine-tuning step ``s`` reads batch ``s mod E`` of epoch ``s div E`` (E whole batches per epoch;
`trainer/finetune/ordered.py`). So a
checkpoint holds no iterator state, a run resumes at any step on any number of workers, and the
batches are, byte for byte, what the NumPy and PyTorch readers give for the same step. In a cluster
of W workers worker w reads only rank w's share of every global batch (1/W of the bytes); its
replicas then take consecutive slices of that share (`devices.replica_slices`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np

from bert_datagen.contract.loading.source import DatasetReplaced, LoadError
from bert_datagen.trainer.errors import DataError


class OrderedInput:
    """Batches ``make(start)``, ``make(start + 1)``, ... computed ``depth`` ahead on one thread (the
    reader releases the GIL in I/O and NumPy, so it overlaps the step); a LoadError is a DataError."""

    def __init__(self, make: Callable[[int], dict[str, np.ndarray]], start: int, depth: int = 2) -> None:
        # NumPy batches: each backend's step places them on its devices (`runtime/training.py`).
        self._make, self._next, self._depth = make, start, depth
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="bert-input")
        self._ahead: list[Future] = []

    def next(self) -> dict[str, np.ndarray]:
        while len(self._ahead) <= self._depth:
            self._ahead.append(self._pool.submit(self._make, self._next))
            self._next += 1
        try:
            batch = self._ahead.pop(0).result()
        except LoadError as exc:
            raise data_error(exc) from exc
        return batch

    def close(self) -> None:
        for future in self._ahead:
            future.cancel()
        self._pool.shutdown(wait=True)


def data_error(exc: LoadError) -> DataError:
    """The trainer's error for a loader's: a replaced dataset says so and what to do (the run read
    nothing of the new one, and resuming it there is refused); a corrupt one is "corrupt input"."""
    if isinstance(exc, DatasetReplaced):
        return DataError(f"{exc.manifest}: the dataset was {exc.what} while this command read it (a run or task "
                         "--overwrite?): stopped before using any record of another dataset; to train on the new one, "
                         "start a new run (another --out)")
    # The loader says "corrupt shard" where the trainer's messages say "corrupt input" first.
    return DataError(f"corrupt input: {str(exc).replace(': corrupt shard: ', ': ', 1)}")


@contextlib.contextmanager
def input_closed(run) -> Iterator[None]:
    """Close ``run.input`` (an `OrderedInput`, or None) when the block ends, however it ends: its
    reader thread stops and the batches read ahead are dropped."""
    try:
        yield
    finally:
        if run.input is not None:
            run.input.close()
            run.input = None
