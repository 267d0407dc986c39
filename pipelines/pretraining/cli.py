"""`bert-datagen run`: options -> DatagenConfig -> the Beam pipeline -> a dataset directory."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

import click

from bert_datagen.cli.plumbing import FiniteFloat, Int, refuse_unused_options
from bert_datagen.contract.buckets import check_output_bucket
from bert_datagen.datagen.config import (
    DEFAULT_NOTNEXT_POOL_TOKENS,
    INPUT_FORMATS,
    NOTNEXT_POOL_TOKENS_RANGE,
    READ_CHUNK_MB_RANGE,
    TARGET_SHARD_MB_RANGE,
    TEXT_LAYOUTS,
    DatagenConfig,
)
from bert_datagen.datagen.masking_units import masking_units
from bert_datagen.datagen.record_layout import MASKINGS, OBJECTIVES
from bert_datagen.pipelines.beam.options import (
    PASS_THROUGH_SETTINGS,
    dataset_options,
    driver_errors,
    runner_options_of,
    summary_lines,
    usage_errors,
)

if TYPE_CHECKING:
    from bert_datagen.contract.manifest import Manifest


def parse_mask_ratios(text: str) -> tuple[float, float, float]:
    try:
        values = tuple(float(x) for x in text.split(","))
    except ValueError as e:
        raise click.BadParameter(f"{text!r}: expected three numbers like 0.8,0.1,0.1") from e
    if len(values) != 3:
        raise click.BadParameter(f"{text!r}: expected three numbers (mask, keep, random)")
    return values  # type: ignore[return-value]


def _unused_options(objective: str, input_format: str, packing: bool = False,
                    num_shards: int | None = None, eval_fraction: float = 0.0) -> dict[str, str]:
    """The options a run with these settings would ignore, and why."""
    unused = {}
    if num_shards is not None and eval_fraction == 0:
        unused["target_shard_mb"] = ("--num-shards fixes the train shards, and without --eval-fraction "
                                     "there is no eval split for it to size")
    if input_format == "sentences":
        unused["sentence_splitter"] = "--input-format sentences gives the sentences (one a line): none is split"
    if input_format == "text":
        unused["read_chunk_mb"] = ("--input-format text files are read whole (only jsonl, sentences and "
                                   "wikiextractor files are read in byte ranges)")
    if not packing:
        unused["max_sequences_per_row"] = "only --packing puts several sequences in one row"
    if objective != "nsp":
        unused["short_seq_prob"] = (f"--objective {objective} packs whole sentences up to --max-seq-length; "
                                    "only --objective nsp draws short targets")
    if input_format != "jsonl":
        unused["text_field"] = f"--input-format {input_format} has no fields (only jsonl does)"
    if input_format != "text":
        unused["text_layout"] = f"--input-format {input_format} has one layout (only text has several)"
    return unused


def summary_table(manifest: Manifest, wall_seconds: float, cpu_seconds: dict[str, float] | None = None) -> str:
    totals = manifest.totals
    rows = [
        ("input files", f"{manifest.input['files']:,}"),
        ("input MB", f"{manifest.input['bytes'] / 1e6:,.2f}"),
        ("documents", f"{totals['documents']:,}"),
        ("duplicate documents", f"{totals['duplicate_documents']:,}"),
        ("dropped documents", f"{totals['dropped_documents']:,}"),
        ("decode errors", f"{totals['decode_errors']:,}"),
        ("sentences", f"{totals['sentences']:,}"),
        ("tokens", f"{totals['tokens']:,}"),
        ("instances", f"{totals['instances']:,}"),
    ]
    config = manifest.config
    if config.get("objective", "nsp") == "nsp":
        rows.append(("NotNext fraction", f"{totals['notnext_fraction']:.4f}"))
    else:
        rows.append(("objective", f"{config['objective']} (no NSP)"))
    if config.get("masking", "static") == "dynamic":
        rows.append(("masking", "dynamic (unmasked records; the trainer masks them)"))
    else:
        rows.append(("masked tokens", f"{totals['masked_tokens']:,}"))
    if isinstance(config.get("word_segmenter"), dict):
        seg = config["word_segmenter"]
        rows.append(("word segmenter", f"{seg['name']} {seg['version']}: {totals.get('segmented_sentences', 0):,} "
                                       f"sentences segmented, {totals.get('segmenter_unaligned_sentences', 0):,} "
                                       "left unsegmented (words cut inside a WordPiece word)"))
    for split, info in manifest.splits.items():
        rows.append((f"{split} shards / records / MB",
                     f"{len(info.shards)} / {info.records:,} / {info.bytes / 1e6:,.2f}"))
    rate = totals["instances"] / wall_seconds if wall_seconds > 0 else 0.0
    rows += [("wall seconds", f"{wall_seconds:,.1f}"), ("instances/s", f"{rate:,.0f}")]
    if cpu_seconds:
        rows.append(("CPU seconds in tasks", ", ".join(f"{k} {v:,.1f}" for k, v in cpu_seconds.items())))
    rows.append(("input fingerprint", manifest.input["fingerprint"][:16] + "..."))
    return summary_lines(rows)


@click.command(
    "run",
    context_settings=PASS_THROUGH_SETTINGS,
    epilog="Any other --name=value option is passed to Beam's PipelineOptions "
    "(e.g. --direct_num_workers=2, --project, --region, --temp_location).",
)
@click.option("--input", "inputs", multiple=True, required=True, metavar="PATTERN",
              help="Input file or glob (local or any Beam filesystem, e.g. gs://); repeatable. .gz/.bz2 by extension.")
@dataset_options
@click.option("--input-format", type=click.Choice(INPUT_FORMATS), default="text", show_default=True)
@click.option("--text-layout", type=click.Choice(TEXT_LAYOUTS), default="auto", show_default=True,
              help="--input-format text: auto-detect per file, or read every file as plain, book or wikitext.")
@click.option("--text-field", default="text", show_default=True, help="JSON field holding the text (jsonl).")
@click.option("--max-seq-length", type=Int(), default=128, show_default=True)
@click.option("--max-predictions-per-seq", type=Int(), default=20, show_default=True)
@click.option("--masked-lm-prob", type=FiniteFloat(), default=0.15, show_default=True)
@click.option("--short-seq-prob", type=FiniteFloat(), default=0.1, show_default=True)
@click.option("--dupe-factor", type=Int(), default=None,
              help="Masked copies of each instance, static masking only  [default: 10]")
@click.option("--random-seed", type=Int(), default=12345, show_default=True)
@click.option("--whole-word-mask", is_flag=True, default=False,
              help="Mask whole words (## pieces together); the same as --masking-unit word.")
@click.option("--masking-unit", type=click.Choice(masking_units()), default=None,
              help="token, word (whole words) or span (SpanBERT spans of whole words)  [default: token]")
@click.option("--objective", type=click.Choice(OBJECTIVES), default="nsp", show_default=True,
              help="nsp: sentence pairs with NSP labels; doc-sentences / full-sentences: packed sentences "
                   "without NSP, within / across documents.")
@click.option("--masking", type=click.Choice(MASKINGS), default="static", show_default=True,
              help="static: --dupe-factor masked copies; dynamic: one unmasked copy, masked by the trainer "
                   "anew each epoch.")
@click.option("--do-lower-case/--no-lower-case", default=True, show_default=True)
@click.option("--mask-ratios", default="0.8,0.1,0.1", show_default=True,
              help="Fractions of chosen positions that become [MASK], keep the token, get a random token.")
@click.option("--num-shards", type=Int(), default=None, help="Train shards (default: from --target-shard-mb).")
@click.option("--target-shard-mb", type=FiniteFloat(*TARGET_SHARD_MB_RANGE), default=64.0, show_default=True,
              help="Shard size target in MiB when --num-shards is not given, in [0.01, 65536] (at most "
                   "100,000 shards).")
@click.option("--eval-fraction", type=FiniteFloat(), default=0.0, show_default=True,
              help="Fraction of documents held out (by document identity) as the eval split.")
@click.option("--notnext-pool-size", type=Int(), default=10000, show_default=True,
              help="Documents per NotNext pool (the whole corpus when smaller).")
@click.option("--notnext-pool-tokens", type=Int(*NOTNEXT_POOL_TOKENS_RANGE), default=DEFAULT_NOTNEXT_POOL_TOKENS,
              show_default=True,
              help="Tokens per NotNext pool at most, in [1000, 2**40]: a pool over it is cut into pools of about "
                   "half of it, at least two documents each. Building a pool's pass holds about 28 bytes a token "
                   "of it (docs/pipeline.md, Memory).")
@click.option("--sentence-splitter", default="nupunkt", show_default=True)
@click.option("--word-segmenter", default=None, metavar="NAME",
              help="With --whole-word-mask or --masking-unit span: mask the words of this segmenter (jieba: "
                   "Chinese) whole, not single CJK characters; token ids are unchanged. Needs the [zh] extra.")
@click.option("--strict", "strict_utf8", is_flag=True, default=False, help="Fail on invalid UTF-8 instead of replacing it.")
@click.option("--read-chunk-mb", type=FiniteFloat(*READ_CHUNK_MB_RANGE), default=None,
              help="Read bigger uncompressed jsonl, sentences and wikiextractor files as byte ranges of "
                   "this size in MiB, in [0.001, 65536], one task each (never changes the output). Default: "
                   "64, or smaller where several workers share few files (4 tasks a worker, ranges of at "
                   "least 1 MB).")
@click.option("--packing", is_flag=True, default=False,
              help="Write packed rows: several whole instances per --max-seq-length row, with sequence and "
                   "position ids (docs/packing.md). Static masking only.")
@click.option("--max-sequences-per-row", type=Int(), default=3, show_default=True,
              help="With --packing: at most this many instances in one row.")
@click.option("--quiet", is_flag=True, default=False, help="No progress lines or summary table.")
@click.pass_context
def run_command(ctx: click.Context, **options) -> None:
    """Generate BERT pre-training data (MLM + NSP TFRecords, manifest.json) from raw documents.

    Variants: --objective doc-sentences|full-sentences (no NSP), --masking dynamic, --masking-unit span.
    """
    runner = runner_options_of(ctx, options)
    inputs, vocab_path, output_dir, overwrite, read_chunk_mb, quiet = (options.pop(name) for name in (
        "inputs", "vocab_path", "output_dir", "overwrite", "read_chunk_mb", "quiet"))
    refuse_unused_options(ctx, _unused_options(options["objective"], options["input_format"], options["packing"],
                                           options["num_shards"], options["eval_fraction"]))
    if options["whole_word_mask"] and options["masking_unit"] not in (None, "word"):
        raise click.BadParameter(f"--whole-word-mask is --masking-unit word, not {options['masking_unit']}",
                                 param_hint="'--whole-word-mask'")
    # Defaults that depend on other options; DatagenConfig checks the values given against them.
    options["masking_unit"] = options["masking_unit"] or "token"
    if options["dupe_factor"] is None:
        options["dupe_factor"] = 1 if options["masking"] == "dynamic" else 10
    options["mask_ratios"] = parse_mask_ratios(options["mask_ratios"])
    with usage_errors():
        config = DatagenConfig(**options)
    from bert_datagen.datagen.segmenters import SegmenterError, check_segmenter
    from bert_datagen.datagen.sentences import available_splitters

    if config.word_segmenter is not None:
        try:
            check_segmenter(config.word_segmenter)
        except SegmenterError as e:
            raise click.UsageError(str(e)) from e

    if config.sentence_splitter not in available_splitters():
        raise click.UsageError(f"--sentence-splitter {config.sentence_splitter!r} is not one of "
                               f"{', '.join(available_splitters())}")

    from bert_datagen.pipelines.pretraining.run import generate_dataset

    check_output_bucket(output_dir, "--output")  # before any work: not at the first write, naming a temp object
    with driver_errors():
        result = generate_dataset(
            config,
            inputs=list(inputs),
            vocab_path=vocab_path,
            output_dir=output_dir,
            runner=runner,
            overwrite=overwrite,
            show_progress=not quiet,
            read_chunk_mb=read_chunk_mb,
        )
    if not quiet:
        click.echo(f"bert-datagen run: wrote {result.output_dir}", err=True)
        click.echo(summary_table(result.manifest, result.wall_seconds, result.cpu_seconds), err=True)
    for warning in result.warnings:  # even with --quiet: each says what to change
        click.echo(f"warning: {warning}", err=True)
    sys.stderr.flush()
