"""Dataset discovery: what a dataset directory (or a glob of TFRecords without a manifest) holds.

One implementation for the data tools and the trainer: shards in split order with their manifest
entries, the vocab, and the record shape. Datasets without a manifest (made by the original tool)
work too: the caller gives the record shape (and, when it needs one, the vocab); the checks that need
a manifest (checksums, counts) are then the caller's to skip.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from bert_datagen.contract.features import DEFAULT_KIND, PRETRAINING, TASK, word_segmented
from bert_datagen.contract.fs import FileSystem, is_remote
from bert_datagen.contract.manifest import (
    MANIFEST_NAME,
    IndexInfo,
    Manifest,
    ManifestError,
    ShardInfo,
    manifest_identity,
)
from bert_datagen.contract.vocab_io import load_vocab
from bert_datagen.datagen.config import masking_unit_of
from bert_datagen.datagen.record_rules import RecordShape
from bert_datagen.vocab.vocab_file import Vocab, VocabError


class DatasetError(ValueError):
    """A dataset that cannot be opened (bad target, missing options, unreadable vocab); says why."""


@dataclass(frozen=True)
class ShardRef:
    split: str
    name: str  # as the manifest lists it (relative), or the file path for data without a manifest
    path: str  # full path to open
    expected: ShardInfo | None = None  # the manifest's entry

    @property
    def index(self) -> tuple[str, IndexInfo] | None:
        """(full path, manifest entry) of the shard's record index (datagen/tfrecord_index.py);
        None for a dataset written before indexes (readers then walk the shard's headers)."""
        entry = self.expected.index if self.expected is not None else None
        path = self.beside(entry.path) if entry is not None else None
        return (path, entry) if path is not None else None

    def beside(self, rel: str) -> str | None:
        """The full path of ``rel``, a path relative to the dataset as the manifest lists it (a
        shard's index, block digests, lengths), beside this shard; None for a shard opened without
        its dataset's layout."""
        if not self.path.endswith(self.name):
            return None
        return self.path[:len(self.path) - len(self.name)] + rel


@dataclass
class Dataset:
    root: str | None  # None for a glob of files without a manifest
    manifest: Manifest | None
    shards: list[ShardRef]
    vocab: Vocab | None  # None only when the caller asked for no vocab (need_vocab=False)
    shape: RecordShape | None  # pre-training record shape; None when vocab is None and for task datasets
    max_seq_length: int
    max_predictions: int
    # The manifest's "kind" (contract.features: PRETRAINING or TASK), validated when it was parsed;
    # TFRecords without a manifest are pre-training data of the original tool. The one place the
    # tools and the trainer learn what kind of data they hold.
    kind: str = DEFAULT_KIND

    @property
    def splits(self) -> list[str]:
        return list(dict.fromkeys(s.split for s in self.shards))

    def split_shards(self, split: str) -> list[ShardRef]:
        return [s for s in self.shards if s.split == split]


def read_vocab(path: str, fs: FileSystem) -> Vocab:
    """The vocab through bert_datagen.vocab.vocab_file (same parsing and validation as the generator uses)."""
    if not fs.exists(path):
        raise DatasetError(f"{path}: vocab file not found")
    try:
        return load_vocab(path, fs)
    except VocabError as e:
        raise DatasetError(str(e)) from e


def record_shape(vocab: Vocab, max_seq_length: int, max_predictions: int, config: dict | None = None
                 ) -> RecordShape:
    """What a record must look like, with this vocab's special ids and the config's masking settings."""
    config = config or {}
    prob = config.get("masked_lm_prob")
    return RecordShape(max_seq_length, max_predictions, len(vocab), vocab.cls_id, vocab.sep_id,
                       vocab.mask_id, vocab.pad_id, vocab.unk_id,
                       float(prob) if prob is not None else None,
                       masking_unit_of(str(config.get("masking_unit", "token")), bool(config.get("whole_word_mask", False))),
                       str(config.get("objective", "nsp")), str(config.get("masking", "static")),
                       int(config.get("max_sequences_per_row", 0)) if config.get("packing") else 0,
                       word_segmented(config))


def is_dataset_dir(path: str, fs: FileSystem) -> bool:
    """A local directory, or a remote prefix holding a manifest (object stores have no directories)."""
    if is_remote(path):
        return fs.exists(fs.join(path, MANIFEST_NAME))
    return os.path.isdir(path)


def open_dataset(
    target: str,
    fs: FileSystem,
    *,
    max_seq_length: int | None = None,
    max_predictions_per_seq: int | None = None,
    vocab_path: str | None = None,
    need_vocab: bool = True,
    original_data: bool = True,
) -> Dataset:
    """A dataset directory with a manifest, or (given the record shape and vocab) TFRecords without one.

    Without a manifest, ``target`` is a file glob, or a directory whose files are all shards.
    ``need_vocab=False`` (the trainer) neither reads the vocab nor asks for one. ``original_data=False``
    (a caller without the options that describe the original tool's data: the loaders, `bert-datagen batches`)
    opens only datasets with a manifest, and its refusal advises no options.
    """
    original_opts = (max_seq_length, max_predictions_per_seq, vocab_path if need_vocab else 0)
    if is_remote(target) and not any(c in target for c in "*?[") and not is_dataset_dir(target, fs) \
            and not fs.exists(target):
        getattr(fs, "check_container", lambda _: None)(target)  # a missing bucket, named as such
        raise DatasetError(f"{target}: nothing at this path (no {MANIFEST_NAME}, no object)")
    has_manifest = fs.exists(fs.join(target, MANIFEST_NAME)) if is_dataset_dir(target, fs) else False
    if has_manifest:
        if any(v is not None for v in original_opts[:2]):
            raise DatasetError(
                f"{target} has a manifest; --max-seq-length/--max-predictions-per-seq are only for "
                "data without one"
            )
        manifest = Manifest.load(target, fs)
        kind = manifest.kind
        task = kind == TASK
        # A task dataset has no masked-LM features: its record rules are bert_datagen.datagen.tasks.rules'.
        seq, preds = (manifest.max_seq_length, 0) if task else manifest.shape
        shards = [ShardRef(split, s.path, fs.join(target, *s.path.split("/")), s)
                  for split in manifest.split_names for s in manifest.splits[split].shards]
        if not need_vocab:
            return Dataset(target, manifest, shards, None, None, seq, preds, kind)
        vocab = read_vocab(vocab_path or fs.join(target, manifest.vocab.path), fs)
        shape = None if task else record_shape(vocab, seq, preds, manifest.config)
        return Dataset(target, manifest, shards, vocab, shape, seq, preds, kind)
    if not original_data:
        if is_dataset_dir(target, fs):
            raise ManifestError(f"{fs.join(target, MANIFEST_NAME)}: no manifest: not a bert-datagen dataset "
                                "(or an incomplete one: an interrupted run)")
        what = "not a directory" if fs.exists(target) else "no such directory"
        raise DatasetError(f"{target}: {what}; a bert-datagen dataset is a directory with a {MANIFEST_NAME}")
    options = "--max-seq-length, --max-predictions-per-seq" + (" and --vocab" if need_vocab else "")
    if any(v is None for v in original_opts):
        if is_dataset_dir(target, fs):
            raise ManifestError(
                f"{fs.join(target, MANIFEST_NAME)}: no manifest: not a complete bert-datagen dataset. "
                f"For data made by the original tool pass {options}"
            )
        raise DatasetError(f"{target}: not a dataset directory; for TFRecords without a manifest pass {options}")
    pattern = fs.join(target, "*") if is_dataset_dir(target, fs) else target
    files = fs.glob(pattern)
    if not files:
        raise DatasetError(f"{pattern}: no input file matches this pattern")
    vocab = read_vocab(vocab_path, fs) if need_vocab else None  # type: ignore[arg-type]
    shards = [ShardRef("files", f, f) for f in files if not _is_hidden(f)]
    if not shards:
        raise DatasetError(f"{target}: no record files")
    seq, preds = int(max_seq_length), int(max_predictions_per_seq)  # type: ignore[arg-type]
    shape = record_shape(vocab, seq, preds) if vocab is not None else None
    return Dataset(None, None, shards, vocab, shape, seq, preds, PRETRAINING)


def _is_hidden(path: str) -> bool:
    return path.rstrip("/").rsplit("/", 1)[-1].startswith(".")


__all__ = ["Dataset", "DatasetError", "ShardRef", "is_dataset_dir", "manifest_identity", "open_dataset",
           "read_vocab", "record_shape"]
