"""A run directory: where it may be, the settings and the dataset it was started with, and when a
rerun of `bert-train pretrain --out RUN` resumes it, restarts it, or is refused.

- A run with a completed step (a checkpoint) resumes: its settings must be those it was started
  with (except the few that do not change what it computes, `TrainConfig.RESUMABLE_CHANGES`), and
  its `--data` must be the same dataset (the same content, however the path is spelled).
- A run with no completed step has nothing to resume: it is restarted with the settings given.
- `--out` must be a directory we can write, and either new, empty or a run directory.
All files are written atomically (temp file with our mark, then rename).

A command that writes a run (or another output: an export, predictions) holds the output's lock
(`output_lock`, `contract.lock`) from before its first write until it ends: a second command on the
same path is refused with a message naming the one that holds it.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

from contract.lock import INSIDE_LOCK_NAME, OutputLock, OutputLockError, lock_output
from trainer import checkpoint as ckpt_lib
from trainer.config import BertConfig, TrainConfig
from trainer.errors import ConfigError, TrainingError

TRAIN_CONFIG_FILE = "train_config.json"
BERT_CONFIG_FILE = "bert_config.json"
DATASET_FILE = "dataset.json"
TMP_MARK = ".tmp-"
# Checked by content (DATASET_FILE), not by how the path is spelled.
_DATA_OPTIONS = frozenset({"data", "eval_data"})
_RUN_FILES = (TRAIN_CONFIG_FILE, BERT_CONFIG_FILE, DATASET_FILE)


def has_completed_steps(run: Path) -> bool:
    return bool(ckpt_lib.list_checkpoints(run))


def _is_run_dir(run: Path) -> bool:
    return any((run / name).is_file() for name in _RUN_FILES) or has_completed_steps(run)


def check_out_dir(given: str | Path) -> None:
    """Raise ConfigError naming `--out` unless a run can be written there (before any work)."""
    out = Path(given)
    if "://" in str(given):
        raise ConfigError(f"--out {given}: must be a local directory (checkpoints are written and renamed "
                          "with local file operations); copy the run to an object store afterwards")
    if out.exists() and not out.is_dir():
        raise ConfigError(f"--out {out}: exists and is not a directory")
    if out.is_dir():
        try:
            entries = [e for e in out.iterdir() if e.name != INSIDE_LOCK_NAME]
        except OSError as exc:
            raise ConfigError(f"--out {out}: cannot read the directory: {exc.strerror}") from exc
        if entries and not _is_run_dir(out):
            raise ConfigError(f"--out {out}: exists, is not empty and is not a bert-train run directory "
                              f"(no {TRAIN_CONFIG_FILE}); give a new or empty directory")
        probe_in = out
    else:
        probe_in = out.parent
        while not probe_in.exists() and probe_in != probe_in.parent:
            probe_in = probe_in.parent
        if not probe_in.is_dir():
            raise ConfigError(f"--out {out}: {probe_in} is not a directory")
    try:  # the only sure test of writability (permissions, read-only filesystems, ACLs)
        os.rmdir(tempfile.mkdtemp(prefix=f"{TMP_MARK}probe-", dir=probe_in))
    except OSError as exc:
        raise ConfigError(f"--out {out}: cannot write in {probe_in}: {exc.strerror}") from exc


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
        raise ConfigError(f"--out {out}: cannot create the run directory: {exc.strerror}") from exc


def check_settings(run: Path, cfg: TrainConfig) -> None:
    """A run with completed steps resumes only with the settings it was started with."""
    path = run / TRAIN_CONFIG_FILE
    if not path.is_file() or not has_completed_steps(run):
        return
    # A key missing from an older run's file had its default then (options only get added).
    previous = {**TrainConfig.field_defaults(), **_read_json(path)}
    current = cfg.to_dict()
    ignored = TrainConfig.RESUMABLE_CHANGES | _DATA_OPTIONS
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


def start(run: Path, cfg: TrainConfig, bert: BertConfig, data: str, identity: dict) -> None:
    """Record what the run is (settings, model, dataset). A run with completed steps keeps what it
    recorded when it started (except a dataset record missing in runs of older versions)."""
    make_run_dir(run)
    resuming = has_completed_steps(run)
    if not resuming or not (run / TRAIN_CONFIG_FILE).is_file():
        write_atomic(run / TRAIN_CONFIG_FILE, cfg.to_json())
        write_atomic(run / BERT_CONFIG_FILE, bert.to_json())
    if not resuming or not (run / DATASET_FILE).is_file():
        record = {"data": data, **identity}
        write_atomic(run / DATASET_FILE, json.dumps(record, indent=2, sort_keys=True) + "\n")


def recorded_dataset(run: Path) -> dict | None:
    path = run / DATASET_FILE
    return _read_json(path) if path.is_file() else None


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise TrainingError(f"{path}: cannot read: {exc}") from exc


def write_atomic(path: Path, text: str) -> None:
    """Write `text` to a marked temp sibling, flush it to disk, rename it over `path`."""
    tmp = path.with_name(f"{TMP_MARK}{path.name}-{os.getpid()}")
    try:
        with open(tmp, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise TrainingError(f"{path}: cannot write: {exc.strerror}") from exc
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def cleanup_temp(run: Path) -> None:
    """Remove what interrupted writes of ours left: marked temp files and checkpoint temp dirs."""
    ckpt_lib.cleanup_partial(run)
    if run.is_dir():
        for child in run.iterdir():
            if child.name.startswith(TMP_MARK) and child.is_file():
                child.unlink(missing_ok=True)
