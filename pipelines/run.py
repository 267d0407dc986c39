"""The data-generation pipeline: raw documents -> byte-reproducible sharded TFRecords.

Stages (every element is coarse: a batch of documents, a pool, a pool's pass, a shard):

1. ``ReadFiles``: one element per input file (listed in the driver), or per byte range of a big one
   (``read_tasks``); the DoFn reads, decodes, splits and tokenizes it in batches and tags each
   document train/eval by a seeded hash of its identity.
2. ``IdentityCensus``: per-split counts of distinct document identities and their tokens (a
   singleton side input) fix the number of NotNext pools, ``max(1, n_docs // notnext_pool_size)``,
   and the shard count, from the corpus alone; the same census gives the input fingerprint.
3. ``AssignPools`` + ``GroupByKey``: each document goes to the pool a seeded hash of its ``doc_id``
   picks; a pool is its documents sorted by ``doc_id`` with duplicates collapsed. Neither the file
   layout nor the worker count can change a pool.
4. ``ShardCount``: ``--num-shards``, or the target shard size applied to a deterministic estimate
   of the record bytes from the census's document and token counts (known before any instance exists).
5. ``StagePools`` + ``FanOutPasses`` + ``Reshuffle``: each pool is written once to a staging file
   and one small task per (pool, pass) names it, so even a one-pool corpus keeps several workers
   busy; ``BuildInstances`` plans the pass (``plan_pool_pass``), lays out, masks and encodes its
   records in key order a block at a time (``encode_pool_pass``) and cuts them by shard = ``(key * num_shards) >> 64`` (contiguous ranges of the 64-bit key space)
   into staging fragments: only paths and counts go through the runner's shuffle.
6. ``GroupByKey`` on (split, shard): ``WriteShard`` merges the shard's fragments by key and writes
   it atomically. Empty shards are written too.
7. ``Summarize``: totals, shard checksums and the input fingerprint go to a summary file that the
   driver reads to write ``vocab.txt``, the dataset card and, last, ``manifest.json``.

Every result is a function of the set of documents and the config: groups are sorted before use and
totals are sums, so the runner, the worker count, bundle boundaries and ``PYTHONHASHSEED`` cannot
change a byte.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import time
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import apache_beam as beam
import numpy as np
from apache_beam.pvalue import AsSingleton

from datagen import rng
from datagen.config import DatagenConfig
from pipelines import fsio
from pipelines.progress import Progress

SPLITS = ("train", "eval")
ERROR_TAG = "[bert-datagen error] "
SUMMARY_PREFIX = ".run-summary-"
STAGING_PREFIX = ".staging-"
TOTAL_KEYS = ("documents", "sentences", "tokens", "instances", "notnext_fraction", "masked_tokens",
              "decode_errors", "dropped_documents", "duplicate_documents")
DOCS_PER_TOKENIZE_BATCH = 256
# CPU seconds each kind of task took, summed over workers: where the time goes, and how well the
# work spread (the summary table shows them; the manifest does not: they differ run to run).
BUSY_PREFIX = "cpu_seconds/"
_U64 = 1 << 64


class DatagenError(RuntimeError):
    """A run that cannot produce a dataset; the message names the file or option and the reason."""


def input_error(message: str) -> RuntimeError:
    """An error raised inside a DoFn whose message the driver can find in any runner's wrapping."""
    return RuntimeError(ERROR_TAG + message.replace("\n", " "))


def extract_input_error(exc: BaseException) -> str | None:
    """The clean message of an ``input_error`` raised in a worker, from a runner's wrapped exception."""
    seen: list[BaseException] = []
    while exc is not None and exc not in seen:
        seen.append(exc)
        match = re.search(re.escape(ERROR_TAG) + r"([^\n]*)", str(exc))
        if match:
            message = re.sub(r"\s*\[while running [^\]]*\].*$", "", match.group(1))
            return message.strip().rstrip("'\"")
        exc = exc.__cause__ or exc.__context__  # type: ignore[assignment]
    return None


# ---------------------------------------------------------------- pure helpers (unit-tested)


def split_of(doc_id: int, config: DatagenConfig) -> str:
    """'eval' for a seeded-hash fraction ``eval_fraction`` of document identities, else 'train'."""
    if config.eval_fraction <= 0.0:
        return "train"
    key = rng.derive_key(config.random_seed, "eval-split")
    draw = rng.mix64(int(doc_id) ^ key)
    return "eval" if draw < int(config.eval_fraction * _U64) else "train"


