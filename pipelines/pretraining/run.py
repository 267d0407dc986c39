"""The data-generation pipeline: raw documents -> byte-reproducible sharded TFRecords.

This module is the driver (``generate_dataset``) and the graph (``build_pipeline``); the DoFns are in
``bert_datagen.pipelines.pretraining.transforms``, the placement rules they apply in ``bert_datagen.datagen.placement``.

Stages (every element is coarse: a read task, a spill file, a pool, a pool's pass, a shard), in two
pipelines run one after the other:

1. ``ReadFiles``: one element per input file (listed in the driver), or per byte range of a big one
   (``read_tasks``); the DoFn reads, decodes, splits and tokenizes it a piece at a time, tags each
   document train/eval by a seeded hash of its identity (``split_of``) and spills the documents of
   each split to a staging file sorted by their pool hash; only identities and token counts go on.
2. ``ReadCensus`` (the end of the first pipeline): per-split counts of distinct document
   identities and their tokens, the input fingerprint and the readers' counts, in a file the driver
   reads. From it the driver fixes the number of NotNext pools, ``max(1, n_docs //
   notnext_pool_size)``, and the shard count (``--num-shards``, or the target shard size applied
   to a deterministic estimate of the record bytes), before any instance exists. They reach the
   second pipeline as constants: no side inputs (see ``build_read_pipeline``).
3. ``AssignPools`` + ``GroupByKey`` + ``StagePools``: each document belongs to the pool a seeded
   hash of its ``doc_id`` picks (``pool_of``), one contiguous run of each spill file; a pool is
   its runs read back, sorted by ``doc_id``, duplicates collapsed (``unique_documents``, the only
   dedupe), and written once to a staging file. Neither the file layout nor the worker count can
   change a pool.
4. ``FanOutPasses`` + ``Spread``: one small task per (pool, pass) names the pool file, so even
   a one-pool corpus keeps several workers busy (on Dask too, where ``Reshuffle`` does nothing);
   ``BuildInstances`` turns the pass into records in key order
   (``bert_datagen.datagen.framed.encode_pool_pass``: plan, lay out, mask, encode, frame, a block
   at a time) and cuts them by shard = ``(key * num_shards) >> 64`` (contiguous ranges of the
   64-bit key space) into staging fragments: only paths and counts go through the runner's shuffle.
5. ``GroupByKey`` on (split, shard): ``WriteShard`` merges the shard's fragments by key and writes
   it atomically. Empty shards are written too.
6. ``Summarize``: totals, shard checksums and the input fingerprint go to a summary file that the
   driver reads to write ``vocab.txt``, the dataset card and, last, ``manifest.json``.

All of it is written inside the run's staging directory in the output directory; the driver swaps
the complete dataset in at the end (``bert_datagen.pipelines.beam.outputs``: nothing the run did not create is ever
replaced, and a failed or killed run leaves the old dataset as it was).

Every result is a function of the set of documents and the config: groups are sorted before use and
totals are sums, so the runner, the worker count, bundle boundaries and ``PYTHONHASHSEED`` cannot
change a byte.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import apache_beam as beam

from bert_datagen.datagen.config import READ_CHUNK_MB_RANGE, DatagenConfig
from bert_datagen.datagen.placement import num_pools_for, shard_counts_of, splits_of
from bert_datagen.pipelines.beam import fsio, outputs
from bert_datagen.pipelines.beam.driver import (
    local_abspath,
    manifest_provenance,
    read_run_vocab,
    run_pipeline,
    staged_dataset,
)
from bert_datagen.pipelines.beam.errors import DatagenError  # noqa: F401 - raised here, caught by the CLIs
from bert_datagen.pipelines.beam.overlap import share_malloc_arena
from bert_datagen.pipelines.beam.progress import BUSY_PREFIX
from bert_datagen.pipelines.beam.runners import DIRECT, RunnerOptions, runner_setup
from bert_datagen.pipelines.beam.split_checks import empty_split_error, run_warnings
from bert_datagen.pipelines.beam.spread import Spread
from bert_datagen.pipelines.pretraining.transforms import (
    TOTAL_KEYS,
    AssignPools,
    BuildInstances,
    ReadFiles,
    WriteShard,
    empty_shards,
    fan_out_passes,
    read_census,
    stage_pool,
    summarize,
)

if TYPE_CHECKING:
    from bert_datagen.contract.manifest import Manifest
    from bert_datagen.vocab.vocab_file import Vocab


DEFAULT_READ_CHUNK_MB = 64.0
READ_TASKS_PER_WORKER = 4  # read tasks each worker should get at least, where the input can be cut
MIN_AUTO_CHUNK_MB = 1.0  # smaller ranges cost more in per-task start-up than they win in balance
# Passes the only worker of a local run builds at once (bert_datagen.pipelines.beam.overlap): two on
# two cores build 1.5x as fast; each pass in flight is one more pass's memory, so no more than two.
IN_FLIGHT = 2


def usable_cores() -> int:
    """The cores this process may run on (a process pinned to one core builds one pass at a time)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def in_flight_for(runner: str, workers: int, cores: int) -> int:
    """Passes a worker builds at once: up to ``IN_FLIGHT`` where the only worker of a local run
    has ``cores``; one where workers share the machine (each is one core) or are the cluster's."""
    return min(IN_FLIGHT, cores) if runner == "DirectRunner" and workers == 1 else 1


