"""`bert-train finetune` and `bert-train predict` (and the task-metric branch of `bert-train eval`)."""

from __future__ import annotations

import json

import click

from bert_datagen.cli.plumbing import FiniteFloat, Int, given, refuse_unused_options
from bert_datagen.contract.bounds import MAX_SEED, MAX_TIMEOUT_S
from bert_datagen.trainer.backends.option import backend_option, use_backend
from bert_datagen.trainer.errors import TrainConfigError
from bert_datagen.trainer.finetune.config import BUCKETS, SPAN_METRICS
from bert_datagen.trainer.runtime.config import PRECISIONS, STRATEGIES


def _user_errors() -> tuple[type[Exception], ...]:
    from bert_datagen.trainer.errors import TrainerError

    return (TrainerError,)


def _seed_list(value: str | None) -> list[int] | None:
    if value is None:
        return None
    try:
        seeds = [int(part) for part in value.split(",") if part.strip()]
    except ValueError:
        raise click.BadParameter(f"{value!r} is not a comma-separated list of integers", param_hint="--seeds") from None
    if not seeds or len(set(seeds)) != len(seeds):
        raise click.BadParameter(f"{value!r}: give distinct seeds, e.g. 1,2,3", param_hint="--seeds")
    outside = [s for s in seeds if not 0 <= s <= MAX_SEED]
    if outside:
        raise click.BadParameter(f"seed {outside[0]} is not in [0, {MAX_SEED}]", param_hint="--seeds")
    return seeds


@click.command("finetune")
@click.option("--data", required=True, help="Task dataset directory (the output of `bert-datagen task`).")
@click.option("--out", required=True, help="Run directory; rerunning the same command resumes it.")
@click.option("--init-from", help="A pre-training run of ours (its latest checkpoint) or checkpoint directory.")
@click.option("--init-checkpoint", help="An original TF1 checkpoint, or a Hugging Face BertForPreTraining / "
                                        "BertModel directory.")
@click.option("--bert-config", "bert_config_file", type=click.Path(exists=True, dir_okay=False),
              help="bert_config.json of a TF1 --init-checkpoint (default: the one beside it).")
@click.option("--epochs", type=FiniteFloat(0, min_open=True), default=None, help="Default: 3 (classification, tagging), 2 (span).")
@click.option("--learning-rate", type=FiniteFloat(0, min_open=True), default=None, help="Default: 5e-5 (classification, tagging), 3e-5 (span).")
@click.option("--batch-size", type=Int(1), default=None, help="Global batch. Default: 32 (classification, tagging), 12 (span).")
@click.option("--warmup-proportion", type=FiniteFloat(0, 1, max_open=True), default=0.1, show_default=True)
@click.option("--seed", type=Int(0, MAX_SEED), default=None, help="Default 12345.")
@click.option("--seeds", default=None, help="Comma-separated seeds: one sub-run per seed (RUN/seed-N) and a summary.")
@click.option("--train-split", default="train", show_default=True)
@click.option("--eval-split", default="dev", show_default=True, help="Evaluated after each epoch; 'none' to skip.")
@click.option("--max-steps", type=Int(1), default=None, help="Stop after this many steps (also ends the lr decay).")
@click.option("--weight-decay", type=FiniteFloat(0), default=0.01, show_default=True)
@click.option("--accumulation-steps", type=Int(1), default=1, show_default=True)
@click.option("--checkpoint-every", type=Int(0), default=0, show_default=True, help="Steps; 0: at each epoch's end.")
@click.option("--keep-checkpoints", type=Int(1), default=1, show_default=True)
@click.option("--log-every", type=Int(1), default=50, show_default=True)
@click.option("--null-score-diff-threshold", type=FiniteFloat(), default=0.0, show_default=True, help="SQuAD v2.0.")
@click.option("--span-metric", type=click.Choice(SPAN_METRICS), default="auto", show_default=True,
              help="SQuAD-layout data: squad (the official v1.1/v2.0 script's), cmrc2018 (CMRC 2018's: Chinese "
                   "characters, English words whole), or auto (cmrc2018 for unspaced data, e.g. Chinese).")
@click.option("--strategy", type=click.Choice(STRATEGIES), default="auto", show_default=True)
@click.option("--tpu", default=None)
@click.option("--cluster-timeout", type=Int(1, MAX_TIMEOUT_S), default=300, show_default=True,
              help="--strategy multi-worker: seconds to wait for the other workers (TF_CONFIG) to join, and "
                   "for each collective step, before stopping.")
@backend_option
@click.option("--precision", type=click.Choice(PRECISIONS), default="float32", show_default=True)
@click.option("--jit/--no-jit", default=False, show_default=True)
@click.option("--group-by-length/--no-group-by-length", default=False, show_default=True,
              help=f"Batch examples of similar length and pad each batch to one of at most {BUCKETS} lengths "
                   f"(k/{BUCKETS} of the dataset's sequence length, multiples of 8), not always to it: faster on short "
                   "examples; other batches than without it.")
@click.option("--allow-vocab-mismatch", is_flag=True,
              help="Fine-tune although the task dataset's vocab is not the init checkpoint's (refused by default).")
