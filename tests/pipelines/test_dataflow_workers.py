"""Issue #44 point 4 (b): `bert-datagen run` on Beam's portable job API (how Dataflow Runner v2
runs a Python pipeline) with its SDK workers started from a clean virtualenv that holds Beam, the
GCS client a Dataflow container brings, and this package only as the wheel `run` stages for
Dataflow (`runners.build_wheel`), installed by pip (tests/support/clean_venv.py): no checkout on
the workers' path, no gcsfs, so the workers reach gs:// through Beam's own GCS filesystem as a
Dataflow worker does. Input, vocab and output are in a bucket of the GCS emulator; every process
may reach only 127.0.0.1 (the socket guard). The shards are the DirectRunner's golden bytes.

Making the venv takes about 17 s here (pip installing 55 wheels), once a test session."""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from bert_datagen.contract.buckets import BUCKETS
from tests.pipelines.test_pipeline_portable import free_port, golden_cli_args, wait_for_port
from tests.support.clean_venv import worker_venv
from tests.support.pipeline_corpus import make_documents, write_sentence_files, write_vocab
from tests.support.pipeline_golden import GOLDEN_FINGERPRINT, GOLDEN_SHARDS
from tests.support.servers import guard_sitecustomize, new_bucket, upload_tree

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parent.parent.parent
@pytest.fixture(scope="session")
def workers(tmp_path_factory) -> Iterator[tuple[Path, float]]:
    """The workers' python for this checkout's wheel (built as `run` builds it), made once a test
    session in a folder keyed on the wheel's sha256, and the seconds it took; removed after the
    session (over 500 MB)."""
    from bert_datagen.pipelines.beam.runners import build_wheel

    base = tmp_path_factory.mktemp("dataflow_workers")
    wheel = Path(build_wheel(str(base)))
    venv = base / f"workers-{hashlib.sha256(wheel.read_bytes()).hexdigest()[:24]}"
    started = time.monotonic()
    python = worker_venv(venv, wheel)
    try:
        yield python, time.monotonic() - started
    finally:
        shutil.rmtree(venv, ignore_errors=True)


def clean_env(python: Path, extra: dict[str, str]) -> dict[str, str]:
    """A worker's environment: its venv's python first on PATH (the pool starts `python`), nothing
    of this checkout's (no PYTHONPATH, no virtualenv of ours)."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    return {**env, "PATH": os.pathsep.join([str(python.parent), env.get("PATH", "")]), **extra}


def run_on_clean_workers(tmp_path: Path, gcs: dict[str, str], workers: tuple[Path, float]) -> dict:
    python, venv_seconds = workers
    bucket = new_bucket("gs")
    corpus = tmp_path / "corpus"
    write_sentence_files(corpus / "in", make_documents(30, seed=42, max_sentences=8), n_files=2)
    write_vocab(corpus / "vocab.txt")
    upload_tree(corpus, bucket)
    guard_dir = tmp_path / "guard"
    guard_dir.mkdir()
    log = tmp_path / "refused.log"
    guard = guard_sitecustomize(guard_dir, log)  # its PYTHONPATH holds only the guard
    quiet_cloud = {"AWS_EC2_METADATA_DISABLED": "true", "NO_GCE_CHECK": "True", **gcs}
    worker_env = clean_env(python, {**guard, **quiet_cloud})
    workdir = tmp_path / "workers"
    workdir.mkdir()
    # What the workers import: the wheel's modules from the venv, and no gcsfs.
    probe = subprocess.run([str(python), "-c", "import importlib.util as u, bert_datagen.pipelines.beam.fsio as f; "
                            "print(f.__file__); print(u.find_spec('gcsfs'))"],
                           env=worker_env, cwd=workdir, capture_output=True, text=True, timeout=120)
    assert probe.returncode == 0, probe.stderr[-2000:]
    port = free_port()
    with open(tmp_path / "pool.log", "wb") as pool_log:
        pool = subprocess.Popen([str(python), "-m", "apache_beam.runners.worker.worker_pool_main",
                                 f"--service_port={port}"], env=worker_env, cwd=workdir, stdout=pool_log,
                                stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_for_port(port, pool, 60)
        started = time.monotonic()
        done = subprocess.run(
            [sys.executable, "-m", "bert_datagen.pipelines.cli", "run", "--input", f"{bucket}/in/*.txt",
             "--vocab", f"{bucket}/vocab.txt", "--output", f"{bucket}/out", *golden_cli_args(), "--quiet",
             "--runner", "PortableRunner", "--job_endpoint=embed", "--environment_type=EXTERNAL",
             f"--environment_config=127.0.0.1:{port}"],
            cwd=REPO, env={**os.environ, **guard, **quiet_cloud}, capture_output=True, text=True, timeout=300)
        run_seconds = time.monotonic() - started
        assert done.returncode == 0, done.stderr[-4000:]
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pool.pid, signal.SIGKILL)
        pool.wait(timeout=30)
    objects = sorted(p[len(bucket) + 1:] for p in BUCKETS.glob(f"{bucket}/out/**"))
    shards = {name[len("out/"):]: hashlib.sha256(BUCKETS.read_bytes(f"{bucket}/{name}")).hexdigest()
              for name in objects if name.endswith(".tfrecord")}
    return {"probe": probe.stdout.splitlines(), "venv": python.parent.parent, "shards": shards, "objects": objects,
            "manifest": BUCKETS.read_bytes(f"{bucket}/out/manifest.json").decode(), "refused": log.read_text(),
            "pool_log": (tmp_path / "pool.log").read_text(errors="replace"), "venv_seconds": venv_seconds,
            "run_seconds": run_seconds}


@pytest.fixture
def gcs(object_stores, monkeypatch) -> dict[str, str]:
    for name, value in object_stores["gs"].items():
        monkeypatch.setenv(name, value)
    return object_stores["gs"]


def check_run(result: dict) -> None:
    module, gcsfs_spec = result["probe"]
    assert Path(module).is_relative_to(result["venv"]) and not Path(module).is_relative_to(REPO)
    assert gcsfs_spec == "None"
    assert "Starting worker" in result["pool_log"]  # the work ran in the clean venv's harnesses
    assert result["shards"] == GOLDEN_SHARDS
    import json

    manifest = json.loads(result["manifest"])
    assert manifest["input"]["fingerprint"] == GOLDEN_FINGERPRINT
    assert manifest["created_by"]["runner"] == "PortableRunner"
    # Only the dataset is left: no staging prefix, no temporary object.
    assert not [o for o in result["objects"] if "/.bert-datagen-" in f"/{o}" or "/.tmp-" in f"/{o}"]
    assert result["refused"] == ""
    print(f"workers' venv made in {result['venv_seconds']:.1f} s, run {result['run_seconds']:.1f} s")


@pytest.mark.timeout(600)
def test_clean_workers_read_and_write_gs_with_the_golden_bytes(tmp_path, gcs, workers) -> None:
    check_run(run_on_clean_workers(tmp_path, gcs, workers))
