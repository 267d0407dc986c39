"""Buckets that never hang and never reach elsewhere (issue #43 point 6), against the real servers on
127.0.0.1 (tests/support/servers.py): a server that stops answering part way through a read, or is
gone, is an error within the bucket deadline with one line naming the path; the bucket commands
contact no address but the configured endpoint; an output in a missing bucket is refused before any
work."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from bert_datagen.contract.buckets import BUCKETS, Deadline, backoff_allowance
from bert_datagen.contract.fs import DEFAULT_FS
from bert_datagen.contract.loading.batches import NumpyBatches
from bert_datagen.contract.loading.source import LoadError, open_source
from bert_datagen.pipelines.cli import main
from tests.support.servers import StallingProxy, guard_sitecustomize, upload_tree

pytestmark = pytest.mark.timeout(240)

DEADLINE = 8.0  # 2 tries of 3 s (Deadline.within), short enough for a test
# What a check allows past the deadline: a new client's set-up (botocore loads its service models)
# and a loaded 2-core machine. Without the deadline these reads took 277 s (s3) and over 15 minutes (gs).
SLACK = 5.0
# A fresh Python process that imports the CLI and a client, on the same machine.
START_SLACK = 15.0
ENDPOINT = {"s3": "AWS_ENDPOINT_URL", "gs": "STORAGE_EMULATOR_HOST"}


@pytest.fixture(scope="module")
def local_dataset(tmp_path_factory) -> Path:
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from benchmarks.bench_verify import make_dataset

    root = tmp_path_factory.mktemp("deadline") / "ds"
    make_dataset(str(root), seed=4, records=600, shards=3, max_seq_length=32, max_predictions=5)
    return root


@pytest.fixture
def remote(bucket, local_dataset) -> str:
    upload_tree(local_dataset, f"{bucket}/ds")
    return f"{bucket}/ds"


@pytest.fixture
def proxy(bucket, monkeypatch):
    """The bucket's server behind a relay that can stop answering; the environment points at the relay."""
    name = ENDPOINT[bucket.split("://")[0]]
    with StallingProxy(os.environ[name]) as relay:
        monkeypatch.setenv(name, relay.url)
        yield relay


def _one_line_naming(message: str, prefix: str) -> None:
    assert message.count("\n") == 0 and prefix in message and "did not answer" in message, message


@pytest.mark.parametrize("how", ["stall", "refuse"])
def test_a_loader_stops_within_the_deadline_when_the_server_stops_mid_read(remote, proxy, how, capfd) -> None:
    fs = DEFAULT_FS.with_deadline(Deadline.within(DEADLINE))
    batches = NumpyBatches(open_source(remote, fs=fs), seed=1, batch_size=8, prefetch=False)
    for _ in range(3):  # reading, through the relay
        next(batches)
    getattr(proxy, how)()
    start = time.monotonic()
    with pytest.raises((OSError, LoadError)) as info:  # the loader reads on: the next window, the version check
        for _ in range(10_000):
            next(batches)
    took = time.monotonic() - start
    assert took < DEADLINE + SLACK, took
    _one_line_naming(str(info.value), remote)
    # A server that waited out one deadline is not asked again at once: without that, the loader's
    # check of what happened waited out a second deadline (76 s at the default 60 s).
    start = time.monotonic()
    with pytest.raises(OSError) as again:
        fs.version(f"{remote}/manifest.json")
    assert again.value.errno == errno.ETIMEDOUT and time.monotonic() - start < 1.0
    # gcsfs logged each failed request with its traceback before raising it.
    assert "Traceback" not in capfd.readouterr().err


def test_a_bucket_command_whose_server_stopped_answering_prints_one_line(remote, proxy) -> None:
    proxy.stall()
    # One command a scheme: both read through the same seam (the loader's order; the tools' shards).
    if remote.startswith("s3"):
        commands = [["batches", remote, "--seed", "1", "--batch-size", "4", "--step", "3"]]
    else:
        commands = [["inspect", remote, "-n", "2"]]
    for command in commands:
        start = time.monotonic()
        done = subprocess.run([sys.executable, "-m", "bert_datagen.pipelines.cli", "--bucket-deadline",
                               str(DEADLINE), *command], capture_output=True, text=True, env=os.environ,
                              timeout=120)
        took = time.monotonic() - start
        assert done.returncode == 1 and done.stdout == "", (done.returncode, done.stdout)
        assert done.stderr.startswith("Error: ") and done.stderr.endswith("\n"), done.stderr
        _one_line_naming(done.stderr[:-1], remote)  # nothing else: no tracebacks, no client logs
        assert f"{DEADLINE:g} s" in done.stderr
        assert took < DEADLINE + START_SLACK, took


