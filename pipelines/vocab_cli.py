"""`bert-datagen vocab`: train a WordPiece vocab.txt on the documents `bert-datagen run` would read."""

from __future__ import annotations

import time
from collections.abc import Iterator

import click

from bert_datagen.cli.plumbing import Int, given, refuse_unused_options
from bert_datagen.contract.bounds import INT32_MAX
from bert_datagen.contract.vocab_io import write_vocab
from bert_datagen.datagen.config import INPUT_FORMATS
from bert_datagen.pipelines.beam import fsio
from bert_datagen.vocab.train import LAYOUTS, resolve_layout, train_vocab
from bert_datagen.vocab.vocab_file import VocabError


def iter_corpus_texts(patterns: list[str], config, stats: dict[str, int]) -> Iterator[str]:
    """Paragraphs (or given sentences) of every document, read exactly as `bert-datagen run` reads them."""
    from bert_datagen.datagen.readers import read_documents

    for info in fsio.match_files(patterns):
        data = fsio.read_bytes(info.path)
        stats["files"] = stats.get("files", 0) + 1
        stats["bytes"] = stats.get("bytes", 0) + len(data)
        for doc in read_documents(info.path, data, config, stats):
            stats["documents"] = stats.get("documents", 0) + 1
            yield from (doc.sentences if doc.sentences is not None else doc.paragraphs or [])


@click.command("vocab")
@click.option("--input", "inputs", multiple=True, required=True, metavar="PATTERN",
              help="Input file or glob (local or any Beam filesystem, e.g. gs://); repeatable. .gz/.bz2 by extension.")
@click.option("--output", required=True, help="vocab.txt to write (atomically); an existing file only with --overwrite.")
@click.option("--overwrite", is_flag=True, default=False, help="Replace an existing --output file.")
@click.option("--vocab-size", type=Int(6, INT32_MAX), default=30522, show_default=True,
              help="Total ids, reserved tokens included (Google's English vocab: 30522).")
@click.option("--uncased/--cased", "do_lower_case", default=True, show_default=True,
              help="Lowercase and strip accents (uncased) or keep case and accents (cased).")
@click.option("--input-format", type=click.Choice(INPUT_FORMATS),
              default="text", show_default=True)
@click.option("--text-field", default="text", show_default=True, help="JSON field holding the text (jsonl).")
@click.option("--num-unused", type=Int(0), default=994, show_default=True,
              help="[unusedN] slots (Google: 994, of which 99 sit before [UNK]). --layout auto's compact "
                   "layout has none unless this is given.")
@click.option("--layout", type=click.Choice(LAYOUTS), default="auto", show_default=True,
              help="Reserved-id layout: google ([UNK]=100), compact ([PAD],[UNK],[CLS],[SEP],[MASK] = 0..4), "
                   "auto (google when the vocab has room for 1,000 learned pieces after the reserved ids), or "
                   "google-chinese (Google's Chinese release: [unused1..99], [UNK]=100, <S>, <T>; character-"
                   "level for CJK: every ideograph seen --min-frequency times).")
@click.option("--min-frequency", type=Int(1), default=2, show_default=True,
              help="Pieces seen fewer times are not learned.")
@click.option("--limit-alphabet", type=Int(1), default=1000, show_default=True,
              help="Most single characters kept in the initial alphabet; characters of scripts written without "
                   "spaces (CJK, kana, Hangul, Thai, ...) seen --min-frequency times are kept besides.")
@click.option("--strict", is_flag=True, default=False, help="Fail on invalid UTF-8 instead of replacing it.")
@click.pass_context
def vocab_command(ctx: click.Context, inputs, output, overwrite, vocab_size, do_lower_case, input_format, text_field,
                  num_unused, layout, min_frequency, limit_alphabet, strict) -> None:
    """Train a WordPiece vocabulary in Google's vocab.txt layout."""
    if input_format != "jsonl":
        refuse_unused_options(ctx, {"text_field": f"--input-format {input_format} has no fields (only jsonl does)"})
    if layout == "auto" and given(ctx, "num_unused") and resolve_layout(layout, vocab_size, num_unused)[0] == "compact":
        # auto's compact layout has no [unused] slots; slots the user asked for are kept.
        layout = "compact"
    from bert_datagen.contract.buckets import check_output_bucket
    from bert_datagen.datagen.config import ConfigError, DatagenConfig
    from bert_datagen.datagen.readers import InputError
    from bert_datagen.pipelines.beam.fsio import InputNotFoundError, match_files
    from bert_datagen.pipelines.beam.outputs import OutputError, check_file_output, lock_output

    try:
        config = DatagenConfig(input_format=input_format, text_field=text_field,
                               do_lower_case=do_lower_case, strict_utf8=strict)
        resolve_layout(layout, vocab_size, num_unused)  # the options against each other, before any work
    except (ConfigError, VocabError) as e:
        raise click.UsageError(str(e)) from e
    check_output_bucket(output, "--output")  # before training: not at the write, naming a temp object
    try:
        sources = [f.path for f in match_files(list(inputs))]
        check_file_output(output, "--output", sources, overwrite)
        lock = lock_output(output, "--output")
    except (OutputError, InputNotFoundError) as e:
        raise click.ClickException(str(e)) from e
    stats: dict[str, int] = {}
    start = time.perf_counter()
    try:
        with lock:
            tokens = train_vocab(iter_corpus_texts(list(inputs), config, stats), vocab_size, do_lower_case,
                                 num_unused=num_unused, layout=layout, min_frequency=min_frequency,
                                 limit_alphabet=limit_alphabet)
            if stats.get("documents", 0) == 0:
                raise click.ClickException(f"no documents found in {', '.join(inputs)} (format {input_format})")
            check_file_output(output, "--output", sources, overwrite)
            vocab = write_vocab(tokens, output, fsio.BEAM_FS)
    except (InputError, fsio.InputNotFoundError, VocabError, OutputError) as e:
        raise click.ClickException(str(e)) from e
    seconds = time.perf_counter() - start
    click.echo(f"wrote {output}: {vocab.size:,} tokens (requested {vocab_size:,}), sha256 {vocab.sha256}")
    click.echo(f"  {stats.get('files', 0):,} files, {stats.get('bytes', 0) / 1e6:,.2f} MB, "
               f"{stats.get('documents', 0):,} documents, {seconds:,.1f} s")
    if vocab.size < vocab_size:
        singles = sum(1 for t in vocab.tokens if len(t.removeprefix("##")) == 1)
        click.echo(f"  {vocab_size - vocab.size:,} short of --vocab-size: no more pieces occur at least "
                   f"--min-frequency {min_frequency} times in this corpus ({singles:,} of the tokens are single "
                   "characters; CJK ideographs are words of their own, so they are never merged)")
    if stats.get("decode_errors"):
        click.echo(f"  warning: {stats['decode_errors']:,} invalid UTF-8 sequences replaced by U+FFFD", err=True)
