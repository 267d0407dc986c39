"""The `bert-datagen task` driver: inputs and output checked, the pipeline run, the manifest written last.

The output safety of `bert-datagen run` (`bert_datagen.pipelines.beam.outputs`): the dataset is built in a staging
directory and swapped in complete; without --overwrite an existing dataset is refused; a failed or
interrupted run leaves the directory as it was; the run holds the directory's lock throughout.
"""

from __future__ import annotations

import hashlib
import json
import time
import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from bert_datagen.datagen.tasks import build
from bert_datagen.datagen.tasks.config import TaskConfig
from bert_datagen.datagen.tasks.features import task_feature_spec
from bert_datagen.pipelines.beam import fsio
from bert_datagen.pipelines.beam.driver import (
    local_abspath,
    manifest_provenance,
    read_run_vocab,
    run_pipeline,
    staged_dataset,
)
from bert_datagen.pipelines.beam.errors import DatagenError
from bert_datagen.pipelines.beam.runners import DIRECT, RunnerOptions, runner_setup
from bert_datagen.pipelines.beam.split_checks import empty_training_split_error, unk_warning
from bert_datagen.pipelines.tasks.graph import (
    EXAMPLES_NAME,
    SUMMARY_PREFIX,
    WINDOWS_NAME,
    TaskPlan,
    build_pipeline,
    parse_split,
)

if TYPE_CHECKING:
    from bert_datagen.contract.manifest import Manifest


@dataclass
class TaskResult:
    output_dir: str
    manifest: Manifest
    wall_seconds: float
    pipeline_seconds: float
    cpu_seconds: dict[str, float] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)  # for the summary (bert_datagen.pipelines.beam.split_checks)


def match_splits(config: TaskConfig, split_options: list[str]) -> list[tuple[str, list[str]]]:
    """(name, files) per --split, in the order given; files sorted by path within a pattern. The
    names are checked against the config (`TaskConfig.check_split_names`) before any file is looked for."""
    parsed = [parse_split(option) for option in split_options]
    if not parsed:
        raise DatagenError("give at least one --split NAME=PATTERN")
    config.check_split_names([name for name, _ in parsed])
    matched = []
    for option, (name, pattern) in zip(split_options, parsed, strict=True):
        try:
            matched.append((name, sorted(f.path for f in fsio.match_files([local_abspath(pattern)]))))
        except fsio.InputNotFoundError as e:
            raise DatagenError(f"--split {option!r}: {e}") from e
    return matched


def _task_field(config: TaskConfig, labels: list[str]) -> dict[str, Any]:
    task: dict[str, Any] = {"kind": config.kind, "type": config.task_type, "labels": labels,
                            "columns": build.columns_description(config), "max_seq_length": config.max_seq_length,
                            "do_lower_case": config.do_lower_case}
    if config.task_type == "span":
        task.update(doc_stride=config.doc_stride, max_query_length=config.max_query_length)
    if config.task_type == "tagging":
        task["scheme"] = "iob2" if config.scheme == "iob1" else config.scheme
        task["scheme_read"] = config.scheme
    return task


def _split_entry(config: TaskConfig, name: str, info: dict[str, Any]) -> dict[str, Any]:
    L = config.max_seq_length
    assert L is not None
    training = config.is_training(name)
    features = task_feature_spec(config.task_type, L, training and config.task_type == "span")
    entry = {"shards": info["shards"], "labelled": info["labelled"], "mode": "train" if training else "predict",
             "features": {k: [v[0], v[1]] for k, v in features.items()}, "counts": info["counts"],
             "side": [{k: s[k] for k in ("path", "bytes", "sha256")} for s in info["side"]]}
    if info["histogram"]:
        entry["windows_per_example"] = info["histogram"]
    return entry


