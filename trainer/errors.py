"""The trainer's error types: every user error of `bert-train` is one of these, with a message that
names the path or option and the reason, so the CLI prints it as one line without a traceback."""

from __future__ import annotations


class TrainerError(ValueError):
    """Base of every error the trainer reports to the user (bad option, input, checkpoint or run)."""


class TrainConfigError(TrainerError):
    """A configuration that cannot describe a valid model or run."""


class DataError(TrainerError):
    """Input that cannot be used (missing, corrupt, too small, or not fitting the model); names the file."""


class CheckpointError(TrainerError):
    """A run checkpoint that is missing or does not match the model; names it."""


class CheckpointFormatError(TrainConfigError):
    """A checkpoint, config or output path that cannot be used; the message names the file."""


class CheckpointMismatchError(CheckpointFormatError):
    """A checkpoint lacks weights the model needs, or holds them in the wrong shape."""


class TrainingError(TrainerError, RuntimeError):
    """A run that cannot continue (non-finite loss, a run dir of another config or dataset, ...)."""
