"""Issue #44 point 4 (c): a bundle retried after a failure leaves the bytes of an undisturbed run.

Dataflow retries a failed bundle (up to 4 times in batch) and keeps the side effects of the failed
attempts: whatever it wrote before it died stays where it was written. Two ways to prove the
writes are idempotent, each locally and in a GCS emulator bucket:

- Beam's own replay: ``--direct_runner_bundle_repeat=1`` makes the DirectRunner's FnApiRunner run
  every bundle of every stage twice, discarding the first run's outputs and keeping its writes.
- A failure injected into every writing step of the pipeline (the read's spills, the census, the
  pools, the fragments, the shards and their indexes, the summary): its first attempt dies after
  the temporary object of a write is in place (the first write, or the second, after one file is
  complete) or after all its writes (before its outputs are committed); the step is retried on the
  same element and only the successful attempt's outputs go on, as a runner does with a bundle.

Either way: the golden shards, and no temporary or staging object left that could be read as
output."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from bert_datagen.contract.buckets import BUCKETS
from bert_datagen.contract.fs import temp_path_for
from bert_datagen.pipelines.beam import fsio
from bert_datagen.pipelines.beam.runners import RunnerOptions
from bert_datagen.pipelines.pretraining import run, transforms
from tests.support.pipeline_corpus import make_documents, write_sentence_files, write_vocab
from tests.support.pipeline_golden import CONFIG, GOLDEN_FINGERPRINT, GOLDEN_SHARDS
from tests.support.servers import new_bucket, upload_tree

pytestmark = pytest.mark.integration

MAX_ATTEMPTS = 4  # Dataflow's for a batch bundle


class WorkerDied(RuntimeError):
    """The injected failure of an attempt."""


class Faults:
    """Which write of an attempt dies: ``at`` 1 or 2 (after its temporary object is written, before
    the rename), or 0 (after every write of the attempt, before its outputs are committed)."""

    def __init__(self, at: int) -> None:
        self.at = at
        self.attempt = 0  # 0: outside a step (the driver's own writes pass through)
        self.writes = 0
        self.failed: dict[str, int] = {}

    def write(self, original: Callable[[str, bytes], None], path: str, data: bytes) -> None:
        if self.attempt == 1:
            self.writes += 1
            if self.writes == self.at:
                tmp = temp_path_for(path)  # what the write leaves when its worker dies before the rename
                if "://" in tmp:
                    fsio.BEAM_FS.store(tmp).write(tmp, data)
                else:
                    os.makedirs(os.path.dirname(tmp), exist_ok=True)
                    Path(tmp).write_bytes(data)
                raise WorkerDied(path)
        original(path, data)

    def run_step(self, name: str, step: Callable[[], list[Any]]) -> list[Any]:
        """One element of a step, retried as a runner retries a bundle: outputs of failed attempts dropped."""
        for attempt in range(1, MAX_ATTEMPTS + 1):
            self.attempt, self.writes = attempt, 0
            try:
                outputs = step()
                if attempt == 1 and self.at == 0 or (attempt == 1 and self.writes and self.writes < self.at):
                    raise WorkerDied(name)  # every write done (or fewer than `at`): dies before committing
                return outputs
            except WorkerDied:
                self.failed[name] = self.failed.get(name, 0) + 1
            finally:
                self.attempt = 0
        raise AssertionError(f"{name} failed {MAX_ATTEMPTS} times")


ACTIVE: list[Faults] = []  # the faults of the running test: Beam pickles a Map's function by value


class RetriedMap:
    """A Map step's function under `Faults.run_step` (looked up here, in this process, at each call)."""

    def __init__(self, name: str, function: Callable[..., Any]) -> None:
        self.name, self.function = name, function

    def __call__(self, element: Any, *args: Any) -> Any:
        return ACTIVE[-1].run_step(self.name, lambda: [self.function(element, *args)])[0]


