"""A run directory: where it may be, the settings and the dataset it was started with, and when a
rerun of `bert-train pretrain --out RUN` resumes it, restarts it, or is refused.

- A run with a completed step (a checkpoint) resumes: its settings must be those it was started
  with (except the few that do not change what it computes, `TrainConfig.RESUMABLE_CHANGES`), and
  its `--data` must be the same dataset (the same content, however the path is spelled).
- A run with no completed step has nothing to resume: it is restarted with the settings given.
- `--out` must be a directory we can write, and either new, empty or a run directory of the same
  kind (`run_kind`: pre-training, fine-tuning, multi-seed fine-tuning; each is recognised by the
  files it writes first); never a dataset of ours, nor inside one.
All files are written atomically (temp file with our mark, `replacing`, then rename); `cleanup_temp`
removes what an interrupted write left, in the run and in the subdirectories it owns.

A command that writes a run (or another output: an export, predictions) holds the output's lock
(`output_lock`, `bert_datagen.cli.lock`) from before its first write until it ends: a second command on the
same path is refused with a message naming the one that holds it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, ClassVar, Protocol

from bert_datagen.cli.lock import INSIDE_LOCK_NAME, OutputLock, OutputLockError, lock_output
from bert_datagen.contract import fs
from bert_datagen.contract.manifest import MANIFEST_NAME
from bert_datagen.trainer.errors import TrainConfigError, TrainingError
from bert_datagen.trainer.runtime import checkpoint as ckpt_lib

TRAIN_CONFIG_FILE = "train_config.json"
FINETUNE_CONFIG_FILE = "finetune_config.json"
SEEDS_FILE = "finetune_seeds.json"
BERT_CONFIG_FILE = "bert_config.json"
DATASET_FILE = "dataset.json"
TMP_MARK = fs.TMP_MARKER  # cleanup_temp removes every name with it: the whole run directory is ours
# Checked by content (DATASET_FILE), not by how the path is spelled.
_DATA_OPTIONS = frozenset({"data", "eval_data", "mix"})  # paths: the data's identity is checked itself
# Subdirectories a run writes files into itself (the last evaluation's predictions).
OWNED_SUBDIRS = ("eval",)

PRETRAINING, FINETUNING, FINETUNING_SEEDS = "pre-training run", "fine-tuning run", "multi-seed fine-tuning run"
# What to do instead when --out is a run of another kind: (kind found, kind asked for) -> hint.
_OTHER_KIND_HINT = {
    (PRETRAINING, FINETUNING): "it can be the --init-from of a fine-tuning run; give a new or empty --out",
    (PRETRAINING, FINETUNING_SEEDS): "it can be the --init-from of a fine-tuning run; give a new or empty --out",
    (FINETUNING, FINETUNING_SEEDS): "resume it with a single --seed, or give a new or empty --out",
    (FINETUNING_SEEDS, FINETUNING): "resume it with --seeds (it holds one seed-N/ run per seed), or give a new "
                                    "or empty --out",
}
_SEED_DIR = re.compile(r"seed-\d+")


class RunSettings(Protocol):
    """A run's settings as `check_settings` compares them (TrainConfig, FinetuneConfig)."""

    RESUMABLE_CHANGES: ClassVar[frozenset[str]]

    def to_dict(self) -> dict[str, Any]: ...

    def settings_of_record(self, recorded: dict[str, Any]) -> dict[str, Any]: ...


def has_completed_steps(run: Path) -> bool:
    return bool(ckpt_lib.list_checkpoints(run))


def run_kind(path: Path) -> str | None:
    """Which kind of run `path` is, from the record each kind writes first (or, for runs that
    lack it, from its checkpoints); None when it is none of ours."""
    if (path / SEEDS_FILE).is_file():
        return FINETUNING_SEEDS
    if (path / FINETUNE_CONFIG_FILE).is_file():
        return FINETUNING
    if (path / TRAIN_CONFIG_FILE).is_file():
        return PRETRAINING
    found = ckpt_lib.list_checkpoints(path)
    if found:
        try:
            state = ckpt_lib.load_state(found[-1][1])
        except ckpt_lib.CheckpointError:
            state = {}
        return FINETUNING if "task" in state else PRETRAINING
    try:  # a multi-seed run of a version that wrote no SEEDS_FILE
        children = list(path.iterdir()) if path.is_dir() else []
    except OSError:
        children = []
    if any(_SEED_DIR.fullmatch(c.name) and (c / FINETUNE_CONFIG_FILE).is_file() for c in children):
        return FINETUNING_SEEDS
    return None


