"""Balanced Dask partitions (issue #44 point 3): ``pipelines/beam/dask_runner.py``.

Beam's Dask translation put 9 read tasks in 5 partitions (2 each, one worker idle at the end of the
read) and hashed the 20 (pool, pass) tasks of a 10x run 0 to 3 to a partition. Our runner deals them:
a small Create and a ``Spread`` with a known count give one partition a task, a GroupByKey deals its
groups evenly; the dealing is deterministic and never changes a byte.
"""

from __future__ import annotations

import os
import random
import uuid

import pytest

from bert_datagen.pipelines.beam.dask_runner import _deal_elements, _group_and_deal, deal
from bert_datagen.pipelines.beam.runners import RunnerOptions, local_dask_cluster, runner_setup
from bert_datagen.pipelines.pretraining.run import generate_dataset
from tests.support.pipeline_corpus import make_documents, shard_digests, write_text_files, write_vocab


def test_deal_puts_the_costliest_first_into_the_emptiest_partition() -> None:
    costs = {"a": 9, "b": 7, "c": 5, "d": 4, "e": 4, "f": 1}
    parts = deal(costs, 2, costs.__getitem__, str)
    assert parts == [["a", "d", "f"], ["b", "c", "e"]]  # 14 and 16: longest-first, not round-robin
    loads = [sum(costs[e] for e in p) for p in parts]
    assert max(loads) - min(loads) <= max(costs.values())


def test_deal_is_the_same_whatever_the_input_order_and_keeps_every_entry_once() -> None:
    entries = [(f"pool-{i % 7}", i) for i in range(200)]
    cost = lambda e: 1 + e[1] % 5  # noqa: E731
    first = deal(entries, 8, cost, repr)
    for seed in range(5):
        shuffled = list(entries)
        random.Random(seed).shuffle(shuffled)
        assert deal(shuffled, 8, cost, repr) == first
    assert sorted(e for p in first for e in p) == sorted(entries)
    loads = [sum(map(cost, p)) for p in first]
    assert max(loads) - min(loads) <= 5


def test_no_more_entries_than_partitions_gives_one_each_in_order() -> None:
    tasks = [(("train", pool, pass_index), f"/pools/{pool}") for pool in range(2) for pass_index in range(10)]
    random.Random(1).shuffle(tasks)
    # As a Dask task has them: in the partitions of the stage before, some empty.
    parts = _deal_elements(24, tasks[:13], [], tasks[13:])
    assert [len(p) for p in parts] == [1] * 20 + [0] * 4
    assert [p[0] for p in parts[:20]] == sorted(tasks, key=lambda t: repr(t[0]))


def test_groups_are_beams_groups_and_even_over_the_partitions() -> None:
    items = [((split, shard), f"part-{split}-{shard}-{i}") for i in range(3) for split in ("eval", "train")
             for shard in range(5)]
    random.Random(2).shuffle(items)
    parts = _group_and_deal(4, items[:11], items[11:])
    groups = dict(g for p in parts for g in p)
    assert groups.keys() == {(s, k) for s in ("eval", "train") for k in range(5)}
    for key, values in groups.items():  # each group's values, in the order they came
        assert values == [v for k, v in items if k == key]
    assert sorted(len(p) for p in parts) == [2, 2, 3, 3]


def test_deal_needs_a_partition() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        deal([1], 0, lambda _: 1, repr)


class _MarkBundle:
    """A DoFn's bundle on a Dask worker is a partition: each element names its bundle and process."""

    def __init__(self, folder: str) -> None:
        self.folder = folder

    def dofn(self):
        import apache_beam as beam

        folder = self.folder

        class Mark(beam.DoFn):
            def start_bundle(self) -> None:
                self.bundle = uuid.uuid4().hex

            def process(self, element):
                name = element[0][1] if isinstance(element, tuple) else element
                with open(os.path.join(folder, f"{name}-{self.bundle}-{os.getpid()}"), "w"):
                    pass
                yield element

        return Mark()


def _fan_out(pool: str):
    for index in range(20):
        yield (0, index), pool


def test_a_known_count_of_tasks_and_a_small_create_give_a_partition_each(tmp_path) -> None:
    """Fails with Beam's translation: the 20 tasks hashed into 16 partitions share some (and the 9
    read tasks of a Create with --dask_npartitions 8 were 5 partitions)."""
    pytest.importorskip("distributed")
    import apache_beam as beam

    from bert_datagen.pipelines.beam.spread import Spread

    spread, created = tmp_path / "spread", tmp_path / "create"
    spread.mkdir()
    created.mkdir()
    with local_dask_cluster(2) as address:
        with runner_setup(RunnerOptions("DaskRunner", dask_scheduler=address)) as setup:
            # Two pipelines: Beam's DaskRunner computes only what its last transform depends on.
            for build in (lambda p: (p | beam.Create(["pool-0"]) | beam.FlatMap(_fan_out) | Spread(20)
                                     | beam.ParDo(_MarkBundle(str(spread)).dofn())),
                          lambda p: (p | beam.Create([f"task{i}" for i in range(9)])
                                     | beam.ParDo(_MarkBundle(str(created)).dofn()))):
                pipeline = beam.Pipeline(options=setup.options)
                build(pipeline)
                result = pipeline.run()
                result.wait_until_finish()
                result.client.close()
    for folder, count in ((spread, 20), (created, 9)):
        marks = [name.split("-") for name in os.listdir(folder)]
        assert sorted(m[0] for m in marks) == sorted(str(i) if folder == spread else f"task{i}" for i in range(count))
        assert len({m[1] for m in marks}) == count, f"{folder.name}: tasks shared a partition"
        assert len({m[2] for m in marks}) == 2, f"{folder.name}: every task ran in one worker"


