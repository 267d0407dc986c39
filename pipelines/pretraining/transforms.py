"""The pipeline's transforms: the DoFns and per-element functions that ``bert_datagen.pipelines.pretraining.run.build_pipeline``
wires together (its module docstring walks through the stages).

Every rule that decides where a document or a record goes is in ``bert_datagen.datagen.placement``; how a pool
pass becomes record bytes in ``bert_datagen.datagen.framed``; the staging file bytes in ``bert_datagen.datagen.staging``.
What is here is Beam: reading files in workers, grouping, staging through files, writing shards.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import time
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

import apache_beam as beam
import numpy as np
from apache_beam.transforms.window import GlobalWindows

from bert_datagen.datagen.config import DatagenConfig
from bert_datagen.datagen.documents import TokenizedDocument, split_marks, unique_documents
from bert_datagen.datagen.framed import EncodedRecords, pass_shard_records, sorted_shard
from bert_datagen.datagen.instances import plan_pool_pass
from bert_datagen.datagen.placement import (
    fingerprint,
    identity_census,
    pool_hashes,
    pool_runs,
    shard_name,
    split_of,
)
from bert_datagen.datagen.staging import (
    StagedPool,
    flat_pool_from_bytes,
    pool_from_bytes,
    pool_to_bytes,
    records_from_bytes,
    records_to_bytes,
)
from bert_datagen.datagen.tfrecord_index import index_files
from bert_datagen.pipelines.beam import fsio
from bert_datagen.pipelines.beam.errors import input_error
from bert_datagen.pipelines.beam.overlap import Overlap
from bert_datagen.pipelines.beam.progress import BUSY_PREFIX, Progress

if TYPE_CHECKING:
    from bert_datagen.datagen.readers import RawDocument
    from bert_datagen.vocab.vocab_file import Vocab

TOTAL_KEYS = ("documents", "sentences", "tokens", "instances", "notnext_fraction", "masked_tokens",
              "decode_errors", "dropped_documents", "duplicate_documents")
DOCS_PER_TOKENIZE_BATCH = 256
# The most of a file one read step decodes at once (a read task of --read-chunk-mb is read in such
# pieces): bounds the reader's memory, never changes a byte of the output.
READ_PIECE_BYTES = 8 << 20
def add_counts(total: dict[str, Any], part: dict[str, Any]) -> dict[str, Any]:
    for k, v in part.items():
        if isinstance(v, bool) or not isinstance(v, int | float | np.integer | np.floating):
            continue
        total[k] = total.get(k, 0) + (int(v) if isinstance(v, int | np.integer) else float(v))
    return total


class _ReportingDoFn(beam.DoFn):
    """A DoFn that reports its counts as progress lines when the run shows progress."""

    show_progress: bool = False

    def setup(self) -> None:
        self._progress = Progress() if self.show_progress else None

    def teardown(self) -> None:
        if getattr(self, "_progress", None):
            self._progress.finish()  # the final counts of this worker


class ReadFiles(_ReportingDoFn):
    """Read task -> its documents, tokenized, in one spill file per split; emits only their identities.

    The documents of a split go to ``staging/read/<task>-<split>.bin`` sorted by the hash that picks
    their pool (``pool_hashes``), so every pool is one contiguous run of every spill file, whatever
    the number of pools the census later fixes. The runner then carries 16 bytes a document (for the
    census and the pool runs), never tokens: a local runner keeps every element it shuffles or
    buffers for a side input in memory, which made memory grow with the corpus.
    """

    def __init__(self, config: DatagenConfig, vocab: Vocab, show_progress: bool = False,
                 single_thread_tokenizer: bool = True, staging: str = "") -> None:
        self.config = config
        self.vocab = vocab
        self.show_progress = show_progress
        self.single_thread_tokenizer = single_thread_tokenizer
        self.staging = staging

    def setup(self) -> None:
        from bert_datagen.vocab.tokenizer import BertTokenizer

        self._tokenizer = BertTokenizer(self.vocab, self.config.do_lower_case, self.single_thread_tokenizer)
        self._unk_id = self.vocab.unk_id
        super().setup()

    def process(self, task: tuple[str, int, int, int | None]) -> Iterator[dict[str, Any]]:
        path, size, start, end = task
        started = time.process_time()
        stats: dict[str, Any] = {"files": int(start == 0)}
        by_split = self._tokenized(path, self._documents(path, size, start, end, stats), stats)
        name = hashlib.sha256(f"{path}\0{start}".encode()).hexdigest()[:24]
        spills = {split: self._spill(docs, f"{name}-{split}") for split, docs in sorted(by_split.items())}
        if self._progress:
            self._progress.add(files=stats["files"], documents=sum(len(d) for d in by_split.values()))
        stats[f"{BUSY_PREFIX}read"] = time.process_time() - started
        yield {"spills": spills, "stats": stats}

    def _documents(self, path: str, size: int, start: int, end: int | None,
                   stats: dict[str, Any]) -> Iterator[RawDocument]:
        """The task's raw documents. A format whose documents a byte range can find on its own is
        read ``READ_PIECE_BYTES`` at a time, whatever the task's size: its text as str objects
        takes up to ten times its bytes (four bytes a character once one character needs them)."""
        from bert_datagen.datagen.ranges import byte_ranges, read_range_documents, splittable
        from bert_datagen.datagen.readers import read_documents

        if not splittable(path, self.config.input_format):
            try:
                data = fsio.read_bytes(path)
            except Exception as e:
                raise input_error(f"{path}: cannot read: {e}") from e
            stats["input_bytes"] = len(data)
            yield from read_documents(path, data, self.config, stats)
            return
        stop = size if end is None else end
        stats["input_bytes"] = stop - start
        try:
            stream = fsio.open_read(path)
        except Exception as e:
            raise input_error(f"{path}: cannot read: {e}") from e
        with stream:
            for lo, hi in byte_ranges(stop - start, READ_PIECE_BYTES):
                yield from read_range_documents(path, stream, size, start + lo, start + hi, self.config, stats)

    def _tokenized(self, path: str, raws: Iterator[RawDocument], stats: dict[str, Any]
                   ) -> dict[str, list[TokenizedDocument]]:
        from bert_datagen.datagen.documents import tokenize_document_batches
        from bert_datagen.datagen.readers import InputError

        by_split: dict[str, list[TokenizedDocument]] = {}
        try:
            # A worker with the machine to itself splits the next batch while its tokenizer encodes
            # this one; workers that share the cores keep one thread each.
            for docs in tokenize_document_batches(_batches(raws, DOCS_PER_TOKENIZE_BATCH), self._tokenizer,
                                                  self.config, stats, overlap=not self.single_thread_tokenizer):
                self._tag(docs, stats, by_split)
        except InputError as e:
            message = str(e)
            raise input_error(message if path in message else f"{path}: {message}") from e
        except OSError as e:
            raise input_error(f"{path}: cannot read: {e}") from e
        return by_split

    def _tag(self, docs: list[TokenizedDocument], stats: dict[str, Any],
             by_split: dict[str, list[TokenizedDocument]]) -> None:
        # Unknown tokens, counted for the run summary's warning (a vocab that does not fit the corpus).
        stats["unk_tokens"] = stats.get("unk_tokens", 0) + sum(
            int(np.count_nonzero(split_marks(doc.tokens)[0] == self._unk_id)) for doc in docs)
        for doc in docs:
            by_split.setdefault(split_of(doc.doc_id, self.config), []).append(doc)

    def _spill(self, docs: list[TokenizedDocument], name: str) -> dict[str, Any]:
        ids = np.fromiter((int(d.doc_id) for d in docs), dtype=np.uint64, count=len(docs))
        # Stable, so equal identities keep the reading order (unique_documents breaks ties anyway).
        order = np.argsort(pool_hashes(ids, self.config), kind="stable")
        docs = [docs[i] for i in order]
        path = fsio.join(self.staging, "read", f"{name}.bin")
        fsio.write_atomic(path, pool_to_bytes(docs))
        tokens = np.fromiter((d.num_tokens for d in docs), dtype=np.uint64, count=len(docs))
        return {"path": path, "identities": np.stack([ids[order], tokens])}


def _batches(raws: Iterable[RawDocument], size: int) -> Iterator[list[RawDocument]]:
    it = iter(raws)
    while batch := list(itertools.islice(it, size)):
        yield batch


def read_counts(element: dict[str, Any]) -> dict[str, Any]:
    # Documents, sentences and tokens count once, after duplicates collapse (pool_stats); the
    # reader's own counts (duplicates included) are kept under other names.
    counts = {(f"read_{k}" if k in ("documents", "sentences", "tokens") else k): v
              for k, v in element["stats"].items()}
    for split, spill in element["spills"].items():
        counts[f"read_docs/{split}"] = counts.get(f"read_docs/{split}", 0) + spill["identities"].shape[1]
    return counts


def read_census(element: tuple[int, Iterable[dict[str, Any]]], summary_path: str,
                config: DatagenConfig | None = None) -> str:
    """The read stage's summary, written for the driver: the identity census (``identity_census``:
    distinct documents and tokens per split, the input fingerprint and, given ``config``, where pools
    over ``notnext_pool_tokens`` are cut), the readers' counts summed, and the spill files, sorted.
    The driver fixes the pools and the shard counts from it before the second pipeline starts, so no
    later stage needs a side input (Beam's DaskRunner recomputes everything behind a side input in
    every task that reads it)."""
    _, elements = element
    identities, totals, spills = [], {}, []
    for item in elements:
        identities.append({split: spill["identities"] for split, spill in item["spills"].items()})
        add_counts(totals, read_counts(item))
        spills.extend([split, spill["path"]] for split, spill in item["spills"].items() if spill["identities"].size)
    summary = {"census": identity_census((0, identities), config), "totals": totals, "spills": sorted(spills)}
    fsio.write_atomic(summary_path, (json.dumps(summary, sort_keys=True, indent=1) + "\n").encode())
    return summary_path


class AssignPools(beam.DoFn):
    """(split, spill path) -> (split, pool) -> (spill path, lo, hi): the pool's run of documents in
    the file (sorted by ``pool_hashes``), from the file's identities alone; ``pool_cuts``: where the
    census cut pools over the token bound, per split (``bert_datagen.datagen.placement.pool_cuts``)."""

    def __init__(self, config: DatagenConfig, num_pools: dict[str, int],
                 pool_cuts: dict[str, list[int]] | None = None) -> None:
        self.config = config
        self.num_pools = num_pools
        self.pool_cuts = pool_cuts or {}

    def process(self, spill: tuple[str, str]):
        split, path = spill
        with fsio.open_read(path) as stream:
            doc_ids = StagedPool(stream, path).doc_ids
        runs = pool_runs(pool_hashes(doc_ids, self.config), self.num_pools[split], self.pool_cuts.get(split, ()))
        for pool, lo, hi in runs:
            yield (split, pool), (path, lo, hi)


def build_pool(element: tuple[tuple[str, int], Iterable[tuple[str, int, int]]]
               ) -> tuple[tuple[str, int], list[TokenizedDocument], int]:
    """A pool's documents, read from its run of every spill file, sorted by ``doc_id``, duplicates
    collapsed (counted): its only dedupe."""
    key, runs = element
    docs: list[TokenizedDocument] = []
    for path, lo, hi in sorted(runs):
        with fsio.open_read(path) as stream:
            docs.extend(StagedPool(stream, path).documents(lo, hi))
    unique, duplicates = unique_documents(docs)
    return key, unique, duplicates


# ---------------------------------------------------------------- staging files
# Bulk data (a pool's documents, a task's records for one shard) goes through files under
# DIR/.staging-<run>/ and only paths and counts go through the runner's shuffle: Beam's local
# runners hold every shuffled byte in the driver several times over, and a pool read by
# `dupe_factor` tasks would otherwise be shuffled `dupe_factor` times. Their bytes: bert_datagen.datagen.staging.


def records_from_file(path: str) -> EncodedRecords:
    return records_from_bytes(fsio.read_bytes(path), path)


def stage_pool(element: tuple[tuple[str, int], Iterable[tuple[str, int, int]]], staging: str) -> dict[str, Any]:
    """Gather the pool (``build_pool``) and write its documents to a staging file; return its stats
    (with the path). One step, so a pool's documents never pass through the runner."""
    pool = build_pool(element)
    (split, index), docs, duplicates = pool
    path = fsio.join(staging, "pools", f"{split}-{index:06d}.bin")
    fsio.write_atomic(path, pool_to_bytes(docs))
    return {**pool_stats(pool), "path": path, "split": split, "pool": index}


