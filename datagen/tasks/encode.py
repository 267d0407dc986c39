"""Task records -> serialized `tf.train.Example`s, with the slot encoder of `bert_datagen.datagen.records`.

Any set of fixed-length columns: float32 columns become float lists, every other column an int64
list; map entries in key order, values packed, as protobuf's deterministic serialization writes
them (the same bytes as `bert_datagen.datagen.records` writes for pre-training features).
"""

from __future__ import annotations

import numpy as np

from bert_datagen.datagen import records as _slots
from bert_datagen.datagen.tfrecord import frame_records


def _key_bytes(name: str) -> bytes:
    raw = name.encode()
    return b"\x0a" + _slots._varint(len(raw)) + raw


def encode_payloads(columns: dict[str, np.ndarray]) -> list[bytes]:
    """The serialized Example of every row (all columns have the same number of rows)."""
    names = sorted(columns)
    n = int(columns[names[0]].shape[0]) if names else 0
    if n == 0:
        return []
    pieces = []
    entries_len = np.zeros(n, dtype=np.int64)
    for name in names:
        values = columns[name]
        if values.dtype == np.float32:
            floats = np.ascontiguousarray(values, dtype="<f4").reshape(n, -1)
            piece = (floats.view(np.uint8), None)
            values_len = np.full(n, floats.shape[1] * 4, dtype=np.int64)
            list_tag = b"\x12"  # Feature.float_list
        else:
            # Any integer dtype: the slot encoder widens to uint64 (two's complement for -1) itself.
            piece, values_len = _slots._varint_slots(values.reshape(n, -1))
            list_tag = b"\x1a"  # Feature.int64_list
        key = _key_bytes(name)
        vl, vl_n = _slots._length_varint(values_len)
        list_len = 1 + vl_n + values_len
        ll, ll_n = _slots._length_varint(list_len)
        feature_len = 1 + ll_n + list_len
        fl, fl_n = _slots._length_varint(feature_len)
        entry_len = len(key) + 1 + fl_n + feature_len
        el, el_n = _slots._length_varint(entry_len)
        entries_len += 1 + el_n + entry_len
        pieces += [_slots._const(b"\x0a", n), el, _slots._const(key + b"\x12", n), fl, _slots._const(list_tag, n),
                   ll, _slots._const(b"\x0a", n), vl, piece]
    head, head_n = _slots._length_varint(entries_len)
    lengths = 1 + head_n + entries_len
    flat = _slots._compact([_slots._const(b"\x0a", n), head, *pieces], n).tobytes()
    ends = np.cumsum(lengths).tolist()
    return [flat[lo:hi] for lo, hi in zip([0, *ends[:-1]], ends, strict=True)]


def encode_framed(columns: dict[str, np.ndarray]) -> tuple[bytes, list[int]]:
    """Every row as a framed TFRecord, back to back, and each framed record's length."""
    payloads = encode_payloads(columns)
    return frame_records(payloads), [len(p) + 16 for p in payloads]
