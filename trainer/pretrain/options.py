"""The options of `bert-train pretrain` and `eval` that only some data or runs use, checked against
the data and run they meet: a value the data contradicts, or one this run would not use, is refused
(or, where scripts have long passed it, dropped with a warning) before any work, so that the run's
record (train_config.json) is what ran. The lengths and --eval-data a manifest contradicts are
checked where the data is opened (`data.refuse_manifest_contradictions`).
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Callable
from pathlib import Path

from bert_datagen.contract.manifest import MANIFEST_NAME
from bert_datagen.trainer.errors import ConfigError, DataError
from bert_datagen.trainer.pretrain.data import DatasetInfo
from bert_datagen.trainer.run import gfs
from bert_datagen.trainer.run.config import TrainConfig
from bert_datagen.trainer.run.dataset_dir import load_dataset_manifest
from bert_datagen.trainer.run.rundir import TRAIN_CONFIG_FILE

# The shuffle buffer of runs of earlier versions that recorded none (their default then).
LEGACY_SHUFFLE_BUFFER = 10000


def model_vocab_size(info: DatasetInfo, vocab_size: int | None) -> int | None:
    """The vocab size a named model size gets: the manifest's, or --vocab-size for data without one."""
    if info.vocab_size is not None and vocab_size is not None and vocab_size != info.vocab_size:
        raise DataError(f"--vocab-size {vocab_size} contradicts {info.source}/{MANIFEST_NAME}, whose vocab has "
                        f"{info.vocab_size} tokens (the option is for TFRecord globs without a manifest)")
    return info.vocab_size or vocab_size


def no_eval_split(data: str, eval_data: str | None) -> str | None:
    """Why a run on `data` has nothing to evaluate; None when it has an eval split, or when the data
    cannot be read yet (opening it later says why)."""
    if eval_data:
        return None
    manifest_path = os.path.join(data, MANIFEST_NAME)
    if gfs.isdir(data) and gfs.exists(manifest_path):
        manifest = load_dataset_manifest(data)
        if manifest is None or manifest.get("splits", {}).get("eval", {}).get("shards"):
            return None
        return f"{manifest_path} has no eval split (`bert-datagen run --eval-fraction` makes one)"
    if not gfs.isdir(data) and not any(gfs.glob(p.strip()) for p in data.split(",")):
        return None  # not data at all: opening it says so
    return f"--data {data} has no manifest and no --eval-data is given, so there is no eval split"


def legacy_shuffle_buffer(run_dir: str | Path, given: int | None) -> int:
    """The shuffle buffer of a run started by an earlier version (it reads through tf.data): the one
    it recorded; another given one is refused, as it would change the batches of the resumed run."""
    path = Path(run_dir) / TRAIN_CONFIG_FILE
    try:
        recorded = json.loads(path.read_text()).get("shuffle_buffer")
    except (OSError, ValueError, AttributeError):  # nothing recorded: the run starts reading now
        return LEGACY_SHUFFLE_BUFFER if given is None else given
    recorded = LEGACY_SHUFFLE_BUFFER if recorded is None else int(recorded)
    if given is not None and given != recorded:
        raise ConfigError(f"--shuffle-buffer {given}: {path} records {recorded}, the buffer this run (started by "
                          "an earlier version, reading through tf.data) reads with; resume it with that")
    return recorded


def unused_shuffle_buffer(shuffle_buffer: int | None, reads_through_tf_data: bool) -> str | None:
    """The warning for a shuffle buffer the run would not use (scripts have long passed one, so it is
    dropped, not refused, and the run records none); None when there is none to drop."""
    if shuffle_buffer is None or reads_through_tf_data:
        return None
    return (f"warning: --shuffle-buffer {shuffle_buffer} has no effect: the run reads the global order (its "
            "shuffle is a pure function of --seed); only runs started by an earlier version, which read "
            "through tf.data, use a buffer")


def as_run(cfg: TrainConfig, reads_through_tf_data: bool, log: Callable[[str], None]) -> TrainConfig:
    """`cfg` as the run records it: without a shuffle buffer it does not use (warned once)."""
    warning = unused_shuffle_buffer(cfg.shuffle_buffer, reads_through_tf_data)
    if warning is None:
        return cfg
    log(warning)
    return dataclasses.replace(cfg, shuffle_buffer=None)
