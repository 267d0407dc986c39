"""What our trainer needs on an accelerator machine that has JAX, PyTorch and CUDA but no TensorFlow and
no network: the wheels `bench_gpu prepare` puts beside its data, and `bench_gpu measure` unpacks there.

Which distributions: Keras and the rest of the `[train-jax]` extra, what `bert-train` itself needs
(click; google-crc32c for the records' checksums), and whatever a JAX run of ours imports besides,
found by running one (`probe`: pre-training and fine-tuning of a tiny model, in a process where
importing TensorFlow fails, so it also says whether the JAX path is free of TensorFlow); each with
its requirements, except what the machines have (`ON_ACCELERATOR` and what those require). Wheels
for the machines' Python come from the package index (`pip download`), else, for pure-Python ones,
from the distribution installed here.
"""

from __future__ import annotations

import base64
import csv
import hashlib
import importlib.metadata as metadata
import importlib.util
import io
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# Named by issue #42 as present there (JAX with CUDA, PyTorch, NumPy, h5py, ml-dtypes, absl-py, rich); what
# they require is there too.
ON_ACCELERATOR = ("jax", "jaxlib", "torch", "numpy", "h5py", "ml-dtypes", "absl-py", "rich")
NEEDED = ("keras", "safetensors", "click", "google-crc32c")
ACCELERATOR_PYTHON = "3.12"  # python3 of the lent machines' image (device KINDS.md)
PLATFORMS = ("manylinux2014_x86_64", "manylinux1_x86_64",
             *(f"manylinux_2_{n}_x86_64" for n in (17, 24, 27, 28, 31, 34, 35, 39)))
WHEEL_NAME = re.compile(r"^(?P<name>[^-]+)-(?P<version>[^-]+)(-\d[^-]*)?-(?P<py>[^-]+)-(?P<abi>[^-]+)-(?P<plat>[^-]+)\.whl$")


class WheelError(Exception):
    """A wheel that cannot be had or used: the message names it and why."""


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _requirements(name: str) -> list[str]:
    from packaging.requirements import Requirement

    found = []
    for text in metadata.requires(name) or []:
        req = Requirement(text)
        if req.marker is None or req.marker.evaluate({"extra": ""}):
            found.append(canonical(req.name))
    return found


def closure(roots: set[str], stop: set[str] = frozenset()) -> set[str]:
    """`roots` and everything they require (installed here), not descending into `stop`."""
    seen: set[str] = set()
    todo = [canonical(r) for r in roots]
    while todo:
        name = todo.pop()
        if name in seen or name in stop:
            continue
        seen.add(name)
        try:
            todo.extend(_requirements(name))
        except metadata.PackageNotFoundError:
            continue
    return seen


def accelerator_has() -> set[str]:
    present = {canonical(n) for n in ON_ACCELERATOR}
    return present | closure(present)


def wanted(imported: set[str]) -> set[str]:
    """The distributions to carry: `NEEDED` and `imported` with their requirements, less what the
    accelerator machines have and this package itself."""
    has = accelerator_has()
    return closure({*NEEDED, *imported}, stop=has) - has - {"bert-datagen"}


def fetch(names: set[str], dest: Path, python: str = ACCELERATOR_PYTHON) -> list[Path]:
    """A wheel of each distribution, at the version installed here, for `python` on x86-64 Linux, in
    `dest` (one already there is kept)."""
    dest.mkdir(parents=True, exist_ok=True)
    out = []
    for name in sorted(names):
        version = metadata.version(name)
        have = [w for w in dest.glob("*.whl") if _parsed(w.name)[:2] == (name, version)]
        if have:
            out.append(have[0])
            continue
        with tempfile.TemporaryDirectory(dir=dest) as scratch:
            got = _download(name, version, Path(scratch), python) or _from_installed(name, Path(scratch))
            if got is None:
                raise WheelError(f"{name} {version}: no wheel for Python {python} on x86-64 Linux from the package "
                                 "index, and it is not pure Python (no wheel can be made from the install here)")
            final = dest / got.name
            os.replace(got, final)
            out.append(final)
    return out