def pool_stats(pool: tuple[tuple[str, int], list[TokenizedDocument], int]) -> dict[str, Any]:
    (split, _), docs, duplicates = pool
    return {
        "kind": "pool",
        "notnext_pools": 1,
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
    A retried task rewrites the same fragments with the same bytes. ``in_flight``: how many passes
    this worker builds at once (``bert_datagen.pipelines.beam.overlap``; more than one only where the
    worker has the machine to itself); the output is the same.
    """

    def __init__(self, config: DatagenConfig, vocab: Vocab, staging: str, num_shards: dict[str, int],
                 show_progress: bool = False, in_flight: int = 1) -> None:
        self.config = config
        self.vocab = vocab
        self.staging = staging
        self.num_shards = num_shards
        self.show_progress = show_progress
        self.in_flight = in_flight

    def setup(self) -> None:
        self._overlap = Overlap(self._work, self.in_flight)
        super().setup()

    def start_bundle(self) -> None:
        self._overlap.discard()  # a retried bundle: what its failed attempt left running

    def teardown(self) -> None:
        self._overlap.close()
        super().teardown()

    def process(self, task: tuple[tuple[str, int, int], str]):
        for outputs, counts in self._overlap.submit(task):
            yield from self._reported(outputs, counts)

    def finish_bundle(self):
        for outputs, counts in self._overlap.drain():
            for output in self._reported(outputs, counts):
                yield GlobalWindows.windowed_value(output)

    def _reported(self, outputs: list, counts: dict[str, int]) -> list:
        """Outputs made in a thread, their progress counted here, on the DoFn's own thread."""
        if self._progress and any(counts.values()):
            self._progress.add(**counts)
        return outputs

    def _work(self, task: tuple[tuple[str, int, int], str]) -> tuple[list, dict[str, int]]:
        """The task's outputs, and how many instances it built (its own thread's CPU time: passes
        may be built two at a time)."""
        num_shards = self.num_shards
        (split, pool, pass_index), pool_path = task
        started = time.thread_time()
        # The pool file's bytes are let go once the pass is planned (the plan holds its own copy of
        # the tokens). NSP passes take the pool flat, as stored: no per-document work in every pass.
        data = fsio.read_bytes(pool_path)
        docs = flat_pool_from_bytes(data, pool_path) if self.config.objective == "nsp" else pool_from_bytes(data, pool_path)
        del data
        plan = plan_pool_pass(docs, pass_index, self.config)
        del docs
        if plan is None:
            return [], {}
        outputs: list = []
        instances = 0
        # One shard's run of the pass at a time: its fragment is written before the next is encoded.
        for shard, built in pass_shard_records(plan, self.config, self.vocab, num_shards[split]):
            path = fsio.join(self.staging, "parts", f"{split}-{shard:05d}-{pool:06d}-{pass_index:04d}.bin")
            fsio.write_atomic(path, records_to_bytes(built.records))
            stats = add_counts(part_stats(built.records, built.labels, built.masked, split), _plan_counts(built.stats))
            outputs.append(((split, shard), (path, stats)))
            instances += len(built.records)
        if not outputs:
            extra = _plan_counts(plan.stats)
            return ([((split, 0), (None, extra))] if extra else []), {}
        outputs.append(((split, 0), (None, {f"{BUSY_PREFIX}build": time.thread_time() - started})))
        return outputs, {"instances": instances}


def _plan_counts(stats: dict[str, int]) -> dict[str, int]:
    """A pass plan's own counters, less those its records are counted for (not taken twice)."""
    return {k: v for k, v in stats.items() if k not in TOTAL_KEYS and k != "notnext"}


def empty_shards(num_shards: dict[str, int]):
    for split, n in sorted(num_shards.items()):
        for shard in range(n):
            yield (split, shard), (None, {})


class WriteShard(_ReportingDoFn):
    """All fragments of one shard -> the shard file, records sorted by key, written atomically.

    With ``config.packing`` the shard's sorted records are packed into rows here, so that which
    shard an instance is in never depends on packing (``bert_datagen.datagen.packed``).
    """

    def __init__(self, output_dir: str, num_shards: dict[str, int], show_progress: bool = False,
                 config: DatagenConfig | None = None) -> None:
        self.output_dir = output_dir
        self.num_shards = num_shards
        self.show_progress = show_progress
        self.config = config

    def setup(self) -> None:
        # The shard's sha256 is taken while the shard is written: both release the GIL.
        self._hasher = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sha256")
        super().setup()

    def teardown(self) -> None:
        self._hasher.shutdown(wait=True)
        super().teardown()

    def process(self, element: tuple[tuple[str, int], Iterable[tuple[str | None, dict]]]):
        num_shards = self.num_shards
        (split, shard), parts = element
        started = time.thread_time()
        name = shard_name(split, shard, num_shards[split])
        parts = sorted(parts, key=lambda part: part[0] or "")
        records = sorted_shard([records_from_file(path) for path, _ in parts if path], name)
        stats = sum_all(stats for _, stats in parts)
        if self.config is not None and self.config.packing:
            from bert_datagen.datagen.packed import pack_records

            records = pack_records(records, self.config, name)
            stats["packed_rows"] = len(records)
        digest = self._hasher.submit(_sha256_hex, records.blob)
        fsio.write_atomic(fsio.join(self.output_dir, *name.split("/")), records.blob)
        # The record index, written once here, so that no reader walks the shard's headers (docs/loading.md).
        index_data, index_entry = index_files(records.lengths, name)
        for rel, data in index_data.items():
            fsio.write_atomic(fsio.join(self.output_dir, *rel.split("/")), data)
        stats[f"{BUSY_PREFIX}write"] = stats.get(f"{BUSY_PREFIX}write", 0.0) + time.thread_time() - started
        if self._progress:
            self._progress.add(records_written=len(records), shards_written=1)
        yield {
            "kind": "shard",
            "split": split,
            "index": shard,
            "shard": {"path": name, "records": len(records), "bytes": len(records.blob),
                      "sha256": digest.result(),
                      "index": index_entry},
            "stats": stats,
        }


def _sha256_hex(data: bytes | np.ndarray) -> str:
    return hashlib.sha256(data).hexdigest()


def sum_all(parts: Iterable[dict[str, Any]]) -> dict[str, Any]:
    total: dict[str, Any] = {}
    for part in parts:
        add_counts(total, part)
    return total


def summarize(element: tuple[int, Iterable[dict[str, Any]]], summary_path: str,
              read_totals: dict[str, Any] | None = None, digest: str | None = None) -> str:
    """Combine every stats/shard element, and the read stage's totals and fingerprint, into the run
    summary and write it (JSON)."""
    _, items = element
    totals: dict[str, Any] = dict(read_totals or {})
    shards: dict[str, list[tuple[int, dict]]] = {}
    digest = digest or fingerprint([])
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
