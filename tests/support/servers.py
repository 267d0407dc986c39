"""Real object-store servers on 127.0.0.1 for the bucket tests: moto's S3 server and a GCS emulator,
each a child process on a free port, waited for with a timeout, stopped at the end; a relay that
stops answering (`StallingProxy`) and a guard that refuses every other address (`guard_sitecustomize`)."""

from __future__ import annotations

import contextlib
import os
import select
import shutil
import socket
import subprocess
import sys
import threading
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


class StallingProxy:
    """A TCP relay on 127.0.0.1 in front of one of the servers above, to play a server that stops
    answering without touching the server (other tests share it): `stall` stops relaying (connections
    stay open and new ones are accepted, but no byte comes back: a frozen process), `refuse` closes the
    port and every connection (a process that died). ``url`` is the relay's ``http://127.0.0.1:PORT``."""

    def __init__(self, target: str) -> None:
        self._target = ("127.0.0.1", int(target.rstrip("/").rsplit(":", 1)[1]))
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._listener.getsockname()[1]}"
        self._stalled = threading.Event()
        self._closed = threading.Event()
        self._sockets: list[socket.socket] = [self._listener]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            self._sockets.append(client)
            if self._stalled.is_set():
                continue  # accepted by the kernel, never answered
            server = socket.create_connection(self._target)
            self._sockets.append(server)
            for a, b in ((client, server), (server, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket) -> None:
        while not self._closed.is_set():
            if self._stalled.is_set():
                time.sleep(0.05)  # read nothing, send nothing: what a stopped process does
                continue
            ready, _, _ = select.select([source], [], [], 0.05)
            if not ready:
                continue
            try:
                data = source.recv(1 << 16)
                if not data:
                    sink.shutdown(socket.SHUT_WR)
                    return
                sink.sendall(data)
            except OSError:
                return

    def stall(self) -> None:
        self._stalled.set()

    def refuse(self) -> None:
        self._closed.set()
        for s in self._sockets:
            with contextlib.suppress(OSError):
                s.close()

    def __enter__(self) -> StallingProxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.refuse()


# Run as a `sitecustomize` module (`guard_sitecustomize`): every process started with it (a CLI, the
# worker processes it starts) refuses to connect or resolve anything but 127.0.0.1, and appends each
# refused address to $BERT_DATAGEN_TEST_GUARD_LOG, so a test can tell that nothing even tried.
_GUARD = '''
import os, socket

_LOG = os.environ["BERT_DATAGEN_TEST_GUARD_LOG"]
_LOCAL = ("127.0.0.1", "localhost", "::1")


def _refuse(what):
    with open(_LOG, "a") as f:
        f.write(f"{os.getpid()} {what}\\n")
    raise OSError(101, f"test guard: {what} is not 127.0.0.1")


_connect, _connect_ex, _getaddrinfo = socket.socket.connect, socket.socket.connect_ex, socket.getaddrinfo


def connect(self, address):
    if self.family in (socket.AF_INET, socket.AF_INET6) and address[0] not in _LOCAL:
        _refuse(f"connect {address!r}")
    return _connect(self, address)


def connect_ex(self, address):
    if self.family in (socket.AF_INET, socket.AF_INET6) and address[0] not in _LOCAL:
        _refuse(f"connect {address!r}")
    return _connect_ex(self, address)


def getaddrinfo(host, *args, **kwargs):
    name = host.decode() if isinstance(host, bytes) else host
    if name not in _LOCAL and name is not None:
        _refuse(f"resolve {name!r}")
    return _getaddrinfo(host, *args, **kwargs)


socket.socket.connect, socket.socket.connect_ex, socket.getaddrinfo = connect, connect_ex, getaddrinfo
'''


def guard_sitecustomize(directory: Path, log: Path) -> dict[str, str]:
    """Write the guard into ``directory``; the environment variables that make a Python process load
    it (``PYTHONPATH`` first) and log refused addresses to ``log``."""
    (directory / "sitecustomize.py").write_text(_GUARD)
    log.touch()
    path = os.pathsep.join(p for p in (str(directory), os.environ.get("PYTHONPATH", "")) if p)
    return {"PYTHONPATH": path, "BERT_DATAGEN_TEST_GUARD_LOG": str(log)}
