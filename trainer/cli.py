"""`bert-train`: pre-train, evaluate and export BERT models."""

from __future__ import annotations

import click

from contract.cliutil import DEBUG_HELP, CommandGroup

COMMANDS = {
    "pretrain": "trainer.train_cli:pretrain_command",
    "eval": "trainer.train_cli:eval_command",
    "export": "trainer.export_cli:export_command",
}


@click.group(cls=CommandGroup, lazy_commands=COMMANDS)
@click.option("--debug", is_flag=True, expose_value=False, help=DEBUG_HELP)
def main() -> None:
    """Pre-train BERT (MLM + NSP) on bert-datagen datasets; evaluate; export checkpoints."""


if __name__ == "__main__":
    main()
