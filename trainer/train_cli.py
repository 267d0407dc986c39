"""`bert-train pretrain` and `bert-train eval`."""

from __future__ import annotations

import json

import click

from trainer.config import MODEL_SIZES, PRECISIONS, STRATEGIES, BertConfig, ConfigError, TrainConfig


def _user_errors() -> tuple[type[Exception], ...]:
    from trainer.checkpoint import CheckpointError
    from trainer.data import DataError
    from trainer.train import TrainingError

    try:
        from contract.manifest import ManifestError
    except ImportError:  # pragma: no cover
        ManifestError = ConfigError  # noqa: N806
    return (ConfigError, DataError, CheckpointError, TrainingError, ManifestError)


@click.command("pretrain")
@click.option("--data", required=True, help="Dataset directory (manifest.json) or TFRecord glob(s), comma-separated.")
@click.option("--out", "out", required=True, help="Run directory; rerunning the same command resumes it.")
@click.option("--model", type=click.Choice(list(MODEL_SIZES)), default="tiny", show_default=True,
              help="Model size (RECIPE.md section 6). Ignored with --bert-config.")
@click.option("--bert-config", "bert_config_file", type=click.Path(exists=True, dir_okay=False),
              help="An original bert_config.json (or a Hugging Face config.json) defining the model.")
@click.option("--batch-size", type=int, default=32, show_default=True, help="Global batch: sequences per step.")
@click.option("--accumulation-steps", type=int, default=1, show_default=True,
              help="Split each step's batch into this many micro-batches (same result, less memory).")
@click.option("--steps", type=int, required=True, help="Total optimizer steps (also the end of the lr decay).")
@click.option("--learning-rate", type=float, default=1e-4, show_default=True)
@click.option("--warmup-steps", type=int, default=10000, show_default=True)
@click.option("--weight-decay", type=float, default=0.01, show_default=True)
@click.option("--seed", type=int, default=12345, show_default=True)
@click.option("--max-seq-length", type=int, help="For TFRecord globs without a manifest.")
@click.option("--max-predictions-per-seq", type=int, help="For TFRecord globs without a manifest.")
@click.option("--vocab-size", type=int, help="For TFRecord globs without a manifest (or use --bert-config).")
@click.option("--eval-data", help="Eval TFRecord glob, for --data globs without a manifest.")
@click.option("--shuffle-buffer", type=int, default=10000, show_default=True)
@click.option("--checkpoint-every", type=int, default=1000, show_default=True)
@click.option("--keep-checkpoints", type=int, default=3, show_default=True)
@click.option("--eval-every", type=int, default=0, show_default=True, help="0: evaluate at the end only.")
@click.option("--eval-batches", type=int, default=20, show_default=True)
@click.option("--log-every", type=int, default=50, show_default=True)
@click.option("--strategy", type=click.Choice(STRATEGIES), default="auto", show_default=True)
@click.option("--tpu", default=None, help="TPU name or address for --strategy tpu.")
@click.option("--precision", type=click.Choice(PRECISIONS), default="float32", show_default=True)
@click.option("--jit/--no-jit", default=False, show_default=True, help="Compile the step with XLA.")
@click.option("--init-from", help="Phase 2: start from the weights of a run (its latest checkpoint) or checkpoint.")
@click.option("--init-checkpoint", help="Start from an original TF1 checkpoint or a Hugging Face directory.")
def pretrain_command(bert_config_file, **options) -> None:
    """Pre-train BERT (MLM + NSP) from a dataset; resumes RUN when it has checkpoints."""
    errors = _user_errors()
    try:
        if options.get("init_checkpoint"):
            from trainer.convert import init_checkpoint_config

            # The checkpoint fixes the model: --bert-config, its bert_config.json, or HF config.json.
            options["bert_config"] = BertConfig.from_dict(
                init_checkpoint_config(options["init_checkpoint"], bert_config_file)).to_dict()
        elif bert_config_file:
            options["bert_config"] = BertConfig.from_json_file(bert_config_file).to_dict()
        cfg = TrainConfig(**options)
        from trainer.train import pretrain

        result = pretrain(cfg, log=lambda line: click.echo(line))
    except errors as exc:
        raise click.ClickException(str(exc)) from exc
    click.echo(f"run directory: {result['run_dir']}")


@click.command("eval")
@click.option("--run", "run", default=None, help="Run directory (latest checkpoint) or a checkpoint directory.")
@click.option("--init-checkpoint", default=None,
              help="Instead of --run: an original TF1 checkpoint (PATH/bert_model.ckpt) or a Hugging Face dir.")
@click.option("--bert-config", "bert_config_file", type=click.Path(exists=True, dir_okay=False),
              help="bert_config.json of --init-checkpoint (default: the one beside it).")
@click.option("--data", required=True, help="Dataset directory (manifest.json) or TFRecord glob(s).")
@click.option("--split", type=click.Choice(["eval", "train"]), default="eval", show_default=True)
@click.option("--batch-size", type=int, default=32, show_default=True)
@click.option("--max-batches", type=int, default=None, help="Default: the whole split.")
@click.option("--max-seq-length", type=int, help="For TFRecord globs without a manifest.")
@click.option("--max-predictions-per-seq", type=int, help="For TFRecord globs without a manifest.")
@click.option("--json", "as_json", is_flag=True, help="Print the figures as JSON.")
def eval_command(run, init_checkpoint, bert_config_file, data, split, batch_size, max_batches, max_seq_length,
                 max_predictions_per_seq, as_json) -> None:
    """MLM/NSP loss and accuracy of a run's latest checkpoint on a dataset split."""
    errors = _user_errors()
    try:
        from trainer.train import enable_determinism, evaluate_run

        enable_determinism(0)
        if (run is None) == (init_checkpoint is None):
            raise ConfigError("pass exactly one of --run and --init-checkpoint")
        if init_checkpoint:
            from trainer.convert import evaluate_external

            result = evaluate_external(init_checkpoint, data, bert_config_file, batch_size=batch_size,
                                       max_batches=max_batches, split=split, max_seq_length=max_seq_length,
                                       max_predictions_per_seq=max_predictions_per_seq)
        else:
            result = evaluate_run(run, data, batch_size=batch_size, max_batches=max_batches, split=split,
                                  max_seq_length=max_seq_length, max_predictions_per_seq=max_predictions_per_seq)
    except errors as exc:
        raise click.ClickException(str(exc)) from exc
    if as_json:
        click.echo(json.dumps(result, indent=2, sort_keys=True))
        return
    step = "" if result.get("step") is None else f" (step {result['step']})"
    click.echo(f"checkpoint {result['checkpoint']}{step}, {split} split, "
               f"{int(result['examples'])} sequences")
    click.echo(f"  mlm_loss {result['mlm_loss']:.4f}  mlm_accuracy {result['mlm_accuracy']:.4f}")
    click.echo(f"  nsp_loss {result['nsp_loss']:.4f}  nsp_accuracy {result['nsp_accuracy']:.4f}")
    click.echo(f"  loss {result['loss']:.4f}")
