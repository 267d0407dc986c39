"""`--backend` as the commands take it: chosen (and exported to Keras) before Keras is imported."""

from __future__ import annotations

import os

import click

from bert_datagen.trainer.backends import BACKENDS, BackendError, choose_backend

BACKEND_HELP = "Keras backend [default: KERAS_BACKEND, else tensorflow]; a run may resume on the other."


def backend_option(fn):
    return click.option("--backend", type=click.Choice(BACKENDS), default=None, help=BACKEND_HELP)(fn)


def use_backend(option: str | None) -> str:
    """The process's backend from `--backend` and this process's `KERAS_BACKEND`; a contradiction, an
    uninstalled backend or one Keras did not start on is a usage error (exit 2) naming why."""
    try:
        return choose_backend(option, os.environ)
    except BackendError as exc:
        raise click.UsageError(str(exc)) from None

