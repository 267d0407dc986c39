"""Decoding serialized ``tf.train.Example`` records without TensorFlow.

Two paths of one decoder, for pre-training and task records alike: ``decode_batch``/``decode_raw``
parse a whole batch with NumPy against a feature spec (the names, dtypes and lengths come from the
spec; nothing here knows a record kind), and hand every record they find irregular to
``decode_exact``, the exact record-at-a-time parser (any field order, packed or not), which gives
exact values or an exact error.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from bert_datagen.datagen.tfrecord import RawBatch, RecordError


class RecordSpec(Protocol):
    """What the batch decoder needs of a record shape (bert_datagen.datagen.record_rules.RecordShape has it)."""

    def spec(self) -> dict[str, tuple[str, int]]: ...


# name -> (dtype, length): bert_datagen.datagen.records.feature_spec for pre-training records,
# bert_datagen.datagen.tasks.features.task_feature_spec (a manifest split's "features") for task records.
FeatureSpec = dict[str, tuple[str, int]]


# ---------------------------------------------------------------- exact, one record


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


# ---------------------------------------------------------------- vectorized Example parsing
#
# Protobuf is parsed level by level for a whole batch at once: at every level each message advances
# one field per step, so the Python loop runs (fields per message) times, not (records x fields).
# Anything unusual marks the record "irregular"; those go through decode_example,
# which gives exact values or an exact error.


def _read_varints(buf: np.ndarray, pos: np.ndarray, limit: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Varint at each position: (value as uint64, position after it, ok).

    Byte by byte over the positions still open: most varints here are one or two bytes long.
    """
    last = max(len(buf) - 1, 0)
    b = buf[np.minimum(pos, last)] if len(buf) else np.zeros(len(pos), np.uint8)
    value = (b & 0x7F).astype(np.uint64)
    ok = pos < limit
    nbytes = np.ones(len(pos), np.int64)
    idx = np.nonzero((b >= 0x80) & ok)[0]
    shift = 7
    while len(idx):
        if shift >= 70:
            ok[idx] = False  # more than ten bytes: not a varint
            break
        p = pos[idx] + nbytes[idx]
        inside = p < limit[idx]
        bb = buf[np.minimum(p, last)]
        value[idx] |= (bb & 0x7F).astype(np.uint64) << np.uint64(min(shift, 63))
        nbytes[idx] += 1
        ok[idx[~inside]] = False
        idx = idx[(bb >= 0x80) & inside]
        shift += 7
    return value, pos + nbytes, ok


@dataclass
class _Fields:
    """Fields of a batch of messages, flattened: owner = index of the message each belongs to."""

    owner: np.ndarray
    number: np.ndarray
    wire: np.ndarray
    start: np.ndarray  # content start (wire 2/5/1); value for wire 0
    end: np.ndarray


def _walk(buf: np.ndarray, start: np.ndarray, end: np.ndarray, bad: np.ndarray, owner_rec: np.ndarray) -> _Fields:
    """Every field of messages [start, end); marks the owning record bad on malformed input."""
    pos = start.copy()
    active = (pos < end) & ~bad[owner_rec]
    out: list[tuple[np.ndarray, ...]] = []
    while active.any():
        idx = np.nonzero(active)[0]
        lim = end[idx]
        tag, p, ok = _read_varints(buf, pos[idx], lim)
        number = (tag >> np.uint64(3)).astype(np.int64)
        wire = (tag & np.uint64(7)).astype(np.int64)
        val, p2, ok2 = _read_varints(buf, p, lim)
        val_i = np.minimum(val, np.uint64(1 << 62)).astype(np.int64)
        c_start = np.where(wire == 2, p2, p)
        c_end = np.select([wire == 2, wire == 0, wire == 5, wire == 1], [p2 + val_i, p2, p + 4, p + 8], -1)
        ok &= (c_end >= 0) & (c_end <= lim) & ((wire == 5) | (wire == 1) | ok2)
        c_start = np.where(wire == 0, val_i, c_start)
        bad[owner_rec[idx[~ok]]] = True
        good = idx[ok]
        out.append((good, number[ok], wire[ok], c_start[ok], c_end[ok]))
        pos[good] = c_end[ok]
        pos[idx[~ok]] = end[idx[~ok]]
        active = (pos < end) & ~bad[owner_rec]
    if not out:
        e = np.zeros(0, np.int64)
        return _Fields(e, e, e, e, e)
    cols = [np.concatenate(c) for c in zip(*out, strict=True)]
    order = np.argsort(cols[0], kind="stable")
    return _Fields(*(c[order] for c in cols))


