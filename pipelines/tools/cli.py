"""`bert-datagen verify | inspect | stats | diff`: look at and prove frozen datasets."""

from __future__ import annotations

import contextlib
import json
import sys

import click

from bert_datagen.cli.plumbing import Int, refuse_unused_options
from bert_datagen.contract.dataset import Dataset, DatasetError, open_dataset
from bert_datagen.contract.features import TASK
from bert_datagen.contract.manifest import ManifestError
from bert_datagen.datagen.record_rules import MAX_PROBLEMS_PER_SHARD
from bert_datagen.datagen.tfrecord import RecordError
from bert_datagen.pipelines.beam import fsio
from bert_datagen.pipelines.tools.diff import diff_datasets, format_diff
from bert_datagen.pipelines.tools.kinds import KindTools, tools_for


def _original_data_options(f):
    """Options for TFRecords made without a manifest (e.g. by the original tool)."""
    f = click.option("--vocab", "vocab_path", default=None,
                     help="Vocab file (one token per line). Needed without a manifest; with one, "
                          "overrides DIR/vocab.txt.")(f)
    f = click.option("--max-predictions-per-seq", type=Int(1), default=None,
                     help="Record shape for data without a manifest.")(f)
    f = click.option("--max-seq-length", type=Int(5), default=None,
                     help="Record shape for data without a manifest.")(f)
    return f


def _open(target: str, max_seq_length, max_predictions_per_seq, vocab_path,
          original_data: bool = True) -> tuple[Dataset, KindTools]:
    """The dataset and, looked up once by its kind, what each command does with it; ``original_data``:
    whether the command has the options that describe TFRecords without a manifest."""
    try:
        ds = open_dataset(target, fsio.BEAM_FS, max_seq_length=max_seq_length,
                          max_predictions_per_seq=max_predictions_per_seq, vocab_path=vocab_path,
                          original_data=original_data)
        return ds, tools_for(ds.kind)
    except (DatasetError, ManifestError) as e:
        raise click.ClickException(str(e)) from e


_workers = click.option("--workers", type=Int(1), default=None,
                        help="Processes reading shards in parallel (default: all cores).")


@click.command("verify")
@click.argument("target")
@_original_data_options
@_workers
@click.option("--max-problems", type=Int(1), default=MAX_PROBLEMS_PER_SHARD,
              show_default=True, help="Problems listed per shard (all are counted).")
@click.option("--checksums-only", is_flag=True,
              help="Check sha256, sizes, framing, CRCs and record counts, but do not parse the records "
                   "(several times faster).")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
def verify_command(target, max_seq_length, max_predictions_per_seq, vocab_path, workers, max_problems,
                   checksums_only, as_json) -> None:
    """Prove that TARGET is exactly the dataset its manifest.json describes.

    Recomputes every shard's sha256, size and record count, checks TFRecord framing and CRCs, parses
    every record against the feature spec and checks the BERT layout and masking invariants. Exit
    status 0 when everything holds, 1 otherwise (the problems name shard and record).

    TARGET is a dataset directory (local or gs://), or, with --max-seq-length,
    --max-predictions-per-seq and --vocab, a glob of TFRecord files without a manifest.
    """
    ds, tools = _open(target, max_seq_length, max_predictions_per_seq, vocab_path)
    report = tools.verify(ds, workers=workers, max_problems=max_problems, check_records=not checksums_only)
    mb = report.bytes / 1e6
    if as_json:
        click.echo(json.dumps({
            "ok": report.ok, "problem_count": report.problem_count, "problems": report.problems,
            "records": report.records, "bytes": report.bytes, "seconds": round(report.seconds, 3),
            "manifest": report.has_manifest, "records_checked": not checksums_only,
            "shards": [{"path": s.ref.name, "records": s.records, "bytes": s.bytes, "sha256": s.sha256,
                        "problems": s.problem_count} for s in report.shards],
        }, indent=2))
    else:
        if not report.has_manifest:
            click.echo("no manifest: checked framing, CRCs and every record; the sha256 below are computed, "
                       "not compared")
            for s in report.shards:
                click.echo(f"  {s.sha256}  {s.records:>9} records  {s.ref.name}")
        rate = mb / report.seconds if report.seconds > 0 else 0.0
        summary = (f"{len(report.shards)} shards, {report.records} records, {mb:.1f} MB "
                   f"in {report.seconds:.1f} s ({rate:.0f} MB/s)")
        if checksums_only:
            summary += "; records not parsed (--checksums-only)"
        if report.ok:
            click.echo(f"OK: {target}: {summary}")
        else:
            click.echo(f"FAILED: {target}: {report.problem_count} problem(s); {summary}")
            for p in report.problems:
                click.echo(f"  {p}")
    sys.exit(0 if report.ok else 1)


@click.command("inspect")
@click.argument("target")
@click.option("--split", default=None, help="Split to read (default: the first, usually train).")
@click.option("--shard", type=Int(0), default=0, show_default=True,
              help="Shard number within the split.")
@click.option("--index", type=Int(0), default=0, show_default=True,
              help="First record (0-based, within the shard).")
