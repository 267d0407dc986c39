"""Serialized ``tf.train.Example`` payloads, unframed, for the tests and benchmarks that look at
records one at a time (the product frames records as it encodes them:
`bert_datagen.datagen.records.frame_columns`), and the scalar reference the encoder is checked
against."""

from __future__ import annotations

import numpy as np

from bert_datagen.datagen.record_layout import FLOAT_FEATURES
from bert_datagen.datagen.records import InstanceBatch, frame_columns, varint

HEADER, FOOTER = 12, 4  # a TFRecord's length and its CRC; the payload's CRC


def encode_payloads(columns: dict[str, np.ndarray]) -> list[bytes]:
    """The serialized Example of every row (all columns have the same number of rows)."""
    blob, framed = frame_columns(columns)
    ends = np.cumsum(framed).tolist()
    return [blob[end - size + HEADER:end - FOOTER] for end, size in zip(ends, framed.tolist(), strict=True)]


def encode_batch(batch: InstanceBatch) -> list[bytes]:
    """Serialized ``tf.train.Example`` bytes of every instance in the batch, through the encoder."""
    return encode_payloads(batch.columns())


# ---------------------------------------------------------------- the reference
# Records built value by value with scalar varints: independent of the vectorized slot encoder they check.


def length_delimited(field: int, payload: bytes) -> bytes:
    return varint((field << 3) | 2) + varint(len(payload)) + payload


def encode_batch_reference(batch: InstanceBatch) -> list[bytes]:
    """Serialized ``tf.train.Example`` bytes, one record at a time (the reference for encode_batch)."""
    n = len(batch)
    names = batch.feature_names
    packed = {name: [np.atleast_1d(np.asarray(row)).astype(np.uint64).tolist() for row in getattr(batch, name)]
              for name in names if name not in FLOAT_FEATURES}
    weights = np.ascontiguousarray(batch.masked_lm_weights if batch.masked_lm_weights is not None
                                   else np.zeros((n, 0)), dtype="<f4")
    weight_bytes = weights.tobytes()
    row_w = weights.shape[1] * 4

    records: list[bytes] = []
    for i in range(n):
        entries = []
        for name in names:
            if name in packed:
                values = b"".join(varint(v) for v in packed[name][i])
                feature = length_delimited(3, length_delimited(1, values))  # int64_list
            else:
                values = weight_bytes[i * row_w : (i + 1) * row_w]
                feature = length_delimited(2, length_delimited(1, values))  # float_list
            entry = length_delimited(1, name.encode()) + length_delimited(2, feature)
            entries.append(length_delimited(1, entry))
        records.append(length_delimited(1, b"".join(entries)))
    return records