def _ld_at(buf: np.ndarray, pos: np.ndarray, limit: np.ndarray, tag: int | np.ndarray
           ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The length-delimited field that must start at each position with this tag byte:
    (content start, content end, ok)."""
    last = max(len(buf) - 1, 0)
    ok = (limit - pos >= 2) & (buf[np.minimum(pos, last)] == tag)
    length, c_start, ok_len = _read_varints(buf, pos + 1, limit)
    c_end = c_start + np.minimum(length, np.uint64(1 << 40)).astype(np.int64)
    ok &= ok_len & (c_end <= limit)
    return c_start, c_end, ok


def _expect_ld(buf: np.ndarray, start: np.ndarray, end: np.ndarray, tag: int | np.ndarray, bad: np.ndarray,
               owner_rec: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Content of messages that hold exactly one length-delimited field with this tag byte, as every
    protobuf writer emits them here; anything else marks the owning record for the exact decoder."""
    c_start, c_end, ok = _ld_at(buf, start, end, tag)
    ok &= c_end == end
    bad[owner_rec[~ok]] = True
    return np.where(ok, c_start, 0), np.where(ok, c_end, 0)


def _gather_ranges(buf: np.ndarray, start: np.ndarray, end: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The bytes of every range, concatenated, and each range's offset in the result."""
    lengths = end - start
    offsets = np.zeros(len(lengths) + 1, np.int64)
    np.cumsum(lengths, out=offsets[1:])
    if len(lengths) and (lengths == lengths[0]).all():  # common: a 2-D gather, no repeat needed
        return buf[start[:, None] + np.arange(lengths[0])].ravel(), offsets
    total = int(offsets[-1])
    idx = np.repeat(start - offsets[:-1], lengths) + np.arange(total)
    return buf[idx], offsets


def _decode_packed_varints(data: np.ndarray, offsets: np.ndarray, count: int,
                           bad_rows: np.ndarray) -> np.ndarray:
    """Rows of exactly ``count`` packed varints each; rows that do not fit are flagged in bad_rows."""
    n = len(offsets) - 1
    if n == 0:
        return np.zeros((0, count), np.int64)
    term = data < 0x80
    lengths = np.diff(offsets)
    if len(data) == n * count and term.all():  # one byte per value everywhere: nothing to split
        return data.astype(np.int64).reshape(n, count)
    nonempty = lengths > 0
    ends_ok = np.zeros(n, bool)
    ends_ok[nonempty] = term[offsets[1:][nonempty] - 1]
    term_cum = np.concatenate([[0], np.cumsum(term)])
    per_row = term_cum[offsets[1:]] - term_cum[offsets[:-1]]
    row_ok = ends_ok & (per_row == count)
    bad_rows |= ~row_ok
    out = np.zeros((n, count), np.int64)
    if not row_ok.any():
        return out
    # Keep only the bytes of well-formed rows, so values line up as rows x count.
    if row_ok.all():
        b, t = data, term
    else:
        keep = row_ok[np.repeat(np.arange(n), lengths)]
        b, t = data[keep], term[keep]
    if t.all():  # every value fits in one byte (masks, segment ids, short positions)
        values = b.astype(np.int64)
        too_long = np.zeros(len(b), bool)
    else:
        starts = np.nonzero(np.concatenate([[True], t[:-1]]))[0]
        acc = (b[starts] & 0x7F).astype(np.uint64)
        too_long = np.zeros(len(starts), bool)
        idx = np.nonzero(~t[starts])[0]
        k = 1
        while len(idx):
            if k >= 10:
                too_long[idx] = True
                break
            p = starts[idx] + k
            acc[idx] |= (b[p] & 0x7F).astype(np.uint64) << np.uint64(min(7 * k, 63))
            idx = idx[~t[p]]
            k += 1
        values = acc.view(np.int64)
    rows_values = values.reshape(-1, count)
    if row_ok.all():
        out = rows_values
    else:
        out[row_ok] = rows_values
    long_rows = too_long.reshape(-1, count).any(axis=1)
    if long_rows.any():
        idx = np.nonzero(row_ok)[0][long_rows]
        bad_rows[idx] = True
    return out


@dataclass(frozen=True)
class _NameTable:
    """How the batch decoder tells a spec's feature names apart without a per-name comparison.

    A name is guessed from its key's length and the byte at `at`, one table look-up per entry for any
    spec; the guessed name's bytes are then compared in full. Specs whose names no single position
    separates still decode exactly: an entry whose guess is wrong goes through the exact decoder.
    """

    names: tuple[str, ...]
    dtypes: tuple[str, ...]
    counts: tuple[int, ...]
    at: int
    guess: np.ndarray  # [key length, byte at `at`] -> index in names, -1: no name
    table: np.ndarray  # the names' bytes, zero padded
    tags: np.ndarray  # each name's Feature tag byte: float_list is field 2, int64_list field 3


@functools.lru_cache(maxsize=64)
def _name_table(items: tuple[tuple[str, tuple[str, int]], ...]) -> _NameTable:
    names = tuple(name for name, _ in items)
    encoded = [name.encode() for name in names]
    shortest = min(len(b) for b in encoded)

    def clashes(at: int) -> int:
        return len(encoded) - len({(len(b), b[at]) for b in encoded})

    at = min(range(shortest), key=clashes, default=0)  # the first position separating the most names
    guess = np.full((max(len(b) for b in encoded) + 2, 256), -1, np.int64)
    table = np.zeros((len(names), max(len(b) for b in encoded)), np.uint8)
    for j, b in enumerate(encoded):
        if len(b) > at and guess[len(b), b[at]] < 0:  # an empty name is left to the exact decoder
            guess[len(b), b[at]] = j
        table[j, :len(b)] = np.frombuffer(b, np.uint8)
    tags = np.array([0x12 if dtype == "float32" else 0x1A for _, (dtype, _) in items], np.uint8)
    return _NameTable(names, tuple(d for _, (d, _) in items), tuple(c for _, (_, c) in items),
                      at, guess, table, tags)


def _spec_of(spec: RecordSpec | FeatureSpec) -> FeatureSpec:
    return spec if isinstance(spec, dict) else spec.spec()


@dataclass
class Batch:
    """Decoded records of a batch; ``index`` are the record indices in the shard."""

    index: np.ndarray
    features: dict[str, np.ndarray]

    def __len__(self) -> int:
        return len(self.index)


def decode_batch(payloads: list[bytes], indices: list[int], spec: RecordSpec | FeatureSpec
                 ) -> tuple[Batch, list[tuple[int, str]]]:
    """Parse payloads against a feature spec (a dict, or a record shape's); returns the good records
    and (index, problem) pairs."""
    lengths = [len(p) for p in payloads]
    starts = np.zeros(len(payloads), np.int64)
    if payloads:
        np.cumsum(lengths[:-1], out=starts[1:])
    return decode_raw(RawBatch(list(indices), b"".join(payloads), starts.tolist(), lengths), spec)


def decode_raw(raw: RawBatch, spec: RecordSpec | FeatureSpec) -> tuple[Batch, list[tuple[int, str]]]:
    """decode_batch on payloads that are ranges of one buffer (as ShardStream.raw_batches gives them)."""
    spec = _spec_of(spec)
    names = _name_table(tuple((k, (d, int(c))) for k, (d, c) in spec.items()))  # hashable, for the cache
    indices = raw.indices
    n = len(indices)
    lengths = np.asarray(raw.lengths, np.int64)
    rec_start = np.asarray(raw.starts, np.int64)
    buf = np.frombuffer(raw.data, np.uint8)
    last = max(len(buf) - 1, 0)
    bad = np.zeros(n, bool)
    rec_ids = np.arange(n)

    # Example{features: Features{feature: map entries, in any order}}
    f_start, f_end = _expect_ld(buf, rec_start, rec_start + lengths, 0x0A, bad, rec_ids)
    entries = _walk(buf, f_start, f_end, bad, rec_ids)
    ent_rec = entries.owner
    bad[ent_rec[(entries.number != 1) | (entries.wire != 2)]] = True
    # Map entry: key (field 1) then value (field 2), the order every writer uses.
    key_s, key_e, ok_k = _ld_at(buf, entries.start, entries.end, 0x0A)
    val_s, val_e, ok_v = _ld_at(buf, key_e, entries.end, 0x12)
    ok_entry = ok_k & ok_v & (val_e == entries.end)
    bad[ent_rec[~ok_entry]] = True

    # Which feature each entry is: guessed from the key's length and one byte, then the bytes compared.
    key_len = key_e - key_s
    guess = names.guess[np.clip(key_len, 0, len(names.guess) - 1), buf[np.minimum(key_s + names.at, last)]]
    width = names.table.shape[1]
    got = buf[np.minimum(key_s[:, None] + np.arange(width), last)]
    same = (got == names.table[np.maximum(guess, 0)]) | (np.arange(width) >= key_len[:, None])
    name_of = np.where((guess >= 0) & same.all(axis=1) & ok_entry, guess, -1)
    bad[ent_rec[name_of < 0]] = True
    known = name_of >= 0
    k = len(names.names)
    per_name = np.bincount(ent_rec[known] * k + name_of[known], minlength=n * k).reshape(n, k)
    bad |= (per_name != 1).any(axis=1)  # each feature of the spec exactly once

    # Feature{int64_list (3) | float_list (2)} -> List{value (1), packed}
    use = np.nonzero(known & ~bad[ent_rec])[0]
    l_s, l_e = _expect_ld(buf, val_s[use], val_e[use], names.tags[name_of[use]], bad, ent_rec[use])
    d_s_all, d_e_all = _expect_ld(buf, l_s, l_e, 0x0A, bad, ent_rec[use])

    features: dict[str, np.ndarray] = {}
    for j, (name, dtype, count) in enumerate(zip(names.names, names.dtypes, names.counts, strict=True)):
        sel = np.nonzero(name_of[use] == j)[0]
        recs = ent_rec[use[sel]]
        ok = ~bad[recs]
        recs, d_s, d_e = recs[ok], d_s_all[sel][ok], d_e_all[sel][ok]
        if dtype == "float32":
            values = np.zeros((n, count), np.float32)
            right = (d_e - d_s) == 4 * count
            bad[recs[~right]] = True
            recs, d_s = recs[right], d_s[right]
            if len(recs):
                idx = d_s[:, None] + np.arange(4 * count)
                values[recs] = buf[idx].copy().view("<f4").reshape(len(recs), count)
        else:
            data, offsets = _gather_ranges(buf, d_s, d_e)
            bad_rows = np.zeros(len(recs), bool)
            decoded = _decode_packed_varints(data, offsets, count, bad_rows)
            bad[recs[bad_rows]] = True
            if len(recs) == n:  # every record so far is regular: rows are already in order
                values = decoded
            else:
                values = np.zeros((n, count), np.int64)
                values[recs] = decoded
        features[name] = values

    problems: list[tuple[int, str]] = []
    keep = ~bad
    for i in np.nonzero(bad)[0]:
        try:
            feats = decode_exact(raw.data[raw.starts[i]:raw.starts[i] + raw.lengths[i]], spec)
        except RecordError as e:
            problems.append((indices[i], str(e)))
            continue
        keep[i] = True
        for name, v in feats.items():
            features[name][i] = v
    if keep.all():
        return Batch(np.asarray(indices, np.int64), features), problems
    index = np.asarray(indices, np.int64)[keep]
    return Batch(index, {k: v[keep] for k, v in features.items()}), problems


def decode_exact(payload: bytes, spec: RecordSpec | FeatureSpec) -> dict[str, np.ndarray]:
    """One record, exactly (any field order, packed or not): its features, or RecordError saying what
    does not match the spec. The slow path of decode_batch, for the records it finds irregular."""
    spec = _spec_of(spec)
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