def test_one_and_two_dask_workers_write_the_direct_runners_bytes(tmp_path) -> None:
    pytest.importorskip("distributed")
    from bert_datagen.datagen.config import DatagenConfig

    config = DatagenConfig(max_seq_length=48, max_predictions_per_seq=7, dupe_factor=3, num_shards=3,
                           eval_fraction=0.15, notnext_pool_size=25)
    write_text_files(tmp_path / "in", make_documents(90, seed=21), n_files=4)
    vocab = str(write_vocab(tmp_path / "vocab.txt"))
    digests = {}
    for name, runner in (("direct", RunnerOptions("DirectRunner")),
                         ("dask-1", RunnerOptions("DaskRunner", dask_workers=1)),
                         ("dask-2", RunnerOptions("DaskRunner", dask_workers=2))):
        generate_dataset(config, inputs=[str(tmp_path / "in" / "*.txt")], vocab_path=vocab,
                         output_dir=str(tmp_path / name), runner=runner)
        digests[name] = shard_digests(tmp_path / name)
    assert digests["dask-1"] == digests["direct"] == digests["dask-2"]
    assert len(digests["direct"]) >= 4  # train and eval shards, and the index files beside them


def _last_bag(runner_class, build, npartitions: int | None = 4, partition_size: int | None = None):
    import apache_beam as beam
    from apache_beam.runners.dask.overrides import dask_overrides

    pipeline = beam.Pipeline()
    build(pipeline)
    pipeline.replace_all(dask_overrides())
    options = {"npartitions": npartitions} if partition_size is None else {"partition_size": partition_size}
    visitor = runner_class.to_dask_bag_visitor(options)
    pipeline.visit(visitor)
    return list(visitor.bags.values())[-1]


def test_a_groupbykey_makes_at_most_four_times_the_partitions_asked_for() -> None:
    """The groups of 100 one-element partitions: Beam's shuffle keeps 100 partitions (a 100x run's
    84 shards came from 284, 200 of them empty tasks); dealt, 16 for --dask_npartitions 4."""
    pytest.importorskip("distributed")
    import apache_beam as beam
    from apache_beam.runners.dask.dask_runner import DaskRunner

    from bert_datagen.pipelines.beam.dask_runner import GROUP_PARTITIONS, BalancedDaskRunner

    def build(pipeline):
        pipeline | beam.Create(list(range(100))) | beam.Map(lambda i: (i % 30, i)) | beam.GroupByKey()

    assert _last_bag(DaskRunner, build, npartitions=100).npartitions == 100  # its input's partitions
    assert _last_bag(BalancedDaskRunner, build).npartitions == GROUP_PARTITIONS * 4 == 16
    few = _last_bag(BalancedDaskRunner, lambda p: p | beam.Create([(0, 1)]) | beam.GroupByKey())
    assert few.npartitions == 4  # never fewer than asked for
    # Partitions of a given size (--dask_partition_size): Beam's counts, 50 partitions of 2 and 50 after.
    assert _last_bag(BalancedDaskRunner, build, partition_size=2).npartitions == 50


def test_each_spread_task_hangs_off_the_one_gather_task_only() -> None:
    """Dask queues a stage's tasks and hands them out as workers free up only when they depend on
    few others (here: the gather); tasks that also read a second value of the graph (a DoFn sent once
    to each worker, tried) were assigned all at once by where their inputs lay: 13 and 7 of a 10x
    run's 20 build tasks, one worker idle 6.5 s at the end."""
    pytest.importorskip("distributed")
    import apache_beam as beam
    import dask
    from apache_beam.runners.dask.overrides import dask_overrides
    from dask.core import get_dependencies

    from bert_datagen.pipelines.beam.dask_runner import DEAL_PREFIX, BalancedDaskRunner
    from bert_datagen.pipelines.beam.spread import Spread

    pipeline = beam.Pipeline(runner=BalancedDaskRunner())
    pipeline | beam.Create(["pool-0"]) | beam.FlatMap(_fan_out) | Spread(20) | beam.Map(lambda task: task)
    pipeline.replace_all(dask_overrides())
    visitor = BalancedDaskRunner.to_dask_bag_visitor({"npartitions": 4})
    pipeline.visit(visitor)
    (bag,) = dask.optimize(list(visitor.bags.values())[-1])
    graph = dict(bag.__dask_graph__())
    tasks = [key for key in graph if isinstance(key, tuple) and key[0] == bag.name]
    assert len(tasks) == 20
    for key in tasks:  # down the (fused) chain of the task to the gather, one dependency a step
        while not str(key[0]).startswith(f"{DEAL_PREFIX}-gather-"):
            dependencies = get_dependencies(graph, key)
            assert len(dependencies) == 1, dependencies
            (key,) = dependencies
