"""`bert-datagen run` passes options it does not define to Beam's PipelineOptions. Beam discards the
ones it does not know either with a warning, so a misspelled option of ours (`--max-seq-lenght 64`)
would silently run with the default. Here every such option is checked against what Beam defines
and parsed with Beam's own parser before any work: an unknown one or a bad value is a usage error
naming the option (with the closest known spelling)."""

from __future__ import annotations

from collections.abc import Sequence

import click

from contract.cliutil import closest_option


class BeamOptionError(ValueError):
    """A Beam option with a value Beam's parser rejects."""


def _beam_parser():
    from apache_beam.options.pipeline_options import PipelineOptions, _BeamArgumentParser

    try:  # registers DaskOptions, when the dask extra is installed
        import apache_beam.runners.dask.dask_runner  # noqa: F401
    except ImportError:
        pass

    class CheckingParser(_BeamArgumentParser):
        def error(self, message: str):  # argparse would print its own usage and exit
            raise BeamOptionError(message)

    parser = CheckingParser(allow_abbrev=False)
    seen: dict[str, type] = {}
    for cls in PipelineOptions.__subclasses__():
        seen.setdefault(str(cls), cls)
    for cls in seen.values():
        cls._add_argparse_args(parser)  # same construction as PipelineOptions.get_all_options
    return parser


def beam_option_names() -> list[str]:
    return sorted(s for s in _beam_parser()._option_string_actions if s.startswith("--"))


def check_pass_through_options(args: Sequence[str], own_options: Sequence[str]) -> None:
    """Raise click.UsageError (exit 2) unless every option in ``args`` is Beam's, with a valid value."""
    parser = _beam_parser()
    beam_names = [s for s in parser._option_string_actions if s.startswith("--")]
    for arg in args:
        if arg.startswith("-") and arg != "--":
            name = arg.split("=", 1)[0]
            if name not in parser._option_string_actions:
                hint = closest_option(name, [*own_options, *beam_names])
                raise click.UsageError(f"no such option: {name}{hint}; neither bert-datagen run nor Beam's "
                                       "PipelineOptions define it")
    try:
        parser.parse_known_args(list(args))
    except BeamOptionError as e:
        raise click.UsageError(f"Beam option: {e}") from e
