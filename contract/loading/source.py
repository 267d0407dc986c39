"""What a loader reads: a dataset split's shards, their record counts, fingerprint and feature spec,
and any range of a shard's records, CRC-checked and decoded into NumPy.

A shard's records are found through its record index (`bert_datagen.datagen.tfrecord_index`),
which `run` and `task` write beside it and list in the manifest. A source learns a shard's record offsets
as records are asked for (`shard_index.ShardOffsets`: a block of index lines at a time, each
checked against its digest, or the whole index checked against the manifest, or for datasets
written before indexes a walk of the shard's headers). Then a read fetches the bytes of just its
records, as few ranged reads (adjacent spans joined, shards read concurrently), and
`bert_datagen.datagen.tfrecord` checks every frame and CRC at the offset the index gives.

Every read checks, once its bytes are in hand, that the dataset is still the one opened
(`Source.check_unchanged`): a replaced dataset is an error before any of its records is handed out.
"""

from __future__ import annotations

import contextlib
import errno
import os
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np

from bert_datagen.contract.dataset import DatasetError, ShardRef, open_dataset
from bert_datagen.contract.features import TASK
from bert_datagen.contract.fs import DEFAULT_FS, FileSystem, is_remote
from bert_datagen.contract.loading.shard_index import ShardIndexError, ShardOffsets
from bert_datagen.contract.manifest import MANIFEST_NAME, Manifest, ManifestError
from bert_datagen.contract.vocab_io import load_vocab
from bert_datagen.datagen.config import DatagenConfig
from bert_datagen.datagen.example_codec import FeatureSpec, decode_raw
from bert_datagen.datagen.record_layout import INSTANCE_KEY
from bert_datagen.datagen.tfrecord import RawBatch, check_frames_at
from bert_datagen.datagen.tfrecord_index import (
    FRAME_OVERHEAD,
)
from bert_datagen.vocab.vocab_file import Vocab, VocabError


class LoadError(ValueError):
    """A dataset a loader cannot read (missing or corrupt shard, unusable manifest); names the file."""


class DatasetReplaced(LoadError):
    """The dataset was replaced (or removed) since the loader opened it: records read from now on
    could be of another dataset. ``manifest`` is the manifest's path, ``what`` "replaced" or "removed"."""

    def __init__(self, manifest: str, what: str) -> None:
        self.manifest, self.what = manifest, what
        super().__init__(f"{manifest}: the dataset was {what} while this loader read it (a run --overwrite?); "
                         "its batches would mix two datasets: open it again to read the new one")


def manifest_version(root: str, fs: FileSystem) -> str | None:
    """What the dataset's manifest is now (`PathFS.version`), to compare with later; None where the
    filesystem cannot tell or the manifest cannot be looked at (then opening the dataset fails)."""
    if not hasattr(fs, "version"):
        return None
    with contextlib.suppress(OSError):
        return fs.version(fs.join(root, MANIFEST_NAME))
    return None


def check_unchanged(root: str, version: str | None, fs: FileSystem) -> None:
    """DatasetReplaced unless the manifest of the dataset at ``root`` is still ``version`` (nothing
    to compare with when None). A replacement retires the old manifest first and places the new one
    last, so bytes read before a check that passes are the dataset's that was opened."""
    if version is None:
        return
    path = fs.join(root, MANIFEST_NAME)
    try:
        now = fs.version(path)  # type: ignore[attr-defined]
    except OSError as e:  # a bucket's missing object is an OSError of ENOENT, not FileNotFoundError
        if e.errno != errno.ENOENT:
            raise LoadError(f"{path}: cannot check that the dataset is unchanged: {e}") from e
        now = "gone"
    if now != version:
        raise DatasetReplaced(path, "removed" if now == "gone" else "replaced")


def masking_config(manifest: Manifest) -> DatagenConfig:
    """The dataset's masking options, from its manifest config (as the trainer's dynamic input reads them)."""
    return DatagenConfig.from_recorded(manifest.config)


_DECODE_RECORDS = 4096  # per decode call: larger ones run slower, their arrays outgrowing the caches
# Spans of a file at most this far apart are read as one: a request costs more than this many bytes
# (object stores bill and wait per request), and the records between are few (a record is ~1 KB).
_JOIN_GAP = 16 << 10
_CONCURRENT_FILES = 16  # files of a window read at once (a rank's window spans up to batch_size / N shards)


