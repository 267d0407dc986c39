"""Beam's own option parser, for the checks of the options we pass through to Beam: below both the
CLI's pass-through check (`options.py`) and the runners' range check (`runners.py`)."""

from __future__ import annotations


class BeamOptionError(ValueError):
    """A Beam option with a value Beam's parser rejects."""


def beam_parser():
    """An argparse parser of every Beam pipeline option (Dask's too where installed) that raises
    BeamOptionError instead of printing usage and exiting."""
    from apache_beam.options.pipeline_options import PipelineOptions, _BeamArgumentParser

    try:  # registers DaskOptions, when the dask extra is installed
        import apache_beam.runners.dask.dask_runner  # noqa: F401
    except (ImportError, AttributeError):
        # AttributeError: dask without distributed, where Beam's module fails on an annotation
        # (`ddist.Client` of the {} it puts in distributed's place); the runner check names the package.
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