@contextlib.contextmanager
def failing_first_attempts(monkeypatch, at: int) -> Iterator[Faults]:
    faults = Faults(at)
    # A Dataflow worker builds one pass at a time; so does this model of its retries (one element's
    # process() again). The sole local worker's passes in flight are retried as a whole bundle
    # (tests/pipelines/test_build_overlap.py).
    monkeypatch.setattr(run, "usable_cores", lambda: 1)
    original_write = fsio.write_atomic
    monkeypatch.setattr(fsio, "write_atomic", lambda path, data: faults.write(original_write, path, data))
    for cls in (transforms.ReadFiles, transforms.BuildInstances, transforms.WriteShard):
        process = cls.process

        def retried(self, element, _process=process, _name=cls.__name__):
            yield from faults.run_step(_name, lambda: list(_process(self, element)))

        monkeypatch.setattr(cls, "process", retried)
    for name in ("read_census", "stage_pool", "summarize"):  # the Map steps the graph takes from run
        monkeypatch.setattr(run, name, RetriedMap(name, getattr(run, name)))
    ACTIVE.append(faults)
    try:
        yield faults
    finally:
        ACTIVE.remove(faults)


def make_corpus(root: Path) -> tuple[str, str]:
    write_sentence_files(root / "in", make_documents(30, seed=42, max_sentences=8), n_files=2)
    return str(root / "in" / "*.txt"), str(write_vocab(root / "vocab.txt"))


def generate(inputs: str, vocab: str, output: str, *beam_args: str) -> None:
    run.generate_dataset(CONFIG, inputs=[inputs], vocab_path=vocab, output_dir=output,
                         runner=RunnerOptions(beam_args=beam_args))


def dataset_files(output: str) -> dict[str, bytes]:
    """Every file under the output (local or a bucket prefix), relative name -> bytes."""
    if "://" in output:
        return {p[len(output) + 1:]: BUCKETS.read_bytes(p) for p in BUCKETS.glob(f"{output}/**")}
    root = Path(output)
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def check_dataset(output: str) -> None:
    import hashlib
    import json

    from bert_datagen.contract.manifest import CARD_NAME, Manifest
    from bert_datagen.pipelines.beam.outputs import manifest_files

    files = dataset_files(output)
    shards = {n: hashlib.sha256(b).hexdigest() for n, b in files.items() if n.endswith(".tfrecord")}
    assert shards == GOLDEN_SHARDS
    assert json.loads(files["manifest.json"])["input"]["fingerprint"] == GOLDEN_FINGERPRINT
    # Nothing else: no temporary object, no staging prefix, nothing a reader could take for output.
    assert set(files) == {*manifest_files(Manifest.load(output, fsio.BEAM_FS)), CARD_NAME}


@pytest.fixture
def gcs_bucket(object_stores, monkeypatch) -> str:
    for name, value in object_stores["gs"].items():
        monkeypatch.setenv(name, value)
    return new_bucket("gs")


@pytest.mark.parametrize("where", ["local", "gs"])
def test_every_bundle_replayed_by_beam_leaves_the_golden_bytes(where, tmp_path, request) -> None:
    inputs, vocab = make_corpus(tmp_path)
    output = str(tmp_path / "out")
    if where == "gs":
        bucket = request.getfixturevalue("gcs_bucket")
        upload_tree(tmp_path / "in", f"{bucket}/in")
        inputs, output = f"{bucket}/in/*.txt", f"{bucket}/out"
    generate(inputs, vocab, output, "--direct_runner_bundle_repeat=1")
    check_dataset(output)


STEPS = {"ReadFiles", "read_census", "stage_pool", "BuildInstances", "WriteShard", "summarize"}


@pytest.mark.parametrize("at", [1, 2, 0], ids=["first-temp", "second-temp", "after-writes"])
def test_steps_retried_after_dying_midway_leave_the_golden_bytes(at, tmp_path, monkeypatch) -> None:
    inputs, vocab = make_corpus(tmp_path)
    output = str(tmp_path / "out")
    with failing_first_attempts(monkeypatch, at) as faults:
        generate(inputs, vocab, output)
    assert set(faults.failed) == STEPS  # every writing step died once per element, and was retried
    check_dataset(output)


def test_steps_retried_in_a_bucket_leave_the_golden_bytes(tmp_path, monkeypatch, gcs_bucket) -> None:
    make_corpus(tmp_path)
    upload_tree(tmp_path / "in", f"{gcs_bucket}/in")
    output = f"{gcs_bucket}/out"
    with failing_first_attempts(monkeypatch, 2) as faults:
        generate(f"{gcs_bucket}/in/*.txt", str(tmp_path / "vocab.txt"), output)
    assert set(faults.failed) == STEPS
    check_dataset(output)
