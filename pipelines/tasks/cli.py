"""`bert-datagen task`: options -> TaskConfig -> the task pipeline -> a task dataset directory."""

from __future__ import annotations

import sys

import click

from bert_datagen.cli.plumbing import FiniteFloat, Int, refuse_unused_options
from bert_datagen.contract.buckets import check_output_bucket
from bert_datagen.datagen.config import TARGET_SHARD_MB_RANGE
from bert_datagen.datagen.tasks.config import (
    KINDS,
    SCHEMES,
    SPAN,
    SPAN_KINDS,
    TAGGING,
    TAGGING_KINDS,
    TaskConfig,
)
from bert_datagen.pipelines.beam.options import (
    PASS_THROUGH_SETTINGS,
    dataset_options,
    driver_errors,
    runner_options_of,
    summary_lines,
    usage_errors,
)

# Options that only one type of task reads: (the type, the kinds that have it).
TYPE_OPTIONS = {"doc_stride": (SPAN, SPAN_KINDS), "max_query_length": (SPAN, SPAN_KINDS),
                "token_column": (TAGGING, TAGGING_KINDS), "tag_column": (TAGGING, TAGGING_KINDS),
                "scheme": (TAGGING, TAGGING_KINDS)}


def parse_labels(text: str | None) -> tuple[str, ...] | None:
    if text is None:
        return None
    return tuple(label.strip() for label in text.split(","))


# Unspaced SQuAD-layout data (CMRC 2018): its contexts and misaligned answers, counted (squad_read.py).
_SQUAD_COUNTS = (("character_word_contexts", "contexts split into characters"),
                 ("reanchored_answers", "answers re-anchored"),
                 ("unanchored_skipped", "questions skipped (answer not at its offset)"),
                 ("unanchored_answers", "answers scored by text only (not at their offset)"))


def summary_table(result) -> str:
    manifest = result.manifest
    rows = [("task", f"{manifest.task['kind']} ({manifest.task['type']})"),
            ("input files / MB", f"{manifest.input['files']} / {manifest.input['bytes'] / 1e6:,.2f}")]
    for split, info in manifest.splits.items():
        counts = info.counts
        rows.append((f"{split} ({info.mode})", f"{counts.get('examples', 0):,} examples, {info.records:,} "
                     f"records, {len(info.shards)} shard(s), {counts.get('truncated_examples', 0):,} truncated"
                     + (f", {counts['skipped_answers']:,} skipped answers" if counts.get("skipped_answers") else "")
                     + "".join(f", {counts[key]:,} {what}" for key, what in _SQUAD_COUNTS if counts.get(key))))
    rows.append(("wall seconds", f"{result.wall_seconds:,.1f} (pipeline {result.pipeline_seconds:,.1f})"))
    if result.cpu_seconds:
        rows.append(("CPU seconds in tasks", ", ".join(f"{k} {v:,.2f}" for k, v in result.cpu_seconds.items())))
    return summary_lines(rows)


@click.command(
    "task",
    context_settings=PASS_THROUGH_SETTINGS,
    epilog="Any other --name=value option is passed to Beam's PipelineOptions (e.g. --direct_num_workers=2).",
)
@click.option("--task", "kind", required=True, type=click.Choice(KINDS), metavar="KIND",
              help=f"Task kind: {', '.join(KINDS)}.")
@click.option("--split", "splits", multiple=True, required=True, metavar="NAME=PATTERN",
              help="A split and its file(s); repeatable. Training splits (see --train-splits) are shuffled "
                   "(seeded) and, for SQuAD, labelled; every other split keeps its input order, to predict.")
@click.option("--train-splits", default=None, metavar="NAME,...",
              help="The splits written for training (bert-train finetune --train-split NAME)  [default: train]")