def _download(name: str, version: str, scratch: Path, python: str) -> Path | None:
    command = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
               "--python-version", python, "--implementation", "cp",
               *(a for p in PLATFORMS for a in ("--platform", p)), "-d", str(scratch), f"{name}=={version}"]
    if subprocess.run(command, capture_output=True, text=True, timeout=300).returncode != 0:
        return None
    wheels = list(scratch.glob("*.whl"))
    return wheels[0] if len(wheels) == 1 else None


def _from_installed(name: str, scratch: Path) -> Path | None:
    """A wheel of the pure-Python distribution `name` made from its files installed here."""
    dist = metadata.distribution(name)
    wheel_meta = next((f for f in dist.files or [] if f.name == "WHEEL" and f.parent.name.endswith(".dist-info")), None)
    if wheel_meta is None or "Root-Is-Purelib: true" not in wheel_meta.read_text():
        return None
    stem = f"{re.sub(r'[-.]+', '_', dist.metadata['Name'])}-{dist.version}"
    path = scratch / f"{stem}-py3-none-any.whl"
    info = f"{stem}.dist-info"
    rows = []
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        for f in dist.files or []:
            parts = f.parts
            if ".." in parts or "__pycache__" in parts or f.suffix == ".pyc":
                continue
            if parts[0].endswith(".dist-info") and f.name in ("RECORD", "INSTALLER", "REQUESTED", "direct_url.json"):
                continue
            data = Path(dist.locate_file(f)).read_bytes()
            arcname = f"{info}/{f.name}" if parts[0].endswith(".dist-info") else f.as_posix()
            z.writestr(arcname, data)
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            rows.append((arcname, f"sha256={digest}", str(len(data))))
        record = io.StringIO()
        csv.writer(record, lineterminator="\n").writerows([*rows, (f"{info}/RECORD", "", "")])
        z.writestr(f"{info}/RECORD", record.getvalue())
    return path


def _parsed(filename: str) -> tuple[str, str, str, str, str]:
    match = WHEEL_NAME.match(filename)
    if not match:
        raise WheelError(f"{filename}: not a wheel's file name")
    return canonical(match["name"]), match["version"], match["py"], match["abi"], match["plat"]


def fits_here(filename: str) -> bool:
    """Whether a wheel installs on this interpreter (pure Python 3, or CPython of this version, or of the
    stable ABI, on x86-64 manylinux): what our wheels can be."""
    _, _, py, abi, plat = _parsed(filename)
    if abi == "none" and plat == "any":
        return any(tag in ("py3", f"py3{sys.version_info.minor}") for tag in py.split("."))
    here = (sys.version_info.major, sys.version_info.minor)
    versions = [(int(t[2]), int(t[3:])) for t in py.split(".") if re.fullmatch(r"cp\d\d+", t)]
    # abi3: CPython's stable ABI, for the tag's version and every later one
    python_fits = here in versions or (abi == "abi3" and any(v <= here for v in versions))
    return (python_fits and sys.platform == "linux" and platform.machine() == "x86_64"
            and any(p.startswith("manylinux") and p.endswith("x86_64") for p in plat.split(".")))


def _installed(name: str) -> bool:
    try:
        metadata.version(name)
        return True
    except metadata.PackageNotFoundError:
        return False


def install(wheels: Path, target: Path, every_fitting: bool = False) -> list[str]:
    """Unpack onto `target` (a folder to put first on the path) each wheel in `wheels` whose distribution
    is missing here, or with `every_fitting` each that fits this interpreter (to try the wheels where
    everything is installed). Never shadows an installed distribution otherwise: the machine's own
    copies are what its JAX and PyTorch were built with. Returns the names unpacked."""
    target.mkdir(parents=True, exist_ok=True)
    done = []
    for wheel in sorted(wheels.glob("*.whl")):
        name, version = _parsed(wheel.name)[:2]
        fits = fits_here(wheel.name)
        if _installed(name) and not (every_fitting and fits):
            continue
        if not fits:
            raise WheelError(f"{wheel}: {name} is not installed here and this wheel is for another Python or "
                             f"platform: run prepare with --python-version {sys.version_info.major}."
                             f"{sys.version_info.minor}")
        with zipfile.ZipFile(wheel) as z:
            z.extractall(target)
        for kind in ("purelib", "platlib"):  # a wheel's .data/ folders that belong on the path
            for data in target.glob(f"*.data/{kind}"):
                shutil.copytree(data, target, dirs_exist_ok=True)
                shutil.rmtree(data)
        done.append(f"{name} {version}")
    if importlib.util.find_spec("bert_datagen") is None:
        # The package's folders are the repository's (pyproject's package-dir): a link names them.
        link = target / "bert_datagen"
        if not link.exists():
            link.symlink_to(ROOT, target_is_directory=True)
        done.append("bert_datagen -> " + str(ROOT))
    return done


