"""CLI plumbing shared by `bert-datagen` and `bert-train`.

LazyGroup: a click group whose subcommands are imported only when used, so `--help` stays fast, a
Dataflow worker that unpickles a DoFn never imports the CLI modules of other commands, and
`bert-train` never loads Beam.
"""

from __future__ import annotations

import importlib

import click


class LazyGroup(click.Group):
    def __init__(self, *args, lazy_commands: dict[str, str] | None = None, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.lazy_commands = dict(lazy_commands or {})

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(set(super().list_commands(ctx)) | set(self.lazy_commands))

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name in self.lazy_commands:
            module_name, attr = self.lazy_commands[cmd_name].split(":")
            return getattr(importlib.import_module(module_name), attr)
        return super().get_command(ctx, cmd_name)
