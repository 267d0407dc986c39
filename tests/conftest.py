from __future__ import annotations

import signal
from pathlib import Path

import pytest


def pytest_configure(config: pytest.Config) -> None:
    # A suite started in the background of a shell without job control (`cmd &` in a script) inherits
    # SIGINT ignored, and so would every command the Ctrl-C tests start, which then never see their
    # Ctrl-C: give this process, and so its children, a terminal's disposition.
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # The long modules first (the trainer's, and any with an end-to-end test), whole, in their own
    # order: on 2 workers the suite then ends on short tests instead of one worker finishing a
    # minute-long test alone.
    def is_long(module: str) -> bool:
        return module.startswith("tests/trainer/") or module in long_modules

    long_modules = {item.nodeid.split("::")[0] for item in items if item.get_closest_marker("integration")}
    items.sort(key=lambda item: not is_long(item.nodeid.split("::")[0]))


REPO = Path(__file__).resolve().parent.parent
SHARED = REPO.parent / "shared"
CORPORA = SHARED / "corpora"


@pytest.fixture(scope="session")
def shared_corpora() -> Path:
    """`../shared/corpora`; tests that need real text skip with a reason when it is absent."""
    if not CORPORA.is_dir():
        pytest.skip(f"real-text corpora not found at {CORPORA} (they live in ../shared beside the repo)")
    return CORPORA


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return REPO


def snapshot(root: Path) -> dict[str, tuple[str, str]]:
    """Every entry under `root` (relative path -> kind and sha256 of the bytes, or the link target): two
    equal snapshots mean a command changed nothing there, which the data-loss tests assert."""
    import hashlib

    entries: dict[str, tuple[str, str]] = {}
    for path in sorted(root.rglob("*")):
        rel = str(path.relative_to(root))
        if path.is_symlink():
            entries[rel] = ("link", str(path.readlink()))
        elif path.is_dir():
            entries[rel] = ("dir", "")
        else:
            entries[rel] = ("file", hashlib.sha256(path.read_bytes()).hexdigest())
    return entries


@pytest.fixture
def tree_snapshot():
    """`tree_snapshot(path)`: see `snapshot`."""
    return snapshot


@pytest.fixture
def full_disk(tmp_path):
    """A real, small filesystem (a 64 KiB tmpfs) for the full-disk tests; skipped with the reason
    where mounting is not permitted (not root, no mount(8), a container without CAP_SYS_ADMIN):
    the injected-ENOSPC tests check the same messages everywhere."""
    import os
    import shutil
    import subprocess

    if os.name != "posix" or os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a small tmpfs needs root and mount(8)")
    mount = tmp_path / "small-fs"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mount)],
                          capture_output=True, text=True, timeout=30)
    if done.returncode:
        pytest.skip(f"cannot mount a small tmpfs here: {done.stderr.strip() or done.returncode}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", str(mount)], capture_output=True, timeout=30)


@pytest.fixture(scope="session")
def object_stores():
    """A real S3 server (moto) and GCS emulator on 127.0.0.1 for this test process: scheme -> the
    environment variables their clients read (tests/support/servers.py)."""
    from contextlib import ExitStack

    from tests.support.servers import gcs_server, s3_server

    with ExitStack() as stack:
        yield {"s3": stack.enter_context(s3_server()), "gs": stack.enter_context(gcs_server())}


@pytest.fixture(params=["s3", "gs"])
def bucket(request, object_stores, monkeypatch) -> str:
    """A new empty bucket (``s3://NAME`` or ``gs://NAME``), the environment pointing at its server."""
    from tests.support.servers import new_bucket

    for name, value in object_stores[request.param].items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")  # never ask a cloud metadata address
    return new_bucket(request.param)