def probe(pretrain_data: Path, task_data: Path, work: Path) -> dict:
    """Run `python -m benchmarks.gpu_wheels probe` (a JAX pre-training and fine-tuning run of a tiny
    model with TensorFlow blocked): the distributions imported, where TensorFlow was asked for, the
    runs' errors."""
    out = work / "probe.json"
    command = [sys.executable, "-m", "benchmarks.gpu_wheels", "probe", str(pretrain_data), str(task_data), str(work),
               str(out)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=900, cwd=ROOT,
                          env=dict(os.environ, KERAS_BACKEND="jax", JAX_PLATFORMS="cpu"))
    if not out.exists():
        return {"distributions": [], "tensorflow_from": None,
                "errors": [f"probe failed: {(done.stderr or done.stdout).strip()[-300:]}"]}
    found = json.loads(out.read_text())
    said = [line for line in done.stderr.splitlines() if line.startswith("Error:")]
    if found["errors"] and said:  # the command's own one-line reason
        found["errors"][-1] += f" ({said[-1]})"
    return found


TRAVEL_LIMIT = 64 * 2**20  # what may travel to a lent machine: the working tree and this folder together


def prepare(out: Path, python: str = ACCELERATOR_PYTHON) -> None:
    """The wheels of what our trainer needs on the accelerator machines beyond what they have, for
    their Python, in out/wheels; and whether the JAX path ran with TensorFlow blocked."""
    with tempfile.TemporaryDirectory() as scratch:
        found = probe(out / "pt-128", out / "sst2", Path(scratch))
    wheels = fetch(wanted(set(found["distributions"])), out / "wheels", python)
    print(f"wheels for Python {python} in {out / 'wheels'}: " + ", ".join(w.name for w in wheels))
    stale = sorted(set((out / "wheels").glob("*.whl")) - set(wheels))
    if stale:  # kept, as everything prepare finds, but they travel and measure would unpack them
        print(f"NOTE: {out / 'wheels'} also holds wheels no longer needed: {', '.join(w.name for w in stale)}",
              file=sys.stderr)
    for error in found["errors"]:
        print(f"NOTE: with TensorFlow's import blocked, {error}: our trainer cannot run on the accelerator "
              f"machines as it stands (TensorFlow first asked for by {found['tensorflow_from']})", file=sys.stderr)
    if not found["errors"]:
        asked = f" (TensorFlow asked for by {found['tensorflow_from']}, and done without)" if found["tensorflow_from"] else ""
        print(f"with TensorFlow's import blocked, JAX pre-training and fine-tuning ran{asked}")
    folder = sum(f.stat().st_size for f in out.rglob("*") if f.is_file())
    tree = _tracked_bytes()
    print(f"{out}: {folder / 2**20:.1f} MiB; with the working tree ({tree / 2**20:.1f} MiB): "
          f"{(folder + tree) / 2**20:.1f} MiB of the {TRAVEL_LIMIT // 2**20} MiB that may travel")
    if folder + tree > TRAVEL_LIMIT:
        raise SystemExit(f"{out}: {(folder + tree) / 2**20:.1f} MiB with the working tree, over the "
                         f"{TRAVEL_LIMIT // 2**20} MiB a lent machine takes")


def _tracked_bytes() -> int:
    try:
        names = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return 0
    return sum((ROOT / n).stat().st_size for n in names.decode().split("\0") if n and (ROOT / n).is_file())


