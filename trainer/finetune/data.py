"""Reading a task dataset (`bert-datagen task` output, docs/tasks.md) for fine-tuning.

A task dataset is a directory with manifest.json ("kind": "task"), vocab.txt and one directory per
split of fixed-length tf.train.Example shards, plus examples.jsonl / windows.jsonl for span and
tagging splits. Training batches come from the global order (`ordered.py`), evaluation's from
`read_split`; tf.data reads task splits only for runs of an earlier version (`tf_data.py`).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np

from bert_datagen.contract.features import TASK
from bert_datagen.contract.loading.source import LoadError, manifest_version, open_source
from bert_datagen.contract.loading.source import check_unchanged as check_manifest_unchanged
from bert_datagen.contract.loading.split_records import SplitRecords
from bert_datagen.contract.manifest import MANIFEST_NAME, SplitInfo
from bert_datagen.trainer.errors import DataError
from bert_datagen.trainer.model.heads import TASK_TYPES
from bert_datagen.trainer.pretrain.data import (
    check_first_record,
    check_shard_file,
    open_manifest_dataset,
)
from bert_datagen.trainer.runtime import gfs
from bert_datagen.trainer.runtime.gfs import GFILE_FS
from bert_datagen.trainer.runtime.ordered_input import data_error


@dataclass
class TaskSplit:
    name: str
    files: list[str]
    records: int
    labelled: bool
    mode: str
    features: dict[str, tuple[str, int]]
    side: dict[str, str] = field(default_factory=dict)  # file name -> path
    sizes: dict[str, int] = field(default_factory=dict)  # shard path -> bytes, as the manifest lists them
    root: str = ""  # the dataset's directory
    # Its manifest before it was read (`manifest_version`): the split's reads stop once it changes.
    manifest_version: str | None = None


@dataclass
class TaskDataset:
    source: str
    task_kind: str
    task_type: str
    labels: list[str]
    max_seq_length: int
    vocab_size: int
    vocab_path: str
    do_lower_case: bool
    splits: dict[str, TaskSplit]
    task: dict
    vocab_sha256: str = ""  # the manifest's, of vocab_path's bytes
    identity: dict = field(default_factory=dict)  # `manifest_identity`: what a run records and resumes on

    @property
    def num_labels(self) -> int:
        return len(self.labels)

    def split(self, name: str) -> TaskSplit:
        if name not in self.splits:
            raise DataError(f"{self.source}: no split {name!r} (the dataset has {', '.join(sorted(self.splits))})")
        return self.splits[name]


def open_task_dataset(directory: str) -> TaskDataset:
    """Describe a task dataset; DataError (naming the file) for anything else, e.g. pre-training data."""
    version = manifest_version(directory, GFILE_FS)  # before the manifest is read: see open_source
    ds = open_manifest_dataset(directory)
    manifest = ds.manifest
    assert manifest is not None
    path = os.path.join(directory, MANIFEST_NAME)
    if ds.kind != TASK:
        raise DataError(f"{directory}: a pre-training dataset (manifest kind {ds.kind!r}), "
                        "not a task dataset; fine-tune on the output of `bert-datagen task`, or pre-train "
                        "on this one with `bert-train pretrain`")
    try:
        task = manifest.task
        task_type = task["type"]
        if task_type not in TASK_TYPES:
            raise DataError(f"{path}: task type {task_type!r} is not one of {', '.join(TASK_TYPES)}")
        vocab = manifest.vocab
        splits = {name: _split_info(directory, name, info, path, version) for name, info in manifest.splits.items()}
        # docs/tasks.md records it in "task"; older writers only beside the vocab or in the config.
        recorded = vocab.do_lower_case if vocab.do_lower_case is not None else manifest.config.get("do_lower_case", True)
        do_lower_case = bool(task.get("do_lower_case", recorded))
        return TaskDataset(source=directory, task_kind=str(task["kind"]), task_type=task_type,
                           labels=[str(x) for x in task.get("labels", [])],
                           max_seq_length=int(task["max_seq_length"]), vocab_size=vocab.size,
                           vocab_path=os.path.join(directory, vocab.path), do_lower_case=do_lower_case,
                           splits=splits, task=dict(task), vocab_sha256=str(vocab.sha256),
                           identity=manifest.identity())
    except (KeyError, TypeError, ValueError) as exc:
        if isinstance(exc, DataError):
            raise
        raise DataError(f"{path}: not a valid task manifest ({type(exc).__name__}: {exc})") from exc


def _split_info(directory: str, name: str, info: SplitInfo, manifest_path: str,
                version: str | None) -> TaskSplit:
    files = [os.path.join(directory, s.path) for s in info.shards]
    for f in files:
        if not gfs.exists(f):
            raise DataError(f"{f}: shard listed in {manifest_path} is missing")
    side = {os.path.basename(f.path): os.path.join(directory, f.path) for f in info.side}
    if info.features is None:
        raise DataError(f"{manifest_path}: not a valid task manifest (split {name!r} lists no features)")
    sizes = {path: s.bytes for path, s in zip(files, info.shards, strict=True)}
    return TaskSplit(name=name, files=files, records=info.records, labelled=info.labelled,
                     mode=str(info.mode if info.mode is not None else "predict"), features=dict(info.features),
                     side=side, sizes=sizes, root=directory, manifest_version=version)


def check_split_files(dataset: TaskDataset, splits: list[TaskSplit | None]) -> None:
    """What pre-training checks before its first step (bert_datagen.trainer.pretrain.data), for the splits a command will
    read: each shard has the size the manifest gives and its first record parses with the split's
    features. A truncated dev shard would otherwise surface only after training, as a TensorFlow
    error that names no file."""
    manifest = os.path.join(dataset.source, MANIFEST_NAME)
    for split in splits:
        if split is None:
            continue
        for path in split.files:
            if path in split.sizes:
                check_shard_file(path, split.sizes[path], manifest)
            check_first_record(path, split.features)


def check_unchanged(split: TaskSplit) -> None:
    """DataError unless the split's dataset is still the one opened (`Source.check_unchanged`)."""
    try:
        check_manifest_unchanged(split.root, split.manifest_version, GFILE_FS)
    except LoadError as exc:
        raise data_error(exc) from exc


def read_split(split: TaskSplit, batch_size: int) -> Iterator[dict[str, np.ndarray]]:
    """The split in record order, once, as NumPy batches (the last may be short), through the
    loaders every framework shares (`contract/loading`); the dataset must still be the one
    `open_task_dataset` read (a replaced one is refused at the first batch), a record the loaders
    cannot read is a DataError."""
    try:
        records = SplitRecords(open_source(split.root, split.name, GFILE_FS, split.manifest_version))
        for start in range(0, len(records), batch_size):
            yield records[start:start + batch_size]
    except LoadError as exc:
        raise data_error(exc) from exc


def read_side_file(split: TaskSplit, name: str, source: str) -> list[dict]:
    if name not in split.side:
        raise DataError(f"{source}: split {split.name!r} lists no {name} side file")
    path = split.side[name]
    rows = []
    with gfs.open_text(path) as f:
        for line_number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as exc:
                raise DataError(f"{path}: line {line_number}: not JSON ({exc})") from exc
    return rows
