"""README.md stays true: its make targets, subcommands and options exist."""

from __future__ import annotations

import re
from pathlib import Path

import click
import pytest

from pipelines.cli import main as datagen_main
from trainer.cli import main as train_main

REPO = Path(__file__).resolve().parent.parent
README = (REPO / "README.md").read_text()
# Options Beam's PipelineOptions takes through `bert-datagen run` (passed on, not click options).
BEAM_OPTIONS = {"--project", "--region", "--temp_location", "--direct_num_workers", "--max_num_workers"}


def _code_commands(prefix: str) -> list[str]:
    """Every command line in README code blocks starting with ``prefix``, continuations joined."""
    commands = []
    for block in re.findall(r"```(?:bash)?\n(.*?)```", README, flags=re.S):
        joined = re.sub(r"\\\n\s*", " ", block)
        for line in joined.splitlines():
            line = line.split("#", 1)[0].strip()
            for part in re.split(r"&&|;", line):
                part = part.strip()
                if part.startswith(prefix + " "):
                    commands.append(part)
    return commands


def test_two_commands_are_make_targets() -> None:
    makefile = (REPO / "Makefile").read_text()
    for target in ("test", "pretrain", "bench", "lint", "clean"):
        assert re.search(rf"^{target}:", makefile, flags=re.M), target
        assert f"make {target}" in README
    assert "make test" in (REPO / ".ci" / "run").read_text()


@pytest.mark.parametrize("prefix,group", [("bert-datagen", datagen_main), ("bert-train", train_main)])
def test_readme_subcommands_and_options_exist(prefix: str, group: click.Group) -> None:
    commands = _code_commands(prefix)
    assert commands, f"README shows no {prefix} command"
    ctx = click.Context(group)
    for line in commands:
        words = line.split()
        if words[1].startswith("-"):
            continue
        command = group.get_command(ctx, words[1])
        assert command is not None, f"README: `{line}`: no subcommand {words[1]!r}"
        known = {opt for param in command.params for opt in (*param.opts, *param.secondary_opts)}
        for word in words[2:]:
            option = word.strip("[]|").split("=", 1)[0]
            if not option.startswith("--") or option in ("--help",):
                continue
            if prefix == "bert-datagen" and words[1] == "run" and option in BEAM_OPTIONS:
                continue
            assert option in known, f"README: `{line}`: {words[1]} has no option {option}"