OUR_PACKAGES = ("cli", "contract", "datagen", "pipelines", "trainer", "vocab")


def _caller(frame: object) -> Path | None:
    """The file of the first frame above the import machinery (`importlib.import_module` included)."""
    while frame is not None and (frame.f_code.co_filename.startswith("<frozen")
                                 or Path(frame.f_code.co_filename).parent.name == "importlib"):
        frame = frame.f_back
    return None if frame is None else Path(frame.f_code.co_filename)


def _ours(file: Path | None) -> bool:
    return (file is not None and file.is_relative_to(ROOT) and len(file.parts) > len(ROOT.parts)
            and file.parts[len(ROOT.parts)] in OUR_PACKAGES)


class _ImportWatch:
    """An import hook: importing TensorFlow fails (noting who asked first), and the top-level modules
    our own modules import are noted: what the JAX path needs, as against what the libraries it uses
    import when it happens to be installed (Keras tries matplotlib, scikit-learn, requests, ...)."""

    def __init__(self) -> None:
        self.tensorflow_from: str | None = None
        self.ours: set[str] = set()

    def find_spec(self, name: str, path: object = None, target: object = None) -> None:
        caller = _caller(sys._getframe(1))
        if "." not in name and _ours(caller):
            self.ours.add(name)
        if name.split(".")[0] != "tensorflow":
            return None
        if self.tensorflow_from is None:
            where = caller.relative_to(ROOT) if _ours(caller) else caller
            self.tensorflow_from = f"{where}:{_line_of(sys._getframe(1), caller)}"
        raise ModuleNotFoundError(f"No module named {name!r} (blocked: the JAX path must not need it)", name=name)


def _line_of(frame: object, file: Path | None) -> int:
    while frame is not None and Path(frame.f_code.co_filename) != file:
        frame = frame.f_back
    return 0 if frame is None else frame.f_lineno


def _cli(args: list[str]) -> str | None:
    from bert_datagen.trainer.cli import main

    try:
        main(args, standalone_mode=False)
    except SystemExit as exc:
        return None if exc.code in (0, None) else f"bert-train {args[0]}: exit {exc.code}"
    except Exception as exc:  # the probe reports what stopped the run, and what it had imported by then
        return f"bert-train {args[0]}: {type(exc).__name__}: {exc}"
    return None


def _probe_main(pretrain_data: str, task_data: str, work: str, out: str) -> None:
    watch = _ImportWatch()
    sys.meta_path.insert(0, watch)
    vocab = sum(1 for _ in open(Path(pretrain_data) / "vocab.txt", "rb"))
    config = Path(work) / "probe-config.json"
    config.write_text(json.dumps({"vocab_size": vocab, "hidden_size": 32, "num_hidden_layers": 1,
                                  "num_attention_heads": 2, "intermediate_size": 64}))
    run = str(Path(work) / "probe-pretrain")
    errors = [_cli(["pretrain", "--backend", "jax", "--data", pretrain_data, "--out", run, "--bert-config",
                    str(config), "--batch-size", "2", "--steps", "2", "--log-every", "1"])]
    if errors[0] is None:
        errors.append(_cli(["finetune", "--data", task_data, "--out", str(Path(work) / "probe-finetune"), "--init-from",
                            run, "--batch-size", "2", "--max-steps", "2", "--eval-split", "none", "--log-every", "1"]))
    names = metadata.packages_distributions()
    tops = watch.ours - set(sys.stdlib_module_names)
    dists = sorted({canonical(d) for t in tops for d in names.get(t, [])} - {"bert-datagen"})
    Path(out).write_text(json.dumps({"distributions": dists, "tensorflow_from": watch.tensorflow_from,
                                     "errors": [e for e in errors if e]}, indent=1))


if __name__ == "__main__":
    if sys.argv[1:2] != ["probe"] or len(sys.argv) != 6:
        sys.exit("usage: python -m benchmarks.gpu_wheels probe PRETRAIN_DATA TASK_DATA WORK OUT.json")
    _probe_main(*sys.argv[2:])