@dataclass
class Fetched:
    """The bytes of record ranges laid end to end, every record's frame located: what `Source.fetch`
    reads and `Source.decode` checks and decodes."""

    ranges: np.ndarray  # (shard, start, stop) of each range, a row each
    blob: bytes
    heads: np.ndarray  # each record's frame in ``blob``, records in the ranges' order
    lengths: np.ndarray  # each record's payload length
    at: np.ndarray  # each record's byte offset in its shard (for messages)


@dataclass
class Source:
    """One split of a dataset with a manifest, ready to be read a record range at a time."""

    root: str
    split: str
    shards: list[ShardRef]
    counts: tuple[int, ...]
    fingerprint: str
    spec: FeatureSpec
    kind: str
    dynamic: bool
    fs: FileSystem = DEFAULT_FS
    vocab: Vocab | None = None
    mask_config: DatagenConfig | None = None
    # What the manifest was when the source was opened (`PathFS.version`: size and mtime of a local
    # file, ETag or generation of an object); None for shard lists without a manifest.
    manifest_version: str | None = None
    _offsets: dict[int, ShardOffsets] = field(default_factory=dict, repr=False)
    # A loader's read-ahead thread and its caller may both need a shard's offsets first: its index
    # is then read once, not by each. (The process that made the lock: a forked DataLoader worker
    # makes its own, as the parent's may have been held by another thread at the fork.)
    _offsets_lock: tuple[int, threading.Lock] = field(
        default_factory=lambda: (os.getpid(), threading.Lock()), repr=False, compare=False)

    def check_unchanged(self) -> None:
        """DatasetReplaced unless the dataset is still the one opened: a `run --overwrite` (or
        anything else) that replaced its manifest since makes every record read after it suspect,
        so a loader stops rather than mix records of two datasets. Every read calls it once its
        bytes are in hand (`check`); a read that failed calls it first, to say what happened."""
        check_unchanged(self.root, self.manifest_version, self.fs)

    @contextlib.contextmanager
    def explained(self) -> Iterator[None]:
        """A LoadError raised within, reported as `DatasetReplaced` when the dataset was replaced
        meanwhile: a file that changed under a read reads as missing or corrupt, and the replacement
        is the error to report."""
        try:
            yield
        except LoadError as e:
            if not isinstance(e, DatasetReplaced):
                self.check_unchanged()
            raise

    @property
    def has_instance_key(self) -> bool:
        return INSTANCE_KEY in self.spec

    def read(self, shard: int, start: int, stop: int) -> dict[str, np.ndarray]:
        """Records [start, stop) of a shard, decoded (rows in shard order); LoadError names the shard."""
        return self.read_ranges([(shard, start, stop)])

    def read_ranges(self, ranges: list[tuple[int, int, int]] | np.ndarray, model_inputs: bool = False,
                    order: np.ndarray | None = None) -> dict[str, np.ndarray]:
        """The records of several ``(shard, start, stop)`` ranges, rows in the ranges' order (or row i
        is their record ``order[i]``): one read per range (a shard opened once), then every frame and
        CRC checked and all records decoded (a decode call has a fixed cost, so a window's chunks are
        decoded together); LoadError names the shard and record. ``model_inputs``: integer features
        as int32, as the Keras trainer parses them (a record's 64-bit identity stays int64)."""
        parts = self.read_pieces(ranges, model_inputs, order)
        return parts[0] if len(parts) == 1 else {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}

    def read_pieces(self, ranges: list[tuple[int, int, int]] | np.ndarray, model_inputs: bool = False,
                    order: np.ndarray | None = None, piece: int | None = None) -> list[dict[str, np.ndarray]]:
        """``read_ranges`` as consecutive pieces of at most ``piece`` rows (default _DECODE_RECORDS),
        not joined (a reader that can use the pieces as they are saves copying them all once more)."""
        return self.decode(self.fetch(ranges), model_inputs, order, piece)

    def fetch(self, ranges: list[tuple[int, int, int]] | np.ndarray) -> Fetched:
        """The bytes of several ``(shard, start, stop)`` record ranges, every record's frame located:
        the only I/O of a read (a loader runs it ahead, on another thread). A shard's offsets come
        from its whole index, read and checked the first time the shard is read (`offsets`); then
        just these records' bytes are fetched, adjacent ranges of a shard joined into one read, the
        shards read concurrently. Records are placed with array operations, not a step per range:
        fine-tuning's order reads ranges of one record."""
        with self.explained():
            return self._fetch(np.asarray(ranges, np.int64).reshape(-1, 3))

    def _fetch(self, table: np.ndarray) -> Fetched:
        shard, sizes = table[:, 0], table[:, 2] - table[:, 1]
        firsts = np.cumsum(sizes) - sizes
        rec_shard = np.repeat(shard, sizes)  # every record of the ranges, in the ranges' order
        rec_index = np.arange(len(rec_shard), dtype=np.int64) + np.repeat(table[:, 1] - firsts, sizes)
        at, frames = np.zeros(len(rec_shard), np.int64), np.zeros(len(rec_shard), np.int64)
        shards = np.unique(shard[sizes > 0]).tolist()
        mine = {s: np.flatnonzero(rec_shard == s) for s in shards}
        self._load_offsets({s: rec_index[mine[s]] for s in shards})
        for s in shards:
            records, offsets = rec_index[mine[s]], self._offsets[s].offsets
            at[mine[s]] = offsets[records]
            frames[mine[s]] = offsets[records + 1] - at[mine[s]]
        full = sizes > 0
        last = firsts + sizes - 1
        spans = {s: np.stack([at[firsts[sel]], at[last[sel]] + frames[last[sel]]], axis=1)
                 for s in shards for sel in [full & (shard == s)]}
        heads = np.zeros(len(at), np.int64)
        datas: list[bytes] = []
        base = 0
        for s, (begins, parts) in self._read_files(spans).items():
            sizes_read = np.array([len(p) for p in parts], np.int64)
            heads[mine[s]] = _placed(begins, base + np.cumsum(sizes_read) - sizes_read, at[mine[s]])
            datas.extend(parts)
            base += int(sizes_read.sum())
        blob = datas[0] if len(datas) == 1 else b"".join(datas)
        return Fetched(table, blob, heads, frames - FRAME_OVERHEAD, at)

    def decode(self, fetched: Fetched, model_inputs: bool = False, order: np.ndarray | None = None,
               piece: int | None = None) -> list[dict[str, np.ndarray]]:
        """Fetched records: the dataset checked unchanged and every frame and CRC checked, then
        decoded (a decode call has a fixed cost, so a window's chunks are decoded together) in
        pieces of at most ``piece`` rows (default _DECODE_RECORDS); LoadError names the shard and
        record."""
        self.check(fetched)
        rows = np.arange(len(fetched.heads)) if order is None else np.asarray(order, np.int64)
        step = piece or _DECODE_RECORDS
        return [self.decode_rows(fetched, rows[a:a + step], model_inputs) for a in range(0, max(len(rows), 1), step)]

    def check(self, fetched: Fetched) -> None:
        """What fetched records must pass before any is decoded: the dataset is still the one opened
        (the bytes are in hand, so they are of that dataset), and every frame and CRC at the offset
        the index gives holds; LoadError names the shard and record."""
        self.check_unchanged()
        problems = check_frames_at(fetched.blob, fetched.heads, fetched.lengths)
        if problems:
            at, record = self._locate(fetched.ranges, problems[0][0])
            raise LoadError(f"{self.shards[at].path}: corrupt shard: record {record} at byte "
                            f"{int(fetched.at[problems[0][0]])}: {problems[0][1]}")

    def decode_rows(self, fetched: Fetched, rows: np.ndarray, model_inputs: bool = False) -> dict[str, np.ndarray]:
        """Fetched records ``rows`` (indices into the ranges' records laid end to end), decoded in
        that order, their frames `check`-ed before; LoadError names the shard and record.
        ``model_inputs``: integer features as int32, as the Keras trainer parses them (a record's
        64-bit identity stays int64)."""
        narrow = [k for k, (d, _) in self.spec.items() if d == "int64" and k != INSTANCE_KEY] if model_inputs else ()
        batch, problems = decode_raw(RawBatch(rows, fetched.blob, fetched.heads[rows] + 12, fetched.lengths[rows]),
                                     self.spec, narrow)
        if problems:
            at, record = self._locate(fetched.ranges, problems[0][0])
            with self.explained():
                raise LoadError(f"{self.shards[at].path}: record {record}: {problems[0][1]}")
        return batch.features

    def _load_offsets(self, records: dict[int, np.ndarray]) -> None:
        """Learn the offsets of these records of each shard where they are not known yet
        (`ShardOffsets.learn`): the shards' index reads run concurrently when they are remote, as a
        window's shards are."""
        if self._offsets_lock[0] != os.getpid():  # a forked child has one thread: safe to replace
            self._offsets_lock = (os.getpid(), threading.Lock())
        with self._offsets_lock[1]:
            for s in records:
                if s not in self._offsets:
                    self._offsets[s] = ShardOffsets(self.shards[s], self.counts[s], self.fs)
            todo = [s for s, r in records.items() if self._offsets[s].missing(r)]
            try:
                if len(todo) > 1 and any(is_remote(self.shards[s].path) for s in todo):
                    with ThreadPoolExecutor(min(len(todo), _CONCURRENT_FILES)) as pool:
                        list(pool.map(lambda s: self._offsets[s].learn(records[s]), todo))
                else:
                    for s in todo:
                        self._offsets[s].learn(records[s])
            except ShardIndexError as e:
                raise LoadError(str(e)) from e

    def _read_files(self, wanted: dict[int, np.ndarray]) -> dict[int, tuple[np.ndarray, list[bytes]]]:
        """The bytes of each shard's ``[begin, end)`` spans as the reads `coalesce` makes of them:
        (their begins, their bytes) per shard; the files are read concurrently when they are remote."""
        reads = {s: coalesce(spans, _JOIN_GAP) for s, spans in wanted.items() if len(spans)}

        def read(shard: int) -> list[bytes]:
            path = self.shards[shard].path
            try:
                return self.fs.read_ranges(path, reads[shard])
            except FileNotFoundError as e:
                raise LoadError(f"{path}: shard listed in the manifest is missing") from e
            except OSError as e:
                raise LoadError(f"{path}: cannot read shard: {e}") from e

        remote = [s for s in reads if is_remote(self.shards[s].path)]
        if len(remote) > 1:
            with ThreadPoolExecutor(min(len(reads), _CONCURRENT_FILES)) as pool:
                got = dict(zip(reads, pool.map(read, list(reads)), strict=True))
        else:
            got = {s: read(s) for s in reads}
        return {s: (np.array([b for b, _ in reads[s]], np.int64), got[s]) for s in reads}

    @staticmethod
    def _locate(ranges: np.ndarray, index: int) -> tuple[int, int]:
        """(shard, record) of the ``index``-th record of the ranges laid end to end."""
        firsts = np.concatenate([[0], np.cumsum(ranges[:, 2] - ranges[:, 1])]).astype(np.int64)
        r = int(np.searchsorted(firsts, index, side="right")) - 1
        return int(ranges[r, 0]), int(ranges[r, 1]) + index - int(firsts[r])