@pytest.mark.integration
def test_bert_train_takes_the_deadline_too(remote, proxy, tmp_path) -> None:
    """`bert-train --bucket-deadline` sets the trainer's deadline as bert-datagen's sets the data
    commands' (JAX, so that no TensorFlow start-up is timed; the default deadline would take 60 s)."""
    proxy.stall()
    start = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "bert_datagen.trainer.cli", "--bucket-deadline", str(DEADLINE),
                           "pretrain", "--backend", "jax", "--data", remote, "--out", str(tmp_path / "run"),
                           "--steps", "2", "--batch-size", "8"],
                          capture_output=True, text=True, env={**os.environ, "KERAS_BACKEND": "jax"}, timeout=120)
    took = time.monotonic() - start
    assert done.returncode == 1 and done.stderr.startswith("Error: "), (done.returncode, done.stderr[-2000:])
    _one_line_naming(done.stderr[:-1], remote)  # nothing else: no tracebacks, no client logs
    assert f"{DEADLINE:g} s" in done.stderr and took < DEADLINE + 3 * START_SLACK, took
    assert not (tmp_path / "run").exists()


def test_the_deadline_configures_both_clients_and_its_bounds_are_checked(object_stores, monkeypatch) -> None:
    deadline = Deadline(20.0, attempts=3)
    # Every try, stalled in both phases, and the clients' waits fit in the deadline.
    assert deadline.attempts * (deadline.connect_timeout + deadline.read_timeout) + \
        backoff_allowance(deadline.attempts) == pytest.approx(20.0)
    objects = BUCKETS.with_deadline(deadline)
    assert objects is not BUCKETS and objects.deadline == deadline and BUCKETS.deadline == Deadline()
    for name, value in {**object_stores["s3"], **object_stores["gs"]}.items():
        monkeypatch.setenv(name, value)
    s3 = objects.client("s3://b/x")
    s3.connect()
    config = s3.s3.meta.config
    assert (config.connect_timeout, config.read_timeout) == (deadline.connect_timeout, deadline.read_timeout)
    assert config.retries["total_max_attempts"] == 3 and s3.retries == 1
    gs = objects.client("gs://b/x")
    assert gs.requests_timeout.sock_read == deadline.read_timeout and gs.requests_timeout.total is None
    assert gs.credentials.method == "anon"  # an emulator: no credentials looked for, no metadata server
    for bad in (1, 5, 3601, float("nan"), True):  # 5: under 1 s a try once 3 tries wait 5 s between them
        with pytest.raises(ValueError, match="bucket deadline"):
            Deadline(bad)
    assert Deadline.within(60) == Deadline() and Deadline.within(DEADLINE) == Deadline(DEADLINE, attempts=2)
    assert Deadline.within(2).attempts == 1
    result = CliRunner().invoke(main, ["--bucket-deadline", "1", "verify", "s3://b/x"])
    assert result.exit_code == 2 and "--bucket-deadline" in result.output and "[2, 3600]" in result.output


def _run_guarded(args: list[str], env: dict[str, str], code: str | None = None) -> subprocess.CompletedProcess:
    argv = [sys.executable, "-c", code] if code else [sys.executable, "-m", "bert_datagen.pipelines.cli", *args]
    return subprocess.run(argv, capture_output=True, text=True, env=env, timeout=180)


