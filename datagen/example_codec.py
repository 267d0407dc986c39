"""Decoding serialized ``tf.train.Example`` records without TensorFlow.

Two paths of one decoder, for pre-training and task records alike: ``decode_batch``/``decode_raw``
parse a whole batch with NumPy against a feature spec (the names, dtypes and lengths come from the
spec; nothing here knows a record kind), and hand every record they find irregular to
``decode_exact``, the exact record-at-a-time parser (any field order, packed or not), which gives
exact values or an exact error.

The batch parser first tries the layout one writer gives all its records (the same features in
the same order): it walks every record in step and compares what must be equal at once; a batch
where any record differs is parsed level by level in any order. The packed values themselves are
decoded a row per record by `bert_datagen.datagen.varint_rows`.
"""

from __future__ import annotations

import functools
from collections.abc import Collection
from dataclasses import dataclass

import numpy as np

from bert_datagen.datagen.example_exact import FeatureSpec, RecordSpec, decode_exact, read_varint, spec_dict
from bert_datagen.datagen.tfrecord import RawBatch, RecordError
from bert_datagen.datagen.varint_rows import all_equal_at, decode_varint_rows, rows_at

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
    lengths: tuple[int, ...]  # of each name's bytes
    at: int
    guess: np.ndarray  # [key length, byte at `at`] -> index in names, -1: no name
    table: np.ndarray  # the names' bytes, zero padded
    tags: np.ndarray  # each name's Feature tag byte: float_list is field 2, int64_list field 3
    index: dict[bytes, int]  # a name's bytes -> its index


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
                      tuple(len(b) for b in encoded), at, guess, table, tags, {b: j for j, b in enumerate(encoded)})


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


def _regular_columns(data: bytes, f_start: np.ndarray, f_end: np.ndarray, names: _NameTable
                     ) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]] | None:
    """Where each feature's packed values are, for the layout one writer gives every record: the
    spec's features once each, in one order shared by all records, each a single packed list. The
    first record's entries are parsed in Python; all records are then walked in step, an entry at a
    time: where every record's entry starts with the first one's key and headers (so has its size:
    its lengths are among those bytes), that comparison is all the entry costs, and the entries whose
    size varies (token ids) are parsed record by record in arrays. None as soon as any record
    differs (the general walk then sorts the records out)."""
    n, k = len(f_start), len(names.names)
    template = _first_layout(data, int(f_start[0]), int(f_end[0]), names) if n else None
    if template is None or len(template) != k:
        return None
    buf = np.frombuffer(data, np.uint8)
    recs = np.arange(n)
    columns: list[tuple[np.ndarray, np.ndarray, np.ndarray] | None] = [None] * k
    pos = f_start
    for j, size, prefix in template:
        first = int(pos[0])
        if (pos + size <= f_end).all() and all_equal_at(buf, pos, buf[first:first + prefix]):
            d_s, d_e = pos + prefix, pos + size
        else:
            e_s, e_e, ok = _ld_at(buf, pos, f_end, 0x0A)
            found = _entry_values(buf, e_s, e_e, names) if ok.all() else None
            if found is None or found[0] != j:
                return None
            _, d_s, d_e = found
        if columns[j] is not None:
            return None
        columns[j] = (recs, d_s, d_e)
        pos = d_e
    if not (pos == f_end).all():
        return None
    return columns  # type: ignore[return-value]  # k distinct names filled k slots


def _first_layout(data: bytes, start: int, end: int, names: _NameTable) -> list[tuple[int, int, int]] | None:
    """The map entries of one record's Features ``data[start:end]``, each (its feature's index, its
    size, the bytes before its packed values), when all are the plain layout; else None."""
    out = []
    try:
        while start < end:
            if data[start] != 0x0A:
                return None
            size, at = read_varint(data, start + 1)
            found = _plain_entry(data, at, at + size, names) if at + size <= end else None
            if found is None:
                return None
            out.append((found[0], at + size - start, at - start + found[1]))
            start = at + size
    except (IndexError, RecordError):
        return None
    return out


def _plain_entry(data: bytes, start: int, end: int, names: _NameTable) -> tuple[int, int] | None:
    """One map entry ``data[start:end]`` in the plain layout: (its feature's index, how many bytes
    come before the packed values); None for anything else."""
    try:
        if data[start] != 0x0A:
            return None
        size, pos = read_varint(data, start + 1)
        j = names.index.get(data[pos:pos + size])
        pos += size
        if j is None or data[pos] != 0x12:
            return None
        for tag in (int(names.tags[j]), 0x0A):  # Feature{list}, then List{packed values}
            size, pos = read_varint(data, pos + 1)
            if pos + size != end or data[pos] != tag:
                return None
        size, pos = read_varint(data, pos + 1)
    except (IndexError, RecordError):
        return None
    return (j, pos - start) if pos + size == end else None


