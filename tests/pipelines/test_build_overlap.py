"""The only worker of a local run builds two passes at once (issue #44 point 2), with the same bytes;
workers that share the machine build one at a time."""

from __future__ import annotations

import threading
import time

import pytest

from bert_datagen.pipelines.beam.overlap import Overlap
from bert_datagen.pipelines.beam.runners import RunnerOptions
from bert_datagen.pipelines.pretraining import run as run_module
from bert_datagen.pipelines.pretraining import transforms
from bert_datagen.pipelines.pretraining.run import generate_dataset, in_flight_for, usable_cores
from tests.support.pipeline_corpus import make_documents, shard_digests, write_sentence_files, write_vocab
from tests.support.pipeline_golden import CONFIG, GOLDEN_SHARDS


class Running:
    """Counts how many calls are inside ``work`` at once (and on which threads)."""

    def __init__(self, hold: float = 0.05) -> None:
        self.hold = hold
        self.now = 0
        self.most = 0
        self.threads: set[str] = set()
        self.lock = threading.Lock()

    def work(self, x: int) -> int:
        with self.lock:
            self.now += 1
            self.most = max(self.most, self.now)
            self.threads.add(threading.current_thread().name)
        time.sleep(self.hold * (x % 3))  # later elements often finish first
        with self.lock:
            self.now -= 1
        if x == 13:
            raise ValueError("element 13")
        return x * x


@pytest.mark.parametrize("width", [1, 2, 3])
def test_results_come_back_in_order_with_at_most_width_running(width) -> None:
    running = Running()
    overlap = Overlap(running.work, width)
    got = [r for x in range(10) for r in overlap.submit(x)] + list(overlap.drain())
    overlap.close()
    assert got == [x * x for x in range(10)]
    assert running.most == width
    assert (running.threads == {threading.current_thread().name}) == (width == 1)


def test_an_error_comes_back_in_its_place_and_close_waits_for_the_rest() -> None:
    running = Running()
    overlap = Overlap(running.work, 2)
    got = []
    with pytest.raises(ValueError, match="element 13"):
        for x in range(10, 20):
            got += overlap.submit(x)
    overlap.close()
    assert got == [100, 121, 144] and running.now == 0


def test_width_must_be_positive() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        Overlap(abs, 0)


@pytest.mark.parametrize(("runner", "workers", "cores", "in_flight"), [
    ("DirectRunner", 1, 2, 2), ("DirectRunner", 1, 16, 2), ("DirectRunner", 1, 1, 1),
    ("DirectRunner", 2, 2, 1), ("DaskRunner", 1, 2, 1), ("PortableRunner", 0, 2, 1), ("DataflowRunner", 0, 8, 1)])
def test_only_a_sole_local_worker_builds_passes_at_once(runner, workers, cores, in_flight) -> None:
    assert in_flight_for(runner, workers, cores) == in_flight


STEPS = ("plan_pool_pass", "sorted_shard")  # a pass's build, a shard's write (one at a time: memory)
IN_FLIGHT = {"plan_pool_pass": run_module.IN_FLIGHT, "sorted_shard": 1}


def _golden_run(tmp_path, monkeypatch, runner: RunnerOptions | None = None) -> tuple[dict, dict[str, list]]:
    """The golden dataset, recording when each pass's build and each shard's write ran (each held a
    moment, so that two run at once are seen at once)."""
    spans: dict[str, list[tuple[float, float]]] = {step: [] for step in STEPS}

    def timed(step, real):
        def run(*args, **kwargs):
            start = time.monotonic()
            time.sleep(0.2)
            done = real(*args, **kwargs)
            spans[step].append((start, time.monotonic()))
            return done
        return run

    for step in STEPS:
        monkeypatch.setattr(transforms, step, timed(step, getattr(transforms, step)))
    write_sentence_files(tmp_path / "in", make_documents(30, seed=42, max_sentences=8), n_files=2)
    vocab = write_vocab(tmp_path / "vocab.txt")
    out = tmp_path / "out"
    extra = {} if runner is None else {"runner": runner}
    generate_dataset(CONFIG, inputs=[str(tmp_path / "in" / "*.txt")], vocab_path=str(vocab), output_dir=str(out),
                     **extra)
    return shard_digests(out), spans