def read_chunk_mb_for(files: list[tuple[str, int]], input_format: str, workers: int,
                      chunk_mb: float | None) -> float:
    """The byte-range size of the read tasks: ``chunk_mb`` when given; else 64 MB, or less where
    several workers would otherwise wait for one task (one 43 MB file on a 2-worker Dask cluster
    was read and tokenized by one worker, a third of the run): enough ranges for
    ``READ_TASKS_PER_WORKER`` tasks a worker. The ranges never change a byte of the dataset."""
    from bert_datagen.datagen.ranges import splittable

    if chunk_mb is not None:
        return chunk_mb
    if workers <= 1:
        return DEFAULT_READ_CHUNK_MB
    cuttable = sum(size for path, size in files if splittable(path, input_format))
    if cuttable == 0:
        return DEFAULT_READ_CHUNK_MB
    per_task = cuttable / (READ_TASKS_PER_WORKER * workers) / 2**20
    return min(DEFAULT_READ_CHUNK_MB, max(MIN_AUTO_CHUNK_MB, per_task))


def read_tasks(files: list[tuple[str, int]], input_format: str,
               chunk_mb: float = DEFAULT_READ_CHUNK_MB) -> list[tuple[str, int, int, int | None]]:
    """``(path, size, start, end)`` per read task: one per file (``end`` None: read it whole), or
    one per byte range of ``chunk_mb`` of a bigger uncompressed file in a format whose documents
    a range can find on its own (``bert_datagen.datagen.ranges``), so one big file is read by many workers and
    none holds more than a range of it."""
    from bert_datagen.datagen.ranges import byte_ranges, splittable

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
    """What the driver hands to the pipeline builders."""

    config: DatagenConfig
    vocab: Vocab
    files: list[tuple[str, int, int, int | None]]  # read tasks (``read_tasks``)
    output_dir: str
    summary_path: str
    staging_dir: str = ""
    show_progress: bool = False
    # A worker is one core: its tokenizer uses one thread, unless it is the only worker.
    single_thread_tokenizer: bool = True
    # Passes a worker builds at once: one a core, where the only worker has the machine.
    in_flight: int = 1


@dataclass
class ReadSummary:
    """What the read pipeline leaves for the second one (``read_census``): the spill files, the
    pool and shard counts the census fixes, the readers' totals and the input fingerprint."""

    spills: list[tuple[str, str]]
    num_pools: dict[str, int]
    num_shards: dict[str, int]
    totals: dict[str, Any]
    fingerprint: str
    pool_cuts: dict[str, list[int]] = field(default_factory=dict)  # per split (placement.pool_cuts)

    @classmethod
    def load(cls, path: str, config: DatagenConfig) -> ReadSummary:
        data = json.loads(fsio.read_bytes(path).decode())
        census = data["census"]
        return cls(spills=[(split, p) for split, p in data["spills"]],
                   num_pools={split: num_pools_for(int(census.get(f"distinct_docs/{split}", 0)), config)
                              for split in splits_of(config)},
                   num_shards=shard_counts_of(census, config), totals=data["totals"],
                   fingerprint=census["fingerprint"],
                   pool_cuts={split: census.get(f"pool_cuts/{split}", []) for split in splits_of(config)})


def read_summary_path(plan: PipelinePlan) -> str:
    return fsio.join(plan.staging_dir, "read-summary.json")


def build_read_pipeline(p: beam.Pipeline, plan: PipelinePlan) -> None:
    """The first pipeline: read and tokenize every task into spill files (``ReadFiles``) and write
    the census of their identities (``read_census``). Its one result, the census, is a barrier for
    everything after it; ending the pipeline there, rather than handing it on as a side input, means
    no runner computes a stage twice (Beam's DaskRunner recomputes the whole graph behind a side input
    in every task that reads it: the input was read five times) and no runner buffers the documents
    while it waits for the census (local runners held them all in memory)."""
    (
        p
        | "ListFiles" >> beam.Create(plan.files)
        | "ReadFiles" >> beam.ParDo(ReadFiles(plan.config, plan.vocab, plan.show_progress,
                                              plan.single_thread_tokenizer, plan.staging_dir))
        | "ReadKey" >> beam.Map(lambda d: (0, d))
        | "GroupReads" >> beam.GroupByKey()
        | "ReadCensus" >> beam.Map(read_census, read_summary_path(plan), plan.config)
    )


