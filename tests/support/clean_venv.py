"""A clean virtualenv for SDK workers, holding what a Dataflow worker holds: Beam and the packages
its container brings for GCS (google-cloud-storage), and this package only as the wheel `run`
stages, installed by pip with its requirements (never the checkout, never gcsfs or TensorFlow).

Nothing is downloaded (the tests reach no registry): the packages Beam, google-cloud-storage and the
wheel require come from this interpreter's installed distributions, repacked into wheels (each
distribution's files as its RECORD lists them, under its own WHEEL tags), and pip installs the wheel
and them into a venv made without system site-packages, with ``--no-index --find-links``, resolving
the wheel's requirements as a worker's boot does (17 s here).
"""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import os
import shutil
import subprocess
import sys
import zipfile
from importlib.metadata import Distribution, PackageNotFoundError, distribution
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

# What a worker's container has besides Beam for gs:// (Beam's GCS filesystem needs it); the rest
# of apache-beam[gcp] serves other Google services.
CONTAINER_EXTRAS = ("google-cloud-storage",)
_DROPPED_METADATA = ("RECORD", "INSTALLER", "REQUESTED", "direct_url.json")


def requirement_closure(roots: list[str]) -> list[Distribution]:
    """The installed distributions ``roots`` need, with their requirements' requirements (markers
    and extras evaluated here), sorted by name."""
    extras_of: dict[str, set[str]] = {}
    todo = [(root, frozenset()) for root in roots]
    while todo:
        name, extras = todo.pop()
        key = canonicalize_name(name)
        try:
            dist = distribution(key)
        except PackageNotFoundError:
            raise RuntimeError(f"{name} is needed on the workers and not installed here") from None
        if key in extras_of and extras <= extras_of[key]:
            continue
        extras_of.setdefault(key, set()).update(extras)
        environments = [{"extra": e} for e in (extras_of[key] or {""})]
        for text in dist.requires or []:
            req = Requirement(text)
            if req.marker is None or any(req.marker.evaluate(env) for env in environments):
                todo.append((req.name, frozenset(req.extras)))
    return [distribution(key) for key in sorted(extras_of)]


def _files(dist: Distribution) -> list[tuple[str, Path]]:
    """(path inside site-packages, installed file) of what a distribution installed there."""
    out = []
    for entry in dist.files or []:
        rel = entry.as_posix()
        if rel.startswith("..") or "__pycache__" in entry.parts or rel.endswith(".pyc"):
            continue  # scripts live outside site-packages; caches are rebuilt
        if entry.parent.name.endswith(".dist-info") and entry.name in _DROPPED_METADATA:
            continue
        path = Path(dist.locate_file(entry))
        if path.is_file():
            out.append((rel, path))
    return out


def _pip_install(venv: Path, args: list[str]) -> None:
    """pip of this interpreter installing into ``venv`` (``--python``), offline."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL")}
    cmd = [sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install", "--no-index",
           "--disable-pip-version-check", "-q", *args]
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900)
    if done.returncode != 0:
        raise RuntimeError(f"pip install into {venv} failed:\n{done.stderr[-3000:]}")


def repack(dist: Distribution, out_dir: Path) -> Path:
    """A wheel of an installed distribution: its files as installed, a fresh RECORD, its own tags."""
    files = _files(dist)
    info = next(rel.split("/", 1)[0] for rel, _ in files if rel.split("/", 1)[0].endswith(".dist-info"))
    wheel_meta = dist.read_text("WHEEL") or ""
    tags = [line.split(":", 1)[1].strip() for line in wheel_meta.splitlines() if line.startswith("Tag:")]
    name = canonicalize_name(dist.metadata["Name"]).replace("-", "_")
    # The compressed tag set of the file name (py2.py3-none-any): each part's values, in order.
    parts = [list(dict.fromkeys(tag.split("-")[i] for tag in tags)) for i in range(3)] if tags else [["py3"], ["none"], ["any"]]
    target = out_dir / f"{name}-{dist.version}-{'-'.join('.'.join(p) for p in parts)}.whl"
    record = io.StringIO()
    writer = csv.writer(record, lineterminator="\n")
    with zipfile.ZipFile(target, "w", zipfile.ZIP_STORED) as z:
        for rel, path in files:
            data = path.read_bytes()
            z.writestr(rel, data)
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            writer.writerow([rel, f"sha256={digest}", len(data)])
        writer.writerow([f"{info}/RECORD", "", ""])
        z.writestr(f"{info}/RECORD", record.getvalue())
    return target


def worker_venv(venv: Path, wheel: Path) -> Path:
    """Build the workers' venv at ``venv`` (see the module doc); its python."""
    closure = requirement_closure([Requirement(r).name for r in wheel_requirements(wheel)] + list(CONTAINER_EXTRAS))
    closure = [d for d in closure if canonicalize_name(d.metadata["Name"]) != "bert-datagen"]
    if venv.exists():
        shutil.rmtree(venv)
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, capture_output=True,
                   timeout=300)
    house = venv.parent / f"{venv.name}-wheelhouse"
    house.mkdir()
    try:
        for dist in closure:
            repack(dist, house)
        _pip_install(venv, ["--find-links", str(house), str(wheel), *CONTAINER_EXTRAS])
    finally:
        shutil.rmtree(house)  # 420 MB here; the venv is what is kept
    return venv / "bin" / "python"


def wheel_requirements(wheel: Path) -> list[str]:
    """The Requires-Dist lines of a wheel's METADATA (without extras' requirements)."""
    with zipfile.ZipFile(wheel) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        lines = z.read(meta).decode().splitlines()
    reqs = [line.split(":", 1)[1].strip() for line in lines if line.startswith("Requires-Dist:")]
    return [r for r in reqs if Requirement(r).marker is None or Requirement(r).marker.evaluate({"extra": ""})]
