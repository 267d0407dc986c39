"""Serialized ``tf.train.Example`` payloads, unframed, for the tests and benchmarks that look at
records one at a time (the product frames records as it encodes them:
`bert_datagen.datagen.records.frame_columns`)."""

from __future__ import annotations

import numpy as np

from bert_datagen.datagen.records import frame_columns

HEADER, FOOTER = 12, 4  # a TFRecord's length and its CRC; the payload's CRC


def encode_payloads(columns: dict[str, np.ndarray]) -> list[bytes]:
    """The serialized Example of every row (all columns have the same number of rows)."""
    blob, framed = frame_columns(columns)
    ends = np.cumsum(framed).tolist()
    return [blob[end - size + HEADER:end - FOOTER] for end, size in zip(ends, framed.tolist(), strict=True)]
