"""README.md stays true: its make targets, subcommands and options exist."""

from __future__ import annotations

import re
from pathlib import Path

import click
import pytest

from bert_datagen.pipelines.cli import main as datagen_main
from bert_datagen.trainer.cli import main as train_main

REPO = Path(__file__).resolve().parent.parent.parent
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
    for target in ("test", "pretrain", "finetune", "bench", "lint", "clean"):
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


# ---------------------------------------------------------------- every --option anywhere in the docs

DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
GROUPS = {"bert-datagen": datagen_main, "bert-train": train_main}
MENTION = re.compile(r"\b(bert-datagen|bert-train)[ \t]+([a-z][a-z-]*)")
OPTION = re.compile(r"(?<![\w-])--(\[no-\])?([a-z][a-z0-9_-]*[a-z0-9])")
# Code lines of other programs (pip, make, python -m ..., pytest): their options are not ours.
FOREIGN_LINE = re.compile(r"^\s*(?:\$\s*)?(?!bert-datagen\b|bert-train\b)[\w./][\w./-]*")


def _command_options(prefix: str, name: str) -> set[str] | None:
    group = GROUPS[prefix]
    command = group.get_command(click.Context(group), name)
    if command is None:
        return None
    known = {o for p in (*command.params, *group.params) for o in (*p.opts, *p.secondary_opts)} | {"--help"}
    if (prefix, name) == ("bert-datagen", "run"):
        from tests.support.beam_options import beam_option_names

        known |= set(beam_option_names())
    return known


def _all_commands() -> list[tuple[str, str]]:
    return [(prefix, name) for prefix, group in GROUPS.items() for name in group.list_commands(click.Context(group))]


def _options_in(text: str) -> list[tuple[str, int]]:
    found = []
    for m in OPTION.finditer(text):
        found.append((f"--{m.group(2)}", m.start()))
        if m.group(1):
            found.append((f"--no-{m.group(2)}", m.start()))
    return found


# Stand-ins in prose ("any other `--name=value` option goes to Beam") and the misspelling the docs
# show being refused: not options.
PLACEHOLDERS = {"--name", "--max-seq-lenght"}
SCRIPT = re.compile(r"\b[\w-]+\.py\b")  # the original tool's scripts (run_pretraining.py --init_checkpoint)


def _blank_foreign_code(m: re.Match) -> str:
    code = m.group(0)[1:]
    foreign = FOREIGN_LINE.match(code) and not MENTION.match(code) and not SCRIPT.search(code)
    return " " * len(m.group(0)) if foreign else m.group(0)


def option_problems(text: str, source: str) -> list[str]:
    """Every `--option` in a Markdown text that the command it belongs to lacks.

    The command of an option: in a code block, the `bert-datagen X` / `bert-train X` line it is on
    (continuations joined; lines of other programs are skipped); in prose, one of the commands the
    section has named so far (in prose or code), or any command when it has named none. Inline code
    of another program (`pip wheel --no-deps`) and a paragraph about one of the original scripts
    (`run_pretraining.py --init_checkpoint`) are skipped.
    """
    problems = []
    named: list[tuple[str, str]] = []  # commands the current section has named so far
    for block in re.split(r"(```[^\n]*\n.*?```)", text, flags=re.S):
        if block.startswith("```"):
            joined = re.sub(r"\\\n\s*", " ", block)
            for line in joined.splitlines()[1:-1]:
                for part in re.split(r"&&|;|\|\|", line.split("#", 1)[0]):
                    mention = MENTION.search(part)
                    if mention and part.strip().startswith(mention.group(1)):
                        named.append((mention.group(1), mention.group(2)))
                        problems += _check(part, _options_in(part), [named[-1]], source)
                    elif not FOREIGN_LINE.match(part):
                        problems += _check(part, _options_in(part), named, source)
            continue
        for paragraph in re.split(r"\n\s*\n|\n(?=#{1,6} )", block):
            if re.match(r"\s*#{1,6} ", paragraph):
                named = []  # a new section
            prose = re.sub(r"`[^`]*`", _blank_foreign_code, paragraph)
            events = sorted([(m.start(), "mention", (m.group(1), m.group(2))) for m in MENTION.finditer(prose)]
                            + [(m.start(), "script", None) for m in SCRIPT.finditer(prose)]
                            + [(at, "option", name) for name, at in _options_in(prose)], key=lambda e: e[0])
            script = False
            for _, kind, value in events:
                if kind == "mention":
                    named.append(value)
                    script = False
                elif kind == "script":
                    script = True
                elif not script:
                    problems += _check(paragraph, [(value, 0)], named, source)
    return problems


def _check(where: str, options: list[tuple[str, int]], named: list[tuple[str, str]], source: str) -> list[str]:
    problems = []
    commands = [c for c in dict.fromkeys(named) if _command_options(*c) is not None]
    for option, _ in options:
        if option in PLACEHOLDERS:
            continue
        if commands:
            if not any(option in _command_options(*c) for c in commands):
                names = " or ".join(f"`{' '.join(c)}`" for c in commands)
                problems.append(f"{source}: {names} has no option {option}")
        elif not any(option in (_command_options(*c) or set()) for c in _all_commands()):
            problems.append(f"{source}: no command has the option {option} (in {where.strip()[:60]!r})")
    return problems


def test_every_option_in_readme_and_docs_exists_on_its_command() -> None:
    problems = []
    for path in DOCS:
        problems += option_problems(path.read_text(), path.relative_to(REPO).as_posix())
    assert problems == []


def test_the_option_check_finds_a_fake_option() -> None:
    text = ("## Run\n\n```bash\nbert-datagen run --input x --vocab v --output o \\\n    --max-seq-lenhgt 64\n```\n\n"
            "Then `--no-such-thing` tunes it.\n\n"
            "## Other\n\n`--totally-fake` and `--text-layout` and `--[no-]do-lower-case`.\n")
    assert option_problems(text, "fake.md") == [
        "fake.md: `bert-datagen run` has no option --max-seq-lenhgt",
        "fake.md: `bert-datagen run` has no option --no-such-thing",
        "fake.md: no command has the option --totally-fake (in '`--totally-fake` and `--text-layout` and `--[no-]do-lower-ca')",
    ]
    text = "## Train\n\n```bash\nbert-train pretrain --data d\n```\n\nIt takes `--text-layout` too.\n"
    assert option_problems(text, "fake.md") == ["fake.md: `bert-train pretrain` has no option --text-layout"]
