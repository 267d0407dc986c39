"""The options of the commands that run a Beam pipeline (`bert-datagen run` and `task`).

They pass options they do not define to Beam's PipelineOptions. Beam discards the ones it does not
know either with a warning, so a misspelled option of ours (`--max-seq-lenght 64`) would silently run
with the default. Here every such option is checked against what Beam defines and parsed with Beam's
own parser before any work: an unknown one or a bad value is a usage error naming the option (with
the closest known spelling). The options both commands have (vocab, output, runner) are declared
once, here, and so is how they become a RunnerOptions, how a config's refusal becomes a usage error
and how a driver's error becomes the command's one `Error:` line.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from typing import TypeVar

import click

from bert_datagen.cli.plumbing import Int, closest_option, refuse_unused_options
from bert_datagen.pipelines.beam.parser import BeamOptionError, beam_parser
from bert_datagen.pipelines.beam.runners import RUNNERS, RunnerError, RunnerOptions

F = TypeVar("F", bound=Callable[..., object])

# A command that passes the options it does not define on to Beam.
PASS_THROUGH_SETTINGS = {"ignore_unknown_options": True, "allow_extra_args": True}


# Beam's S3 options configure Beam's S3 filesystem, which bert-datagen does not use (s3:// goes through
# s3fs in every process: bert_datagen.contract.buckets): refused, naming the setting that works.
_S3_SETTINGS = {"--s3_endpoint_url": "AWS_ENDPOINT_URL", "--s3_access_key_id": "AWS_ACCESS_KEY_ID",
                "--s3_secret_access_key": "AWS_SECRET_ACCESS_KEY", "--s3_session_token": "AWS_SESSION_TOKEN",
                "--s3_region_name": "AWS_DEFAULT_REGION"}


def check_pass_through_options(args: Sequence[str], own_options: Sequence[str], command: str) -> None:
    """Raise click.UsageError (exit 2) unless every option in ``args`` is Beam's, with a valid value."""
    parser = beam_parser()
    beam_names = [s for s in parser._option_string_actions if s.startswith("--")]
    for arg in args:
        if arg.startswith("-") and arg != "--":
            name = arg.split("=", 1)[0]
            if name.startswith("--s3_"):
                setting = _S3_SETTINGS.get(name, "AWS's own configuration (~/.aws/config, AWS_* variables)")
                raise click.UsageError(f"{name} would be ignored: s3:// paths go through s3fs, which reads "
                                       f"{setting} (docs/buckets.md)")
            if name not in parser._option_string_actions:
                hint = closest_option(name, [*own_options, *beam_names])
                raise click.UsageError(f"no such option: {name}{hint}; neither {command} nor Beam's "
                                       "PipelineOptions define it")
    try:
        parser.parse_known_args(list(args))
    except BeamOptionError as e:
        raise click.UsageError(f"Beam option: {e}") from e


def stray_arguments(args: list[str]) -> list[str]:
    """Words that are neither a Beam option (``--name=value``, ``--name value``, ``--flag``) nor its value."""
    stray, may_take_value = [], False
    for arg in args:
        if arg.startswith("--"):
            may_take_value = "=" not in arg
        elif may_take_value:
            may_take_value = False
        else:
            stray.append(arg)
    return stray


def beam_args_of(ctx: click.Context) -> list[str]:
    """The command's arguments it does not define, checked as Beam options (click.UsageError if not)."""
    args = list(ctx.args)
    own = [o for p in ctx.command.params for o in (*p.opts, *p.secondary_opts)]
    check_pass_through_options(args, own, f"bert-datagen {ctx.command.name}")
    bad = stray_arguments(args)
    if bad:
        raise click.UsageError(f"unexpected argument(s) {' '.join(bad)}; Beam options look like --name=value")
    return args


def dataset_options(f: F) -> F:
    """--vocab, --output, --overwrite and the runner options of a command that writes a dataset."""
    decorators = [
        click.option("--vocab", "vocab_path", required=True, help="WordPiece vocab file (one token per line)."),
        click.option("--output", "output_dir", required=True, help="Dataset directory to write."),
        click.option("--overwrite", is_flag=True, default=False, help="Replace an existing dataset in --output."),
        click.option("--runner", type=click.Choice(RUNNERS, case_sensitive=False), default="DirectRunner",
                     show_default=True),
        click.option("--dask-scheduler", default=None,
                     help="DaskRunner: address of a running dask.distributed scheduler (default: a local cluster)."),
        click.option("--dask-workers", type=Int(), default=2, show_default=True,
                     help="DaskRunner without --dask-scheduler: worker processes of the local cluster."),
    ]
    for decorate in reversed(decorators):  # applied bottom up, so --help lists them in this order
        f = decorate(f)
    return f


@contextlib.contextmanager
def usage_errors() -> Iterator[None]:
    """A config's refusal of an option value (its validation, the one place each check lives) as a
    usage error naming the option: exit 2, before any work."""
    from bert_datagen.datagen.config import ConfigError

    try:
        yield
    except (ConfigError, RunnerError) as e:
        raise click.UsageError(str(e)) from e


def _unused_runner_options(runner: str, dask_scheduler: str | None, beam_args: list[str]) -> dict[str, str]:
    """The runner options this run would ignore, and why."""
    if runner.lower() != "daskrunner":
        why = f"--runner {runner} is not DaskRunner (only it reads the Dask options)"
        return {"dask_scheduler": why, "dask_workers": why}
    if dask_scheduler is not None or any(a.split("=", 1)[0] == "--dask_client_address" for a in beam_args):
        return {"dask_workers": "a running scheduler is given, whose own workers run the pipeline "
                                "(--dask-workers sizes the local cluster started without one)"}
    return {}


def runner_options_of(ctx: click.Context, options: dict) -> RunnerOptions:
    """Takes the runner options of `dataset_options` out of ``options``, with the command's Beam
    options (``beam_args_of``), as one RunnerOptions; a value it refuses is a usage error."""
    beam_args = beam_args_of(ctx)
    with usage_errors():
        runner = RunnerOptions(runner=options.pop("runner"), beam_args=tuple(beam_args),
                               dask_scheduler=options.pop("dask_scheduler"), dask_workers=options.pop("dask_workers"))
    refuse_unused_options(ctx, _unused_runner_options(runner.runner, runner.dask_scheduler, beam_args))
    return runner


def summary_lines(rows: list[tuple[str, str]]) -> str:
    """A run's summary table: one indented `name  value` line per row, the values aligned."""
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"  {k.ljust(width)}  {v}" for k, v in rows)


@contextlib.contextmanager
def driver_errors() -> Iterator[None]:
    """A driver's refusal (bad input, runner, config or output) as the command's `Error:` line, exit 1."""
    from bert_datagen.datagen.config import ConfigError
    from bert_datagen.pipelines.beam.errors import DatagenError
    from bert_datagen.pipelines.beam.outputs import OutputError
    from bert_datagen.pipelines.beam.runners import RunnerError

    try:
        yield
    except (DatagenError, RunnerError, ConfigError, OutputError) as e:
        raise click.ClickException(str(e)) from e
