"""Work spread over Dask workers (issue #32): a one-file, one-pool corpus keeps every worker busy.

Beam's DaskRunner gives each stage the partitions of the Create it descends from and translates
``beam.Reshuffle`` to the identity, so before `Spread` and the read-range sizing all ``dupe_factor``
passes of a one-pool corpus, and the read of a one-file corpus, ran in one worker.
"""

from __future__ import annotations

import os
import time

import pytest

from bert_datagen.pipelines.beam.runners import RunnerOptions, local_dask_cluster, runner_setup
from bert_datagen.pipelines.pretraining.run import (
    DEFAULT_READ_CHUNK_MB,
    MIN_AUTO_CHUNK_MB,
    READ_TASKS_PER_WORKER,
    read_chunk_mb_for,
    read_tasks,
)

MB = 2**20


def test_read_ranges_give_every_worker_tasks() -> None:
    one_file = [("/c/wiki.txt", 43 * MB)]
    assert read_chunk_mb_for(one_file, "sentences", 1, None) == DEFAULT_READ_CHUNK_MB
    chunk = read_chunk_mb_for(one_file, "sentences", 2, None)
    assert len(read_tasks(one_file, "sentences", chunk)) >= READ_TASKS_PER_WORKER * 2
    assert read_chunk_mb_for(one_file, "sentences", 2, 7.5) == 7.5  # the user's value stands
    assert read_chunk_mb_for([("/c/a.txt", MB)], "sentences", 8, None) == MIN_AUTO_CHUNK_MB
    assert read_chunk_mb_for([("/c/a.txt", 10 * 2**30)], "sentences", 2, None) == DEFAULT_READ_CHUNK_MB
    # A file no range can enter (text, compressed) is one task whatever the workers.
    assert read_chunk_mb_for([("/c/a.txt.gz", 43 * MB)], "sentences", 2, None) == DEFAULT_READ_CHUNK_MB


def _mark_after_nap(task: tuple[tuple[int, int], str], folder: str) -> None:
    time.sleep(0.15)  # long enough that an idle worker takes the next partition
    (_, index), _pool = task
    with open(os.path.join(folder, f"task-{index}-pid-{os.getpid()}"), "w"):
        pass


def _fan_out(pool: str):  # one element in, 20 (pool, pass) tasks out: all in one partition
    for index in range(20):
        yield (0, index), pool


def test_spread_hands_one_partitions_tasks_to_every_dask_worker(tmp_path) -> None:
    pytest.importorskip("distributed")
    import apache_beam as beam

    from bert_datagen.pipelines.beam.spread import Spread

    with local_dask_cluster(2) as address:
        with runner_setup(RunnerOptions("DaskRunner", dask_scheduler=address)) as setup:
            with beam.Pipeline(options=setup.options) as p:
                (p | beam.Create(["pool-0"]) | beam.FlatMap(_fan_out) | Spread()
                 | beam.Map(_mark_after_nap, str(tmp_path)))
    marks = [name.split("-") for name in os.listdir(tmp_path)]
    assert sorted(int(m[1]) for m in marks) == list(range(20))  # each task once
    assert len({m[3] for m in marks}) == 2, "every task ran in one worker"


def _trim_threshold() -> str | None:
    return os.environ.get("MALLOC_TRIM_THRESHOLD_")


def _profiling(dask_worker) -> bool:
    return "profile" in dask_worker.periodic_callbacks


def test_local_cluster_workers_keep_glibcs_sliding_mmap_threshold_and_do_not_profile() -> None:
    """Dask's default MALLOC_TRIM_THRESHOLD_ made every large array a fresh mmap (3x the system time);
    its workers' 10 ms stack sampling feeds a dashboard this cluster does not have."""
    pytest.importorskip("distributed")
    from distributed import Client

    with local_dask_cluster(1) as address:
        with Client(address) as client:
            assert set(client.run(_trim_threshold).values()) == {None}
            assert set(client.run(_profiling).values()) == {False}