def num_pools_for(n_docs: int, config: DatagenConfig) -> int:
    return max(1, n_docs // config.notnext_pool_size)


def pool_of(doc_id: int, num_pools: int, config: DatagenConfig) -> int:
    """The NotNext pool of a document: a seeded hash of its identity mapped onto ``num_pools``."""
    key = rng.derive_key(config.random_seed, "notnext-pool")
    return (rng.mix64(int(doc_id) ^ key) * num_pools) >> 64


def shard_of_keys(keys: np.ndarray, num_shards: int) -> np.ndarray:
    """``(key * num_shards) >> 64`` for every uint64 key, exactly, without 128-bit integers."""
    if not 1 <= num_shards < (1 << 32):
        raise ValueError(f"num_shards {num_shards} out of range")
    keys = np.asarray(keys, dtype=np.uint64)
    n = np.uint64(num_shards)
    hi = keys >> np.uint64(32)
    lo = keys & np.uint64(0xFFFFFFFF)
    return ((hi * n + ((lo * n) >> np.uint64(32))) >> np.uint64(32)).astype(np.int64)


def shards_for_bytes(total_bytes: int, target_shard_mb: float) -> int:
    return max(1, -(-int(total_bytes) // max(1, int(target_shard_mb * 2**20))))


def estimated_record_bytes(documents: int, tokens: int, config: DatagenConfig) -> int:
    """A deterministic estimate of a split's TFRecord bytes, from its document and token counts.

    The shard count must be known before instances exist (each task cuts its records by shard
    right away, so no stage holds all records): about one instance per ``max_seq_length - 3``
    tokens (at least one per document) per pass, each about 4 bytes per position (ids, mask,
    segments) plus 8 per prediction slot plus framing and feature names.
    """
    if documents <= 0:
        return 0
    s, p = config.max_seq_length, config.max_predictions_per_seq
    instances = config.dupe_factor * max(documents, -(-tokens // (s - 3)))
    return instances * (4 * s + 8 * p + 180)


def shard_counts(config: DatagenConfig, split_bytes: dict[str, int]) -> dict[str, int]:
    """Shards per split: ``--num-shards`` for train; eval (small) is sized by the target shard size."""
    counts = {}
    for split in splits_of(config):
        if split == "train" and config.num_shards is not None:
            counts[split] = config.num_shards
        else:
            counts[split] = shards_for_bytes(split_bytes.get(split, 0), config.target_shard_mb)
    return counts


def splits_of(config: DatagenConfig) -> tuple[str, ...]:
    return SPLITS if config.eval_fraction > 0 else ("train",)


def shard_name(split: str, index: int, count: int) -> str:
    return f"{split}/part-{index:05d}-of-{count:05d}.tfrecord"


def add_counts(total: dict[str, Any], part: dict[str, Any]) -> dict[str, Any]:
    for k, v in part.items():
        if isinstance(v, bool) or not isinstance(v, int | float | np.integer | np.floating):
            continue
        total[k] = total.get(k, 0) + (int(v) if isinstance(v, int | np.integer) else float(v))
    return total


def fingerprint(doc_ids: Iterable[np.ndarray]) -> str:
    """sha256 over the sorted, distinct 64-bit document content hashes, each 8 bytes big-endian."""
    arrays = [np.asarray(a, dtype=np.uint64) for a in doc_ids]
    ids = np.unique(np.concatenate(arrays)) if arrays else np.zeros(0, dtype=np.uint64)
    return hashlib.sha256(ids.astype(">u8").tobytes()).hexdigest()


def dedupe_sorted(docs: list[Any]) -> tuple[list[Any], int]:
    """Documents sorted by ``doc_id`` with equal identities collapsed to one; and how many collapsed.

    Equal ``doc_id`` means equal content (a content hash); the tie-break on the tokens keeps the
    choice deterministic even if a 64-bit collision ever happened.
    """
    ordered = sorted(docs, key=lambda d: (int(d.doc_id), np.asarray(d.tokens).tobytes()))
    unique: list[Any] = []
    for doc in ordered:
        if unique and int(unique[-1].doc_id) == int(doc.doc_id):
            continue
        unique.append(doc)
    return unique, len(ordered) - len(unique)


@dataclass
class EncodedRecords:
    """Framed TFRecords of one task, as one blob (cheap to pickle) with per-record keys and lengths."""

    keys: np.ndarray  # uint64
    lengths: np.ndarray  # int64, framed bytes per record
    blob: bytes | np.ndarray  # framed records back to back; a uint8 view when read from a staging file

    @classmethod
    def empty(cls) -> EncodedRecords:
        return cls(np.zeros(0, np.uint64), np.zeros(0, np.int64), b"")

    def __len__(self) -> int:
        return int(self.keys.shape[0])

    def slice(self, lo: int, hi: int) -> EncodedRecords:
        start = int(self.lengths[:lo].sum())
        size = int(self.lengths[lo:hi].sum())
        return EncodedRecords(self.keys[lo:hi], self.lengths[lo:hi], self.blob[start:start + size])


ENCODE_CHUNK_ROWS = 4096


def encode_pool_pass(plan: Any, config: DatagenConfig, vocab: Any) -> tuple[EncodedRecords, np.ndarray, np.ndarray]:
    """A pool pass's records, laid out, masked, encoded and framed in key order, a block at a time.

    Key order makes every shard (a range of keys) a contiguous slice of the result; blocks keep
    every temporary small, and no full-size instance batch ever exists. Also returns each
    record's NotNext label and masked-token count, in the same order.
    """
    from datagen.instances import masked_rows
    from datagen.records import encode_framed

    order = np.argsort(plan.keys, kind="stable")
    blobs: list[bytes] = []
    lengths: list[np.ndarray] = []
    masked: list[np.ndarray] = []
    for lo in range(0, len(order), ENCODE_CHUNK_ROWS):
        batch = masked_rows(plan, order[lo:lo + ENCODE_CHUNK_ROWS], config, vocab)
        framed, framed_lengths = encode_framed(batch)
        blobs.append(framed)
        lengths.append(framed_lengths)
        masked.append((batch.masked_lm_weights > 0).sum(axis=1))
    if not blobs:
        return EncodedRecords.empty(), np.zeros(0, np.int32), np.zeros(0, np.int64)
    records = EncodedRecords(plan.keys[order], np.concatenate(lengths).astype(np.int64), b"".join(blobs))
    return records, plan.labels[order], np.concatenate(masked)


def sorted_shard(parts: list[EncodedRecords], where: str) -> EncodedRecords:
    """A shard's records ordered by key; two records with one key is a bug, so it fails loudly.

    Records are gathered straight from the parts' buffers (one copy: the final join).
    """
    parts = [p for p in parts if len(p)]
    if not parts:
        return EncodedRecords.empty()
    keys = np.concatenate([p.keys for p in parts])
    lengths = np.concatenate([p.lengths for p in parts])
    part_of = np.repeat(np.arange(len(parts)), [len(p) for p in parts])
    starts = np.concatenate([np.cumsum(p.lengths) - p.lengths for p in parts])
    order = np.argsort(keys, kind="stable")
    keys = keys[order]
    if keys.size > 1:
        dup = np.nonzero(keys[1:] == keys[:-1])[0]
        if dup.size:
            raise RuntimeError(f"{where}: two instances share the key {int(keys[dup[0]]):#018x}; "
                               "instance keys must be unique")
    views = [memoryview(p.blob) for p in parts]
    lengths = lengths[order]
    spans = zip(part_of[order].tolist(), starts[order].tolist(), lengths.tolist(), strict=True)
    blob = b"".join([views[i][lo:lo + n] for i, lo, n in spans])
    return EncodedRecords(keys, lengths, blob)


# ---------------------------------------------------------------- DoFns


class _ReportingDoFn(beam.DoFn):
    """A DoFn that reports its counts as progress lines when the run shows progress."""

    show_progress: bool = False

    def setup(self) -> None:
        self._progress = Progress() if self.show_progress else None

    def teardown(self) -> None:
        if getattr(self, "_progress", None) and self._progress.counts:
            self._progress.emit()  # the final counts of this worker


class ReadFiles(_ReportingDoFn):
    """Input file -> batches of tokenized documents tagged train/eval, then the file's stats."""

    def __init__(self, config: DatagenConfig, vocab: Any, show_progress: bool = False,
                 single_thread_tokenizer: bool = True) -> None:
        self.config = config
        self.vocab = vocab
        self.show_progress = show_progress
        self.single_thread_tokenizer = single_thread_tokenizer

    def setup(self) -> None:
        from vocab.tokenizer import BertTokenizer

        self._tokenizer = BertTokenizer(self.vocab, self.config.do_lower_case, self.single_thread_tokenizer)
        super().setup()

    def process(self, task: tuple[str, int, int, int | None]) -> Iterator[dict[str, Any]]:
        from datagen.ranges import read_range_documents
        from datagen.readers import read_documents

        path, size, start, end = task
        started = time.process_time()
        with contextlib.ExitStack() as stack:
            try:
                if end is None:
                    data = fsio.read_bytes(path)
                    stats: dict[str, Any] = {"files": 1, "input_bytes": len(data)}
                    raws = read_documents(path, data, self.config, stats)
                else:  # one byte range of a big file (see datagen.ranges)
                    stream = stack.enter_context(fsio.open_read(path))
                    stats = {"files": int(start == 0), "input_bytes": end - start}
                    raws = read_range_documents(path, stream, size, start, end, self.config, stats)
            except Exception as e:
                raise input_error(f"{path}: cannot read: {e}") from e
            yield from self._tokenized(path, raws, stats, started)

    def _tokenized(self, path: str, raws: Iterator[Any], stats: dict[str, Any],
                   started: float) -> Iterator[dict[str, Any]]:
        from datagen.documents import tokenize_documents
        from datagen.readers import InputError

        batch: list[Any] = []
        n_docs = 0
        try:
            for raw in raws:
                batch.append(raw)
                if len(batch) >= DOCS_PER_TOKENIZE_BATCH:
                    docs = tokenize_documents(batch, self._tokenizer, self.config, stats)
                    n_docs += len(docs)
                    yield self._tagged(docs)
                    batch = []
            if batch:
                docs = tokenize_documents(batch, self._tokenizer, self.config, stats)
                n_docs += len(docs)
                yield self._tagged(docs)
        except InputError as e:
            message = str(e)
            raise input_error(message if path in message else f"{path}: {message}") from e
        except OSError as e:
            raise input_error(f"{path}: cannot read: {e}") from e
        if self._progress:
            self._progress.add(files=stats["files"], documents=n_docs)
        stats[f"{BUSY_PREFIX}read"] = time.process_time() - started
        yield {"docs": {}, "stats": stats}

    def _tagged(self, docs: list[Any]) -> dict[str, Any]:
        by_split: dict[str, list[Any]] = {}
        for doc in docs:
            by_split.setdefault(split_of(doc.doc_id, self.config), []).append(doc)
        return {"docs": by_split, "stats": {}}


def read_counts(element: dict[str, Any]) -> dict[str, Any]:
    # Documents, sentences and tokens count once, after duplicates collapse (pool_stats); the
    # reader's own counts (duplicates included) are kept under other names.
    counts = {(f"read_{k}" if k in ("documents", "sentences", "tokens") else k): v
              for k, v in element["stats"].items()}
    for split, docs in element["docs"].items():
        counts[f"read_docs/{split}"] = counts.get(f"read_docs/{split}", 0) + len(docs)
    return counts


def read_identities(element: dict[str, Any]) -> dict[str, np.ndarray]:
    """Per split: each document's identity and token count, as a (2, n) uint64 array."""
    return {split: np.array([[int(d.doc_id) for d in docs], [int(d.num_tokens) for d in docs]], dtype=np.uint64)
            .reshape(2, len(docs))
            for split, docs in element["docs"].items()}


def identity_census(element: tuple[int, Iterable[dict[str, np.ndarray]]]) -> dict[str, Any]:
    """Distinct documents and their tokens per split (they fix the pool and shard counts) and the
    input fingerprint.

    Holds 16 bytes per document in one place: the price of a fingerprint over sorted identities and
    of pool and shard counts that duplicates cannot change. Equal identities are equal content, so
    a duplicate's token count is the same as the first copy's.
    """
    _, parts = element
    per_split: dict[str, list[np.ndarray]] = {}
    for part in parts:
        for split, arrays in part.items():
            per_split.setdefault(split, []).append(np.asarray(arrays, dtype=np.uint64).reshape(2, -1))
    census: dict[str, Any] = {"fingerprint": fingerprint([a[0] for arrays in per_split.values() for a in arrays])}
    for split, arrays in per_split.items():
        both = np.concatenate(arrays, axis=1)
        ids, first = np.unique(both[0], return_index=True)
        census[f"distinct_docs/{split}"] = int(ids.size)
        census[f"distinct_tokens/{split}"] = int(both[1][first].sum())
    return census


def shard_counts_of(census: dict[str, Any], config: DatagenConfig) -> dict[str, int]:
    """Shards per split, from the distinct documents and tokens the census counted."""
    return shard_counts(config, {s: estimated_record_bytes(int(census.get(f"distinct_docs/{s}", 0)),
                                                           int(census.get(f"distinct_tokens/{s}", 0)), config)
                                 for s in splits_of(config)})


class AssignPools(beam.DoFn):
    def __init__(self, config: DatagenConfig) -> None:
        self.config = config

    def process(self, element: dict[str, Any], counts: dict[str, Any]):
        for split, docs in element["docs"].items():
            num_pools = num_pools_for(int(counts.get(f"distinct_docs/{split}", 0)), self.config)
            pools: dict[int, list[Any]] = {}
            for doc in docs:
                pools.setdefault(pool_of(doc.doc_id, num_pools, self.config), []).append(doc)
            for pool, members in sorted(pools.items()):
                yield (split, pool), members


def build_pool(element: tuple[tuple[str, int], Iterable[list[Any]]]) -> tuple[tuple[str, int], list[Any], int]:
    key, batches = element
    docs = [doc for batch in batches for doc in batch]
    unique, duplicates = dedupe_sorted(docs)
    return key, unique, duplicates


# ---------------------------------------------------------------- staging files
# Bulk data (a pool's documents, a task's records for one shard) goes through files under
# DIR/.staging-<run>/ and only paths and counts go through the runner's shuffle: Beam's local
# runners hold every shuffled byte in the driver several times over, and a pool read by
# `dupe_factor` tasks would otherwise be shuffled `dupe_factor` times.


_STAGING_MAGIC = b"BDSTAGE1"


def _pack_arrays(**arrays: np.ndarray) -> bytes:
    """Named arrays as one blob: magic, header length, a JSON header (dtype, shape, offset), raw bytes.

    Not ``np.savez``: its zip container computes a CRC over every byte and copies the data twice,
    which cost more than the encoding itself; these files live only for one run.
    """
    header, at = {}, 0
    raw = []
    for name, array in arrays.items():
        array = np.ascontiguousarray(array)
        header[name] = [array.dtype.str, list(array.shape), at]
        raw.append(array.data.cast("B") if array.size else b"")
        at += array.nbytes
    head = json.dumps(header, sort_keys=True).encode()
    return b"".join([_STAGING_MAGIC, len(head).to_bytes(4, "little"), head, *raw])


def _unpack_arrays(data: bytes, path: str) -> dict[str, np.ndarray]:
    if data[:len(_STAGING_MAGIC)] != _STAGING_MAGIC:
        raise RuntimeError(f"{path}: not a staging file of this run (bad magic)")
    at = len(_STAGING_MAGIC)
    size = int.from_bytes(data[at:at + 4], "little")
    header = json.loads(data[at + 4:at + 4 + size])
    base = at + 4 + size
    out = {}
    for name, (dtype, shape, offset) in header.items():
        count = int(np.prod(shape)) if shape else 1
        out[name] = np.frombuffer(data, dtype=np.dtype(dtype), count=count, offset=base + offset).reshape(shape)
    return out


def _read_arrays(path: str) -> dict[str, np.ndarray]:
    return _unpack_arrays(fsio.read_bytes(path), path)


def pool_to_bytes(docs: list[Any]) -> bytes:
    def cat(arrays: list[np.ndarray], dtype) -> np.ndarray:
        return np.concatenate(arrays).astype(dtype, copy=False) if arrays else np.zeros(0, dtype)

    return _pack_arrays(
        doc_ids=np.fromiter((int(d.doc_id) for d in docs), dtype=np.uint64, count=len(docs)),
        n_tokens=np.fromiter((len(d.tokens) for d in docs), dtype=np.int64, count=len(docs)),
        n_sentences=np.fromiter((len(d.sentence_ends) for d in docs), dtype=np.int64, count=len(docs)),
        tokens=cat([np.asarray(d.tokens) for d in docs], np.int32),
        sentence_ends=cat([np.asarray(d.sentence_ends) for d in docs], np.int32),
    )


def pool_from_file(path: str) -> list[Any]:
    from datagen.documents import TokenizedDocument

    a = _read_arrays(path)
    tok_at = np.concatenate([[0], np.cumsum(a["n_tokens"])])
    sent_at = np.concatenate([[0], np.cumsum(a["n_sentences"])])
    return [TokenizedDocument(doc_id=int(a["doc_ids"][i]), tokens=a["tokens"][tok_at[i]:tok_at[i + 1]],
                              sentence_ends=a["sentence_ends"][sent_at[i]:sent_at[i + 1]])
            for i in range(len(a["doc_ids"]))]


def records_to_bytes(records: EncodedRecords) -> bytes:
    return _pack_arrays(keys=records.keys, lengths=records.lengths, blob=np.frombuffer(records.blob, np.uint8))


def records_from_file(path: str) -> EncodedRecords:
    a = _read_arrays(path)
    return EncodedRecords(a["keys"], a["lengths"], a["blob"])  # a view of the file's bytes, not a copy


def stage_pool(pool: tuple[tuple[str, int], list[Any], int], staging: str) -> dict[str, Any]:
    """Write the pool's documents to a staging file; return its stats (with the path)."""
    (split, index), docs, duplicates = pool
    path = fsio.join(staging, "pools", f"{split}-{index:06d}.bin")
    fsio.write_atomic(path, pool_to_bytes(docs))
    return {**pool_stats(pool), "path": path, "split": split, "pool": index}


def pool_stats(pool: tuple[tuple[str, int], list[Any], int]) -> dict[str, Any]:
    (split, _), docs, duplicates = pool
    return {
        "kind": "pool",
        "documents": len(docs),
        f"documents/{split}": len(docs),
        "duplicate_documents": duplicates,
        "sentences": sum(len(d.sentence_ends) for d in docs),
        "tokens": (tokens := sum(int(np.asarray(d.tokens).shape[0]) for d in docs)),
        f"tokens/{split}": tokens,
    }


def fan_out_passes(staged: dict[str, Any], dupe_factor: int):
    if staged["documents"] == 0:
        return
    for pass_index in range(dupe_factor):
        yield (staged["split"], staged["pool"], pass_index), staged["path"]


def part_stats(records: EncodedRecords, labels: np.ndarray, masked: np.ndarray, split: str) -> dict[str, int]:
    return {"instances": len(records), f"instances/{split}": len(records), "notnext": int(labels.sum()),
            "masked_tokens": int(masked.sum())}


class BuildInstances(_ReportingDoFn):
    """(pool, pass) -> the pass's instances, encoded and framed, cut by shard into staging files.

    Emits ((split, shard), (fragment path, stats of its records)): the runner shuffles no records.
    A retried task rewrites the same fragments with the same bytes.
    """

    def __init__(self, config: DatagenConfig, vocab: Any, staging: str, show_progress: bool = False) -> None:
        self.config = config
        self.vocab = vocab
        self.staging = staging
        self.show_progress = show_progress

    def process(self, task: tuple[tuple[str, int, int], str], num_shards: dict[str, int]):
        from datagen.instances import plan_pool_pass

        (split, pool, pass_index), pool_path = task
        started = time.process_time()
        docs = pool_from_file(pool_path)
        plan = plan_pool_pass(docs, pass_index, self.config)
        del docs
        if plan is None:
            return
        records, labels, masked = encode_pool_pass(plan, self.config, self.vocab)
        # Counts this DoFn takes from the records themselves are not taken twice from the plan.
        extra = {k: v for k, v in plan.stats.items() if k not in TOTAL_KEYS and k != "notnext"}
        del plan
        if self._progress:
            self._progress.add(instances=len(records))
        if not len(records):
            if extra:
                yield (split, 0), (None, extra)
            return
        # Keys are sorted, so each shard's records are one contiguous run.
        shards = shard_of_keys(records.keys, num_shards[split])
        bounds = np.searchsorted(shards, np.arange(num_shards[split] + 1))
        for shard in range(num_shards[split]):
            lo, hi = int(bounds[shard]), int(bounds[shard + 1])
            if hi > lo:
                part = records.slice(lo, hi)
                path = fsio.join(self.staging, "parts", f"{split}-{shard:05d}-{pool:06d}-{pass_index:04d}.bin")
                fsio.write_atomic(path, records_to_bytes(part))
                stats = part_stats(part, labels[lo:hi], masked[lo:hi], split)
                if extra:  # the pass's own counters ride on its first part only
                    stats, extra = add_counts(stats, extra), {}
                yield (split, shard), (path, stats)
        yield (split, 0), (None, {f"{BUSY_PREFIX}build": time.process_time() - started})


def empty_shards(num_shards: dict[str, int]):
    for split, n in sorted(num_shards.items()):
        for shard in range(n):
            yield (split, shard), (None, {})


class WriteShard(_ReportingDoFn):
    """All fragments of one shard -> the shard file, records sorted by key, written atomically."""

    def __init__(self, output_dir: str, show_progress: bool = False) -> None:
        self.output_dir = output_dir
        self.show_progress = show_progress

    def process(self, element: tuple[tuple[str, int], Iterable[tuple[str | None, dict]]],
                num_shards: dict[str, int]):
        (split, shard), parts = element
        started = time.process_time()
        name = shard_name(split, shard, num_shards[split])
        parts = sorted(parts, key=lambda part: part[0] or "")
        records = sorted_shard([records_from_file(path) for path, _ in parts if path], name)
        stats = sum_all(stats for _, stats in parts)
        fsio.write_atomic(fsio.join(self.output_dir, *name.split("/")), records.blob)
        stats[f"{BUSY_PREFIX}write"] = stats.get(f"{BUSY_PREFIX}write", 0.0) + time.process_time() - started
        if self._progress:
            self._progress.add(records_written=len(records), shards_written=1)
        yield {
            "kind": "shard",
            "split": split,
            "index": shard,
            "shard": {"path": name, "records": len(records), "bytes": len(records.blob),
                      "sha256": hashlib.sha256(records.blob).hexdigest()},
            "stats": stats,
        }


def sum_all(parts: Iterable[dict[str, Any]]) -> dict[str, Any]:
    total: dict[str, Any] = {}
    for part in parts:
        add_counts(total, part)
    return total


def summarize(element: tuple[int, Iterable[dict[str, Any]]], summary_path: str) -> str:
    """Combine every stats/shard/census element into the run summary and write it (JSON)."""
    _, items = element
    totals: dict[str, Any] = {}
    shards: dict[str, list[tuple[int, dict]]] = {}
    digest = fingerprint([])
    for item in items:
        kind = item.get("kind")
        if kind == "shard":
            shards.setdefault(item["split"], []).append((item["index"], item["shard"]))
            add_counts(totals, item["stats"])
        elif kind == "census":
            digest = item["fingerprint"]
        else:
            add_counts(totals, {k: v for k, v in item.items() if k != "kind"})
    summary = {
        "totals": totals,
        "fingerprint": digest,
        "shards": {split: [s for _, s in sorted(entries, key=lambda e: e[0])]
                   for split, entries in sorted(shards.items())},
    }
    fsio.write_atomic(summary_path, (json.dumps(summary, sort_keys=True, indent=1) + "\n").encode())
    return summary_path


DEFAULT_READ_CHUNK_MB = 64.0


def read_tasks(files: list[tuple[str, int]], input_format: str,
               chunk_mb: float = DEFAULT_READ_CHUNK_MB) -> list[tuple[str, int, int, int | None]]:
    """``(path, size, start, end)`` per read task: one per file (``end`` None: read it whole), or
    one per byte range of ``chunk_mb`` of a bigger uncompressed file in a format whose documents
    a range can find on its own (``datagen.ranges``), so one big file is read by many workers and
    none holds more than a range of it."""
    from datagen.ranges import byte_ranges, splittable

    chunk = max(1, int(chunk_mb * 2**20))
    tasks: list[tuple[str, int, int, int | None]] = []
    for path, size in files:
        if size > chunk and splittable(path, input_format):
            tasks.extend((path, size, lo, hi) for lo, hi in byte_ranges(size, chunk))
        else:
            tasks.append((path, size, 0, None))
    return tasks


@dataclass
class PipelinePlan:
    """What the driver hands to the pipeline builder."""

    config: DatagenConfig
    vocab: Any
    files: list[tuple[str, int, int, int | None]]  # read tasks (``read_tasks``)
    output_dir: str
    summary_path: str
    staging_dir: str = ""
    show_progress: bool = False
    # A worker is one core: its tokenizer uses one thread, unless it is the only worker.
    single_thread_tokenizer: bool = True
    extra: dict[str, Any] = field(default_factory=dict)


def build_pipeline(p: beam.Pipeline, plan: PipelinePlan) -> None:
    """Add the data-generation transforms to ``p``. The last transform depends on every branch
    (Beam's DaskRunner computes only the graph behind the last transform)."""
    config = plan.config
    read = (
        p
        | "ListFiles" >> beam.Create(plan.files)
        | "ReadFiles" >> beam.ParDo(ReadFiles(config, plan.vocab, plan.show_progress, plan.single_thread_tokenizer))
    )
    census = (
        read
        | "ReadIdentities" >> beam.Map(read_identities)
        | "IdentitiesKey" >> beam.Map(lambda d: (0, d))
        | "GroupIdentities" >> beam.GroupByKey()
        | "IdentityCensus" >> beam.Map(identity_census)
    )
    # The shard count comes from the census, so instances can be cut by shard as soon as they
    # exist; every other total is summed once, at the end (fewer stages, each a barrier).
    num_shards = census | "ShardCount" >> beam.Map(shard_counts_of, config)
    pools = (
        read
        | "AssignPools" >> beam.ParDo(AssignPools(config), AsSingleton(census))
        | "GroupPools" >> beam.GroupByKey()
        | "BuildPools" >> beam.Map(build_pool)
    )
    staged = pools | "StagePools" >> beam.Map(stage_pool, plan.staging_dir)
    pool_info = staged | "PoolStats" >> beam.Map(lambda d: {k: v for k, v in d.items()
                                                            if k not in ("path", "split", "pool")})
    parts = (
        staged
        | "FanOutPasses" >> beam.FlatMap(fan_out_passes, config.dupe_factor)
        | "SpreadTasks" >> beam.Reshuffle()
        | "BuildInstances" >> beam.ParDo(BuildInstances(config, plan.vocab, plan.staging_dir, plan.show_progress),
                                         AsSingleton(num_shards))
    )
    placeholders = num_shards | "EmptyShards" >> beam.FlatMap(empty_shards)
    shard_info = (
        (parts, placeholders)
        | "AllShardParts" >> beam.Flatten()
        | "GroupShards" >> beam.GroupByKey()
        | "WriteShards" >> beam.ParDo(WriteShard(plan.output_dir, plan.show_progress), AsSingleton(num_shards))
    )
    read_info = read | "ReadCounts" >> beam.Map(lambda element: {**read_counts(element), "kind": "read"})
    census_info = census | "CensusInfo" >> beam.Map(lambda d: {"kind": "census", "fingerprint": d["fingerprint"]})
    (
        (read_info, census_info, pool_info, shard_info)
        | "AllResults" >> beam.Flatten()
        | "ResultsKey" >> beam.Map(lambda d: (0, d))
        | "GroupResults" >> beam.GroupByKey()
        | "Summarize" >> beam.Map(summarize, plan.summary_path)
    )


# ---------------------------------------------------------------- the driver


def existing_dataset_files(output_dir: str) -> list[str]:
    """Files that make ``output_dir`` look like a dataset (manifest, shards, card, vocab copy)."""
    from contract.manifest import CARD_NAME, MANIFEST_NAME, VOCAB_NAME

    found = []
    for name in (MANIFEST_NAME, CARD_NAME, VOCAB_NAME):
        path = fsio.join(output_dir, name)
        if fsio.exists(path):
            found.append(path)
    for split in SPLITS:
        pattern = fsio.join(output_dir, split, "part-*.tfrecord")
        try:
            found.extend(f.path for f in fsio.match_files([pattern]))
        except fsio.InputNotFoundError:
            pass
    return found


def stale_temp_files(output_dir: str) -> list[str]:
    found = []
    for pattern in (fsio.join(output_dir, f"{fsio.TMP_MARKER}*"),
                    *(fsio.join(output_dir, s, f"{fsio.TMP_MARKER}*") for s in SPLITS),
                    fsio.join(output_dir, f"{SUMMARY_PREFIX}*"),
                    *(fsio.join(output_dir, f"{STAGING_PREFIX}*", sub, "*") for sub in ("pools", "parts"))):
        try:
            found.extend(f.path for f in fsio.match_files([pattern]))
        except fsio.InputNotFoundError:
            pass
    return found


def prepare_output(output_dir: str, overwrite: bool) -> None:
    """Refuse to overwrite a dataset unless asked; with ``overwrite`` remove it, manifest first (so
    a crash while deleting leaves no manifest that points at missing shards)."""
    existing = existing_dataset_files(output_dir)
    if existing and not overwrite:
        raise DatagenError(
            f"{output_dir}: already holds a dataset ({len(existing)} files, e.g. {existing[0]}); "
            "pass --overwrite to replace it or choose another --output"
        )
    from contract.manifest import MANIFEST_NAME

    manifest = fsio.join(output_dir, MANIFEST_NAME)
    fsio.delete([p for p in existing if p == manifest])
    fsio.delete([p for p in existing if p != manifest])
    remove_stale(output_dir)
    fsio.ensure_dir(output_dir)


def check_vocab(vocab: Any, vocab_path: str) -> None:
    tokens = set(vocab.tokens)
    from vocab.vocab_file import SPECIAL_TOKENS

    missing = [t for t in SPECIAL_TOKENS if t not in tokens]
    if missing:
        raise DatagenError(f"{vocab_path}: the vocab has no {', '.join(missing)} token; "
                           "BERT data needs [PAD], [UNK], [CLS], [SEP] and [MASK]")


# Further counters worth a line in the manifest, when the reader or the instance builder reports them.
EXTRA_TOTALS = ("empty_documents", "nul_bytes", "notnext_forced", "notnext_same_document",
                "truncated_instances", "truncated_tokens", "short_target_documents")


def finalize_totals(totals: dict[str, Any]) -> dict[str, Any]:
    out = {k: int(totals.get(k, 0)) for k in TOTAL_KEYS if k != "notnext_fraction"}
    instances = out["instances"]
    out["notnext_fraction"] = round(totals.get("notnext", 0) / instances, 6) if instances else 0.0
    out.update({k: int(totals[k]) for k in EXTRA_TOTALS if k in totals})
    return out


@dataclass
class RunResult:
    output_dir: str
    manifest: dict[str, Any]
    wall_seconds: float
    cpu_seconds: dict[str, float] = field(default_factory=dict)  # per kind of task, summed over workers


def generate_dataset(
    config: DatagenConfig,
    *,
    inputs: list[str],
    vocab_path: str,
    output_dir: str,
    runner: str = "DirectRunner",
    beam_args: list[str] | None = None,
    overwrite: bool = False,
    dask_scheduler: str | None = None,
    dask_workers: int = 2,
    show_progress: bool = False,
    read_chunk_mb: float = DEFAULT_READ_CHUNK_MB,
) -> RunResult:
    """Run the pipeline and write vocab.txt, the dataset card and, last, manifest.json.

    ``read_chunk_mb`` is the largest piece of one file a read task takes (see ``read_tasks``);
    like the runner options, it never changes a byte of the dataset.
    """
    import platform
    import time

    from contract.manifest import VOCAB_NAME, build_manifest, write_manifest
    from contract.vocab_io import load_vocab
    from datagen.records import feature_spec
    from pipelines.card import write_card
    from pipelines.runners import runner_setup

    start = time.monotonic()
    if not read_chunk_mb > 0:
        raise DatagenError(f"--read-chunk-mb {read_chunk_mb} must be > 0")
    # Workers may run in another directory (Dask): local paths become absolute here.
    inputs = [local_abspath(p) for p in inputs]
    output_dir = local_abspath(output_dir).rstrip("/") or "/"
    try:
        files = fsio.match_files(list(inputs))
    except fsio.InputNotFoundError as e:
        raise DatagenError(str(e)) from e
    try:
        vocab = load_vocab(vocab_path, fsio.BEAM_FS)
    except (OSError, ValueError) as e:
        message = str(e)
        raise DatagenError(message if vocab_path in message else f"{vocab_path}: {message}") from e
    check_vocab(vocab, vocab_path)
    prepare_output(output_dir, overwrite)

    run_id = uuid.uuid4().hex
    summary_path = fsio.join(output_dir, f"{SUMMARY_PREFIX}{run_id}.json")
    staging_dir = fsio.join(output_dir, f"{STAGING_PREFIX}{run_id}")
    tasks = read_tasks([(f.path, f.size) for f in files], config.input_format, read_chunk_mb)
    plan = PipelinePlan(config=config, vocab=vocab, files=tasks,
                        output_dir=output_dir, summary_path=summary_path, staging_dir=staging_dir)
    with runner_setup(runner, beam_args, dask_scheduler=dask_scheduler, dask_workers=dask_workers,
                      parallel_elements=len(tasks)) as setup:
        plan.show_progress = show_progress and setup.local
        # The only worker of a local run may spread tokenizing over the idle cores; where there
        # are several workers (or a cluster's), each is one core and tokenizes on one thread.
        plan.single_thread_tokenizer = not (setup.runner == "DirectRunner" and setup.workers == 1)
        pipeline = beam.Pipeline(options=setup.options)
        build_pipeline(pipeline, plan)
        try:
            result = pipeline.run()
            result.wait_until_finish()
            client = getattr(result, "client", None)  # DaskRunner leaves its client open
            if client is not None:
                client.close()
        except Exception as e:
            message = extract_input_error(e)
            if message is not None:
                _remove_partial(output_dir)
                raise DatagenError(message) from e
            raise
    summary = json.loads(fsio.read_bytes(summary_path).decode())
    remove_stale(output_dir)
    totals = finalize_totals(summary["totals"])
    if totals["documents"] == 0:
        _remove_partial(output_dir)
        names = ", ".join(f.path for f in files[:3]) + (" ..." if len(files) > 3 else "")
        raise DatagenError(
            f"no documents with any tokens in {len(files)} input file(s) ({names}): "
            f"{totals['dropped_documents']} empty document(s) dropped; check --input-format "
            f"({config.input_format}) and the files"
        )
    vocab_bytes = fsio.read_bytes(vocab_path)
    fsio.write_atomic(fsio.join(output_dir, VOCAB_NAME), vocab_bytes)
    splits = {split: {"shards": summary["shards"].get(split, [])} for split in splits_of(config)}
    manifest = build_manifest(
        config=config.to_dict(),
        vocab={"path": VOCAB_NAME, "sha256": hashlib.sha256(vocab_bytes).hexdigest(),
               "size": int(vocab.size), "do_lower_case": config.do_lower_case},
        input_info={"patterns": list(inputs), "files": len(files),
                    "bytes": int(sum(f.size for f in files)), "fingerprint": summary["fingerprint"]},
        features=feature_spec(config.max_seq_length, config.max_predictions_per_seq),
        splits=splits,
        totals=totals,
        created_by={"runner": setup.runner, "python": platform.python_version()},
    )
    write_card(output_dir, manifest)
    write_manifest(output_dir, manifest, fsio.BEAM_FS)
    cpu = {k.removeprefix(BUSY_PREFIX): round(float(v), 3) for k, v in sorted(summary["totals"].items())
           if k.startswith(BUSY_PREFIX)}
    return RunResult(output_dir, manifest, time.monotonic() - start, cpu)


def local_abspath(path: str) -> str:
    return path if "://" in path else os.path.abspath(os.path.expanduser(path))


def remove_stale(output_dir: str) -> None:
    """Temp files, summaries and staging files of this or an earlier (killed) run."""
    fsio.delete(stale_temp_files(output_dir))
    if "://" not in output_dir and os.path.isdir(output_dir):
        import shutil

        for name in os.listdir(output_dir):
            if name.startswith(STAGING_PREFIX):
                shutil.rmtree(os.path.join(output_dir, name), ignore_errors=True)


def _remove_partial(output_dir: str) -> None:
    """After a failed run: no shard, summary or temp file may stay behind to look like output."""
    fsio.delete(existing_dataset_files(output_dir))
    remove_stale(output_dir)
