"""`bert-train pretrain`."""

from __future__ import annotations

import re

import click

from bert_datagen.cli.plumbing import FiniteFloat, Int, refuse_unused_options
from bert_datagen.contract.bounds import INT32_MAX, MAX_SEED, MAX_TIMEOUT_S
from bert_datagen.trainer.backends.option import backend_option, use_backend
from bert_datagen.trainer.errors import TrainConfigError, TrainerError
from bert_datagen.trainer.model.config import MODEL_SIZES, BertConfig
from bert_datagen.trainer.pretrain.config import TrainConfig
from bert_datagen.trainer.runtime.cluster import DEFAULT_TIMEOUT, join_for
from bert_datagen.trainer.runtime.config import OPTIMIZERS, PRECISIONS, STRATEGIES
from bert_datagen.trainer.runtime.rundir import PRETRAINING


def _train_config(options: dict) -> TrainConfig:
    """The run's config; a value no run can take is a usage error naming the option (exit 2)."""
    try:
        return TrainConfig(**options)
    except TrainConfigError as exc:
        message = str(exc)
        # A message that already names options (--x) is the CLI's wording; rewriting would mangle it.
        for name in sorted(options, key=len, reverse=True) if "--" not in message else ():
            message = re.sub(rf"(?<![-\w]){name}\b", "--" + name.replace("_", "-"), message)
        raise click.UsageError(message) from exc


def _mix_options(options: dict) -> None:
    """--mix and --weights as the config takes them (a usage error unless both or neither)."""
    options["mix"] = list(options["mix"])
    if bool(options["mix"]) != (options["mix_weights"] is not None):
        raise click.UsageError("--mix and --weights go together: the other datasets and one weight per dataset")
    if options["mix_weights"] is None:
        options["mix_weights"] = []
        return
    from bert_datagen.contract.loading.mixture import MixtureError, parse_weights

    try:
        options["mix_weights"] = parse_weights(options["mix_weights"], len(options["mix"]) + 1)
    except MixtureError as exc:
        raise click.BadParameter(str(exc), param_hint="--weights") from exc


def _skip_ranges(ctx, param, value: str | None) -> list[list[int]]:
    if value is None:
        return []
    from bert_datagen.contract.loading.skips import SkipError, parse_ranges

    try:
        return [list(r) for r in parse_ranges(value)]
    except SkipError as exc:
        raise click.BadParameter(str(exc)) from exc


def _unused_run_options(strategy: str, bert_config_file: str | None, init_checkpoint: str | None) -> dict[str, str]:
    """The options of `pretrain` this run would ignore whatever its data, and why."""
    unused = {}
    if strategy != "multi-worker":
        unused["cluster_timeout"] = f"--strategy {strategy} joins no cluster (only multi-worker waits for workers)"
    if bert_config_file or init_checkpoint:
        source = "--bert-config" if bert_config_file else "--init-checkpoint"
        unused["model"] = f"{source} gives the model (--model names a size for runs without a model config)"
    return unused


def _check_data_options(ctx: click.Context, options: dict) -> None:
    """The options that only some data or runs use, against those of this run (trainer/pretrain/options.py)."""
    from bert_datagen.trainer.pretrain.options import no_eval_split, unused_shuffle_buffer
    from bert_datagen.trainer.runtime.checkpoint import reads_through_tf_data

    reason = no_eval_split(options["data"], options["eval_data"])
    if reason:
        refuse_unused_options(ctx, {"eval_every": reason, "eval_batches": reason})
    reason = unused_shuffle_buffer(options["shuffle_buffer"], reads_through_tf_data(options["out"]))
    if reason:
        refuse_unused_options(ctx, {"shuffle_buffer": reason})


@click.command("pretrain")
@click.option("--data", required=True, help="Dataset directory (manifest.json) or TFRecord glob(s), comma-separated.")
@click.option("--out", "out", required=True, help="Run directory; rerunning the same command resumes it.")
@click.option("--model", type=click.Choice(list(MODEL_SIZES)), default="tiny", show_default=True,
              help="Model size (RECIPE.md section 6). Ignored with --bert-config.")
@click.option("--bert-config", "bert_config_file", type=click.Path(exists=True, dir_okay=False),
              help="An original bert_config.json (or a Hugging Face config.json) defining the model.")
@click.option("--batch-size", type=Int(1), default=32, show_default=True, help="Global batch: sequences per step.")
@click.option("--accumulation-steps", type=Int(1), default=1, show_default=True,
              help="Split each step's batch into this many micro-batches (same result, less memory).")
