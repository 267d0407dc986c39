"""Reading a task dataset (`bert-datagen task` output, docs/tasks.md) for fine-tuning.

A task dataset is a directory with manifest.json ("kind": "task"), vocab.txt and one directory per
split of fixed-length tf.train.Example shards, plus examples.jsonl / windows.jsonl for span and
tagging splits. Training batches come from a per-epoch shuffle seeded by (seed, epoch), so batch b
of epoch e is a pure function of the seed: a resumed run re-creates its position from the step
alone, with no iterator state to save.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np
import tensorflow as tf

from bert_datagen.contract.features import TASK
from bert_datagen.contract.loading.source import LoadError, manifest_version, open_source
from bert_datagen.contract.loading.source import check_unchanged as check_manifest_unchanged
from bert_datagen.contract.loading.split_records import SplitRecords
from bert_datagen.contract.loading.task_batches import GROUP_WINDOW, bucket_lengths
from bert_datagen.contract.manifest import MANIFEST_NAME
from bert_datagen.contract.manifest import SplitInfo as ManifestSplit
from bert_datagen.trainer.errors import DataError
from bert_datagen.trainer.model.heads import TASK_TYPES
from bert_datagen.trainer.pretrain.data import (
    check_first_record,
    check_shard_file,
    find_bad_record,
    open_manifest_dataset,
)
from bert_datagen.trainer.runtime import gfs
from bert_datagen.trainer.runtime.gfs import GFILE_FS
from bert_datagen.trainer.runtime.ordered_input import data_error


@dataclass
class SplitInfo:
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
    splits: dict[str, SplitInfo]
    task: dict
    vocab_sha256: str = ""  # the manifest's, of vocab_path's bytes
    identity: dict = field(default_factory=dict)  # `manifest_identity`: what a run records and resumes on

    @property
    def num_labels(self) -> int:
        return len(self.labels)

    def split(self, name: str) -> SplitInfo:
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


def _split_info(directory: str, name: str, info: ManifestSplit, manifest_path: str,
                version: str | None) -> SplitInfo:
    files = [os.path.join(directory, s.path) for s in info.shards]
    for f in files:
        if not gfs.exists(f):
            raise DataError(f"{f}: shard listed in {manifest_path} is missing")
    side = {os.path.basename(f.path): os.path.join(directory, f.path) for f in info.side}
    if info.features is None:
        raise DataError(f"{manifest_path}: not a valid task manifest (split {name!r} lists no features)")
    sizes = {path: s.bytes for path, s in zip(files, info.shards, strict=True)}
    return SplitInfo(name=name, files=files, records=info.records, labelled=info.labelled,
                     mode=str(info.mode if info.mode is not None else "predict"), features=dict(info.features),
                     side=side, sizes=sizes, root=directory, manifest_version=version)


def check_split_files(dataset: TaskDataset, splits: list[SplitInfo | None]) -> None:
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


# What tf.data raises on a record it cannot read (a failed CRC, a truncated file) or parse.
TF_DATA_ERRORS = (tf.errors.DataLossError, tf.errors.InvalidArgumentError)


def check_unchanged(split: SplitInfo) -> None:
    """DataError unless the split's dataset is still the one opened (`Source.check_unchanged`)."""
    try:
        check_manifest_unchanged(split.root, split.manifest_version, GFILE_FS)
    except LoadError as exc:
        raise data_error(exc) from exc


def _checked(ds: tf.data.Dataset, split: SplitInfo) -> tf.data.Dataset:
    """``ds`` whose every batch, once its records are read, passes only while the dataset is still
    the one opened: a replacement stops the reading (as an InvalidArgumentError, which
    `split_data_error` names) before any of its records reaches a figure or a prediction."""
    if split.manifest_version is None:
        return ds

    def unchanged() -> bool:
        check_manifest_unchanged(split.root, split.manifest_version, GFILE_FS)  # a ValueError: tf's InvalidArgument
        return True

    def after_check(batch: dict[str, tf.Tensor]) -> dict[str, tf.Tensor]:
        done = tf.py_function(unchanged, [], tf.bool)
        with tf.control_dependencies([done]):
            return {k: tf.identity(v) for k, v in batch.items()}

    return ds.map(after_check, deterministic=True)


def read_split(split: SplitInfo, batch_size: int) -> Iterator[dict[str, np.ndarray]]:
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


def split_data_error(split: SplitInfo, exc: Exception) -> DataError:
    """The DataError for a tf.data failure while reading `split`: the dataset replaced under it, or
    the shard and record at fault, found as pre-training finds them
    (bert_datagen.trainer.pretrain.data.find_bad_record)."""
    try:
        check_unchanged(split)
    except DataError as replaced:
        return replaced
    where = find_bad_record(split.files, 0, 0, split.features)
    if where is not None:
        return DataError(f"corrupt input: {where}")
    # TensorFlow's message goes on with the graph's stack trace: its first line is the reason.
    reason = str(getattr(exc, "message", exc)).strip().splitlines()[0]
    return DataError(f"{', '.join(split.files)}: reading split {split.name!r} failed: {type(exc).__name__}: {reason}")


