"""Portability, run rather than translated: `bert-datagen run` on Beam's portable job service with an
external SDK worker pool in another process (how Flink, Spark and Dataflow Runner v2 execute Python
pipelines) writes the golden bytes.

The job service is Beam's own, in the CLI's process (``--job_endpoint=embed``); the DoFns run in SDK
harness processes that ``worker_pool_main`` starts, which see this repository only through
``PYTHONPATH``, as cluster workers see an installed package. All on 127.0.0.1, no network.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support.pipeline_corpus import (
    make_documents,
    manifest_of,
    shard_digests,
    write_sentence_files,
    write_vocab,
)
from tests.support.pipeline_golden import CONFIG, GOLDEN_FINGERPRINT, GOLDEN_SHARDS

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parent.parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for_port(port: int, proc: subprocess.Popen, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the worker pool exited with status {proc.returncode}")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.2)
    raise TimeoutError(f"the worker pool did not listen on port {port} within {seconds} s")


def golden_cli_args() -> list[str]:
    """The golden test's config as `bert-datagen run` options."""
    c = CONFIG
    return ["--input-format", c.input_format, "--max-seq-length", str(c.max_seq_length),
            "--max-predictions-per-seq", str(c.max_predictions_per_seq), "--dupe-factor", str(c.dupe_factor),
            "--num-shards", str(c.num_shards), "--eval-fraction", str(c.eval_fraction),
            "--notnext-pool-size", str(c.notnext_pool_size), "--random-seed", str(c.random_seed)]


@pytest.mark.timeout(300)
def test_portable_runner_with_external_worker_pool_writes_the_golden_bytes(tmp_path) -> None:
    write_sentence_files(tmp_path / "in", make_documents(30, seed=42, max_sentences=8), n_files=2)
    vocab = write_vocab(tmp_path / "vocab.txt")
    out = tmp_path / "out"
    # The pool starts each SDK harness as `python` from PATH: this interpreter, with this repository.
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep),
           "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])}
    port = free_port()
    pool_log = tmp_path / "pool.log"
    with open(pool_log, "wb") as log:
        # Its own session, so that the pool and the harness processes it starts are killed together.
        pool = subprocess.Popen([sys.executable, "-m", "apache_beam.runners.worker.worker_pool_main",
                                 f"--service_port={port}"], env=env, cwd=tmp_path, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_for_port(port, pool, 60)
        done = subprocess.run(
            [sys.executable, "-m", "bert_datagen.pipelines.cli", "run", "--input", str(tmp_path / "in" / "*.txt"),
             "--vocab", str(vocab), "--output", str(out), *golden_cli_args(), "--quiet",
             "--runner", "PortableRunner", "--job_endpoint=embed", "--environment_type=EXTERNAL",
             f"--environment_config=localhost:{port}"],
            cwd=REPO, env=env, capture_output=True, text=True, timeout=240)
        assert done.returncode == 0, done.stderr[-4000:]
    finally:
        with contextlib.suppress(ProcessLookupError):  # the group may be gone already
            os.killpg(pool.pid, signal.SIGKILL)
        pool.wait(timeout=30)
    assert shard_digests(out) == GOLDEN_SHARDS
    manifest = manifest_of(out)
    assert manifest["input"]["fingerprint"] == GOLDEN_FINGERPRINT
    assert manifest["created_by"]["runner"] == "PortableRunner"
    # The work ran in the pool's harness processes, not in the job service's process.
    assert "Starting worker" in pool_log.read_text(errors="replace")
