"""The original BERT record format, encoded without TensorFlow.

Each instance is a ``tf.train.Example`` (RECIPE.md section 4) serialized the
way protobuf's *deterministic* serialization does it: map entries sorted by
key, repeated numeric fields packed.  Records are framed as TFRecords
(length, masked CRC32C of the length, payload, masked CRC32C of the payload).

Encoding is vectorized over a batch of instances: the varints of every
integer feature of the batch are computed with NumPy in one go.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from dataclasses import dataclass
from typing import BinaryIO

import google_crc32c
import numpy as np

INT_FEATURES = (
    "input_ids",
    "input_mask",
    "segment_ids",
    "masked_lm_positions",
    "masked_lm_ids",
    "next_sentence_labels",
)
FLOAT_FEATURES = ("masked_lm_weights",)
# Deterministic serialization writes map entries in key order.
FEATURE_ORDER = tuple(sorted(INT_FEATURES + FLOAT_FEATURES))


def feature_spec(max_seq_length: int, max_predictions_per_seq: int) -> dict[str, tuple[str, int]]:
    """Name -> (dtype, length) of every feature, as the original trainer parses them."""
    s, p = max_seq_length, max_predictions_per_seq
    return {
        "input_ids": ("int64", s),
        "input_mask": ("int64", s),
        "segment_ids": ("int64", s),
        "masked_lm_positions": ("int64", p),
        "masked_lm_ids": ("int64", p),
        "masked_lm_weights": ("float32", p),
        "next_sentence_labels": ("int64", 1),
    }


@dataclass
class InstanceBatch:
    """Padded instances, one row each (the record's features, before encoding)."""

    input_ids: np.ndarray  # (n, max_seq_length) int
    input_mask: np.ndarray  # (n, max_seq_length) 0/1
    segment_ids: np.ndarray  # (n, max_seq_length) 0/1
    masked_lm_positions: np.ndarray  # (n, max_predictions) int
    masked_lm_ids: np.ndarray  # (n, max_predictions) int
    masked_lm_weights: np.ndarray  # (n, max_predictions) float32
    next_sentence_labels: np.ndarray  # (n,) 0/1

    def __len__(self) -> int:
        return int(self.input_ids.shape[0])

    def row(self, i: int) -> dict[str, np.ndarray]:
        return {name: np.atleast_1d(getattr(self, name)[i]) for name in FEATURE_ORDER}


# ---------------------------------------------------------------- varints


def _varint(value: int) -> bytes:
    out = bytearray()
    value &= (1 << 64) - 1
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _varint_rows(matrix: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Varint bytes of every row of a non-negative int matrix.

    Returns the bytes of all rows concatenated and each row's byte offset
    (length n + 1).
    """
    values = np.ascontiguousarray(matrix, dtype=np.uint64)
    if values.ndim == 1:
        values = values[:, None]
    n = values.shape[0]
    flat_values = values.ravel()
    # A value takes one byte per started 7-bit group (at least one); only as many groups as the
    # largest value needs are looked at (token ids need 3 of the 10).
    top = int(flat_values.max()) if flat_values.size else 0
    n_groups = max(1, -(-top.bit_length() // 7))
    if n_groups == 1:  # every value is one byte (masks, segment ids, labels, small lengths)
        return flat_values.astype(np.uint8), np.arange(n + 1, dtype=np.int64) * values.shape[1]
    nbytes = np.ones(flat_values.shape, dtype=np.int64)
    for k in range(1, n_groups):
        nbytes += flat_values >= np.uint64(1 << (7 * k))
    starts = np.zeros(flat_values.size + 1, dtype=np.int64)
    np.cumsum(nbytes, out=starts[1:])
    flat = np.empty(int(starts[-1]), dtype=np.uint8)
    for k in range(n_groups):
        has = nbytes > k
        group = ((flat_values >> np.uint64(7 * k)) & np.uint64(0x7F)).astype(np.uint8)
        group |= (nbytes > k + 1).astype(np.uint8) << 7
        if k == 0:
            flat[starts[:-1]] = group
        else:
            flat[starts[:-1][has] + k] = group[has]
    row_len = nbytes.reshape(n, -1).sum(axis=1) if n else np.zeros(0, dtype=np.int64)
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(row_len, out=offsets[1:])
    return flat, offsets


def _length_delimited(field: int, payload: bytes) -> bytes:
    return _varint((field << 3) | 2) + _varint(len(payload)) + payload


_KEY_BYTES = {name: b"\x0a" + _varint(len(name)) + name.encode() for name in FEATURE_ORDER}


def _ragged_interleave(pieces: list[tuple[np.ndarray, np.ndarray] | bytes], n: int) -> tuple[np.ndarray, np.ndarray]:
    """Row i of the result = piece_0[i] + piece_1[i] + ...; a piece is ragged rows (flat uint8 bytes,
    row offsets of length n + 1) or constant bytes repeated in every row. Returns (flat, offsets)."""
    lens = np.empty((n, len(pieces)), dtype=np.int64)
    for k, piece in enumerate(pieces):
        lens[:, k] = len(piece) if isinstance(piece, bytes) else np.diff(piece[1])
    starts = np.zeros(n * len(pieces) + 1, dtype=np.int64)
    np.cumsum(lens.ravel(), out=starts[1:])
    total = int(starts[-1])
    starts = starts[:-1].reshape(n, len(pieces))
    out = np.empty(total, dtype=np.uint8)
    for k, piece in enumerate(pieces):
        if isinstance(piece, bytes):
            const = np.frombuffer(piece, dtype=np.uint8)
            out[starts[:, k][:, None] + np.arange(const.size)] = const
        else:
            flat, offsets = piece
            if flat.size:
                shift = starts[:, k] - offsets[:-1]
                out[np.repeat(shift, lens[:, k]) + np.arange(flat.size)] = flat
    row_offsets = np.empty(n + 1, dtype=np.int64)
    row_offsets[:n] = starts[:, 0] if n else 0
    row_offsets[n] = total
    return out, row_offsets


def _varints_1d(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    return _varint_rows(np.asarray(values, dtype=np.int64).reshape(-1, 1))


def encode_batch(batch: InstanceBatch) -> list[bytes]:
    """Serialized ``tf.train.Example`` bytes of every instance in the batch.

    Vectorized over the batch: every length prefix of every nesting level is computed for all rows
    at once and the pieces are interleaved with NumPy; equal to ``encode_batch_reference``.
    """
    flat, offsets = encode_batch_flat(batch)
    data = flat.tobytes()
    return [data[offsets[i]:offsets[i + 1]] for i in range(len(batch))]


def encode_batch_flat(batch: InstanceBatch) -> tuple[np.ndarray, np.ndarray]:
    """Like ``encode_batch``, as all payloads concatenated (uint8) and their offsets (n + 1)."""
    n = len(batch)
    if n == 0:
        return np.zeros(0, dtype=np.uint8), np.zeros(1, dtype=np.int64)
    pieces: list[tuple[np.ndarray, np.ndarray] | bytes] = []
    entry_sizes = np.zeros(n, dtype=np.int64)
    for name in FEATURE_ORDER:
        if name in FLOAT_FEATURES:
            weights = np.ascontiguousarray(getattr(batch, name), dtype="<f4").reshape(n, -1)
            values = (weights.view(np.uint8).ravel(), np.arange(n + 1, dtype=np.int64) * weights.shape[1] * 4)
            list_tag = b"\x12"  # Feature.float_list
        else:
            values = _varint_rows(getattr(batch, name))
            list_tag = b"\x1a"  # Feature.int64_list
        value_len = np.diff(values[1])
        vl = _varints_1d(value_len)  # packed field: 0x0a len values
        list_len = 1 + np.diff(vl[1]) + value_len
        ll = _varints_1d(list_len)  # Feature: tag len List
        feature_len = 1 + np.diff(ll[1]) + list_len
        fl = _varints_1d(feature_len)  # map entry value: 0x12 len Feature
        entry_len = len(_KEY_BYTES[name]) + 1 + np.diff(fl[1]) + feature_len
        el = _varints_1d(entry_len)  # Features map entry: 0x0a len Entry
        entry_sizes += 1 + np.diff(el[1]) + entry_len
        pieces += [b"\x0a", el, _KEY_BYTES[name] + b"\x12", fl, list_tag, ll, b"\x0a", vl, values]
    return _ragged_interleave([b"\x0a", _varints_1d(entry_sizes), *pieces], n)


def encode_batch_reference(batch: InstanceBatch) -> list[bytes]:
    """Serialized ``tf.train.Example`` bytes, one record at a time (the reference for encode_batch)."""
    n = len(batch)
    packed: dict[str, tuple[bytes, np.ndarray]] = {}
    for name in INT_FEATURES:
        flat, offsets = _varint_rows(getattr(batch, name))
        packed[name] = (flat.tobytes(), offsets)
    weights = np.ascontiguousarray(batch.masked_lm_weights, dtype="<f4")
    weight_bytes = weights.tobytes()
    row_w = weights.shape[1] * 4

    records: list[bytes] = []
    for i in range(n):
        entries = []
        for name in FEATURE_ORDER:
            if name in packed:
                data, offsets = packed[name]
                values = data[offsets[i] : offsets[i + 1]]
                feature = _length_delimited(3, _length_delimited(1, values))  # int64_list
            else:
                values = weight_bytes[i * row_w : (i + 1) * row_w]
                feature = _length_delimited(2, _length_delimited(1, values))  # float_list
            entry = _KEY_BYTES[name] + _length_delimited(2, feature)
            entries.append(_length_delimited(1, entry))
        records.append(_length_delimited(1, b"".join(entries)))
    return records


# ---------------------------------------------------------------- TFRecord framing


def masked_crc32c(data: bytes) -> int:
    crc = google_crc32c.value(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def frame_record(payload: bytes) -> bytes:
    length = struct.pack("<Q", len(payload))
    return (
        length
        + struct.pack("<I", masked_crc32c(length))
        + payload
        + struct.pack("<I", masked_crc32c(payload))
    )


def frame_flat(flat: np.ndarray, offsets: np.ndarray) -> tuple[bytes, np.ndarray]:
    """TFRecord framing of concatenated payloads: (framed bytes, framed offsets), equal to
    ``frame_record`` applied to each payload. Headers and footers are built with NumPy (one CRC
    per distinct length, one C call per payload); the bytes are joined by one ``bytes.join``."""
    lengths = np.diff(offsets).astype(np.int64)
    n = lengths.size
    framed_offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(lengths + 16, out=framed_offsets[1:])
    unique, inverse = np.unique(lengths, return_inverse=True)
    length_crcs = np.array([masked_crc32c(struct.pack("<Q", int(v))) for v in unique], dtype="<u4")
    headers = np.empty((n, 12), dtype=np.uint8)
    headers[:, :8] = lengths.astype("<u8").view(np.uint8).reshape(n, 8)
    headers[:, 8:] = length_crcs[inverse].view(np.uint8).reshape(n, 4)
    head = headers.tobytes()
    data = np.ascontiguousarray(flat, dtype=np.uint8).tobytes()  # crc32c takes bytes, not memoryviews
    bounds = offsets.tolist()
    pieces: list[bytes] = []
    for i in range(n):
        payload = data[bounds[i]:bounds[i + 1]]
        pieces += (head[12 * i:12 * i + 12], payload, struct.pack("<I", masked_crc32c(payload)))
    return b"".join(pieces), framed_offsets


def frame_records(payloads: list[bytes]) -> bytes:
    return b"".join(frame_record(p) for p in payloads)


class RecordError(ValueError):
    """A TFRecord file or record that does not parse; says where."""


def iter_tfrecords(stream: BinaryIO, name: str = "<stream>", check_crc: bool = True) -> Iterator[bytes]:
    """Payloads of a TFRecord stream, checking framing and CRCs."""
    index = 0
    offset = 0
    while True:
        header = stream.read(12)
        if not header:
            return
        if len(header) < 12:
            raise RecordError(f"{name}: record {index} at byte {offset}: truncated length header")
        (length,) = struct.unpack("<Q", header[:8])
        (length_crc,) = struct.unpack("<I", header[8:])
        if check_crc and masked_crc32c(header[:8]) != length_crc:
            raise RecordError(f"{name}: record {index} at byte {offset}: length CRC mismatch")
        payload = stream.read(length)
        footer = stream.read(4)
        if len(payload) < length or len(footer) < 4:
            raise RecordError(f"{name}: record {index} at byte {offset}: truncated payload")
        if check_crc and masked_crc32c(payload) != struct.unpack("<I", footer)[0]:
            raise RecordError(f"{name}: record {index} at byte {offset}: payload CRC mismatch")
        yield payload
        index += 1
        offset += 16 + length


# ---------------------------------------------------------------- decoding


def _read_varint(buf: bytes, pos: int) -> tuple[int, int]:
    result = 0
    shift = 0
    while True:
        if pos >= len(buf):
            raise RecordError("truncated varint")
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            return result, pos
        shift += 7
        if shift >= 70:
            raise RecordError("varint too long")


def _fields(buf: bytes) -> Iterator[tuple[int, int, int | bytes]]:
    """(field number, wire type, value) of a protobuf message."""
    pos = 0
    while pos < len(buf):
        key, pos = _read_varint(buf, pos)
        field, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = _read_varint(buf, pos)
        elif wire == 2:
            size, pos = _read_varint(buf, pos)
            if pos + size > len(buf):
                raise RecordError("truncated length-delimited field")
            value, pos = buf[pos : pos + size], pos + size
        elif wire == 5:
            value, pos = buf[pos : pos + 4], pos + 4
        elif wire == 1:
            value, pos = buf[pos : pos + 8], pos + 8
        else:
            raise RecordError(f"unsupported wire type {wire}")
        yield field, wire, value


def _decode_varints(data: bytes) -> list[int]:
    out, pos = [], 0
    while pos < len(data):
        v, pos = _read_varint(data, pos)
        out.append(v - (1 << 64) if v >= 1 << 63 else v)
    return out


def decode_example(payload: bytes) -> dict[str, np.ndarray]:
    """Features of a serialized ``tf.train.Example`` (any field order, packed or not)."""
    features: dict[str, np.ndarray] = {}
    for field, _, features_msg in _fields(payload):
        if field != 1:
            continue
        for f2, _, entry in _fields(features_msg):  # type: ignore[arg-type]
            if f2 != 1:
                continue
            key, value = None, b""
            for f3, _, v in _fields(entry):  # type: ignore[arg-type]
                if f3 == 1:
                    key = v.decode("utf-8")  # type: ignore[union-attr]
                elif f3 == 2:
                    value = v
            if key is None:
                raise RecordError("feature map entry without a key")
            features[key] = _decode_feature(value)  # type: ignore[arg-type]
    return features


def _decode_feature(feature: bytes) -> np.ndarray:
    for kind, _, lst in _fields(feature):
        ints: list[int] = []
        floats: list[float] = []
        for f, wire, v in _fields(lst):  # type: ignore[arg-type]
            if f != 1:
                continue
            if kind == 3:
                ints.extend(_decode_varints(v) if wire == 2 else [v])  # type: ignore[list-item,arg-type]
            elif kind == 2:
                raw = v if wire == 2 else v
                floats.extend(np.frombuffer(raw, dtype="<f4").tolist())  # type: ignore[arg-type]
            elif kind == 1:
                raise RecordError("bytes features are not part of the BERT format")
        if kind == 3:
            return np.asarray(ints, dtype=np.int64)
        if kind == 2:
            return np.asarray(floats, dtype=np.float32)
    return np.zeros(0, dtype=np.int64)