def _most_at_once(spans: list[tuple[float, float]]) -> int:
    edges = sorted([(s, 1) for s, _ in spans] + [(e, -1) for _, e in spans], key=lambda t: (t[0], t[1]))
    now = most = 0
    for _, step in edges:
        now += step
        most = max(most, now)
    return most


@pytest.mark.skipif(usable_cores() < 2, reason="the overlap is for a worker with two or more cores to itself")
def test_the_default_run_builds_two_passes_at_once_with_the_golden_bytes(tmp_path, monkeypatch) -> None:
    digests, spans = _golden_run(tmp_path, monkeypatch)
    assert digests == GOLDEN_SHARDS
    for step in STEPS:
        assert len(spans[step]) >= 3 and _most_at_once(spans[step]) == IN_FLIGHT[step], step


def test_one_core_builds_one_pass_at_a_time_with_the_golden_bytes(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(run_module, "usable_cores", lambda: 1)
    digests, spans = _golden_run(tmp_path, monkeypatch)
    assert digests == GOLDEN_SHARDS
    for step in STEPS:
        assert len(spans[step]) >= 3 and _most_at_once(spans[step]) == 1, step


ARENAS_SCRIPT = r"""
import ctypes, sys, tempfile, threading
from bert_datagen.pipelines.beam.overlap import share_malloc_arena
shared = share_malloc_arena() if sys.argv[1] == "share" else None
libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
libc.fopen.restype = ctypes.c_void_p
held = []
def allocate():
    held.append(libc.malloc(100_000))
threads = [threading.Thread(target=allocate) for _ in range(4)]
for t in threads:
    t.start()
for t in threads:
    t.join(timeout=30)
with tempfile.NamedTemporaryFile(suffix=".xml") as f:
    stream = libc.fopen(f.name.encode(), b"w")
    libc.malloc_info(0, ctypes.c_void_p(stream))
    libc.fclose(ctypes.c_void_p(stream))
    print(shared, open(f.name).read().count("<heap nr="))
"""


@pytest.mark.skipif(__import__("platform").libc_ver()[0] != "glibc", reason="malloc arenas are glibc's")
def test_threads_started_after_sharing_take_no_arena_of_their_own() -> None:
    import subprocess
    import sys

    def arenas(mode: str) -> tuple[str, int]:
        out = subprocess.run([sys.executable, "-c", ARENAS_SCRIPT, mode], capture_output=True, text=True, check=True,
                             timeout=120)
        shared, count = out.stdout.split()
        return shared, int(count)

    assert arenas("share") == ("True", 1)
    assert arenas("own")[1] > 1  # what the worker's threads did before


class _Squares(transforms.BuildInstances):
    """The build DoFn's overlap, squaring its elements two at a time; element 3 fails on its first attempt."""

    def __init__(self) -> None:
        self.show_progress = False
        self.in_flight = 2
        self.attempts: dict[int, int] = {}

    def _work(self, x: int) -> tuple[list, dict[str, int]]:
        self.attempts[x] = self.attempts.get(x, 0) + 1
        time.sleep(0.02 * (x % 2))
        if x == 3 and self.attempts[x] == 1:
            raise RuntimeError("worker died")
        return [x * x], {"done": 1}


def _bundle(fn: _Squares, elements: list[int]) -> list[int]:
    fn.start_bundle()
    out = [v for x in elements for v in fn.process(x)]
    return out + [w.value for w in fn.finish_bundle()]


def test_a_bundle_run_again_after_a_failure_gives_each_output_once() -> None:
    """A runner runs a failed bundle again, whole: the elements its attempt left in flight are dropped."""
    fn = _Squares()
    fn.setup()
    try:
        with pytest.raises(RuntimeError, match="worker died"):
            _bundle(fn, list(range(8)))
        assert _bundle(fn, list(range(8))) == [x * x for x in range(8)]
    finally:
        fn.teardown()
