"""Decoding one serialized ``tf.train.Example`` exactly, without TensorFlow: any field order, packed
or not. The batch decoder (`bert_datagen.datagen.example_codec`) hands it every record it finds
irregular; it gives exact values or an exact error.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Protocol

import numpy as np

from bert_datagen.datagen.tfrecord import RecordError


class RecordSpec(Protocol):
    """What the batch decoder needs of a record shape (bert_datagen.datagen.record_rules.RecordShape has it)."""

    def spec(self) -> dict[str, tuple[str, int]]: ...


# name -> (dtype, length): bert_datagen.datagen.record_layout.feature_spec for pre-training records,
# bert_datagen.datagen.tasks.features.task_feature_spec (a manifest split's "features") for task records.
FeatureSpec = dict[str, tuple[str, int]]


def read_varint(buf: bytes, pos: int) -> tuple[int, int]:
    """The varint at ``buf[pos]`` and the position after it; RecordError when it is cut or too long."""
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
        key, pos = read_varint(buf, pos)
        field, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = read_varint(buf, pos)
        elif wire == 2:
            size, pos = read_varint(buf, pos)
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
        v, pos = read_varint(data, pos)
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


def spec_dict(spec: RecordSpec | FeatureSpec) -> FeatureSpec:
    """A feature spec from a spec or a record shape."""
    return spec if isinstance(spec, dict) else spec.spec()


def decode_exact(payload: bytes, spec: RecordSpec | FeatureSpec) -> dict[str, np.ndarray]:
    """One record, exactly (any field order, packed or not): its features, or RecordError saying what
    does not match the spec. The slow path of decode_batch, for the records it finds irregular."""
    spec = spec_dict(spec)
    try:
        feats = decode_example(payload)
    except (RecordError, UnicodeDecodeError) as e:
        raise RecordError(f"does not parse as tf.train.Example: {e}") from e
    out = {}
    for name, (dtype, count) in spec.items():
        if name not in feats:
            raise RecordError(f"feature {name} is missing")
        v = feats[name]
        want = np.float32 if dtype == "float32" else np.int64
        if v.dtype != want:
            raise RecordError(f"feature {name} is {v.dtype.name}, expected {dtype}")
        if len(v) != count:
            raise RecordError(f"feature {name} has {len(v)} values, expected {count}")
        out[name] = v
    extra = sorted(set(feats) - set(spec))
    if extra:
        raise RecordError(f"unexpected feature(s) {', '.join(extra)} (not in the feature spec)")
    return out