def has_run_record(path: Path) -> bool:
    """Whether `path` holds the record a run of ours writes first (cheaper than `run_kind`: for
    the directories above an output)."""
    return any((path / name).is_file() for name in (SEEDS_FILE, FINETUNE_CONFIG_FILE, TRAIN_CONFIG_FILE))


def is_dataset(path: Path) -> bool:
    """Whether `path` holds a manifest.json written by bert-datagen (a dataset of ours)."""
    manifest = path / MANIFEST_NAME
    if not manifest.is_file():
        return False
    try:
        content = json.loads(manifest.read_text())
    except (OSError, ValueError):
        return False
    return isinstance(content, dict) and (
        str(content.get("schema", "")).startswith("bert-datagen/")
        or (isinstance(content.get("tool"), dict) and content["tool"].get("name") == "bert-datagen"))


def enclosing(out: Path, test: Callable[[Path], bool]) -> Path | None:
    """`out` itself or the nearest directory above it for which `test` holds."""
    for candidate in (out, *out.absolute().parents):
        if candidate.is_dir() and test(candidate):
            return candidate
    return None


def refuse_inside_dataset(out: Path, option: str = "--out") -> None:
    """A dataset is the input of other commands, checked file by file (`bert-datagen verify`):
    nothing of ours may be written in it."""
    dataset = enclosing(out, is_dataset)
    if dataset is not None:
        where = "is" if dataset == out else "is inside"
        raise TrainConfigError(f"{option} {out}: {where} the bert-datagen dataset {dataset}; "
                               "give a directory outside it")


def check_writable(out: Path, option: str = "--out") -> None:
    """TrainConfigError unless files can be created in `out` (or where it would be created)."""
    probe_in = out
    if not out.is_dir():
        probe_in = out.parent
        while not probe_in.exists() and probe_in != probe_in.parent:
            probe_in = probe_in.parent
        if not probe_in.is_dir():
            raise TrainConfigError(f"{option} {out}: {probe_in} is not a directory")
    try:  # the only sure test of writability (permissions, read-only filesystems, ACLs)
        probe = fs.temp_path_for(os.path.join(probe_in, "probe"))
        os.mkdir(probe)
        os.rmdir(probe)
    except OSError as exc:
        raise TrainConfigError(f"{option} {out}: cannot write in {probe_in}: {exc.strerror}") from exc


def check_local_dir(given: str | Path, option: str = "--out") -> Path:
    out = Path(given)
    if fs.is_remote(given):
        raise TrainConfigError(f"{option} {given}: must be a local directory (files are written and renamed "
                               "with local file operations); copy it to an object store afterwards")
    if out.exists() and not out.is_dir():
        raise TrainConfigError(f"{option} {out}: exists and is not a directory")
    return out


def entries_of(out: Path, option: str = "--out") -> list[Path]:
    """What `out` holds besides lock files of ours (its own, or those of outputs inside it: a
    `--seeds` run's seed-N/); [] when it does not exist."""
    if not out.is_dir():
        return []
    try:
        return [e for e in out.iterdir() if not e.name.startswith(INSIDE_LOCK_NAME)]
    except OSError as exc:
        raise TrainConfigError(f"{option} {out}: cannot read the directory: {exc.strerror}") from exc


def check_out_dir(given: str | Path, kind: str = PRETRAINING) -> None:
    """Raise TrainConfigError naming `--out` unless a run of `kind` can be written there (before any
    work): new, empty, or a run of the same kind; never a dataset or a run of another kind."""
    out = check_local_dir(given)
    refuse_inside_dataset(out)
    if out.is_dir():
        entries = entries_of(out)
        found = run_kind(out) if entries else None
        if found is not None and found != kind:
            hint = _OTHER_KIND_HINT.get((found, kind), "give a new or empty --out")
            raise TrainConfigError(f"--out {out}: a {found}, not a {kind}; {hint}")
        if entries and found is None:
            raise TrainConfigError(f"--out {out}: exists, is not empty and is not a bert-train run directory "
                                   f"(no {TRAIN_CONFIG_FILE} or {FINETUNE_CONFIG_FILE}); give a new or empty directory")
    check_writable(out)


def output_lock(out: str | os.PathLike, option: str = "--out", replaced_whole: bool = False) -> OutputLock:
    """The exclusive lock of an output (see the module doc), or TrainingError naming its holder.
    ``replaced_whole``: the output directory is swapped in as a whole (an export), so its lock must
    live beside it, never inside."""
    try:
        return lock_output(os.fspath(out), option, inside_ok=not replaced_whole)
    except OutputLockError as exc:
        raise TrainingError(str(exc)) from exc


def make_run_dir(out: Path) -> None:
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise TrainConfigError(f"--out {out}: cannot create the run directory: {exc.strerror}") from exc


