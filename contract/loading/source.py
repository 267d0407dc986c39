"""What a loader reads: a dataset split's shards, their record counts, fingerprint and feature spec,
and any range of a shard's records, CRC-checked and decoded into NumPy.

A shard's records are found through an index of record offsets, built the first time the shard is
touched by walking its length headers (12 bytes per record, each header CRC checked); a range of
records is then one sequential read whose frames and CRCs `bert_datagen.datagen.tfrecord` checks
against that index.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from bert_datagen.contract.dataset import DatasetError, ShardRef, manifest_identity, open_dataset
from bert_datagen.contract.features import TASK
from bert_datagen.contract.fs import DEFAULT_FS, FileSystem
from bert_datagen.contract.manifest import ManifestError, manifest_kind
from bert_datagen.contract.vocab_io import load_vocab
from bert_datagen.datagen.config import DatagenConfig
from bert_datagen.datagen.example_codec import FeatureSpec, decode_raw
from bert_datagen.datagen.records import INSTANCE_KEY
from bert_datagen.datagen.tfrecord import RawBatch, RecordError, check_frames_at, record_offsets
from bert_datagen.vocab.vocab_file import Vocab, VocabError


class LoadError(ValueError):
    """A dataset a loader cannot read (missing or corrupt shard, unusable manifest); names the file."""


def dataset_fingerprint(manifest: dict) -> str:
    """What the dataset is, whatever its path: the fingerprint `bert-train` records for a run."""
    return manifest_identity(manifest)["fingerprint"]


def masking_config(manifest: dict) -> DatagenConfig:
    """The dataset's masking options, from its manifest config (as the trainer's dynamic input reads them)."""
    return DatagenConfig.from_recorded(manifest.get("config", {}))


_DECODE_RECORDS = 4096  # per decode call: larger ones run slower, their arrays outgrowing the caches


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
    _offsets: dict[int, np.ndarray] = field(default_factory=dict, repr=False)

    @property
    def has_instance_key(self) -> bool:
        return INSTANCE_KEY in self.spec

    def read(self, shard: int, start: int, stop: int) -> dict[str, np.ndarray]:
        """Records [start, stop) of a shard, decoded (rows in shard order); LoadError names the shard."""
        return self.read_ranges([(shard, start, stop)])

    def read_ranges(self, ranges: list[tuple[int, int, int]], model_inputs: bool = False,
                    order: np.ndarray | None = None) -> dict[str, np.ndarray]:
        """The records of several ``(shard, start, stop)`` ranges, rows in the ranges' order (or row i
        is their record ``order[i]``): one read per range (a shard opened once), then every frame and
        CRC checked and all records decoded (a decode call has a fixed cost, so a window's chunks are
        decoded together); LoadError names the shard and record. ``model_inputs``: integer features
        as int32, as the Keras trainer parses them (a record's 64-bit identity stays int64)."""
        parts = self.read_pieces(ranges, model_inputs, order)
        return parts[0] if len(parts) == 1 else {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}

    def read_pieces(self, ranges: list[tuple[int, int, int]], model_inputs: bool = False,
                    order: np.ndarray | None = None) -> list[dict[str, np.ndarray]]:
        """``read_ranges`` as consecutive pieces of at most _DECODE_RECORDS rows, not joined (a
        reader that can use the pieces as they are saves copying them all once more)."""
        spans = np.asarray(ranges, np.int64).reshape(-1, 3)
        shard, start, stop = spans.T
        sizes = stop - start
        firsts = np.concatenate([[0], np.cumsum(sizes)])
        count = int(firsts[-1])
        # Every record's file offset and the next one's, through one table of the shards' offsets.
        used = np.unique(shard).tolist()
        tables = [self.offsets(s) for s in used]
        table = np.concatenate(tables) if tables else np.zeros(0, np.int64)
        base = np.zeros(len(self.shards), np.int64)
        base[used] = np.concatenate([[0], np.cumsum([len(t) for t in tables])[:-1]]).astype(np.int64)
        row = np.repeat(base[shard] + start - firsts[:-1], sizes) + np.arange(count)
        begin, end = table[base[shard] + start], table[base[shard] + stop]  # each range's bytes
        blob_at = np.concatenate([[0], np.cumsum(end - begin)])
        heads = table[row] - np.repeat(begin - blob_at[:-1], sizes)
        lengths = table[row + 1] - table[row] - 16
        blob = self._ranges_bytes(shard.tolist(), start.tolist(), begin.tolist(), end.tolist())
        problems = check_frames_at(blob, heads, lengths)
        if problems:
            at, record = self._locate(ranges, firsts, problems[0][0])
            raise LoadError(f"{self.shards[at].path}: corrupt shard: record {record} at byte "
                            f"{int(self.offsets(at)[record])}: {problems[0][1]}")
        narrow = [k for k, (d, _) in self.spec.items() if d == "int64" and k != INSTANCE_KEY] if model_inputs else ()
        rows = np.arange(count) if order is None else np.asarray(order, np.int64)
        parts = []
        for a in range(0, max(count, 1), _DECODE_RECORDS):  # in pieces whose work stays in the caches
            part = rows[a:a + _DECODE_RECORDS]
            batch, problems = decode_raw(RawBatch(part, blob, heads[part] + 12, lengths[part]), self.spec, narrow)
            if problems:
                at, record = self._locate(ranges, firsts, problems[0][0])
                raise LoadError(f"{self.shards[at].path}: record {record}: {problems[0][1]}")
            parts.append(batch.features)
        return parts

    def _ranges_bytes(self, shards: list[int], starts: list[int], begins: list[int], ends: list[int]) -> bytes:
        """The byte ranges laid end to end, in the order given; each shard file opened once."""
        datas: list[bytes] = [b""] * len(shards)
        of_shard: dict[int, list[int]] = {}
        for i, shard in enumerate(shards):
            of_shard.setdefault(shard, []).append(i)
        for shard, indices in of_shard.items():
            ref = self.shards[shard]
            try:
                # One call per shard: a bucket serves the ranges as concurrent ranged requests.
                parts = self.fs.read_ranges(ref.path, [(begins[i], ends[i]) for i in indices])
            except OSError as e:
                raise LoadError(f"{ref.path}: cannot read shard: {e}") from e
            for i, data in zip(indices, parts, strict=True):
                datas[i] = data
        return b"".join(datas)

    @staticmethod
    def _locate(ranges: list[tuple[int, int, int]], firsts: np.ndarray, index: int) -> tuple[int, int]:
        """(shard, record) of the ``index``-th record of the ranges laid end to end."""
        r = int(np.searchsorted(firsts, index, side="right")) - 1
        shard, start, _ = ranges[r]
        return shard, start + index - int(firsts[r])

    def offsets(self, shard: int) -> np.ndarray:
        """Byte offset of every record of the shard, and its size last (count + 1 entries)."""
        got = self._offsets.get(shard)
        if got is None:
            got = self._offsets[shard] = _index_shard(self.shards[shard], self.counts[shard], self.fs)
        return got


def _index_shard(ref: ShardRef, count: int, fs: FileSystem) -> np.ndarray:
    size = int(ref.expected["bytes"]) if ref.expected else None
    try:
        with fs.open_read(ref.path) as f:
            offsets = record_offsets(f.read, count, ref.path)
    except RecordError as e:
        raise LoadError(str(e).replace(f"{ref.path}: ", f"{ref.path}: corrupt shard: ", 1)) from e
    except FileNotFoundError as e:
        raise LoadError(f"{ref.path}: shard listed in the manifest is missing") from e
    except OSError as e:
        raise LoadError(f"{ref.path}: cannot read shard: {e}") from e
    if size is not None and int(offsets[-1]) != size:
        raise LoadError(f"{ref.path}: corrupt shard: {count} records end at byte {int(offsets[-1])}, the manifest "
                        f"says {size} bytes (bert-datagen verify tells more)")
    return offsets


def open_source(target: str, split: str = "train", fs: FileSystem = DEFAULT_FS) -> Source:
    """A split of a bert-datagen dataset (pre-training or task) for the loaders."""
    try:
        ds = open_dataset(target, fs, need_vocab=False, legacy=False)
    except (DatasetError, ManifestError) as e:
        raise LoadError(str(e)) from e
    manifest = ds.manifest
    if manifest is None:
        raise LoadError(f"{target}: the loaders need a dataset with a manifest")
    kind = manifest_kind(manifest)
    refs = ds.split_shards(split)
    if not refs:
        raise LoadError(f"{target}: no shards in split {split!r} (splits: {', '.join(ds.splits)})")
    config = manifest.get("config", {})
    # The manifest's own feature list, whatever the kind: packed rows carry sequence and position ids
    # and per-sequence slots, task splits their own fields (validate_manifest checked it holds what
    # the kind requires).
    features = manifest["splits"][split]["features"] if kind == TASK else manifest["features"]
    spec = {k: (str(v[0]), int(v[1])) for k, v in features.items()}
    dynamic = kind != TASK and config.get("masking", "static") == "dynamic"
    vocab = mask_config = None
    if dynamic:
        try:
            vocab = load_vocab(fs.join(target, manifest["vocab"]["path"]), fs)
            mask_config = masking_config(manifest)
        except (VocabError, TypeError, ValueError) as e:
            raise LoadError(f"{target}: cannot set up dynamic masking: {e}") from e
    counts = tuple(int(r.expected["records"]) for r in refs)  # type: ignore[index]
    return Source(target, split, refs, counts, dataset_fingerprint(manifest), spec, kind, dynamic, fs,
                  vocab, mask_config)


def files_source(root: str, files: list[str], counts: list[int], fingerprint: str, spec: FeatureSpec, kind: str,
                 fs: FileSystem = DEFAULT_FS, vocab: Vocab | None = None,
                 mask_config: DatagenConfig | None = None) -> Source:
    """A source over a list of shard files with known record counts: a split the caller has
    described itself (the trainer's TFRecord globs of the original tool, which have no manifest).
    ``vocab`` and ``mask_config`` make it dynamic-masking data."""
    refs = [ShardRef(split="train", name=path, path=path) for path in files]
    return Source(root, "train", refs, tuple(int(c) for c in counts), fingerprint, spec, kind,
                  vocab is not None, fs, vocab, mask_config)
