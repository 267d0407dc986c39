from __future__ import annotations

from pathlib import Path

import pytest

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