def field_defaults(cls: type) -> dict[str, Any]:
    """Each field of a settings dataclass that has a plain default, with it."""
    return {f.name: f.default for f in dataclasses.fields(cls) if f.default is not dataclasses.MISSING}


def check_settings(run: Path, cfg: RunSettings, config_file: str = TRAIN_CONFIG_FILE) -> None:
    """A run with completed steps resumes only with the settings it was started with (recorded in
    `config_file`); one with none restarts with the settings given."""
    path = run / config_file
    if not path.is_file() or not has_completed_steps(run):
        return
    # A key missing from an older run's file had its default then (options only get added).
    previous = cfg.settings_of_record({**field_defaults(type(cfg)), **_read_json(path)})
    current = cfg.to_dict()
    ignored = cfg.RESUMABLE_CHANGES | _DATA_OPTIONS
    differing = sorted(k for k in set(previous) | set(current)
                       if k not in ignored and previous.get(k) != current.get(k))
    if differing:
        detail = ", ".join(f"{k}: {previous.get(k)!r} -> {current.get(k)!r}" for k in differing)
        raise TrainingError(f"{path}: the run was started with other settings ({detail}); "
                            "use a new --out to start another run")


def check_dataset(run: Path, data: str, identity: dict) -> None:
    """A run with completed steps resumes only on the dataset it was started on."""
    path = run / DATASET_FILE
    if not path.is_file() or not has_completed_steps(run):
        return
    check_same_dataset(_read_json(path), data, identity, f"{path}")


def check_same_dataset(recorded: dict, data: str, identity: dict, where: str) -> None:
    if recorded.get("fingerprint") == identity["fingerprint"]:
        return
    before = {(s["split"], s["path"]): s for s in recorded.get("shards", [])}
    now = {(s["split"], s["path"]): s for s in identity["shards"]}
    changed = sorted(key[1] for key in set(before) | set(now) if before.get(key) != now.get(key))
    shown = ", ".join(changed[:5]) + (" ..." if len(changed) > 5 else "")
    raise TrainingError(
        f"--data {data}: not the dataset this run was started on: the run's dataset "
        f"({recorded.get('data')}) has fingerprint {recorded.get('fingerprint')}, --data has fingerprint "
        f"{identity['fingerprint']} ({len(changed)} shard(s) differ: {shown or 'features or vocab'}); "
        f"recorded in {where}. A regenerated or other dataset needs a new --out")


def start(run: Path, records: Mapping[str, str], data: str, identity: dict) -> None:
    """Record what the run is: `records` (file name -> text; the first one names the run's kind,
    see `run_kind`, so it goes first) and the dataset. A run with completed steps keeps what it
    recorded when it started (except records missing in runs of older versions)."""
    make_run_dir(run)
    resuming = has_completed_steps(run)
    first = next(iter(records))
    if not resuming or not (run / first).is_file():
        for name, text in records.items():
            write_atomic(run / name, text)
    if not resuming or not (run / DATASET_FILE).is_file():
        record = {"data": data, **identity}
        write_atomic(run / DATASET_FILE, json.dumps(record, indent=2, sort_keys=True) + "\n")


def recorded_seeds(run: Path) -> list[int]:
    """The seeds a `--seeds` run records (in SEEDS_FILE); [] when it records none."""
    path = run / SEEDS_FILE
    seeds = _read_json(path).get("seeds", []) if path.is_file() else []
    return [int(s) for s in seeds] if isinstance(seeds, list) else []


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise TrainingError(f"{path}: cannot read: {exc}") from exc


@contextlib.contextmanager
def replacing(path: Path) -> Iterator[Path]:
    """Yield the marked temp sibling of `path` to write (bert_datagen.contract.fs.replacing); when the
    block ends without error it is flushed to disk and renamed over `path`, otherwise removed
    (TrainingError naming `path` for an OSError)."""
    try:
        with fs.replacing(path, durable=True) as tmp:
            yield tmp
    except OSError as exc:
        raise TrainingError(f"{path}: cannot write: {exc.strerror or exc}") from exc


def write_atomic(path: Path, text: str) -> None:
    """Write `text` to a marked temp sibling, flush it to disk, rename it over `path`."""
    with replacing(path) as tmp:
        tmp.write_text(text, encoding="utf-8")


def cleanup_temp(run: Path) -> None:
    """Remove what interrupted writes of ours left: marked temp files (in the run and the
    subdirectories it owns) and checkpoint temp dirs."""
    ckpt_lib.cleanup_partial(run)
    for directory in (run, *(run / name for name in OWNED_SUBDIRS)):
        fs.remove_temp_files(directory, any_marked=True)