def generate_task_dataset(config: TaskConfig, *, splits: list[str], vocab_path: str, output_dir: str,
                          runner: RunnerOptions = DIRECT, overwrite: bool = False,
                          part_examples: int | None = None) -> TaskResult:
    """Build the dataset in a staging directory under `output_dir` (shards and side files, vocab.txt,
    the card, manifest.json last), then swap it in (`bert_datagen.pipelines.beam.outputs`): an existing dataset is
    replaced only by a complete one, and only with --overwrite.

    `part_examples` (examples per worker task), like the runner options, never changes a byte."""
    start = time.monotonic()
    output_dir = local_abspath(output_dir).rstrip("/") or "/"
    split_files = match_splits(config, splits)
    vocab, vocab_path, vocab_bytes = read_run_vocab(vocab_path)
    inputs = [vocab_path, *(f for _, files in split_files for f in files)]
    with staged_dataset(output_dir, overwrite, inputs=inputs, split_dirs=[name for name, _ in split_files],
                        side_names=(EXAMPLES_NAME, WINDOWS_NAME)) as out:
        return _generate_into(out, config, split_files, vocab, vocab_bytes, splits, runner, part_examples, start)


def _generate_into(out, config: TaskConfig, split_files: list[tuple[str, list[str]]], vocab, vocab_bytes: bytes,
                   splits: list[str], runner: RunnerOptions, part_examples: int | None, start: float) -> TaskResult:
    from bert_datagen.contract.manifest import Manifest
    from bert_datagen.pipelines.tools.card import write_dataset_files

    staging = out.staging
    summary_path = fsio.join(staging, "work", f"{SUMMARY_PREFIX}{uuid.uuid4().hex}.json")
    plan = TaskPlan(config=config, vocab=vocab, splits=split_files, output_dir=staging, summary_path=summary_path,
                    part_examples=part_examples)
    pipeline_start = time.monotonic()
    with runner_setup(runner) as setup:
        plan.single_thread_tokenizer = not (setup.runner == "DirectRunner" and setup.workers == 1)
        run_pipeline(setup, lambda pipeline: build_pipeline(pipeline, plan))
    pipeline_seconds = time.monotonic() - pipeline_start
    summary = json.loads(fsio.read_bytes(summary_path).decode())
    entries = {name: _split_entry(config, name, summary["splits"][name]) for name, _ in split_files}
    problem = empty_training_split_error(entries, dict(split_files))
    if problem:
        raise DatagenError(problem)
    common = set.intersection(*(set(e["features"]) for e in entries.values()))
    first = entries[split_files[0][0]]["features"]
    inputs = {name: summary["inputs"][name] for name, _ in split_files}
    all_inputs = [f for files in inputs.values() for f in files]
    fingerprint = hashlib.sha256("".join(f"{f['sha256']}\n" for f in all_inputs).encode()).hexdigest()
    manifest = Manifest.build(
        config=config.to_dict(),
        input_info={"patterns": list(splits), "files": len(all_inputs), "bytes": sum(f["bytes"] for f in all_inputs),
                    "fingerprint": fingerprint, "splits": inputs},
        features={k: first[k] for k in sorted(common)},
        splits=entries,
        totals={"examples": sum(e["counts"].get("examples", 0) for e in entries.values()),
                "features": sum(e["counts"].get("features", 0) for e in entries.values())},
        kind="task",
        extra={"task": _task_field(config, summary["labels"] or [])},
        **manifest_provenance(setup, vocab, vocab_bytes, config.do_lower_case),
    )
    write_dataset_files(out, manifest, vocab_bytes)
    cpu = {k: round(float(v), 3) for k, v in sorted(summary["cpu"].items())}
    tokens = sum(int(summary["splits"][name].get("tokens", 0)) for name, _ in split_files)
    unk = sum(int(summary["splits"][name].get("unk_tokens", 0)) for name, _ in split_files)
    warning = unk_warning(tokens, unk, config.do_lower_case, "tokens of the task's records", "the task files")
    return TaskResult(out.directory, manifest, time.monotonic() - start, pipeline_seconds, cpu,
                      warnings=[warning] if warning else [])