@click.option("-n", "count", type=Int(1), default=5, show_default=True, help="Records to show.")
@_original_data_options
@click.option("--words", is_flag=True, help="Join ## word pieces into words (masked pieces keep their marker).")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per record.")
@click.pass_context
def inspect_command(ctx: click.Context, target, split, shard, index, count, max_seq_length, max_predictions_per_seq,
                    vocab_path, words, as_json) -> None:
    """Decode records back to text.

    Shows segment A and B, each masked position as {MASK:label}, {kept:label} or
    {random shown:label}, and the NSP label (0 IsNext, 1 NotNext).
    """
    if as_json:
        refuse_unused_options(ctx, {"words": "--json shows each record's tokens as they are"})
    ds, tools = _open(target, max_seq_length, max_predictions_per_seq, vocab_path)
    if ds.kind == TASK:
        refuse_unused_options(ctx, {"words": "a task dataset's records are shown as their word pieces "
                                             "(--words joins those of pre-training records)"})
    try:
        ref, views, problems = tools.inspect(ds, split=split, shard=shard, index=index, count=count)
    except (DatasetError, RecordError) as e:
        raise click.ClickException(str(e)) from e
    if not views and not problems:
        raise click.ClickException(f"{ref.name}: no record at index {index}")
    for v in views:
        click.echo(json.dumps({"shard": ref.name, **v}, ensure_ascii=False) if as_json
                   else tools.format_record(v, ref.name, words) + "\n")
    for p in problems:
        click.echo(f"problem: {p}", err=True)
    if problems:
        sys.exit(1)


@click.command("stats")
@click.argument("target")
@click.option("--split", default=None, help="Only this split (default: all).")
@click.option("--json", "as_json", is_flag=True, help="Print the figures as JSON.")
@click.option("--plot", "plot_path", default=None, metavar="FILE.png",
              help="Write histograms to a PNG (needs matplotlib: the `plot` extra); an existing file only with "
                   "--overwrite.")
@click.option("--overwrite", is_flag=True, default=False, help="Replace an existing --plot file.")
@click.option("--top", type=Int(1), default=20, show_default=True,
              help="Most frequent tokens to list.")
@_original_data_options
@_workers
def stats_command(target, split, as_json, plot_path, overwrite, top, max_seq_length, max_predictions_per_seq,
                  vocab_path, workers) -> None:
    """Lengths, masking, NotNext share, padding, [UNK] rate and most frequent tokens of a dataset."""
    if overwrite and not plot_path:
        raise click.UsageError("--overwrite applies to the --plot file; there is none without --plot")
    lock = contextlib.nullcontext()
    if plot_path:
        from bert_datagen.pipelines.beam.outputs import OutputError, check_file_output, lock_output

        try:
            check_file_output(plot_path, "--plot", [target], overwrite)
            lock = lock_output(plot_path, "--plot")
        except OutputError as e:
            raise click.ClickException(str(e)) from e
    with lock:
        _stats(target, split, as_json, plot_path, overwrite, top, max_seq_length, max_predictions_per_seq, vocab_path,
               workers)


def _stats(target, split, as_json, plot_path, overwrite, top, max_seq_length, max_predictions_per_seq, vocab_path,
           workers) -> None:
    from bert_datagen.pipelines.beam.outputs import OutputError, check_file_output

    ds, tools = _open(target, max_seq_length, max_predictions_per_seq, vocab_path)
    if ds.kind == TASK:
        why = "a task dataset's figures (per split, read as one batch) have no token counts or worker pool"
        refuse_unused_options(click.get_current_context(), {"top": why, "workers": why})
    try:
        st = tools.stats(ds, split=split, workers=workers, top=top)
        if plot_path:
            check_file_output(plot_path, "--plot", [target], overwrite)
            tools.plot_stats(st, plot_path)
    except (DatasetError, OutputError) as e:
        raise click.ClickException(str(e)) from e
    if as_json:
        click.echo(json.dumps(st, indent=2, ensure_ascii=False))
    else:
        click.echo(tools.format_stats(st))
        if plot_path:
            click.echo(f"histograms written to {plot_path}")
    for p in st["problems"]:
        click.echo(f"problem: {p}", err=True)
    if st["problems"]:
        raise click.ClickException(f"{target}: {len(st['problems'])} problem(s) while reading the records "
                                   "(listed above); the figures leave out what could not be read; run "
                                   f"`bert-datagen verify {target}` for the full check")


@click.command("diff")
@click.argument("a")
@click.argument("b")
@click.option("--no-records", is_flag=True, help="Compare manifests only; do not look for the first "
                                                  "differing record.")
def diff_command(a, b, no_records) -> None:
    """Are datasets A and B the same? Exit 0 when identical, 1 when different.

    Compares the manifests (config, vocab, input fingerprint, counts, shard checksums) and shows the
    first differing record of both side by side. created_by, tool and input.patterns, .files and .bytes
    (where the documents came from) are listed but do not make datasets different. diff trusts the
    manifests' checksums: run verify to prove the files match them.
    """
    (da, _), (db, _) = (_open(d, None, None, None, original_data=False) for d in (a, b))
    try:
        report = diff_datasets(da, db, records=not no_records)
    except DatasetError as e:
        raise click.ClickException(str(e)) from e
    click.echo(format_diff(report, a, b))
    sys.exit(0 if report.identical else 1)
