"""`bert-datagen task`: labelled task files -> a reproducible task dataset (docs/tasks.md).

Stages (coarse elements: a split, a part of a split, a split's records):

1. ``ReadSplit``: one element per ``--split NAME=PATTERN``; reads the split's files (sorted by path
   within a pattern, patterns in the order given) and parses them as the task's examples, checking
   every line (`bert_datagen.datagen.tasks.build.read_split`).
2. ``Labels``: the label list (official, ``--labels``, or the sorted labels of the first split), a
   singleton side input.
3. ``PlanParts`` + ``Spread``: labels resolved to ids (errors name the file and line); the
   training splits (`train`, or --train-splits) put in their seeded order (`train_order`), every
   other split kept in input order; each split cut into parts of consecutive examples, spread
   over the workers.
4. ``BuildPart``: features of one part (`part_records`), numbered within the part.
5. ``GroupByKey`` on the split + ``WriteSplit``: the parts in order, numbered as one split
   (`unique_ids`, side data), encoded and cut into shards of consecutive records, side files
   written, each atomically.
6. ``Summarize``: shards, side files, counts and input checksums go to a summary file that the
   driver reads to write ``vocab.txt``, the dataset card and, last, ``manifest.json``.

Every result is a function of the files, their order and the config: parts are sorted before use,
so the runner and the worker count cannot change a byte.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import apache_beam as beam
import numpy as np
from apache_beam.pvalue import AsSingleton

from bert_datagen.contract.fs import is_remote
from bert_datagen.contract.manifest import CARD_NAME, MANIFEST_NAME, VOCAB_NAME
from bert_datagen.datagen.config import ConfigError
from bert_datagen.datagen.placement import shards_for_bytes
from bert_datagen.datagen.records import frame_columns
from bert_datagen.datagen.tasks import build
from bert_datagen.datagen.tasks.config import SPAN, TAGGING, TaskConfig, TaskInputError
from bert_datagen.datagen.tasks.features import TaskRecords, combine_side, unique_ids
from bert_datagen.datagen.tasks.lengths import lengths_file
from bert_datagen.datagen.tfrecord_index import index_files
from bert_datagen.pipelines.beam import fsio
from bert_datagen.pipelines.beam.errors import DatagenError, input_error
from bert_datagen.pipelines.beam.progress import BUSY_PREFIX
from bert_datagen.pipelines.beam.spread import Spread

# A split is a directory beside these files (casefolded: case-insensitive filesystems clash too).
RESERVED_NAMES = frozenset(n.casefold() for n in (MANIFEST_NAME, CARD_NAME, VOCAB_NAME))
SPLIT_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
SUMMARY_PREFIX = ".task-summary-"
EXAMPLES_NAME = "examples.jsonl"
WINDOWS_NAME = "windows.jsonl"
# Examples per part: a part is one worker task (SQuAD questions cost the most).
PART_EXAMPLES = {SPAN: 2000, TAGGING: 5000}
DEFAULT_PART_EXAMPLES = 20000


def parse_split(value: str) -> tuple[str, str]:
    """``NAME=PATTERN`` -> (name, pattern); the name becomes a directory."""
    name, sep, pattern = value.partition("=")
    name, pattern = name.strip(), pattern.strip()
    if not sep or not name or not pattern:
        raise DatagenError(f"--split {value!r}: expected NAME=PATTERN (e.g. train=data/train.tsv)")
    if not SPLIT_NAME.match(name):
        raise DatagenError(f"--split {value!r}: the name {name!r} must be letters, digits, '_', '.', '-' "
                           "(it names a directory)")
    if name.casefold() in RESERVED_NAMES:
        raise DatagenError(f"--split {value!r}: {name!r} is the name of a file every dataset holds "
                           f"({', '.join(sorted(RESERVED_NAMES))}); name the split otherwise")
    if not is_remote(pattern) and os.path.isdir(os.path.expanduser(pattern)):
        raise DatagenError(f"--split {value!r}: {pattern} is a directory; give its files (e.g. "
                           f"{name}={pattern.rstrip('/')}/*.tsv)")
    return name, pattern


def shard_name(split: str, index: int, count: int) -> str:
    return f"{split}/part-{index:05d}-of-{count:05d}.tfrecord"


def _guard(fn, *args):
    """Run a step, turning a task file's error into one the driver can report cleanly."""
    try:
        return fn(*args)
    except TaskInputError as e:
        raise input_error(str(e)) from None


# ---------------------------------------------------------------- transforms


