"""A dataset directory through the contract, as runs and exports open it: one manifest parser for
pre-training and fine-tuning data, its errors as the trainer's `DataError` naming the file."""

from __future__ import annotations

import os

from bert_datagen.contract.dataset import Dataset, DatasetError, open_dataset
from bert_datagen.contract.fs import is_remote
from bert_datagen.contract.manifest import MANIFEST_NAME, Manifest, ManifestError
from bert_datagen.trainer.errors import DataError
from bert_datagen.trainer.runtime.gfs import GFILE_FS, read_errors


def open_manifest_dataset(directory: str) -> Dataset:
    """A dataset directory through the contract (one manifest parser for pre-training and
    fine-tuning): its manifest, kind and shards, no vocab read; DataError naming the file if not."""
    try:
        return open_dataset(directory, GFILE_FS, need_vocab=False)
    except (ManifestError, DatasetError) as exc:
        raise DataError(str(exc)) from exc
    except read_errors() as exc:  # a directory we may not read
        reason = getattr(exc, "message", None) or getattr(exc, "strerror", None) or exc
        raise DataError(f"{directory}/{MANIFEST_NAME}: cannot read: {reason}") from exc


def load_dataset_manifest(data: str) -> Manifest | None:
    """The manifest of a dataset directory; None for TFRecord globs and unreadable manifests."""
    if not is_remote(data) and not os.path.exists(os.path.join(data, MANIFEST_NAME)):
        return None
    try:
        return open_manifest_dataset(data).manifest
    except DataError:
        return None
