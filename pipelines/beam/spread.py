"""`Spread`: keyed elements handed out over the workers, on every runner.

``beam.Reshuffle`` is what spreads a few coarse tasks over the workers on the DirectRunner and on
Dataflow, but Beam's DaskRunner translates it to the identity, and a Dask GroupByKey shuffles into
as many partitions as its input has: tasks made from one element stay in one partition, one worker.
A run whose corpus makes one NotNext pool built all of its ``dupe_factor`` passes in one worker
while the others idled (measured: 2 Dask workers at 0.63x the speed of one DirectRunner worker).

So the tasks are flattened with ``SLOTS`` empty markers made by a Create of their own (on Dask: the
runner's full partition count) and grouped by key: on Dask the groups land in the partitions of
both, on every runner each task key is a group of one, and ungrouping gives back exactly the input.

On ``--runner DaskRunner`` (``bert_datagen.pipelines.beam.dask_runner.BalancedDaskRunner``) the
tasks are dealt instead (``Deal``): one Dask partition each, as many as ``partitions`` (the caller's
count of tasks, when it knows it), so none waits behind another in a partition the hash shuffle
made (2 to 3 passes of about a second each at 10x enwiki, in 6 of 16 partitions).
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Iterator
from typing import Any

import apache_beam as beam

SLOTS = 256  # more than any runner's partitions of a Create; each costs one empty group
_TASK, _SLOT = 1, 0


def _as_task(element: tuple[Any, Any]) -> tuple[Any, tuple[int, Any]]:
    key, value = element
    return key, (_TASK, value)


def _slot(index: int) -> tuple[Any, tuple[int, Any]]:
    return ("bert-datagen-spread-slot", index), (_SLOT, None)


def _ungroup(grouped: tuple[Any, Iterable[tuple[int, Any]]]) -> Iterator[tuple[Any, Any]]:
    key, values = grouped
    for kind, value in values:
        if kind == _TASK:
            yield key, value


class Spread(beam.PTransform):
    """(key, value) elements, unchanged, spread over the workers; keys should be (nearly) unique.
    ``partitions``: how many elements come, where the caller knows (Dask: a partition each)."""

    def __init__(self, partitions: int | None = None) -> None:
        super().__init__()
        self.partitions = partitions

    def expand(self, pcoll: beam.PCollection) -> beam.PCollection:
        # Only a pipeline on that runner has imported its module; others need not import Dask.
        dask_runner = sys.modules.get("bert_datagen.pipelines.beam.dask_runner")
        if dask_runner is not None and isinstance(pcoll.pipeline.runner, dask_runner.BalancedDaskRunner):
            return pcoll | "Deal" >> dask_runner.Deal(self.partitions)
        tasks = pcoll | "MarkTasks" >> beam.Map(_as_task)
        slots = pcoll.pipeline | "Slots" >> beam.Create(range(SLOTS)) | "MarkSlots" >> beam.Map(_slot)
        return ((tasks, slots) | "WithSlots" >> beam.Flatten() | "GroupByTask" >> beam.GroupByKey()
                | "Ungroup" >> beam.FlatMap(_ungroup))
