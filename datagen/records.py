"""The original BERT record format, encoded without TensorFlow (the layout, what a record holds,
is `bert_datagen.datagen.record_layout`).

Each instance is a ``tf.train.Example`` (RECIPE.md section 4) serialized the
way protobuf's *deterministic* serialization does it: map entries sorted by
key, repeated numeric fields packed.  Records are framed as TFRecords by
`bert_datagen.datagen.tfrecord`; `bert_datagen.datagen.example_codec` decodes them.

Encoding is vectorized over a batch of instances: the varints of every
integer feature of the batch are computed with NumPy in one go.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import google_crc32c
import numpy as np

from bert_datagen.datagen.record_layout import FEATURE_ORDER, FLOAT_FEATURES, INSTANCE_KEY, WORD_BITS
from bert_datagen.datagen.tfrecord import length_crcs, mask_crcs


@dataclass
class InstanceBatch:
    """Padded instances, one row each (the record's features, before encoding).

    A feature left ``None`` is not in the records (no NSP label without NSP, no masked_lm_* with
    dynamic masking); ``instance_key`` is only written for dynamic masking, ``word_continues_bits``
    only for dynamic masking with a word segmenter.
    """

    input_ids: np.ndarray  # (n, max_seq_length) int
    input_mask: np.ndarray  # (n, max_seq_length) 0/1
    segment_ids: np.ndarray  # (n, max_seq_length) 0/1
    masked_lm_positions: np.ndarray | None = None  # (n, max_predictions) int
    masked_lm_ids: np.ndarray | None = None  # (n, max_predictions) int
    masked_lm_weights: np.ndarray | None = None  # (n, max_predictions) float32
    next_sentence_labels: np.ndarray | None = None  # (n,) 0/1
    instance_key: np.ndarray | None = None  # (n,) int64 (the uint64 key's bits)
    word_continues_bits: np.ndarray | None = None  # (n, word_bits_length(max_seq_length)) int64

    def __len__(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def feature_names(self) -> tuple[str, ...]:
        """The features of these records, in serialization (key) order."""
        return tuple(sorted(name for name in (*FEATURE_ORDER, INSTANCE_KEY, WORD_BITS)
                            if getattr(self, name) is not None))

    def row(self, i: int) -> dict[str, np.ndarray]:
        return {name: np.atleast_1d(getattr(self, name)[i]) for name in self.feature_names}

    def columns(self) -> dict[str, np.ndarray]:
        """The records' features as ``frame_columns`` takes them: the float features as float32,
        every other feature an integer column."""
        columns = {}
        for name in self.feature_names:
            values = np.asarray(getattr(self, name))
            if name in FLOAT_FEATURES:
                values = values.astype(np.float32, copy=False)
            elif values.dtype == np.float32:  # frame_columns reads float32 as a float list; this one is int64
                values = values.astype(np.uint64)
            columns[name] = values
        return columns


# ---------------------------------------------------------------- varints


def varint(value: int) -> bytes:
    """The protobuf varint of one value (negative int64 values as their two's complement, 10 bytes)."""
    out = bytearray()
    value &= (1 << 64) - 1
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


@functools.cache
def _key_bytes(name: str) -> bytes:
    """A feature map entry's key field: tag, length, name."""
    raw = name.encode()
    return b"\x0a" + varint(len(raw)) + raw


# ---------------------------------------------------------------- slot encoding
# A batch is encoded as one (rows x slots) byte matrix with a same-shaped "keep" mask: every row
# has the same slots (a varint gets as many as the widest value of its column needs), and a
# short varint leaves its spare slots unkept. The kept slots in row-major order are then every
# record, back to back, with no per-record Python and no computed scatter indices.

# (bytes (n, k) uint8, keep (n, k) bool or None when every slot is kept)
_Piece = tuple[np.ndarray, np.ndarray | None]


def _varint_slots(values: np.ndarray) -> tuple[_Piece, np.ndarray]:
    """The varints of an int matrix (n, L) as slots, and each row's byte count.

    Negative int64 values take 10 bytes (two's complement), as protobuf writes them.
    """
    v = np.ascontiguousarray(values).astype(np.uint64).reshape(values.shape[0], -1)
    n, length = v.shape
    top = int(v.max()) if v.size else 0
    width = max(1, -(-top.bit_length() // 7))
    if width == 1:
        return (v.astype(np.uint8), None), np.full(n, length, dtype=np.int64)
    if top < 1 << 32:
        v = v.astype(np.uint32)  # a quarter of the memory traffic for the common case (token ids)
    nbytes = np.ones(v.shape, dtype=np.uint8)
    for k in range(1, width):
        nbytes += v >= (1 << (7 * k))
    slots = np.empty((n, length, width), dtype=np.uint8)
    keep = np.empty((n, length, width), dtype=bool)
    for k in range(width):
        group = (v >> (7 * k)).astype(np.uint8) & np.uint8(0x7F)
        slots[..., k] = group | ((nbytes > k + 1).view(np.uint8) << 7)
        np.greater(nbytes, k, out=keep[..., k])
    return (slots.reshape(n, length * width), keep.reshape(n, length * width)), nbytes.sum(axis=1, dtype=np.int64)


def _constant_slots(data: bytes, n: int) -> _Piece:
    return np.broadcast_to(np.frombuffer(data, dtype=np.uint8), (n, len(data))), None


def _length_slots(lengths: np.ndarray) -> tuple[_Piece, np.ndarray]:
    return _varint_slots(lengths.reshape(-1, 1))


def _example_slots(columns: dict[str, np.ndarray], n: int) -> tuple[list[_Piece], np.ndarray]:
    """The slot pieces of every row's serialized Example, and each row's payload length."""
    pieces: list[_Piece] = []
    entries_len = np.zeros(n, dtype=np.int64)
    for name in sorted(columns):
        column = columns[name]
        if column.dtype == np.float32:
            floats = np.ascontiguousarray(column, dtype="<f4").reshape(n, -1)
            values: _Piece = (floats.view(np.uint8), None)
            values_len = np.full(n, floats.shape[1] * 4, dtype=np.int64)
            list_tag = b"\x12"  # Feature.float_list
        else:
            # Any integer dtype: the slot encoder widens to uint64 (two's complement for -1) itself.
            values, values_len = _varint_slots(column.reshape(n, -1))
            list_tag = b"\x1a"  # Feature.int64_list
        # Nesting, inside out: packed values (0x0a len), the list (tag len), the Feature
        # (0x12 len, after the key), the map entry (0x0a len).
        key = _key_bytes(name)
        vl, vl_n = _length_slots(values_len)
        list_len = 1 + vl_n + values_len
        ll, ll_n = _length_slots(list_len)
        feature_len = 1 + ll_n + list_len
        fl, fl_n = _length_slots(feature_len)
        entry_len = len(key) + 1 + fl_n + feature_len
        el, el_n = _length_slots(entry_len)
        entries_len += 1 + el_n + entry_len
        pieces += [_constant_slots(b"\x0a", n), el, _constant_slots(key + b"\x12", n), fl,
                   _constant_slots(list_tag, n), ll, _constant_slots(b"\x0a", n), vl, values]
    head, head_n = _length_slots(entries_len)
    return [_constant_slots(b"\x0a", n), head, *pieces], 1 + head_n + entries_len


def _kept_bytes(pieces: list[_Piece], n: int) -> np.ndarray:
    """Every row's kept slots, rows back to back (uint8)."""
    widths = [p[0].shape[1] for p in pieces]
    matrix = np.empty((n, sum(widths)), dtype=np.uint8)
    keep = None if all(k is None for _, k in pieces) else np.ones(matrix.shape, dtype=bool)
    at = 0
    for (data, kept), width in zip(pieces, widths, strict=True):
        matrix[:, at:at + width] = data
        if kept is not None:
            keep[:, at:at + width] = kept  # type: ignore[index]
        at += width
    # np.compress is several times faster than boolean indexing on a mostly-true mask.
    return matrix.ravel() if keep is None else np.compress(keep.ravel(), matrix.ravel())


def _row_count(columns: dict[str, np.ndarray]) -> int:
    return int(next(iter(columns.values())).shape[0]) if columns else 0


def frame_columns(columns: dict[str, np.ndarray]) -> tuple[bytes, np.ndarray]:
    """Each row of ``columns`` (name -> (n, ...) array; float32 a float list, any other dtype an
    int64 list) as a framed TFRecord of its serialized ``tf.train.Example``, back to back, and
    each record's framed length (int64).

    Map entries in key order, values packed: protobuf's deterministic serialization. Pre-training
    records (``InstanceBatch.columns``), packed rows and task records are all framed here. Equal to
    ``frame_record`` of each Example. The length header is two more pieces of the slot matrix; the
    payload CRC needs the payload bytes, so four placeholder slots are filled in after one CRC call
    per record.
    """
    n = _row_count(columns)
    if n == 0:
        return b"", np.zeros(0, dtype=np.int64)
    pieces, lengths = _example_slots(columns, n)
    header = np.empty((n, 12), dtype=np.uint8)
    header[:, :8] = lengths.astype("<u8").view(np.uint8).reshape(n, 8)
    header[:, 8:] = length_crcs(lengths).view(np.uint8).reshape(n, 4)
    footer = np.zeros((n, 4), dtype=np.uint8)
    flat = _kept_bytes([(header, None), *pieces, (footer, None)], n)
    framed = lengths + 16
    ends = np.cumsum(framed)
    data = flat.tobytes()
    spans = zip((ends - 4 - lengths).tolist(), (ends - 4).tolist(), strict=True)
    crcs = np.fromiter((google_crc32c.value(data[lo:hi]) for lo, hi in spans), dtype=np.uint64, count=n)
    flat[(ends - 4)[:, None] + np.arange(4)] = mask_crcs(crcs).view(np.uint8).reshape(n, 4)
    return flat.tobytes(), framed
