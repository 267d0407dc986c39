"""The row-wise packed-varint decoder equals a byte-at-a-time reference on every length of varint,
and flags every malformed row instead of guessing."""

from __future__ import annotations

import numpy as np

from bert_datagen.datagen.records import varint
from bert_datagen.datagen.varint_rows import decode_varint_rows, rows_at


def _packed(values: list[int]) -> bytes:
    return b"".join(varint(v & ((1 << 64) - 1)) for v in values)


def _layout(rows: list[bytes], rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The rows in one buffer with junk bytes (>= 0x80 too) around and between them."""
    buf, starts, ends = bytearray(), [], []
    for row in rows:
        buf += bytes(rng.integers(0, 256, int(rng.integers(0, 4)), dtype=np.uint8))
        starts.append(len(buf))
        buf += row
        ends.append(len(buf))
    buf += bytes(rng.integers(128, 256, int(rng.integers(0, 3)), dtype=np.uint8))  # a row may end the buffer
    return np.frombuffer(bytes(buf), np.uint8), np.array(starts, np.int64), np.array(ends, np.int64)


def test_every_varint_length_and_sign_decodes_exactly():
    rng = np.random.default_rng(0)
    count = 9
    bits = rng.integers(0, 64, (300, count))
    values = [[int(rng.integers(0, 1 << int(b))) if b else 0 for b in row] for row in bits]
    values[3] = [-1, -(1 << 62), (1 << 63) - 1, 0, 127, 128, 16383, 16384, 1 << 21]
    buf, start, end = _layout([_packed(v) for v in values], rng)
    bad = np.zeros(len(values), bool)
    got = decode_varint_rows(buf, start, end, count, bad)
    assert not bad.any()
    assert got.dtype == np.int64 and got.tolist() == values


def test_one_byte_rows_take_the_plain_path():
    rng = np.random.default_rng(1)
    values = rng.integers(0, 128, (50, 7))
    buf, start, end = _layout([bytes(v.astype(np.uint8)) for v in values], rng)
    bad = np.zeros(50, bool)
    assert decode_varint_rows(buf, start, end, 7, bad).tolist() == values.tolist() and not bad.any()


def test_malformed_rows_are_flagged_and_the_others_still_decode():
    rng = np.random.default_rng(2)
    good = [[5, 300, 70000], [1, 2, 3], [1 << 40, 0, 9]]
    rows = [_packed(v) for v in good]
    broken = {
        "too few values": _packed([1, 2]),
        "too many values": _packed([1, 2, 3, 4]),
        "ends inside a varint": _packed([1, 2, 3])[:-1] + b"\x85",
        "eleven-byte varint": b"\xff" * 10 + b"\x01" + _packed([1, 2]),
        "empty": b"",
    }
    layout = rows[:2] + list(broken.values()) + rows[2:]
    buf, start, end = _layout(layout, rng)
    bad = np.zeros(len(layout), bool)
    got = decode_varint_rows(buf, start, end, 3, bad)
    assert bad.tolist() == [False, False] + [True] * len(broken) + [False]
    assert got[[0, 1, len(layout) - 1]].tolist() == good


def test_rows_at_reads_zeros_past_the_end():
    buf = np.arange(10, dtype=np.uint8)
    assert rows_at(buf, np.array([0, 8]), 4).tolist() == [[0, 1, 2, 3], [8, 9, 0, 0]]
    assert rows_at(buf, np.zeros(0, np.int64), 4).shape == (0, 4)


def test_a_single_short_row():
    buf = np.frombuffer(b"\x05\xac\x02", np.uint8)
    bad = np.zeros(1, bool)
    assert decode_varint_rows(buf, np.array([1]), np.array([3]), 1, bad).tolist() == [[300]] and not bad.any()
    assert decode_varint_rows(buf, np.array([0]), np.array([1]), 1, bad).tolist() == [[5]] and not bad.any()


def test_blocks_and_narrow_dtype_give_the_same_values(monkeypatch):
    import bert_datagen.datagen.varint_rows as varint_rows

    rng = np.random.default_rng(3)
    values = rng.integers(-(1 << 40), 1 << 40, (500, 6))
    values[0, 0], values[1, 1] = (1 << 31) + 5, -(1 << 33)  # outside int32: wrap as NumPy's cast does
    buf, start, end = _layout([_packed(v.tolist()) for v in values], rng)
    whole = decode_varint_rows(buf, start, end, 6, np.zeros(500, bool))
    monkeypatch.setattr(varint_rows, "_BLOCK_BYTES", 256)  # blocks of 64 rows
    bad = np.zeros(500, bool)
    blocks = decode_varint_rows(buf, start, end, 6, bad)
    narrow = decode_varint_rows(buf, start, end, 6, bad, np.int32)
    assert not bad.any() and whole.tolist() == blocks.tolist() == values.tolist()
    assert narrow.dtype == np.int32 and narrow.tolist() == values.astype(np.int32).tolist()


def test_varints_of_up_to_four_bytes_take_the_word_path(monkeypatch):
    import bert_datagen.datagen.varint_rows as varint_rows

    def general_path(*args):
        raise AssertionError("rows of short varints went through the byte-at-a-time path")

    monkeypatch.setattr(varint_rows, "_values_at_ends", general_path)
    rng = np.random.default_rng(4)
    values = rng.integers(0, 1 << rng.integers(1, 29, (400, 1)), (400, 9))  # each row its own range
    values[0] = [0, 127, 128, 16383, 16384, (1 << 21) - 1, 1 << 21, (1 << 28) - 1, 5]
    buf, start, end = _layout([_packed(v.tolist()) for v in values], rng)
    bad = np.zeros(len(values), bool)
    got = decode_varint_rows(buf, start, end, 9, bad, np.int32)
    assert not bad.any() and got.dtype == np.int32 and got.tolist() == values.tolist()
    # A row at the very start of the buffer, and one that ends it.
    buf = np.frombuffer(_packed([300, 2, 70000]) + _packed([1 << 27, 1, 1]), np.uint8)
    got = decode_varint_rows(buf, np.array([0, 6]), np.array([6, len(buf)]), 3, np.zeros(2, bool))
    assert got.tolist() == [[300, 2, 70000], [1 << 27, 1, 1]]


def test_rows_the_word_path_declines_are_still_decoded_or_flagged():
    rng = np.random.default_rng(5)
    rows = {
        "one value too many, then one too few": [_packed([1, 300, 3, 4]), _packed([1, 300])],
        "a five-byte varint": [_packed([1 << 30, 300, 3])],
        "ends inside a varint": [_packed([1, 300, 3])[:-1] + b"\x85"],
    }
    good = [[7, 300, 70000]] * 3
    for what, broken in rows.items():
        layout = [_packed(good[0])] + broken + [_packed(v) for v in good[1:]]
        buf, start, end = _layout(layout, rng)
        bad = np.zeros(len(layout), bool)
        got = decode_varint_rows(buf, start, end, 3, bad)
        if what == "a five-byte varint":
            assert not bad.any() and got[1].tolist() == [1 << 30, 300, 3], what
        else:
            assert bad.tolist() == [False] + [True] * len(broken) + [False, False], what
        assert got[[0, -2, -1]].tolist() == good, what
