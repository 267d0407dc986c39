"""Iteration over a reader's steps, shared by the readers (`NumpyBatches`, `TaskBatches`, `MixedBatches`).

A reader defines ``batch_at(step)`` and ``order`` (with its ``batch_size``) and keeps ``step`` (the next
batch) and ``stop`` (the first step not given, or None); iteration and a DataLoader worker's part of
the steps follow from those alone.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

from bert_datagen.contract.bounds import ArgumentError, check_int, max_batches
from bert_datagen.contract.loading.order import check_order, check_step


def world_and_rank(world_size: int | None, rank: int | None, neither: str = "one process: whole batches",
                   ) -> tuple[int | None, int | None]:
    """``(world_size, rank)`` as given when both or neither are (``(None, None)``: the caller's
    default, ``neither`` says which); ArgumentError naming the missing one otherwise. A world size
    alone would have every process read rank 0's share, and a rank alone would read the whole
    global batch on every process: either way the ranks train on the wrong records, silently."""
    if (world_size is None) == (rank is None):
        return world_size, rank
    given, missing = ("world_size", "rank") if rank is None else ("rank", "world_size")
    value = world_size if rank is None else rank
    raise ArgumentError(missing, f"{given}={value!r} without {missing}: give both (each process its own rank) "
                        f"or neither ({neither})")


def local_world(world_size: int | None, rank: int | None) -> tuple[int, int]:
    """The world size and rank of a reader made directly: both given, or neither (one process reads
    whole global batches); one without the other is refused (`world_and_rank`)."""
    world_size, rank = world_and_rank(world_size, rank)
    return (1, 0) if world_size is None or rank is None else (world_size, rank)


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