def _placed(begins: np.ndarray, bases: np.ndarray, at: np.ndarray) -> np.ndarray:
    """Where each of ``at`` lies in pieces laid end to end, piece j holding what starts at
    ``begins[j]`` (sorted) and laid from ``bases[j]`` on."""
    j = np.searchsorted(begins, at, side="right") - 1
    return bases[j] + at - begins[j]


def coalesce(spans: np.ndarray | list[tuple[int, int]], gap: int, waste: float = 1 / 8) -> list[tuple[int, int]]:
    """Byte spans of one file, sorted, joined where they overlap or touch, or lie at most ``gap``
    bytes apart while the bytes between, all of a read's together, stay at most ``waste`` of the
    bytes it was asked for: a read of a few bytes between costs less than another request, and
    what is read but not used stays under that fraction of what is, whatever the spans."""
    spans = np.asarray(spans, np.int64).reshape(-1, 2)
    if not len(spans):
        return []
    spans = spans[np.argsort(spans[:, 0], kind="stable")]
    # Spans that overlap or touch are one read whatever the rule: joined at once (fine-tuning's
    # order asks for thousands of one-record spans, most of them next to another).
    reach = np.maximum.accumulate(spans[:, 1])
    runs = np.flatnonzero(np.concatenate([[True], spans[1:, 0] > reach[:-1]]))
    begins, ends = spans[runs, 0].tolist(), np.maximum.reduceat(spans[:, 1], runs).tolist()
    out: list[tuple[int, int]] = []
    first, last = begins[0], ends[0]  # the read being built (runs neither overlap nor touch now)
    unused = 0  # bytes of the read between its spans
    for begin, end in zip(begins[1:], ends[1:], strict=True):
        between = begin - last
        if between <= gap and unused + between <= waste * (last - first - unused + end - begin):
            last, unused = end, unused + between
        else:
            out.append((first, last))
            first, last, unused = begin, end, 0
    out.append((first, last))
    return out



