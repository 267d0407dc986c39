"""A task shard's record lengths: each record's token count (its ``input_mask``'s ones), written
beside the shard (``part-00000-of-00003.tfrecord.lengths``) as little-endian uint16, a record each.

Length grouping (`bert-train finetune --group-by-length`) sorts a window of records by length before
it cuts the window into batches, so each rank must know every length of the window; from this file
(2 bytes a record, listed with its sha256 in the manifest) a rank learns them without reading the
window's records, and then reads only its own.
"""

from __future__ import annotations

import hashlib

import numpy as np

LENGTHS_SUFFIX = ".lengths"
_DTYPE = np.dtype("<u2")  # a task record holds at most 65,535 tokens (max_seq_length is far below)


class LengthsError(ValueError):
    """A lengths file that does not describe its shard; says which file and why."""


def lengths_name(shard_name: str) -> str:
    """The lengths file of a shard: ``part-00000-of-00003.tfrecord.lengths`` beside it."""
    return shard_name + LENGTHS_SUFFIX


def lengths_file(input_mask: np.ndarray, shard_name: str) -> tuple[str, bytes, dict]:
    """What a writer puts beside a task shard whose records have this ``input_mask`` (records x
    sequence): its relative path, its bytes, and the manifest's entry for it."""
    counts = np.asarray(input_mask).astype(bool).sum(axis=1)
    data = counts.astype(_DTYPE).tobytes()
    path = lengths_name(shard_name)
    return path, data, {"path": path, "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}


def read_lengths(data: bytes, records: int, size: int, sha256: str, path: str) -> np.ndarray:
    """The lengths of a shard's ``records`` records from the file's ``data``, checked against its
    manifest entry (``size``, ``sha256``); LengthsError names the file."""
    if len(data) != size or hashlib.sha256(data).hexdigest() != sha256:
        raise LengthsError(f"{path}: its size or sha256 differs from the manifest's: the lengths were changed "
                           "after the dataset was written")
    if len(data) != records * _DTYPE.itemsize:
        raise LengthsError(f"{path}: {len(data)} bytes for {records} records of {_DTYPE.itemsize} bytes")
    return np.frombuffer(data, _DTYPE).astype(np.int64)
