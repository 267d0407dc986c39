"""`bert-train export`: a run's checkpoint as Google's TF1 layout or a Hugging Face model directory."""

from __future__ import annotations

from pathlib import Path

import click

from bert_datagen.cli.plumbing import refuse_unused_options
from bert_datagen.contract.fs import is_remote
from bert_datagen.trainer.backends.option import use_backend
from bert_datagen.trainer.errors import TrainerError
from bert_datagen.trainer.runtime.rundir import refuse_inside_dataset

FORMATS = ("tf1", "hf")  # bert_datagen.trainer.interop.export.FORMATS; spelled here so --help does not import TensorFlow


@click.command("export")
@click.option("--run", "run", required=True,
              help="Run directory (its latest checkpoint) or one RUN/ckpt-NNNNNNNN directory.")
@click.option("--format", "fmt", type=click.Choice(FORMATS), required=True,
              help="tf1: bert_model.ckpt + bert_config.json + vocab.txt (Google's layout); "
                   "hf: config.json + model.safetensors + tokenizer files for BertForPreTraining (fine-tuned "
                   "runs: BertForSequenceClassification / QuestionAnswering / TokenClassification).")
@click.option("--out", required=True, help="Output directory (written atomically).")
@click.option("--vocab", default=None,
              help="vocab.txt to ship (default: the one named by the run's dataset manifest).")
@click.option("--do-lower-case/--no-do-lower-case", default=None,
              help="hf: tokenizer casing (default: from the dataset manifest).")
@click.option("--overwrite", is_flag=True, help="Replace an earlier export in --out (only an export of ours).")
@click.pass_context
def export_command(ctx: click.Context, run, fmt, out, vocab, do_lower_case, overwrite) -> None:
    """Export a run's checkpoint for the original TF1 code or for Hugging Face transformers."""
    use_backend(None)  # a contradicting or uninstalled KERAS_BACKEND is refused here too
    if fmt == "tf1":
        refuse_unused_options(ctx, {"do_lower_case": "the tf1 layout has no tokenizer settings (the original code "
                                                     "takes --do_lower_case itself)"})
    try:
        if not is_remote(out):  # a dataset is another command's input: nothing of ours is written in it
            refuse_inside_dataset(Path(out))
        from bert_datagen.trainer.interop.export import ExportConfig, export_run
        from bert_datagen.trainer.interop.finetune_export import export_finetuned, is_finetune_run

        cfg = ExportConfig(run=run, format=fmt, out=out, vocab=vocab, do_lower_case=do_lower_case,
                           overwrite=overwrite)
        if is_finetune_run(run):  # a task head: BertFor<Task> / the original fine-tuning names
            written, ckpt = export_finetuned(run, fmt, out, vocab, do_lower_case, overwrite)
        else:
            written, ckpt = export_run(cfg)
    except TrainerError as exc:
        raise click.ClickException(str(exc)) from exc
    click.echo(f"exported {ckpt} as {fmt} to {written}")