@dataset_options
@click.option("--max-seq-length", type=Int(), default=None, help="Default 384 for squad/squad2, else 128.")
@click.option("--do-lower-case/--no-lower-case", default=True, show_default=True)
@click.option("--text-a", default=None, help="tsv/csv/jsonl: column name, 0-based index or field of text A.")
@click.option("--text-b", default=None, help="tsv/csv/jsonl: the same for text B (pair tasks).")
@click.option("--label", default=None, help="tsv/csv/jsonl: the same for the label.")
@click.option("--header/--no-header", default=None, help="tsv/csv: the first line names the columns (default: yes).")
@click.option("--labels", default=None, metavar="L1,L2,...",
              help="Fixed label order (default: sorted labels of the first split; GLUE: the official list).")
@click.option("--regression", is_flag=True, default=False, help="tsv/csv/jsonl: the label is a number.")
@click.option("--doc-stride", type=Int(), default=128, show_default=True, help="squad: window stride in tokens.")
@click.option("--max-query-length", type=Int(), default=64, show_default=True, help="squad: question tokens kept.")
@click.option("--token-column", type=Int(), default=0, show_default=True, help="conll: column of the token.")
@click.option("--tag-column", type=Int(), default=-1, show_default=True, help="conll: column of the tag.")
@click.option("--scheme", type=click.Choice(SCHEMES), default="iob2", show_default=True,
              help="conll: tag scheme (iob1 is converted to iob2).")
@click.option("--random-seed", type=Int(), default=12345, show_default=True, help="Order of the train split.")
@click.option("--num-shards", type=Int(), default=None, help="Shards per split (default: from --target-shard-mb).")
@click.option("--target-shard-mb", type=FiniteFloat(*TARGET_SHARD_MB_RANGE), default=64.0, show_default=True,
              help="Shard size target in MiB, in [0.01, 65536] (at most 100,000 shards a split).")
@click.option("--quiet", is_flag=True, default=False, help="No summary table.")
@click.pass_context
def task_command(ctx: click.Context, **options) -> None:
    """Turn labelled task files (GLUE, SQuAD, CoNLL, any TSV/CSV/JSONL) into a fine-tuning dataset."""
    runner = runner_options_of(ctx, options)
    splits, vocab_path, output_dir, overwrite, quiet = (options.pop(name) for name in (
        "splits", "vocab_path", "output_dir", "overwrite", "quiet"))
    task_type = TaskConfig.type_of(options["kind"], options["regression"])
    refuse_unused_options(ctx, {name: f"--task {options['kind']} does not read it (only {', '.join(kinds)} do)"
                                for name, (wanted, kinds) in TYPE_OPTIONS.items() if task_type != wanted})
    if options["num_shards"] is not None:
        refuse_unused_options(ctx, {"target_shard_mb": "--num-shards fixes the shards of every split"})
    options["labels"] = parse_labels(options["labels"])
    if options["train_splits"] is None:
        del options["train_splits"]  # the config's default
    else:
        options["train_splits"] = parse_labels(options["train_splits"])
    with usage_errors():
        config = TaskConfig(**options)
    from bert_datagen.pipelines.beam.errors import DatagenError
    from bert_datagen.pipelines.tasks.graph import parse_split

    try:
        names = [parse_split(option)[0] for option in splits]
    except DatagenError as e:
        raise click.UsageError(str(e)) from e
    with usage_errors():
        config.check_split_names(names)

    from bert_datagen.pipelines.tasks.run import generate_task_dataset

    check_output_bucket(output_dir, "--output")  # before any work: not at the first write, naming a temp object
    with driver_errors():
        result = generate_task_dataset(config, splits=list(splits), vocab_path=vocab_path, output_dir=output_dir,
                                       runner=runner, overwrite=overwrite)
    if not quiet:
        click.echo(f"bert-datagen task: wrote {result.output_dir}", err=True)
        click.echo(summary_table(result), err=True)
    for warning in result.warnings:  # even with --quiet, as `run` does: each says what to change
        click.echo(f"warning: {warning}", err=True)
    sys.stderr.flush()