def test_bucket_reads_contact_no_address_but_the_endpoint(remote, tmp_path) -> None:
    log = tmp_path / "refused.log"
    env = {**os.environ, **guard_sitecustomize(tmp_path, log), "AWS_EC2_METADATA_DISABLED": "true"}
    # The guard works: anything but 127.0.0.1 is refused and logged.
    probe = _run_guarded([], env, "import socket; socket.create_connection(('192.0.2.1', 80), timeout=1)")
    assert probe.returncode != 0 and "192.0.2.1" in log.read_text()
    log.write_text("")
    for command in (["verify", remote, "--workers", "1"], ["batches", remote, "--seed", "1", "--batch-size", "4",
                                                           "--step", "0"]):
        done = _run_guarded(command, env)
        assert done.returncode == 0, (command, done.stderr)
    loader = ("from bert_datagen.contract.loading.batches import NumpyBatches\n"
              "from bert_datagen.contract.loading.source import open_source\n"
              f"b = NumpyBatches(open_source({remote!r}), seed=1, batch_size=8)\n"
              "[next(b) for _ in range(5)]\n")
    done = _run_guarded([], env, loader)
    assert done.returncode == 0, done.stderr
    assert log.read_text() == ""


@pytest.mark.heavy
def test_bucket_writes_contact_no_address_but_the_endpoint(bucket, tmp_path) -> None:
    from tests.support.pipeline_corpus import make_documents, write_text_files

    log = tmp_path / "refused.log"
    env = {**os.environ, **guard_sitecustomize(tmp_path, log), "AWS_EC2_METADATA_DISABLED": "true"}
    write_text_files(tmp_path / "in", make_documents(30, seed=3), n_files=2)
    upload_tree(tmp_path / "in", f"{bucket}/text")
    (tmp_path / "train.tsv").write_text("a b c\t0\nd e f\t1\n")
    vocab = f"{bucket}/vocab.txt"
    for command in (["vocab", "--input", f"{bucket}/text/*.txt", "--output", vocab, "--vocab-size", "300"],
                    ["run", "--input", f"{bucket}/text/*.txt", "--vocab", vocab, "--output", f"{bucket}/ds",
                     "--dupe-factor", "1", "--max-seq-length", "32", "--max-predictions-per-seq", "5", "--quiet"],
                    ["task", "--task", "tsv", "--text-a", "0", "--label", "1", "--no-header", "--split",
                     f"train={tmp_path / 'train.tsv'}", "--vocab", vocab, "--output", f"{bucket}/task", "--quiet"]):
        done = _run_guarded(command, env)
        assert done.returncode == 0, (command, done.stderr)
    assert log.read_text() == ""


def test_an_output_in_a_missing_bucket_is_refused_before_any_work(bucket, tmp_path, monkeypatch) -> None:
    from bert_datagen.pipelines import vocab_cli
    from bert_datagen.pipelines.pretraining import run
    from bert_datagen.pipelines.tasks import run as task_run

    def no_work(*_, **__):
        raise AssertionError("work started")

    monkeypatch.setattr(run, "generate_dataset", no_work)
    monkeypatch.setattr(task_run, "generate_task_dataset", no_work)
    monkeypatch.setattr(vocab_cli, "train_vocab", no_work)
    scheme = bucket.split("://")[0]
    missing = f"{scheme}://missing-{bucket[-12:]}"
    (tmp_path / "a.txt").write_text("Some text.\n")
    (tmp_path / "vocab.txt").write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\nsome\ntext\n.\n")
    (tmp_path / "train.tsv").write_text("a b c\t0\n")
    for output, command in (
            (f"{missing}/ds", ["run", "--input", str(tmp_path / "a.txt"), "--vocab", str(tmp_path / "vocab.txt")]),
            (f"{missing}/task", ["task", "--task", "tsv", "--text-a", "0", "--label", "1", "--no-header",
                                 "--split", f"train={tmp_path / 'train.tsv'}", "--vocab", str(tmp_path / "vocab.txt")]),
            (f"{missing}/vocab.txt", ["vocab", "--input", str(tmp_path / "a.txt"), "--vocab-size", "300"])):
        result = CliRunner().invoke(main, [*command, "--output", output])
        assert result.exit_code == 1 and result.output.count("\n") == 1, result.output
        assert f"Error: {output}: " in result.output and "does not exist (--output)" in result.output, result.output
        assert ".tmp-" not in result.output and "staging" not in result.output