def _entry_values(buf: np.ndarray, e_s: np.ndarray, e_e: np.ndarray, names: _NameTable
                  ) -> tuple[int, np.ndarray, np.ndarray] | None:
    """The feature of map entries [e_s, e_e) that all hold the same key, and where each one's packed
    values are: (name index, start, end); None unless every entry is that plain layout."""
    key_s, key_e, ok = _ld_at(buf, e_s, e_e, 0x0A)
    key_len = int(key_e[0] - key_s[0])
    if not ok.all() or not (key_e - key_s == key_len).all() or not names.at < key_len < len(names.guess):
        return None
    j = int(names.guess[key_len, buf[key_s[0] + names.at]])
    if j < 0 or names.lengths[j] != key_len or not all_equal_at(buf, key_s, names.table[j, :key_len]):
        return None
    v_s, v_e, ok_v = _ld_at(buf, key_e, e_e, 0x12)
    l_s, l_e, ok_l = _ld_at(buf, v_s, v_e, int(names.tags[j]))
    d_s, d_e, ok_d = _ld_at(buf, l_s, l_e, 0x0A)
    if not (ok_v & ok_l & ok_d & (v_e == e_e) & (l_e == v_e) & (d_e == l_e)).all():
        return None
    return j, d_s, d_e


def _columns_of_any_layout(buf: np.ndarray, f_start: np.ndarray, f_end: np.ndarray, names: _NameTable,
                           bad: np.ndarray) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Where each feature's packed values are, for records whose map entries come in any order:
    (records, content start, content end) per feature of the spec; records whose layout is not the
    plain one are marked in ``bad`` for the exact decoder."""
    n = len(f_start)
    last = max(len(buf) - 1, 0)
    rec_ids = np.arange(n)
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
    got = rows_at(buf, key_s, width)
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

    columns = []
    for j in range(len(names.names)):
        sel = np.nonzero(name_of[use] == j)[0]
        recs = ent_rec[use[sel]]
        ok = ~bad[recs]
        columns.append((recs[ok], d_s_all[sel][ok], d_e_all[sel][ok]))
    return columns


def decode_raw(raw: RawBatch, spec: RecordSpec | FeatureSpec, narrow: Collection[str] = ()
               ) -> tuple[Batch, list[tuple[int, str]]]:
    """decode_batch on payloads that are ranges of one buffer (as ShardStream.raw_batches gives them).
    Integer features named in ``narrow`` come out as int32 (as a model takes them; NumPy's cast of
    the int64 value) rather than int64, without an int64 copy in between."""
    spec = spec_dict(spec)
    names = _name_table(tuple((k, (d, int(c))) for k, (d, c) in spec.items()))  # hashable, for the cache
    indices = raw.indices
    n = len(indices)
    lengths = np.asarray(raw.lengths, np.int64)
    rec_start = np.asarray(raw.starts, np.int64)
    buf = np.frombuffer(raw.data, np.uint8)
    bad = np.zeros(n, bool)

    # Example{features: Features{feature: map entries, in any order}}
    f_start, f_end = _expect_ld(buf, rec_start, rec_start + lengths, 0x0A, bad, np.arange(n))
    columns = _regular_columns(raw.data, f_start, f_end, names) if not bad.any() else None
    if columns is None:
        columns = _columns_of_any_layout(buf, f_start, f_end, names, bad)
    features: dict[str, np.ndarray] = {}
    for j, (name, dtype, count) in enumerate(zip(names.names, names.dtypes, names.counts, strict=True)):
        recs, d_s, d_e = columns[j]
        if dtype == "float32":
            values = np.zeros((n, count), np.float32)
            right = (d_e - d_s) == 4 * count
            bad[recs[~right]] = True
            recs, d_s = recs[right], d_s[right]
            if len(recs):
                values[recs] = rows_at(buf, d_s, 4 * count).view("<f4")
        else:
            bad_rows = np.zeros(len(recs), bool)
            dtype = np.int32 if name in narrow else np.int64
            decoded = decode_varint_rows(buf, d_s, d_e, count, bad_rows, dtype)
            bad[recs[bad_rows]] = True
            if len(recs) == n:  # every record so far is regular: rows are already in order
                values = decoded
            else:
                values = np.zeros((n, count), dtype)
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