def read_side_file(split: SplitInfo, name: str, source: str) -> list[dict]:
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


def parse_batch(serialized: tf.Tensor, features: dict[str, tuple[str, int]]) -> dict[str, tf.Tensor]:
    spec = {name: tf.io.FixedLenFeature([length], tf.int64 if dtype == "int64" else tf.float32)
            for name, (dtype, length) in features.items()}
    parsed = tf.io.parse_example(serialized, spec)
    return {k: tf.cast(v, tf.int32) if v.dtype == tf.int64 else v for k, v in parsed.items()}


def _options() -> tf.data.Options:
    options = tf.data.Options()
    options.deterministic = True
    return options


def train_batches(split: SplitInfo, batch_size: int, seed: int, epoch: int,
                  group_by_length: bool = False) -> tf.data.Dataset:
    """One epoch of full batches, shuffled over the whole split by (seed, epoch).

    `group_by_length`: the same shuffle, then each window of `GROUP_WINDOW` batches is sorted by
    length, cut into batches, and those batches are put in an order drawn from (seed, epoch,
    window); each batch is cut to its bucket length (`bucket_length`). Still floor(records /
    batch_size) batches, a pure function of (seed, epoch)."""
    records = gfs.record_dataset(split.files)
    shuffle_seed = (seed * 1000003 + epoch) & 0x7FFFFFFF
    records = records.shuffle(max(split.records, 1), seed=shuffle_seed, reshuffle_each_iteration=False)
    if group_by_length:
        return _grouped(records, split, batch_size, shuffle_seed)
    ds = records.batch(batch_size, drop_remainder=True)
    ds = ds.map(lambda s: parse_batch(s, split.features), num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    return _checked(ds, split).with_options(_options()).prefetch(tf.data.AUTOTUNE)


def bucket_length(longest: tf.Tensor, max_seq_length: int) -> tf.Tensor:
    """The shortest bucket length that holds `longest` tokens."""
    buckets = tf.constant(bucket_lengths(max_seq_length), tf.int32)
    return tf.gather(buckets, tf.reduce_sum(tf.cast(buckets < tf.cast(longest, tf.int32), tf.int32)))


def trim_batch(batch: dict[str, tf.Tensor], max_seq_length: int) -> dict[str, tf.Tensor]:
    """The batch cut to its bucket length: every per-token feature (those of `max_seq_length`
    values) loses padding columns that no example of the batch uses."""
    length = bucket_length(tf.reduce_max(tf.reduce_sum(batch["input_mask"], axis=1)), max_seq_length)
    return {k: v[:, :length] if v.shape.rank == 2 and v.shape[1] == max_seq_length else v for k, v in batch.items()}


def _grouped(records: tf.data.Dataset, split: SplitInfo, batch_size: int, seed: int) -> tf.data.Dataset:
    seq_len = split.features["input_ids"][1]

    def sort_window(index, serialized):
        full = tf.shape(serialized)[0] // batch_size * batch_size  # the window's own leftovers go
        parsed = parse_batch(serialized[:full], split.features)
        order = tf.argsort(tf.reduce_sum(parsed["input_mask"], axis=1), stable=True)
        draw = tf.random.stateless_uniform([full // batch_size], seed=tf.stack([tf.constant(seed, tf.int64), index]),
                                           alg="philox")
        batches = tf.reshape(tf.gather(order, tf.argsort(draw)[:, None] * batch_size + tf.range(batch_size)), [-1])
        return {k: tf.reshape(tf.gather(v, batches), [-1, batch_size] + v.shape[1:].as_list())
                for k, v in parsed.items()}

    ds = records.batch(batch_size * GROUP_WINDOW).enumerate().map(sort_window, num_parallel_calls=tf.data.AUTOTUNE,
                                                                     deterministic=True)
    ds = ds.unbatch().map(lambda b: trim_batch(b, seq_len), num_parallel_calls=tf.data.AUTOTUNE,
                               deterministic=True)
    return _checked(ds, split).with_options(_options()).prefetch(tf.data.AUTOTUNE)


def ordered_batches(split: SplitInfo, batch_size: int) -> tf.data.Dataset:
    """The split in record order, once; the last batch may be short."""
    records = gfs.record_dataset(split.files)
    ds = records.batch(batch_size).map(lambda s: parse_batch(s, split.features),
                                       num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    return _checked(ds, split).with_options(_options()).prefetch(tf.data.AUTOTUNE)