def build_pipeline(p: beam.Pipeline, plan: PipelinePlan, read: ReadSummary) -> None:
    """The second pipeline: pools from the spill files, instances, shards, the summary. The last
    transform depends on every branch (Beam's DaskRunner computes only the graph behind the last
    transform)."""
    config = plan.config
    staged = (
        p
        | "ListSpills" >> beam.Create(read.spills)
        | "AssignPools" >> beam.ParDo(AssignPools(config, read.num_pools, read.pool_cuts))
        | "GroupPools" >> beam.GroupByKey()
        | "StagePools" >> beam.Map(stage_pool, plan.staging_dir)
    )
    pool_info = staged | "PoolStats" >> beam.Map(lambda d: {k: v for k, v in d.items()
                                                            if k not in ("path", "split", "pool")})
    parts = (
        staged
        | "FanOutPasses" >> beam.FlatMap(fan_out_passes, config.dupe_factor)
        # At most a task per (pool, pass): on Dask a partition each, so none waits behind another.
        | "SpreadTasks" >> Spread(config.dupe_factor * sum(
            read.num_pools[split] + len(read.pool_cuts.get(split, ())) for split in read.num_pools))
        | "BuildInstances" >> beam.ParDo(BuildInstances(config, plan.vocab, plan.staging_dir, read.num_shards,
                                                        plan.show_progress, plan.in_flight))
    )
    placeholders = p | "EmptyShards" >> beam.Create(list(empty_shards(read.num_shards)))
    shard_info = (
        (parts, placeholders)
        | "AllShardParts" >> beam.Flatten()
        | "GroupShards" >> beam.GroupByKey()
        | "WriteShards" >> beam.ParDo(WriteShard(plan.output_dir, read.num_shards, plan.show_progress, plan.config))
    )
    (
        (pool_info, shard_info)
        | "AllResults" >> beam.Flatten()
        | "ResultsKey" >> beam.Map(lambda d: (0, d))
        | "GroupResults" >> beam.GroupByKey()
        | "Summarize" >> beam.Map(summarize, plan.summary_path, read.totals, read.fingerprint)
    )


# ---------------------------------------------------------------- the driver


# Further counters worth a line in the manifest, when the reader or the instance builder reports them.
EXTRA_TOTALS = ("notnext_pools", "empty_documents", "nul_bytes", "notnext_forced", "notnext_same_document",
                "truncated_instances", "truncated_tokens", "short_target_documents",
                "cross_document_instances", "packed_rows", "segmented_sentences", "segmenter_unaligned_sentences")


def finalize_totals(totals: dict[str, Any]) -> dict[str, Any]:
    out = {k: int(totals.get(k, 0)) for k in TOTAL_KEYS if k != "notnext_fraction"}
    instances = out["instances"]
    out["notnext_fraction"] = round(totals.get("notnext", 0) / instances, 6) if instances else 0.0
    out.update({k: int(totals[k]) for k in EXTRA_TOTALS if k in totals})
    return out


@dataclass
class RunResult:
    output_dir: str
    manifest: Manifest
    wall_seconds: float
    cpu_seconds: dict[str, float] = field(default_factory=dict)  # per kind of task, summed over workers
    warnings: list[str] = field(default_factory=list)  # for the run summary (bert_datagen.pipelines.beam.split_checks)


def generate_dataset(
    config: DatagenConfig,
    *,
    inputs: list[str],
    vocab_path: str,
    output_dir: str,
    runner: RunnerOptions = DIRECT,
    overwrite: bool = False,
    show_progress: bool = False,
    read_chunk_mb: float | None = None,
) -> RunResult:
    """Run the pipeline on ``runner`` and write vocab.txt, the dataset card and, last, manifest.json.

    ``read_chunk_mb`` is the largest piece of one file a read task takes (see ``read_tasks``; None:
    ``read_chunk_mb_for``'s choice); like the runner options, it never changes a byte of the dataset.
    On the in-memory DirectRunner with two or more cores this process builds passes in threads, and
    from then on its threads share glibc's malloc arenas (``share_malloc_arena``: for the rest of
    the process).
    """
    start = time.monotonic()
    if config.word_segmenter is not None:  # its package, before any work (the CLI has checked it too)
        from bert_datagen.datagen.segmenters import SegmenterError, check_segmenter

        try:
            check_segmenter(config.word_segmenter)
        except SegmenterError as e:
            raise DatagenError(str(e)) from e
    low, high = READ_CHUNK_MB_RANGE
    if read_chunk_mb is not None and not low <= read_chunk_mb <= high:  # NaN fails too
        raise DatagenError(f"--read-chunk-mb {read_chunk_mb} must be in [{low:g}, {high:g}] MiB")
    # Workers may run in another directory (Dask): local paths become absolute here.
    inputs = [local_abspath(p) for p in inputs]
    output_dir = local_abspath(output_dir).rstrip("/") or "/"
    try:
        files = fsio.match_files(list(inputs))
    except fsio.InputNotFoundError as e:
        raise DatagenError(str(e)) from e
    vocab, vocab_path, vocab_bytes = read_run_vocab(vocab_path)
    with staged_dataset(output_dir, overwrite, inputs=[vocab_path, *(f.path for f in files)]) as out:
        return _generate_into(out, config, files, read_chunk_mb, vocab, vocab_bytes, inputs, runner, show_progress,
                              start)


