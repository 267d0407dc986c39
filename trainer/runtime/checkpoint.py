"""Run checkpoints: `RUN/ckpt-00001000/`, written to a temp dir and renamed into place.

A checkpoint directory holds
- `model.npz`: every weight under its ORIGINAL TF1 name (`bert_datagen.trainer.model.bert.tf1_variable_map`),
- `optimizer.npz`: `NAME/adam_m`, `NAME/adam_v` (the original slot names) and loss-scale state,
- `input.*`: the tf.data iterator state (the exact input position),
- `state.json`: step, metrics, the bert config; written last inside the temp dir.
Only complete checkpoints carry the `ckpt-` name, so an interrupted save is never picked up.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from bert_datagen.trainer.errors import CheckpointError, TrainingError

if TYPE_CHECKING:
    from bert_datagen.trainer.runtime.optimizer import AdamWeightDecay, DynamicLossScale

CKPT_RE = re.compile(r"^ckpt-(\d{8})$")
MODEL_FILE = "model.npz"
OPTIMIZER_FILE = "optimizer.npz"
STATE_FILE = "state.json"
INPUT_PREFIX = "input"
TMP_PREFIX = ".tmp-ckpt-"




def checkpoint_dir(run_dir: str | Path, step: int) -> Path:
    return Path(run_dir) / f"ckpt-{step:08d}"


def list_checkpoints(run_dir: str | Path) -> list[tuple[int, Path]]:
    """Complete checkpoints of a run, oldest first."""
    run = Path(run_dir)
    if not run.is_dir():
        return []
    found = []
    for child in run.iterdir():
        match = CKPT_RE.match(child.name)
        if match and (child / STATE_FILE).is_file():
            found.append((int(match.group(1)), child))
    return sorted(found)


def reads_through_tf_data(run_dir: str | Path) -> bool:
    """Whether the run's latest checkpoint holds a tf.data iterator state (a run of an earlier version)."""
    found = list_checkpoints(run_dir)
    return bool(found) and any(p.name.startswith(INPUT_PREFIX + ".") for p in found[-1][1].iterdir())


def resolve_checkpoint(path: str | Path) -> Path:
    """A checkpoint directory from either a run directory (its latest) or a checkpoint directory."""
    p = Path(path)
    if (p / STATE_FILE).is_file() and (p / MODEL_FILE).is_file():
        return p
    found = list_checkpoints(p)
    if not found:
        raise CheckpointError(f"{p}: neither a checkpoint directory nor a run with checkpoints")
    return found[-1][1]


def save_checkpoint(run_dir: str | Path, step: int, model_arrays: dict[str, np.ndarray],
                    optimizer_arrays: dict[str, np.ndarray], state: dict,
                    iterator_saver: Callable[[str], object] | None = None, keep: int = 3) -> Path:
    """Write a checkpoint atomically and delete all but the newest `keep`.

    Everything goes into a `.tmp-ckpt-*` directory, is flushed to disk, and the directory is renamed
    to `ckpt-NNNNNNNN` last: a save interrupted at any point (SIGINT, SIGKILL, a full disk) leaves
    the earlier checkpoints as they were and a temp directory that the next start removes. A
    filesystem error is a `TrainingError` naming the run and the step.
    """
    try:
        return _write_checkpoint(Path(run_dir), step, model_arrays, optimizer_arrays, state, iterator_saver, keep)
    except OSError as exc:
        raise TrainingError(f"{run_dir}: cannot write the checkpoint of step {step}: "
                            f"{exc.strerror or exc}") from exc


def _write_checkpoint(run: Path, step: int, model_arrays: dict[str, np.ndarray],
                      optimizer_arrays: dict[str, np.ndarray], state: dict,
                      iterator_saver: Callable[[str], object] | None, keep: int) -> Path:
    run.mkdir(parents=True, exist_ok=True)
    final = checkpoint_dir(run, step)
    tmp = Path(tempfile.mkdtemp(prefix=f"{TMP_PREFIX}{step:08d}-", dir=run))
    try:
        np.savez(tmp / MODEL_FILE, **model_arrays)
        np.savez(tmp / OPTIMIZER_FILE, **optimizer_arrays)
        if iterator_saver is not None:
            iterator_saver(str(tmp / INPUT_PREFIX))
        (tmp / STATE_FILE).write_text(json.dumps(state, indent=2, sort_keys=True) + "\n")
        _fsync_files(tmp)
        if final.exists():  # a checkpoint of the same step from an earlier attempt: set it aside first
            os.rename(final, Path(tempfile.mkdtemp(prefix=f"{TMP_PREFIX}old-", dir=run)) / final.name)
        os.rename(tmp, final)
        _fsync_dir(run)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    cleanup_partial(run)
    for _, old in list_checkpoints(run)[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def _fsync_files(directory: Path) -> None:
    for path in directory.iterdir():
        with open(path, "rb") as f:
            os.fsync(f.fileno())
    _fsync_dir(directory)


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def load_arrays(ckpt: Path, name: str) -> dict[str, np.ndarray]:
    path = ckpt / name
    if not path.is_file():
        raise CheckpointError(f"{path}: missing")
    try:
        with np.load(path, allow_pickle=False) as data:
            return {k: data[k] for k in data.files}
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as exc:
        raise CheckpointError(f"{path}: cannot read: {exc}") from exc


def load_state(ckpt: Path) -> dict:
    path = ckpt / STATE_FILE
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"{path}: cannot read: {exc}") from exc


def assign_named_weights(variables: dict, arrays: dict[str, np.ndarray], source: str) -> None:
    """Assign `arrays` (TF1 name -> value) to `variables` (TF1 name -> variable); every variable must
    get a value of its exact shape, else CheckpointError listing every problem."""
    problems = []
    for name, var in variables.items():
        if name not in arrays:
            problems.append(f"missing {name}")
            continue
        if tuple(arrays[name].shape) != tuple(var.shape):
            problems.append(f"{name}: shape {tuple(arrays[name].shape)} != model {tuple(var.shape)}")
    if problems:
        raise CheckpointError(f"{source}: does not fit the model: " + "; ".join(problems))
    for name, var in variables.items():
        var.assign(arrays[name])


def cleanup_partial(run_dir: str | Path) -> None:
    """Remove temp dirs of interrupted saves."""
    run = Path(run_dir)
    if run.is_dir():
        for child in run.iterdir():
            if child.name.startswith(TMP_PREFIX):
                shutil.rmtree(child, ignore_errors=True)


def checkpoint_arrays(named: dict, optimizer: AdamWeightDecay, loss_scale: DynamicLossScale | None,
                      step: int) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """(model arrays by TF1 name, optimizer arrays: slots, global_step and the loss-scale state)."""
    model_arrays = {name: var.numpy() for name, var in named.items()}
    opt_arrays = optimizer.slot_arrays()
    opt_arrays["global_step"] = np.asarray(step, dtype=np.int64)
    if loss_scale is not None:
        opt_arrays.update(loss_scale.state())
    return model_arrays, opt_arrays


def restore_checkpoint_arrays(path: Path, named: dict, optimizer: AdamWeightDecay,
                              loss_scale: DynamicLossScale | None) -> None:
    """Weights, optimizer slots and loss-scale state from checkpoint directory `path`."""
    assign_named_weights(named, load_arrays(path, MODEL_FILE),
                                  str(path / MODEL_FILE))
    opt = load_arrays(path, OPTIMIZER_FILE)
    optimizer.load_slot_arrays(opt, str(path / OPTIMIZER_FILE))
    if loss_scale is not None:
        loss_scale.load_state(opt)
