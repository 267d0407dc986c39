"""Iteration over a reader's steps, shared by the readers (`NumpyBatches`, `TaskBatches`, `MixedBatches`).

A reader defines ``batch_at(step)`` and ``order`` (with its ``batch_size``) and keeps ``step`` (the next
batch) and ``stop`` (the first step not given, or None); iteration and a DataLoader worker's part of
the steps follow from those alone.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

from bert_datagen.contract.loading.order import check_order, check_step
from bert_datagen.contract.ranges import check_int, max_batches


def check_reader_arguments(seed: int, batch_size: int, block_size: int, world_size: int, rank: int, start: int,
                           stop: int | None) -> None:
    """The arguments every reader takes, each checked with an ArgumentError naming it (before any data
    is looked at)."""
    check_order(seed, batch_size, block_size)
    check_int(world_size, "world_size", 1)
    check_int(rank, "rank", 0)
    check_step(start, batch_size)
    if stop is not None:
        check_int(stop, "stop", 0, max_batches(batch_size))


class Stepping:
    step: int
    stop: int | None
    order: Any

    def batch_at(self, step: int) -> dict[str, np.ndarray]:
        raise NotImplementedError

    def __iter__(self) -> Iterator[dict[str, np.ndarray]]:
        return self

    def __next__(self) -> dict[str, np.ndarray]:
        if self.stop is not None and self.step >= self.stop:
            raise StopIteration
        batch = self.batch_at(self.step)
        self.step += 1
        return batch

    def steps(self, start: int, stride: int) -> Iterator[dict[str, np.ndarray]]:
        """Batches start, start + stride, ... (below ``stop``): one DataLoader worker's part."""
        check_step(start, self.order.batch_size)
        check_int(stride, "stride", 1)
        step = start
        while self.stop is None or step < self.stop:
            yield self.batch_at(step)
            step += stride
