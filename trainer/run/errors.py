"""Kept only for trainer/finetune/'s imports until they name `bert_datagen.trainer.errors` (issue #34)."""

from bert_datagen.trainer.errors import (  # noqa: F401
    CheckpointError,
    CheckpointFormatError,
    CheckpointMismatchError,
    ConfigError,
    DataError,
    TrainerError,
    TrainingError,
)
