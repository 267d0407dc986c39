"""`bert-datagen`: the data side's command line (no TensorFlow)."""

from __future__ import annotations

import click

from bert_datagen.cli.plumbing import DEBUG_HELP, CommandGroup, bucket_deadline_option
from bert_datagen.datagen import __version__

COMMANDS = {
    "vocab": "bert_datagen.pipelines.vocab_cli:vocab_command",
    "run": "bert_datagen.pipelines.pretraining.cli:run_command",
    "task": "bert_datagen.pipelines.tasks.cli:task_command",
    "verify": "bert_datagen.pipelines.tools.cli:verify_command",
    "inspect": "bert_datagen.pipelines.tools.cli:inspect_command",
    "stats": "bert_datagen.pipelines.tools.cli:stats_command",
    "diff": "bert_datagen.pipelines.tools.cli:diff_command",
    "batches": "bert_datagen.pipelines.tools.batches:batches_command",
}


class DatagenGroup(CommandGroup):
    # Every data command cleans up after SIGTERM as after Ctrl-C (one mechanism, `bert_datagen.cli.plumbing`).
    sigterm_interrupts = True


@click.group(cls=DatagenGroup, lazy_commands=COMMANDS)
@click.version_option(__version__, prog_name="bert-datagen")
@click.option("--debug", is_flag=True, expose_value=False, help=DEBUG_HELP)
@bucket_deadline_option
def main() -> None:
    """Reproducible BERT pre-training data: vocab, run, task, verify, inspect, stats, diff, batches."""


if __name__ == "__main__":
    main()
