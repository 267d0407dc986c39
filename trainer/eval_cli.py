"""`bert-train eval`: the figures of any run on a dataset split, a pre-training run's MLM/NSP or a
fine-tuned run's task metric. Above both kinds of run (and so beside the `bert-train` group), it
reads each through its own package."""

from __future__ import annotations

import json

import click

from bert_datagen.cli.plumbing import Int, refuse_unused_options
from bert_datagen.contract.bounds import INT32_MAX
from bert_datagen.trainer.backends.option import backend_option, use_backend
from bert_datagen.trainer.errors import TrainConfigError, TrainerError
from bert_datagen.trainer.finetune.cli import ALLOW_OTHER_TASK_HELP, ALLOW_VOCAB_MISMATCH_HELP


@click.command("eval")
@click.option("--run", "run", default=None, help="Run directory (latest checkpoint) or a checkpoint directory.")
@click.option("--init-checkpoint", default=None,
              help="Instead of --run: an original TF1 checkpoint (PATH/bert_model.ckpt) or a Hugging Face dir.")
@click.option("--bert-config", "bert_config_file", type=click.Path(exists=True, dir_okay=False),
              help="bert_config.json of --init-checkpoint (default: the one beside it).")
@click.option("--data", required=True, help="Dataset directory (manifest.json) or TFRecord glob(s).")
@click.option("--split", default=None,
              help="Pre-training: eval (default) or train. Fine-tuned runs: any labelled split (default dev).")
@click.option("--batch-size", type=Int(1), default=32, show_default=True)
@click.option("--max-batches", type=Int(1), default=None, help="Default: the whole split.")
@click.option("--max-seq-length", type=Int(1, INT32_MAX), help="For TFRecord globs without a manifest.")
@click.option("--max-predictions-per-seq", type=Int(1, INT32_MAX), help="For TFRecord globs without a manifest.")
@click.option("--json", "as_json", is_flag=True, help="Print the figures as JSON.")
@click.option("--allow-other-task", is_flag=True, help="Fine-tuned runs: " + ALLOW_OTHER_TASK_HELP)
@click.option("--allow-vocab-mismatch", is_flag=True, help="Fine-tuned runs: " + ALLOW_VOCAB_MISMATCH_HELP)
@backend_option
@click.pass_context
def eval_command(ctx: click.Context, run, init_checkpoint, bert_config_file, data, split, batch_size, max_batches,
                 max_seq_length, max_predictions_per_seq, as_json, allow_other_task, allow_vocab_mismatch,
                 backend) -> None:
    """MLM/NSP loss and accuracy of a run's latest checkpoint on a dataset split; for a fine-tuned
    run, its task metric."""
    backend = use_backend(backend)
    from bert_datagen.trainer.interop.finetune_export import is_finetune_run

    finetuned = bool(run) and is_finetune_run(run)
    if finetuned:
        why = "a fine-tuned run is scored on the whole split with the task dataset's own lengths"
        refuse_unused_options(ctx, {"max_batches": why, "max_seq_length": why, "max_predictions_per_seq": why,
                                    "init_checkpoint": "--run names the fine-tuned model",
                                    "bert_config_file": "a fine-tuned run records its model"})
    else:
        why = "only a fine-tuned run's head has a task to compare with the data's"
        refuse_unused_options(ctx, {"allow_other_task": why, "allow_vocab_mismatch": why})
        if init_checkpoint is None:
            refuse_unused_options(ctx, {"bert_config_file": "only --init-checkpoint reads a model config; a run "
                                                            "records its own"})
    if finetuned:
        from bert_datagen.trainer.finetune.cli import eval_finetuned

        return eval_finetuned(run, data, split, batch_size, as_json, allow_other_task, allow_vocab_mismatch,
                              backend)
    split = split or "eval"
    if split not in ("eval", "train"):
        raise click.BadParameter(f"{split!r} is not one of 'eval', 'train' for a pre-training run",
                                 param_hint="--split")
    try:
        from bert_datagen.trainer.pretrain.evaluate import evaluate_external, evaluate_run
        from bert_datagen.trainer.runtime.training import enable_determinism

        enable_determinism(0, backend)
        if (run is None) == (init_checkpoint is None):
            raise TrainConfigError("pass exactly one of --run and --init-checkpoint")
        if init_checkpoint:
            result = evaluate_external(init_checkpoint, data, bert_config_file, batch_size=batch_size,
                                       max_batches=max_batches, split=split, max_seq_length=max_seq_length,
                                       max_predictions_per_seq=max_predictions_per_seq, backend=backend)
        else:
            result = evaluate_run(run, data, batch_size=batch_size, max_batches=max_batches, split=split,
                                  max_seq_length=max_seq_length, max_predictions_per_seq=max_predictions_per_seq,
                                  backend=backend)
    except TrainerError as exc:
        raise click.ClickException(str(exc)) from exc
    if as_json:
        click.echo(json.dumps(result, indent=2, sort_keys=True))
        return
    step = "" if result.get("step") is None else f" (step {result['step']})"
    click.echo(f"checkpoint {result['checkpoint']}{step}, {split} split, "
               f"{int(result['examples'])} sequences")
    click.echo(f"  mlm_loss {result['mlm_loss']:.4f}  mlm_accuracy {result['mlm_accuracy']:.4f}")
    if "nsp_loss" in result:  # data without NSP has no NSP figures
        click.echo(f"  nsp_loss {result['nsp_loss']:.4f}  nsp_accuracy {result['nsp_accuracy']:.4f}")
    click.echo(f"  loss {result['loss']:.4f}")
