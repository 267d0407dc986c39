"""`bert-train`: pre-train, evaluate and export BERT models."""

from __future__ import annotations

import os

import click

from bert_datagen.cli.plumbing import DEBUG_HELP, CommandGroup, bucket_deadline_option
from bert_datagen.trainer.quiet import quiet_tensorflow_logs

# Before any command imports TensorFlow (trainer/quiet.py says why); None where the user set
# TF_CPP_MIN_LOG_LEVEL.
STDERR_NOISE = quiet_tensorflow_logs(os.environ)

COMMANDS = {
    "pretrain": "bert_datagen.trainer.pretrain.cli:pretrain_command",
    "eval": "bert_datagen.trainer.eval_cli:eval_command",
    "export": "bert_datagen.trainer.interop.cli:export_command",
    "finetune": "bert_datagen.trainer.finetune.cli:finetune_command",
    "predict": "bert_datagen.trainer.finetune.cli:predict_command",
}


class TrainGroup(CommandGroup):
    """`bert-train`'s group: the shared one, whose stderr filter also drops TensorFlow's native noise."""

    stderr_noise = STDERR_NOISE

    # SIGTERM (a scheduler's or `kill`'s stop) ends a command as Ctrl-C does: a training run saves
    # the step it finished and says where.
    sigterm_interrupts = True


@click.group(cls=TrainGroup, lazy_commands=COMMANDS)
@click.option("--debug", is_flag=True, expose_value=False, help=DEBUG_HELP)
@bucket_deadline_option
def main() -> None:
    """Pre-train BERT (MLM + NSP) on bert-datagen datasets; fine-tune, evaluate, predict; export."""


if __name__ == "__main__":
    main()