def _generate_into(out: outputs.DatasetOutput, config: DatagenConfig, files: list[fsio.FileInfo],
                   read_chunk_mb: float | None, vocab: Vocab, vocab_bytes: bytes,
                   inputs: list[str], runner: RunnerOptions, show_progress: bool, start: float) -> RunResult:
    """Run the pipeline and write the complete dataset into ``out.staging``, manifest last."""
    from bert_datagen.contract.manifest import Manifest
    from bert_datagen.datagen.record_layout import feature_spec
    from bert_datagen.pipelines.tools.card import write_dataset_files

    staging = out.staging
    summary_path = fsio.join(staging, "work", "summary.json")
    sizes = [(f.path, f.size) for f in files]
    with runner_setup(runner) as setup:
        chunk_mb = read_chunk_mb_for(sizes, config.input_format, setup.workers, read_chunk_mb)
        plan = PipelinePlan(config=config, vocab=vocab, files=read_tasks(sizes, config.input_format, chunk_mb),
                            output_dir=staging, summary_path=summary_path, staging_dir=fsio.join(staging, "work"))
        plan.show_progress = show_progress and setup.local
        # The only worker of a local run may spread tokenizing over the idle cores; where there
        # are several workers (or a cluster's), each is one core and tokenizes on one thread.
        plan.single_thread_tokenizer = not (setup.runner == "DirectRunner" and setup.workers == 1)
        plan.in_flight = in_flight_for(setup.runner, setup.workers, usable_cores())
        run_pipeline(setup, lambda pipeline: build_read_pipeline(pipeline, plan))
        read = ReadSummary.load(read_summary_path(plan), config)
        if plan.in_flight > 1:
            # Passes built in threads: one pass's memory each, not an arena each. Not
            # before the read stage: its tokenizer and splitter threads allocate at once, and one
            # arena between them cost 15% more CPU there (6x WikiExtractor, 40 against 35 s).
            share_malloc_arena()
        if read.spills:
            run_pipeline(setup, lambda pipeline: build_pipeline(pipeline, plan, read))
    if read.spills:
        summary = json.loads(fsio.read_bytes(summary_path).decode())
    else:  # nothing to build: the check below names the inputs
        summary = {"totals": read.totals, "fingerprint": read.fingerprint, "shards": {}}
    totals = finalize_totals(summary["totals"])
    if totals["documents"] == 0:
        names = ", ".join(f.path for f in files[:3]) + (" ..." if len(files) > 3 else "")
        raise DatagenError(
            f"no documents with any tokens in {len(files)} input file(s) ({names}): "
            f"{totals['dropped_documents']} empty document(s) dropped; check --input-format "
            f"({config.input_format}) and the files"
        )
    splits = {split: {"shards": summary["shards"].get(split, [])} for split in splits_of(config)}
    manifest = Manifest.build(
        config=config.to_dict(),
        input_info={"patterns": list(inputs), "files": len(files),
                    "bytes": int(sum(f.size for f in files)), "fingerprint": summary["fingerprint"]},
        features=feature_spec(config.max_seq_length, config.max_predictions_per_seq, config.objective,
                              config.masking, config.max_sequences_per_row if config.packing else 0,
                              config.word_segmenter is not None),
        splits=splits,
        totals=totals,
        **manifest_provenance(setup, vocab, vocab_bytes, config.do_lower_case),
    )
    problem = empty_split_error(manifest, config)
    if problem:
        raise DatagenError(problem)
    write_dataset_files(out, manifest, vocab_bytes)
    cpu = {k.removeprefix(BUSY_PREFIX): round(float(v), 3) for k, v in sorted(summary["totals"].items())
           if k.startswith(BUSY_PREFIX)}
    return RunResult(out.directory, manifest, time.monotonic() - start, cpu,
                     warnings=run_warnings(manifest, config, summary["totals"]))
