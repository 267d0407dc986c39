"""TensorBoard output of a run: RUN/tensorboard/{train,eval}/ event files, written by us.

An event file is TFRecord-framed `Event` protos (the first saying the file's version), which
TensorBoard reads as scalars when each value is a `simple_value`. Written here with the project's
TFRecord framing and protobuf wire helpers, so a run on either backend writes the same files and
needs neither TensorFlow nor the tensorboard package. Only the chief writes; the others get
writers that write nothing.
"""

from __future__ import annotations

import os
import socket
import struct
import time
from pathlib import Path

from bert_datagen.datagen.protowire import FIXED32, FIXED64, field_bytes, field_varint, varint
from bert_datagen.datagen.tfrecord import frame_record

_FILE_VERSION = b"brain.Event:2"


def _event(wall_time: float, step: int = 0, *, file_version: bytes = b"", summary: bytes = b"") -> bytes:
    out = varint(1 << 3 | FIXED64) + struct.pack("<d", wall_time) + field_varint(2, step)
    if file_version:
        out += field_bytes(3, file_version)
    if summary:
        out += field_bytes(5, summary)
    return out


def _scalar(tag: str, value: float) -> bytes:
    one = field_bytes(1, tag.encode("utf-8")) + varint(2 << 3 | FIXED32) + struct.pack("<f", value)
    return field_bytes(1, one)


class EventWriter:
    """Scalars of one directory of RUN/tensorboard, appended to an event file of this process."""

    def __init__(self, directory: Path | None) -> None:
        self._path = None
        if directory is not None:
            directory.mkdir(parents=True, exist_ok=True)
            name = f"events.out.tfevents.{int(time.time())}.{socket.gethostname()}.{os.getpid()}"
            self._path = directory / name
            self._append([_event(time.time(), file_version=_FILE_VERSION)])

    def scalars(self, step: int, values: dict[str, float]) -> None:
        """One event per value at `step` (TensorBoard's scalars dashboard)."""
        now = time.time()
        self._append([_event(now, step, summary=_scalar(tag, float(v))) for tag, v in values.items()])

    def _append(self, events: list[bytes]) -> None:
        if self._path is None:
            return
        with open(self._path, "ab") as f:
            f.write(b"".join(frame_record(e) for e in events))


def tensorboard_writers(run_dir: Path, chief: bool = True) -> tuple[EventWriter, EventWriter]:
    """The (train, eval) writers of RUN/tensorboard/; writers that write nothing on a non-chief worker."""
    if not chief:
        return EventWriter(None), EventWriter(None)
    return EventWriter(run_dir / "tensorboard" / "train"), EventWriter(run_dir / "tensorboard" / "eval")