@click.option("--steps", type=Int(1), required=True, help="Total optimizer steps (also the end of the lr decay).")
@click.option("--learning-rate", type=FiniteFloat(0, min_open=True), default=1e-4, show_default=True)
@click.option("--warmup-steps", type=Int(0), default=10000, show_default=True)
@click.option("--weight-decay", type=FiniteFloat(0), default=0.01, show_default=True)
@click.option("--optimizer", type=click.Choice(OPTIMIZERS), default="adamw", show_default=True,
              help="adamw: the original AdamWeightDecay; lamb: layer-wise trust ratio (large batches).")
@click.option("--seed", type=Int(0, MAX_SEED), default=12345, show_default=True)
@click.option("--max-seq-length", type=Int(1, INT32_MAX), help="For TFRecord globs without a manifest.")
@click.option("--max-predictions-per-seq", type=Int(1, INT32_MAX), help="For TFRecord globs without a manifest.")
@click.option("--vocab-size", type=Int(1, INT32_MAX), help="For TFRecord globs without a manifest (or use --bert-config).")
@click.option("--eval-data", help="Eval TFRecord glob, for --data globs without a manifest.")
@click.option("--shuffle-buffer", type=Int(1), default=None,
              help="Only for a run started by an earlier version, which reads through tf.data (it keeps the "
                   "buffer it recorded); other runs read the global order, which has no buffer.")
@click.option("--checkpoint-every", type=Int(1), default=1000, show_default=True)
@click.option("--keep-checkpoints", type=Int(1), default=3, show_default=True)
@click.option("--eval-every", type=Int(0), default=0, show_default=True, help="0: evaluate at the end only.")
@click.option("--eval-batches", type=Int(1), default=20, show_default=True)
@click.option("--log-every", type=Int(1), default=50, show_default=True)
@click.option("--strategy", type=click.Choice(STRATEGIES), default="auto", show_default=True)
@click.option("--tpu", default=None, help="TPU name or address for --strategy tpu.")
@click.option("--cluster-timeout", type=Int(1, MAX_TIMEOUT_S), default=DEFAULT_TIMEOUT, show_default=True,
              help="--strategy multi-worker: seconds to wait for the other workers (TF_CONFIG) to join, and "
                   "for each collective step, before stopping.")
@backend_option
@click.option("--precision", type=click.Choice(PRECISIONS), default="float32", show_default=True)
@click.option("--jit/--no-jit", default=False, show_default=True, help="Compile the step with XLA.")
@click.option("--init-from", help="Phase 2: start from the weights of a run (its latest checkpoint) or checkpoint.")
@click.option("--init-checkpoint", help="Start from an original TF1 checkpoint or a Hugging Face directory.")
@click.option("--mix", "mix", multiple=True, metavar="DATASET",
              help="Another dataset read with --data as one weighted stream (repeatable; with --weights).")
@click.option("--weights", "mix_weights", default=None, metavar="W1,W2,...",
              help="Mixture weights, one per dataset, --data's first (e.g. 0.7,0.3); recorded in the run.")
@click.option("--skip-batches", "skip_batches", callback=_skip_ranges, metavar="A-B[,C-D]",
              help="Leave out these global batches (inclusive; `bert-datagen batches` shows them) from here "
                   "on, e.g. past a loss spike on resume; the run records what it skipped.")
@click.pass_context
def pretrain_command(ctx: click.Context, bert_config_file, cluster_timeout, **options) -> None:
    """Pre-train BERT (MLM + NSP) from a dataset; resumes RUN when it has checkpoints."""
    refuse_unused_options(ctx, _unused_run_options(options["strategy"], bert_config_file, options["init_checkpoint"]))
    options["backend"] = use_backend(options["backend"])
    try:
        if options["strategy"] == "multi-worker":  # before anything runs on the backend (cluster.py)
            join_for(options["out"], PRETRAINING, cluster_timeout, options["backend"])
        _check_data_options(ctx, options)
        if options.get("init_checkpoint"):
            from bert_datagen.trainer.interop.restore import init_checkpoint_config

            # The checkpoint fixes the model: --bert-config, its bert_config.json, or HF config.json.
            options["bert_config"] = BertConfig.from_dict(
                init_checkpoint_config(options["init_checkpoint"], bert_config_file)).to_dict()
        elif bert_config_file:
            options["bert_config"] = BertConfig.from_json_file(bert_config_file).to_dict()
        _mix_options(options)
        cfg = _train_config(options)
        from bert_datagen.trainer.pretrain.train import pretrain

        result = pretrain(cfg, log=lambda line: click.echo(line))
    except TrainerError as exc:
        raise click.ClickException(str(exc)) from exc
    click.echo(f"run directory: {result['run_dir']}")