def read_split(element: tuple[str, list[str]], config: TaskConfig) -> dict[str, Any]:
    """One split's files -> its parsed examples, with the files' sizes and checksums."""
    name, paths = element
    started = time.process_time()
    files = [(path, fsio.read_bytes(path)) for path in paths]
    split = _guard(build.read_split, config, name, files)
    inputs = [{"path": path, "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()} for path, data in files]
    return {"split": split, "inputs": inputs, "cpu": time.process_time() - started}


def split_labels(element: dict[str, Any], config: TaskConfig) -> list[str]:
    return _guard(build.split_labels, config, element["split"])


def part_size(config: TaskConfig) -> int:
    return PART_EXAMPLES.get(config.task_type, DEFAULT_PART_EXAMPLES)


def plan_parts(element: dict[str, Any], labels: list[str], config: TaskConfig,
               size: int) -> Iterator[tuple[tuple[str, int], Any]]:
    split = element["split"]
    prepared = _guard(build.prepare_split, config, split, labels)
    if config.is_training(split.name):
        prepared = prepared.reordered(build.train_order(len(prepared), config.random_seed).tolist())
    for k, part in enumerate(prepared.parts(size)):
        yield (split.name, k), part


class BuildPart(beam.DoFn):
    """One part of a split -> its records (numbered within the part)."""

    def __init__(self, config: TaskConfig, vocab: Any, single_thread: bool) -> None:
        self.config, self.vocab, self.single_thread = config, vocab, single_thread

    def setup(self) -> None:
        from bert_datagen.vocab.tokenizer import BertTokenizer

        self.tokenizer = BertTokenizer(self.vocab, self.config.do_lower_case, single_thread=self.single_thread)

    def process(self, element: tuple[tuple[str, int], Any]) -> Iterator[tuple[str, tuple[int, TaskRecords, float, bool]]]:
        (name, k), part = element
        started = time.process_time()
        records = _guard(build.part_records, self.config, part, self.tokenizer)
        yield name, (k, records, time.process_time() - started, part.labelled)


def cut_shards(lengths: np.ndarray, num_shards: int) -> list[tuple[int, int]]:
    """Record ranges of each shard: consecutive records, counts as equal as they can be."""
    n = len(lengths)
    bounds = [(i * n) // num_shards for i in range(num_shards + 1)]
    return list(zip(bounds[:-1], bounds[1:], strict=True))


class WriteSplit(beam.DoFn):
    """All parts of a split -> its shards and side files, written atomically."""

    def __init__(self, config: TaskConfig, output_dir: str, unk_id: int = -1, special_ids: tuple[int, ...] = ()) -> None:
        self.config, self.output_dir = config, output_dir
        self.unk_id, self.special_ids = unk_id, special_ids

    def process(self, element: tuple[str, Iterable[tuple[int, TaskRecords, float, bool]]]) -> Iterator[dict[str, Any]]:
        name, items = element
        items = sorted(items, key=lambda item: item[0])
        build_cpu = sum(item[2] for item in items)
        started = time.process_time()
        parts = [item[1] for item in items]
        blobs, lengths, masks, first = [], [], [], 0
        tokens = unk = 0
        for part in parts:
            t, u = self._unk_count(part)
            tokens, unk = tokens + t, unk + u
            columns = dict(part.columns)
            if "unique_ids" in columns:  # numbered in split order, as `combine` numbers them
                columns["unique_ids"] = unique_ids(first, len(part))
            blob, sizes = frame_columns(columns)
            masks.append(columns["input_mask"])
            blobs.append(blob)
            lengths += sizes.tolist()
            first += len(part)
        data = b"".join(blobs)
        ends = np.cumsum(np.array(lengths, dtype=np.int64)) if lengths else np.zeros(0, dtype=np.int64)
        count = self.config.num_shards or self._shards_for(len(data), name)
        mask = np.concatenate(masks) if masks else np.zeros((0, 1), np.int64)
        shards = []
        for index, (lo, hi) in enumerate(cut_shards(np.asarray(lengths), count)):
            start = int(ends[lo - 1]) if lo > 0 else 0
            stop = int(ends[hi - 1]) if hi > 0 else 0
            shard = self._write(shard_name(name, index, count), data[start:stop], hi - lo)
            shard["index"] = self._write_index(shard["path"], lengths[lo:hi])
            shard["lengths"] = self._write_lengths(shard["path"], mask[lo:hi])
            shards.append(shard)
        side_info = combine_side(parts)
        side = []
        if side_info.example_lines is not None:
            for file_name, lines in ((EXAMPLES_NAME, side_info.example_lines), (WINDOWS_NAME, side_info.window_lines)):
                side.append(self._write(f"{name}/{file_name}", "".join(f"{line}\n" for line in lines or []).encode(),
                                        len(lines or [])))
        yield {"kind": "split", "split": name, "shards": shards, "side": side, "counts": side_info.counts,
               "histogram": {str(k): v for k, v in sorted((side_info.histogram or {}).items())},
               "labelled": all(item[3] for item in items), "tokens": tokens, "unk_tokens": unk,
               f"{BUSY_PREFIX}build": build_cpu,
               f"{BUSY_PREFIX}write": time.process_time() - started}

    def _shards_for(self, size: int, split: str) -> int:
        """The split's shards at the target size; more than the cap is the run's error, before any
        shard of the split is written."""
        try:
            return shards_for_bytes(size, self.config.target_shard_mb, split)
        except ConfigError as e:
            raise input_error(str(e)) from None

    def _unk_count(self, part: TaskRecords) -> tuple[int, int]:
        """(text tokens, [UNK] among them) of a part's records, for the summary's UNK warning only
        (never in the manifest: it would change the bytes of existing datasets)."""
        ids, mask = part.columns.get("input_ids"), part.columns.get("input_mask")
        if ids is None or mask is None:
            return 0, 0
        text = (mask != 0) & ~np.isin(ids, np.asarray(self.special_ids, dtype=ids.dtype))
        return int(text.sum()), int((text & (ids == self.unk_id)).sum())

    def _write_index(self, rel: str, lengths: list[int]) -> dict[str, Any]:
        """The shard's record index, written once here (docs/loading.md): its manifest entry."""
        files, entry = index_files(np.asarray(lengths, np.int64), rel)
        for path, data in files.items():
            fsio.write_atomic(fsio.join(self.output_dir, *path.split("/")), data)
        return entry

    def _write_lengths(self, rel: str, input_mask: np.ndarray) -> dict[str, Any]:
        """The shard's record lengths (datagen/tasks/lengths.py: what length grouping sorts by, so a
        rank reads only its records of a window): its manifest entry."""
        path, data, entry = lengths_file(input_mask, rel)
        fsio.write_atomic(fsio.join(self.output_dir, *path.split("/")), data)
        return entry

    def _write(self, rel: str, blob: bytes, records: int) -> dict[str, Any]:
        fsio.write_atomic(fsio.join(self.output_dir, *rel.split("/")), blob)
        return {"path": rel, "records": records, "bytes": len(blob), "sha256": hashlib.sha256(blob).hexdigest()}


def summarize(element: tuple[int, Iterable[dict[str, Any]]], summary_path: str) -> str:
    _, items = element
    summary: dict[str, Any] = {"splits": {}, "inputs": {}, "labels": None, "cpu": {}}
    for item in items:
        kind = item["kind"]
        if kind == "split":
            summary["splits"][item["split"]] = {k: v for k, v in item.items() if not k.startswith(BUSY_PREFIX)}
        elif kind == "inputs":
            summary["inputs"][item["split"]] = item["inputs"]
        elif kind == "labels":
            summary["labels"] = item["labels"]
        for key, value in item.items():
            if key.startswith(BUSY_PREFIX):
                name = key.removeprefix(BUSY_PREFIX)
                summary["cpu"][name] = summary["cpu"].get(name, 0.0) + value
    fsio.write_atomic(summary_path, (json.dumps(summary, sort_keys=True) + "\n").encode())
    return summary_path


@dataclass
class TaskPlan:
    config: TaskConfig
    vocab: Any
    splits: list[tuple[str, list[str]]]  # (name, files in read order)
    output_dir: str
    summary_path: str
    single_thread_tokenizer: bool = True
    part_examples: int | None = None  # examples per worker task (None: by task type); never changes a byte


def build_pipeline(p: beam.Pipeline, plan: TaskPlan) -> None:
    config = plan.config
    first = plan.splits[0][0]
    read = (p | "ListSplits" >> beam.Create(plan.splits)
            | "ReadSplit" >> beam.Map(read_split, config))
    fixed = build.fixed_labels(config)
    size = plan.part_examples or part_size(config)
    if fixed is not None:
        # Known from the config: a plain argument keeps reading and planning in one fused stage.
        labels = p | "Labels" >> beam.Create([fixed])
        parts = read | "PlanParts" >> beam.FlatMap(plan_parts, fixed, config, size)
    else:
        labels = (read | "FirstSplit" >> beam.Filter(lambda e: e["split"].name == first)
                  | "Labels" >> beam.Map(split_labels, config))
        parts = read | "PlanParts" >> beam.FlatMap(plan_parts, AsSingleton(labels), config, size)
    written = (parts
               | "SpreadParts" >> Spread()
               | "BuildPart" >> beam.ParDo(BuildPart(config, plan.vocab, plan.single_thread_tokenizer))
               | "GroupSplit" >> beam.GroupByKey()
               | "WriteSplit" >> beam.ParDo(WriteSplit(config, plan.output_dir, int(plan.vocab.unk_id),
                                                       tuple(int(i) for i in plan.vocab.special_ids if
                                                             i != plan.vocab.unk_id))))
    inputs = read | "InputInfo" >> beam.Map(lambda e: {"kind": "inputs", "split": e["split"].name,
                                                       "inputs": e["inputs"], f"{BUSY_PREFIX}read": e["cpu"]})
    label_info = labels | "LabelInfo" >> beam.Map(lambda labs: {"kind": "labels", "labels": labs})
    ((written, inputs, label_info)
     | "AllResults" >> beam.Flatten()
     | "ResultsKey" >> beam.Map(lambda d: (0, d))
     | "GroupResults" >> beam.GroupByKey()
     | "Summarize" >> beam.Map(summarize, plan.summary_path))
