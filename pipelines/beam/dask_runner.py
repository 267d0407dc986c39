"""Beam's DaskRunner with balanced partitions: what ``--runner DaskRunner`` runs.

Beam's Dask translation (2.78) gives a stage the partitions it descends from: a Create of 9 read
tasks with ``--dask_npartitions 8`` made 5 partitions of 2, 2, 2, 2 and 1 tasks, and a GroupByKey
is Dask's hash shuffle, so the 20 (pool, pass) tasks of a 10x run landed 0 to 3 to a partition.
A partition is a Dask task, so one worker idled while the other finished its last partition (10x
enwiki, 2 workers: 8 s of the read stage and 6 s of the build stage). Its shuffle is also
``n x n`` tiny tasks for ``n`` partitions, all through the scheduler in the driver.

Here three leaves translate differently; everything else is Beam's translation:

- a Create of at most ``ONE_PER_PARTITION`` elements: one partition each;
- a GroupByKey: one task gathers the input (this pipeline shuffles only paths, counts and 16-byte
  identities) and deals the groups over as many partitions as Beam's shuffle would make, but at
  least ``--dask_npartitions`` and at most ``GROUP_PARTITIONS`` times that (the 84 shards of
  a 100x run came from 284 partitions: 200 empty tasks), largest group first into the emptiest partition
  (``deal``);
- ``Deal``, what ``Spread`` applies on this runner: the elements themselves dealt the same way over
  the partitions its caller asks for, one task each when it knows how many tasks come.

Dask's scheduler then hands the partitions out one at a time as workers free up (the local cluster
sets ``worker-saturation`` 1.0), so the slowest worker ends at most one task after the other. That
holds only while a stage's tasks hang off one gather task (Dask then queues them); a DoFn sent once
to each worker as a graph value of its own (tried: the scheduler pickled the 295 KB DoFn for every
task it sent) made each task depend on two, and the scheduler assigned a 10x run's 20 build tasks
13 to one worker and 7 to the other at once (6.5 s idle at the end). The
dealing never changes a byte: every consumer of a group sorts what it reads and totals are sums.
"""

from __future__ import annotations

import heapq
import operator
from collections.abc import Callable, Iterable
from typing import Any

import apache_beam as beam
from apache_beam.runners.dask.dask_runner import DaskRunner
from apache_beam.runners.dask.overrides import _Create, _GroupByKeyOnly
from apache_beam.runners.dask.transform_evaluator import defenestrate

ONE_PER_PARTITION = 1024  # a Create this small (read tasks, spill files, shards) is a task an element
GROUP_PARTITIONS = 4  # a GroupByKey's partitions: at most this many times --dask_npartitions
DEAL_PREFIX = "bert-datagen-deal"


class Deal(beam.PTransform):
    """(key, value) elements unchanged, each Dask partition a share of them (``BalancedDaskRunner``
    only: other runners have no translation for it, and ``Spread`` applies it only here)."""

    def __init__(self, partitions: int | None = None) -> None:
        super().__init__()
        self.partitions = partitions

    def expand(self, pcoll: beam.PCollection) -> beam.PCollection:
        return beam.pvalue.PCollection.from_(pcoll)


def deal(entries: Iterable[Any], partitions: int, cost: Callable[[Any], int], order: Callable[[Any], Any]
         ) -> list[list[Any]]:
    """``entries`` over ``partitions`` lists: in decreasing ``cost`` (ties by ``order``), each to the
    partition with the least cost so far (ties: the lowest index). The same entries give the same
    lists whatever order they come in; with no more entries than partitions, one each, in order."""
    if partitions < 1:
        raise ValueError(f"partitions must be at least 1, not {partitions}")
    ranked = sorted(entries, key=lambda e: (-cost(e), order(e)))
    out: list[list[Any]] = [[] for _ in range(partitions)]
    loads = [(0, index) for index in range(partitions)]  # a heap of (cost so far, partition)
    for entry in ranked:
        load, index = heapq.heappop(loads)
        out[index].append(entry)
        heapq.heappush(loads, (load + cost(entry), index))
    return out


def _key_order(key: Any) -> str:
    # A total order for any keys (a run's keys are tuples of str and int; repr is stable for them).
    return repr(key)


def _group_and_deal(partitions: int, *parts: list[Any]) -> list[list[Any]]:
    """The gathered input of a GroupByKey -> its groups, as Beam's translation makes them, dealt."""
    groups: dict[Any, list[Any]] = {}
    for part in parts:
        for item in part:
            groups.setdefault(item[0], []).append(defenestrate(item[1]))
    return deal(groups.items(), partitions, lambda group: len(group[1]), lambda group: _key_order(group[0]))


def _deal_elements(partitions: int, *parts: list[Any]) -> list[list[Any]]:
    elements = [item for part in parts for item in part]
    return deal(elements, partitions, lambda _: 1, lambda item: _key_order(defenestrate(item)[0]))


def dealt_bag(bag: Any, partitions: int, dealer: Callable[..., list[list[Any]]]) -> Any:
    """A Dask bag of ``partitions`` partitions: one task runs ``dealer`` on every partition of
    ``bag``, and partition ``i`` is its list ``i`` (``partitions`` + 1 tasks, not a shuffle's n x n)."""
    from dask.bag import Bag
    from dask.base import tokenize
    from dask.highlevelgraph import HighLevelGraph

    token = tokenize(bag.name, partitions, dealer)
    gather, name = f"{DEAL_PREFIX}-gather-{token}", f"{DEAL_PREFIX}-{token}"
    graph: dict[Any, Any] = {(gather, 0): (dealer, partitions, *[(bag.name, i) for i in range(bag.npartitions)])}
    graph.update({(name, i): (operator.getitem, (gather, 0), i) for i in range(partitions)})
    return Bag(HighLevelGraph.from_collections(name, graph, dependencies=[bag]), name, partitions)


class BalancedDaskRunner(DaskRunner):
    """Beam's DaskRunner, with small Creates, GroupByKeys and ``Deal`` translated as the module says."""

    @staticmethod
    def to_dask_bag_visitor(bag_kwargs: dict | None = None, *args: Any, **kwargs: Any) -> Any:
        import dask.bag as db

        visitor = DaskRunner.to_dask_bag_visitor(bag_kwargs, *args, **kwargs)
        beams_visit = visitor.visit_transform
        bag_kwargs = bag_kwargs or {}
        asked = bag_kwargs.get("npartitions")  # None with --dask_partition_size: Beam's counts stand

        def visit_transform(node: Any) -> None:
            transform = node.transform
            if isinstance(transform, _GroupByKeyOnly | Deal):
                (pcoll,) = node.inputs
                bag = visitor.bags[pcoll.producer]
                least = asked or bag.npartitions
                partitions = (getattr(transform, "partitions", None)
                              or max(least, min(bag.npartitions, GROUP_PARTITIONS * least)))
                dealer = _deal_elements if isinstance(transform, Deal) else _group_and_deal
                visitor.bags[node] = dealt_bag(bag, partitions, dealer)
            elif (type(transform) is _Create and not bag_kwargs.get("partition_size")
                  and 0 < len(transform.values) <= ONE_PER_PARTITION):
                visitor.bags[node] = db.from_sequence(transform.values, partition_size=1)
            else:
                beams_visit(node)

        visitor.visit_transform = visit_transform
        return visitor