@click.pass_context
def finetune_command(ctx: click.Context, bert_config_file, seeds, seed, epochs, learning_rate, batch_size, eval_split,
                     cluster_timeout, **options) -> None:
    """Fine-tune a pre-trained BERT on a task dataset; evaluates after each epoch."""
    options["backend"] = use_backend(options["backend"])
    seed_list = _seed_list(seeds)
    if seed_list is not None and seed is not None:
        raise click.UsageError("--seed and --seeds are exclusive")
    if seed_list is not None and options["strategy"] == "multi-worker":
        raise click.UsageError("--seeds runs one process per seed; with --strategy multi-worker give one --seed")
    if seed_list is not None and eval_split.lower() == "none":
        raise click.UsageError("--seeds summarises each seed's eval metric; with --eval-split none there is none")
    unused = {}
    if options["strategy"] != "multi-worker":
        unused["cluster_timeout"] = (f"--strategy {options['strategy']} joins no cluster (only multi-worker waits "
                                     "for workers)")
    if options["init_from"]:
        unused["bert_config_file"] = "--init-from's run records its model (--bert-config is for --init-checkpoint)"
    refuse_unused_options(ctx, unused)
    errors = _user_errors()
    try:
        if options["strategy"] == "multi-worker":  # before anything runs on the backend (runtime/cluster.py)
            from bert_datagen.trainer.runtime.cluster import join_for
            from bert_datagen.trainer.runtime.rundir import FINETUNING

            join_for(options["out"], FINETUNING, cluster_timeout, options["backend"])
        from bert_datagen.trainer.finetune.checks import threshold_unused
        from bert_datagen.trainer.finetune.config import TASK_DEFAULTS, FinetuneConfig
        from bert_datagen.trainer.finetune.data import open_task_dataset
        from bert_datagen.trainer.finetune.train import finetune, finetune_seeds

        dataset = open_task_dataset(options["data"])
        reason = threshold_unused(dataset, evaluated=eval_split.lower() != "none")
        if reason:
            refuse_unused_options(ctx, {"null_score_diff_threshold": reason})
        _refuse_span_metric(ctx, dataset)
        defaults = TASK_DEFAULTS[dataset.task_type]
        try:
            cfg = FinetuneConfig(
                **options, seed=12345 if seed is None else seed,
                epochs=defaults["epochs"] if epochs is None else epochs,
                learning_rate=defaults["learning_rate"] if learning_rate is None else learning_rate,
                batch_size=int(defaults["batch_size"]) if batch_size is None else batch_size,
                eval_split=None if eval_split.lower() == "none" else eval_split)
            if cfg.train_split in dataset.splits:  # (a missing split: the run's own error)
                cfg.total_steps(dataset.splits[cfg.train_split].records)
        except TrainConfigError as exc:
            raise click.UsageError(str(exc)) from exc
        log = lambda line: click.echo(line)  # noqa: E731
        if seed_list is not None:
            finetune_seeds(cfg, seed_list, log=log, bert_config_file=bert_config_file)
        else:
            finetune(cfg, log=log, bert_config_file=bert_config_file)
    except errors as exc:
        raise click.ClickException(str(exc)) from exc
    click.echo(f"run directory: {options['out']}")


def _refuse_span_metric(ctx: click.Context, dataset) -> None:
    if given(ctx, "span_metric") and dataset.task_type != "span":
        refuse_unused_options(ctx, {"span_metric": f"{dataset.source} is a {dataset.task_type} task: only span "
                                                   "(SQuAD-layout) predictions are scored by a span metric"})


ALLOW_OTHER_TASK_HELP = ("Run the model on another task's data (another task name or label names than "
                         "it was fine-tuned for); refused by default.")
ALLOW_VOCAB_MISMATCH_HELP = ("Run the model on data made with another vocab than the one it was fine-tuned "
                             "with (only if the ids mean the same words); refused by default.")


def predict_run(run: str, data: str, split: str, out: str | None, batch_size: int = 64,
                null_score_diff_threshold: float = 0.0, need_labels: bool = False,
                allow_other_task: bool = False, overwrite: bool = False,
                allow_vocab_mismatch: bool = False, span_metric: str = "auto", backend: str = "tensorflow") -> dict:
    """Predictions (and metrics, for labelled splits) of a fine-tuned run on a split of a task dataset;
    `out`, when given, is checked before any work (`evaluate.check_predictions_out`) and locked
    from the start to the end (reading a run takes no lock)."""
    import contextlib

    from bert_datagen.trainer.finetune.evaluate import check_predictions_out
    from bert_datagen.trainer.runtime.rundir import output_lock

    if out:
        check_predictions_out(out, overwrite)
    with output_lock(out) if out else contextlib.nullcontext():
        previous = check_predictions_out(out, overwrite) if out else []
        return _predict(run, data, split, out, batch_size, null_score_diff_threshold, need_labels, previous,
                        allow_other_task, allow_vocab_mismatch, span_metric, backend)


