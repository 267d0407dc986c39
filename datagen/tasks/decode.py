"""Task records decoded for a batch at once against a split's feature spec (no TensorFlow).

The protobuf levels are walked with the batch helpers of `datagen.example_codec` (one NumPy step per
field, not per record); feature names are matched against the spec's names. A record with anything
unusual (a missing, repeated or unknown feature, a wrong type or length, unpacked values) goes
through the exact one-record decoder, which gives its values or an exact error.
"""

from __future__ import annotations

import numpy as np

from datagen import example_codec as pb
from datagen.tfrecord import RecordError


def decode_exact(payload: bytes, spec: dict[str, tuple[str, int]]) -> dict[str, np.ndarray]:
    """One record, exactly: its features, or RecordError saying what does not match the spec."""
    try:
        feats = pb.decode_example(payload)
    except (RecordError, UnicodeDecodeError) as e:
        raise RecordError(f"does not parse as tf.train.Example: {e}") from e
    for name, (dtype, count) in spec.items():
        v = feats.get(name)
        if v is None:
            raise RecordError(f"feature {name} is missing")
        if v.dtype != (np.float32 if dtype == "float32" else np.int64) or len(v) != count:
            raise RecordError(f"feature {name} is {v.dtype.name}[{len(v)}], expected {dtype}[{count}]")
    extra = sorted(set(feats) - set(spec))
    if extra:
        raise RecordError(f"unexpected feature(s) {', '.join(extra)} (not in the split's feature spec)")
    return feats


def _name_of(buf: np.ndarray, key_s: np.ndarray, key_e: np.ndarray, names: list[str]) -> np.ndarray:
    """Index in `names` of each entry's key (-1: none)."""
    width = max(len(n) for n in names)
    table = np.zeros((len(names), width), np.uint8)
    lengths = np.array([len(n) for n in names])
    for j, name in enumerate(names):
        table[j, :len(name)] = np.frombuffer(name.encode(), np.uint8)
    key_len = key_e - key_s
    got = buf[np.minimum(key_s[:, None] + np.arange(width), max(len(buf) - 1, 0))]
    inside = np.arange(width)[None, :] < key_len[:, None]
    got = np.where(inside, got, 0)
    match = (got[:, None, :] == table[None, :, :]).all(axis=2) & (key_len[:, None] == lengths[None, :])
    return np.where(match.any(axis=1), match.argmax(axis=1), -1)


def decode_batch(payloads: list[bytes], spec: dict[str, tuple[str, int]]
                 ) -> tuple[dict[str, np.ndarray], list[tuple[int, str]]]:
    """Columns of the records that decode (in order) and (position in `payloads`, problem) of the others."""
    names = sorted(spec)
    n = len(payloads)
    lengths = np.fromiter(map(len, payloads), np.int64, count=n)
    rec_start = np.zeros(n, np.int64)
    if n:
        np.cumsum(lengths[:-1], out=rec_start[1:])
    data = b"".join(payloads)
    buf = np.frombuffer(data, np.uint8)
    bad = np.zeros(n, bool)
    rec_ids = np.arange(n)
    f_start, f_end = pb._expect_ld(buf, rec_start, rec_start + lengths, 0x0A, bad, rec_ids)
    entries = pb._walk(buf, f_start, f_end, bad, rec_ids)
    owner = entries.owner
    bad[owner[(entries.number != 1) | (entries.wire != 2)]] = True
    key_s, key_e, ok_k = pb._ld_at(buf, entries.start, entries.end, 0x0A)
    val_s, val_e, ok_v = pb._ld_at(buf, key_e, entries.end, 0x12)
    ok = ok_k & ok_v & (val_e == entries.end)
    bad[owner[~ok]] = True
    name_of = np.where(ok, _name_of(buf, key_s, key_e, names), -1) if len(owner) else np.zeros(0, np.int64)
    bad[owner[name_of < 0]] = True
    known = name_of >= 0
    per_name = np.bincount(owner[known] * len(names) + name_of[known], minlength=n * len(names)).reshape(n, -1)
    bad |= (per_name != 1).any(axis=1)
    use = np.nonzero(known & ~bad[owner])[0]
    floats = np.array([spec[name][0] == "float32" for name in names])
    tags = np.where(floats[name_of[use]], 0x12, 0x1A).astype(np.uint8)
    l_s, l_e = pb._expect_ld(buf, val_s[use], val_e[use], tags, bad, owner[use])
    d_s_all, d_e_all = pb._expect_ld(buf, l_s, l_e, 0x0A, bad, owner[use])
    columns: dict[str, np.ndarray] = {}
    for j, name in enumerate(names):
        dtype, count = spec[name]
        sel = np.nonzero(name_of[use] == j)[0]
        recs = owner[use[sel]]
        keep = ~bad[recs]
        recs, d_s, d_e = recs[keep], d_s_all[sel][keep], d_e_all[sel][keep]
        if dtype == "float32":
            values = np.zeros((n, count), np.float32)
            right = (d_e - d_s) == 4 * count
            bad[recs[~right]] = True
            recs, d_s = recs[right], d_s[right]
            if len(recs):
                values[recs] = buf[d_s[:, None] + np.arange(4 * count)].copy().view("<f4").reshape(len(recs), count)
        else:
            values = np.zeros((n, count), np.int64)
            raw, offsets = pb._gather_ranges(buf, d_s, d_e)
            bad_rows = np.zeros(len(recs), bool)
            values[recs] = pb._decode_packed_varints(raw, offsets, count, bad_rows)
            bad[recs[bad_rows]] = True
        columns[name] = values
    problems: list[tuple[int, str]] = []
    keep_rows = ~bad
    for i in np.flatnonzero(bad).tolist():
        try:
            exact = decode_exact(payloads[i], spec)
        except RecordError as e:
            problems.append((i, str(e)))
            continue
        keep_rows[i] = True
        for name, v in exact.items():
            columns[name][i] = v
    return {k: v[keep_rows] for k, v in columns.items()}, problems
