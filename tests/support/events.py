"""TensorBoard scalars of a run read without TensorFlow (the event files `runtime/tensorboard.py`
writes: TFRecord-framed `Event` protos), for tests that run on an install without it."""

from __future__ import annotations

import struct
from pathlib import Path

from bert_datagen.datagen.protowire import iter_fields
from bert_datagen.datagen.tfrecord import iter_tfrecords


def scalars(run: Path, name: str, part: str = "train") -> dict[int, list[float]]:
    """Every value logged under tag `name` in RUN/tensorboard/PART, by step, in file order (a step
    redone after a resume appears once per time it was logged)."""
    found: dict[int, list[float]] = {}
    for path in sorted((run / "tensorboard" / part).iterdir()):
        with open(path, "rb") as stream:
            for record in iter_tfrecords(stream, str(path)):
                fields = list(iter_fields(record))
                step = next((v for n, _, v in fields if n == 2), 0)
                for summary in (v for n, _, v in fields if n == 5):
                    for value in (v for n, _, v in iter_fields(summary) if n == 1):  # type: ignore[arg-type]
                        parts = {n: v for n, _, v in iter_fields(value)}  # type: ignore[arg-type]
                        if parts.get(1) == name.encode():
                            found.setdefault(int(step), []).append(
                                struct.unpack("<f", int(parts[2]).to_bytes(4, "little"))[0])  # type: ignore[arg-type]
    return found