def _predict(run: str, data: str, split: str, out: str | None, batch_size: int,
             null_score_diff_threshold: float, need_labels: bool, previous: list[str],
             allow_other_task: bool = False, allow_vocab_mismatch: bool = False,
             span_metric: str = "auto", backend: str = "tensorflow") -> dict:
    from bert_datagen.trainer.finetune.checks import check_data_fits, check_same_task
    from bert_datagen.trainer.finetune.data import check_split_files, open_task_dataset
    from bert_datagen.trainer.finetune.evaluate import evaluate_split, write_predictions_dir
    from bert_datagen.trainer.interop.finetune_export import restore_finetuned
    from bert_datagen.trainer.runtime.training import enable_determinism

    enable_determinism(0, backend)
    model, bert, task, ckpt = restore_finetuned(run)
    dataset = open_task_dataset(data)
    check_split_files(dataset, [dataset.split(split)])
    check_same_task(dataset, task, str(ckpt), allow_other_task, allow_vocab_mismatch)
    check_data_fits(dataset, bert, str(ckpt))
    result = evaluate_split(model, dataset, split, batch_size, need_labels=need_labels,
                            null_score_diff_threshold=null_score_diff_threshold, span_metric=span_metric,
                            backend=backend)
    written = []
    if out:
        about = {"run": str(run), "checkpoint": str(ckpt), "data": str(data), "split": split}
        written = [str(p) for p in write_predictions_dir(out, dataset, result, about, previous)]
    return {"checkpoint": str(ckpt), "split": split, "metrics": result.metrics, "details": result.details,
            "files": written}


@click.command("predict")
@click.option("--run", "run", required=True, help="Fine-tuned run directory (latest checkpoint) or checkpoint.")
@click.option("--data", required=True, help="Task dataset directory.")
@click.option("--split", required=True, help="Split to predict (labelled or not).")
@click.option("--out", required=True, help="Directory for the prediction files: new or empty (or, with "
              "--overwrite, one an earlier predict wrote); never a dataset or a run.")
@click.option("--batch-size", type=Int(1), default=64, show_default=True)
@click.option("--null-score-diff-threshold", type=FiniteFloat(), default=0.0, show_default=True, help="SQuAD v2.0.")
@click.option("--span-metric", type=click.Choice(SPAN_METRICS), default="auto", show_default=True,
              help="SQuAD-layout data: squad (the official v1.1/v2.0 script's), cmrc2018 (CMRC 2018's: Chinese "
                   "characters, English words whole), or auto (cmrc2018 for unspaced data, e.g. Chinese).")
@click.option("--allow-other-task", is_flag=True, help=ALLOW_OTHER_TASK_HELP)
@click.option("--allow-vocab-mismatch", is_flag=True, help=ALLOW_VOCAB_MISMATCH_HELP)
@click.option("--overwrite", is_flag=True, help="Replace the predictions an earlier `bert-train predict` wrote "
              "in --out (recognised by its predictions_record.json; nothing else is replaced).")
@backend_option
@click.pass_context
def predict_command(ctx: click.Context, run, data, split, out, batch_size, null_score_diff_threshold, span_metric,
                    allow_other_task, allow_vocab_mismatch, overwrite, backend) -> None:
    """Write a fine-tuned run's predictions for a split (predictions.tsv / SQuAD JSON / predictions.conll)."""
    backend = use_backend(backend)
    try:
        from bert_datagen.trainer.finetune.checks import threshold_unused
        from bert_datagen.trainer.finetune.data import open_task_dataset

        dataset = open_task_dataset(data)
        reason = threshold_unused(dataset)
        if reason:
            refuse_unused_options(ctx, {"null_score_diff_threshold": reason})
        _refuse_span_metric(ctx, dataset)
        result = predict_run(run, data, split, out, batch_size, null_score_diff_threshold,
                             allow_other_task=allow_other_task, overwrite=overwrite,
                             allow_vocab_mismatch=allow_vocab_mismatch, span_metric=span_metric, backend=backend)
    except _user_errors() as exc:
        raise click.ClickException(str(exc)) from exc
    for path in result["files"]:
        click.echo(f"wrote {path}")
    if result["metrics"]:
        click.echo("  ".join(f"{k} {v:.4f}" for k, v in result["metrics"].items()))


def eval_finetuned(run: str, data: str, split: str | None, batch_size: int, as_json: bool,
                   allow_other_task: bool = False, allow_vocab_mismatch: bool = False,
                   backend: str = "tensorflow") -> None:
    """`bert-train eval --run FINETUNED_RUN`: the task metric on a labelled split (default dev)."""
    try:
        result = predict_run(run, data, split or "dev", None, batch_size, need_labels=True,
                             allow_other_task=allow_other_task, allow_vocab_mismatch=allow_vocab_mismatch,
                             backend=backend)
    except _user_errors() as exc:
        raise click.ClickException(str(exc)) from exc
    if as_json:
        click.echo(json.dumps(result, indent=2, sort_keys=True))
        return
    click.echo(f"checkpoint {result['checkpoint']}, {result['split']} split")
    click.echo("  " + "  ".join(f"{k} {v:.4f}" for k, v in result["metrics"].items()))
