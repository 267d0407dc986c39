"""Real object-store servers on 127.0.0.1 for the bucket tests: moto's S3 server and a GCS emulator,
each a child process on a free port, waited for with a timeout, stopped at the end."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

BIN = Path(sys.executable).parent
START_TIMEOUT = 30.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_until_up(url: str, proc: subprocess.Popen, what: str) -> None:
    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode} before it answered on {url}")
        try:
            urllib.request.urlopen(url, timeout=2).close()
            return
        except OSError as e:  # an HTTP error status is an answer too
            if getattr(e, "code", None):
                return
            time.sleep(0.2)
    proc.kill()
    raise RuntimeError(f"{what} did not answer on {url} within {START_TIMEOUT:.0f} s")


@contextmanager
def _server(argv: list[str], url: str, what: str) -> Iterator[str]:
    if shutil.which(argv[0]) is None:
        raise RuntimeError(f"{argv[0]} is not installed (make install-dev installs the test servers)")
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        _wait_until_up(url, proc, what)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


@contextmanager
def s3_server() -> Iterator[dict[str, str]]:
    """moto's S3 server; yields the environment an S3 client needs to use it (AWS's own variables)."""
    port = _free_port()
    with _server([str(BIN / "moto_server"), "-H", "127.0.0.1", "-p", str(port)],
                 f"http://127.0.0.1:{port}/", "moto_server") as url:
        yield {"AWS_ENDPOINT_URL": url.rstrip("/"), "AWS_ACCESS_KEY_ID": "testing",
               "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}


@contextmanager
def gcs_server() -> Iterator[dict[str, str]]:
    """A GCS emulator (gcp-storage-emulator, in memory); yields STORAGE_EMULATOR_HOST for clients."""
    port = _free_port()
    with _server([str(BIN / "gcp-storage-emulator"), "start", "--host", "127.0.0.1", "--port", str(port),
                  "--in-memory"], f"http://127.0.0.1:{port}/storage/v1/b", "gcp-storage-emulator") as url:
        yield {"STORAGE_EMULATOR_HOST": url.split("/storage")[0]}


def new_bucket(scheme: str) -> str:
    """A new empty bucket on the server the environment points at; its ``scheme://name``."""
    name = f"t{uuid.uuid4().hex[:16]}"
    from bert_datagen.contract.buckets import BUCKETS

    BUCKETS.client(f"{scheme}://{name}").mkdir(name)
    return f"{scheme}://{name}"


def upload_tree(local: Path, remote: str) -> None:
    """Copy a local directory's files under ``remote`` (a bucket prefix)."""
    from bert_datagen.contract.buckets import BUCKETS

    for path in sorted(local.rglob("*")):
        if path.is_file():
            BUCKETS.write(f"{remote}/{path.relative_to(local).as_posix()}", path.read_bytes())


def env_with(extra: dict[str, str]) -> dict[str, str]:
    return {**os.environ, **extra}