def open_source(target: str, split: str = "train", fs: FileSystem = DEFAULT_FS, version: str | None = None) -> Source:
    """A split of a bert-datagen dataset (pre-training or task) for the loaders. ``version``: the
    manifest's `manifest_version` when the caller first read the dataset (a run that opened it at
    its start), so that a dataset replaced since is refused at the first read, not read anew."""
    # Before the manifest is read: a replacement in between then reads as a change, never the reverse.
    version = version if version is not None else manifest_version(target, fs)
    try:
        ds = open_dataset(target, fs, need_vocab=False, original_data=False)
    except (DatasetError, ManifestError) as e:
        raise LoadError(str(e)) from e
    manifest = ds.manifest
    if manifest is None:
        raise LoadError(f"{target}: the loaders need a dataset with a manifest")
    kind = manifest.kind
    refs = ds.split_shards(split)
    if not refs:
        raise LoadError(f"{target}: no shards in split {split!r} (splits: {', '.join(ds.splits)})")
    config = manifest.config
    # The manifest's own feature list, whatever the kind: packed rows carry sequence and position ids
    # and per-sequence slots, task splits their own fields (validate_manifest checked it holds what
    # the kind requires).
    features = manifest.splits[split].features if kind == TASK else manifest.features
    spec = dict(features)  # type: ignore[arg-type]
    dynamic = kind != TASK and config.get("masking", "static") == "dynamic"
    vocab = mask_config = None
    if dynamic:
        try:
            vocab = load_vocab(fs.join(target, manifest.vocab.path), fs)
            mask_config = masking_config(manifest)
        except (VocabError, TypeError, ValueError) as e:
            raise LoadError(f"{target}: cannot set up dynamic masking: {e}") from e
    counts = tuple(r.expected.records for r in refs)  # type: ignore[union-attr]
    return Source(target, split, refs, counts, manifest.fingerprint, spec, kind, dynamic, fs,
                  vocab, mask_config, version)


def files_source(root: str, files: list[str], counts: list[int], fingerprint: str, spec: FeatureSpec, kind: str,
                 fs: FileSystem = DEFAULT_FS, vocab: Vocab | None = None,
                 mask_config: DatagenConfig | None = None, refs: list[ShardRef] | None = None,
                 version: str | None = None) -> Source:
    """A source over a list of shard files with known record counts: a split the caller has
    described itself (the trainer's TFRecord globs of the original tool, which have no manifest;
    the train split of a dataset the trainer opened). ``vocab`` and ``mask_config`` make it
    dynamic-masking data. ``refs``: the files as the manifest lists them (sizes, indexes), in the
    order of ``files``; ``version``: the manifest's `manifest_version` when the caller read it, so
    that a replaced dataset stops the reads (`Source.check_unchanged`)."""
    if refs is None:
        refs = [ShardRef(split="train", name=path, path=path) for path in files]
    elif [r.path for r in refs] != list(files):
        raise ValueError("refs must list the files, in their order")
    return Source(root, "train", refs, tuple(int(c) for c in counts), fingerprint, spec, kind,
                  vocab is not None, fs, vocab, mask_config, version)
