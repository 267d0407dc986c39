"""Fixed-width byte rows out of one buffer, and packed varints decoded a row per record, in NumPy.

The batch Example decoder finds, for every record, where a feature's packed values lie in the
shard's bytes; these two functions turn those ranges into a (records x values) matrix.

Rows are copied through a sliding-window view of the buffer: one row copy per record, about ten
times faster than an element-wise fancy index of the same bytes. Each varint's last byte is then
found in the matrix, and its value built backwards from there, one byte of every varint per step:
as many steps as the longest varint has bytes (two or three for token ids).
"""

from __future__ import annotations

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

_MAX_VARINT = 10  # bytes of a 64-bit varint


def rows_at(buf: np.ndarray, start: np.ndarray, width: int) -> np.ndarray:
    """``buf[start[i]:start[i] + width]`` for every i, as an (n, width) uint8 matrix; bytes past the
    end of ``buf`` read as zero."""
    n = len(start)
    if n == 0 or width == 0:
        return np.zeros((n, width), np.uint8)
    if int(start.max()) + width > len(buf):
        buf = np.concatenate([buf, np.zeros(width, np.uint8)])
    return sliding_window_view(buf, width)[start]


def all_equal_at(buf: np.ndarray, start: np.ndarray, pattern: np.ndarray) -> bool:
    """Whether ``buf[start[i]:start[i] + len(pattern)]`` equals ``pattern`` for every i (all inside
    ``buf``): compared eight bytes at a time, one word per row and step, not a row copy each."""
    size = len(pattern)
    if size < 8 or len(buf) < 8:
        return bool((rows_at(buf, start, size) == pattern).all())
    words = np.ndarray((len(buf) - 7,), "<u8", buf, strides=(1,))
    want = np.ndarray((size - 7,), "<u8", np.ascontiguousarray(pattern), strides=(1,))
    for at in [*range(0, size - 8, 8), size - 8]:  # the last word ends with the pattern
        # An index, not take(): take would first copy the whole unaligned buffer into aligned words.
        if not (words[start + at] == want[at]).all():
            return False
    return True


_BLOCK_BYTES = 1 << 19  # rows decoded together: their working arrays stay in the CPU's caches


def decode_varint_rows(buf: np.ndarray, start: np.ndarray, end: np.ndarray, count: int,
                       bad_rows: np.ndarray, dtype: type = np.int64) -> np.ndarray:
    """Rows of exactly ``count`` packed varints each, row i from ``buf[start[i]:end[i]]``, as int64
    (or ``dtype``, cast as NumPy casts int64 to it); a row that does not hold exactly ``count``
    well-formed varints is flagged in ``bad_rows`` (its values are left zero, for the exact decoder
    to settle)."""
    n = len(start)
    step = max(64, _BLOCK_BYTES // max(int((end - start).max(initial=0)), 1))
    if n <= step:
        return _decode_block(buf, start, end, count, bad_rows, dtype).astype(dtype, copy=False)
    out = np.empty((n, count), dtype)
    for a in range(0, n, step):
        out[a:a + step] = _decode_block(buf, start[a:a + step], end[a:a + step], count, bad_rows[a:a + step], dtype)
    return out


def _decode_block(buf: np.ndarray, start: np.ndarray, end: np.ndarray, count: int,
                  bad_rows: np.ndarray, dtype: type) -> np.ndarray:
    n = len(start)
    lengths = end - start
    if n == 0 or count == 0:
        bad_rows |= lengths != 0
        return np.zeros((n, count), np.int64)
    width = int(lengths.max())
    if width == count and (lengths == count).all():
        m = rows_at(buf, start, count)
        if (m < 0x80).all():  # one byte per value everywhere (masks, segment ids, short positions)
            return m.astype(dtype)
    short = _short_varints(buf, start, lengths, width, count)
    if short is not None:
        return short.astype(dtype)
    # One leading zero column: the byte before every row's first varint is then never a
    # continuation byte, so decoding backwards from a varint's end stops inside its own row.
    if int(start.min()) >= 1:
        m = rows_at(buf, start - 1, width + 1)
    else:
        m = rows_at(np.concatenate([np.zeros(1, np.uint8), buf]), start, width + 1)
    m[:, 0] = 0
    index_type = np.int16 if width < 1 << 15 else np.int64
    inside = np.arange(width + 1, dtype=index_type) <= lengths.astype(index_type)[:, None]
    ends = (m < 0x80) & inside  # the last byte of every varint of the row
    ends[:, 0] = False
    last = m[np.arange(n), lengths]
    ok = (lengths > 0) & (last < 0x80) & (np.count_nonzero(ends, axis=1) == count)
    bad_rows |= ~ok
    if not ok.any():
        return np.zeros((n, count), np.int64)
    if not ok.all():
        m, ends = m[ok], ends[ok]
    values, too_long = _values_at_ends(m.ravel(), np.flatnonzero(ends))
    if ok.all() and not too_long.any():
        return values.reshape(n, count)
    out = np.zeros((n, count), np.int64)
    if too_long.any():  # over ten bytes: not a varint
        rows = np.nonzero(ok)[0]
        long_rows = too_long.reshape(-1, count).any(axis=1)
        bad_rows[rows[long_rows]] = True
        ok[rows[long_rows]] = False
        values = values.reshape(-1, count)[~long_rows]
    out[ok] = values.reshape(-1, count)
    return out


_U32 = np.uint32


def _short_varints(buf: np.ndarray, start: np.ndarray, lengths: np.ndarray, width: int, count: int
                   ) -> np.ndarray | None:
    """The rows' values when every row holds exactly ``count`` varints of at most four bytes (token
    ids, positions: any value below 2**28), else None (the general path then settles each row).

    Each varint's first byte follows the end of the one before (a byte below 0x80); the four bytes
    from there are read as one little-endian word, the bytes past the varint's end cleared, and its
    7-bit groups packed together: a fixed number of array operations per value, whatever its length."""
    n = len(start)
    # Leading zero columns: a row's first varint then follows an "end" too; trailing ones keep the
    # four-byte word of a row's last varint inside the matrix.
    m = rows_at(np.concatenate([np.zeros(_LEAD, np.uint8), buf]), start, width + _LEAD + 3) if int(
        start.min()) < _LEAD else rows_at(buf, start - _LEAD, width + _LEAD + 3)
    m[:, :_LEAD] = 0
    flat = m.ravel()
    starts = np.empty(len(flat), bool)
    np.less(flat[:-1], 0x80, out=starts[1:])
    starts = starts.reshape(m.shape)
    starts[:, :_LEAD] = False
    starts[:, _LEAD:] &= np.arange(1, m.shape[1] - _LEAD + 1, dtype=np.int32) <= lengths.astype(np.int32)[:, None]
    at = np.flatnonzero(starts)
    if len(at) != n * count or not (m[np.arange(n), lengths + _LEAD - 1] < 0x80).all():
        return None
    if not ((at[::count] // m.shape[1] == np.arange(n)) & (at[count - 1::count] // m.shape[1] == np.arange(n))).all():
        return None  # some row has more, another fewer
    # Every byte's four-byte word as an aligned array first (one pass over the rows' bytes), then
    # the words at the varints' starts: faster than an index into the unaligned view.
    words = np.ascontiguousarray(np.ndarray((len(flat) - 3,), "<u4", flat, strides=(1,))).take(at)
    # In place where it can be: these arrays are a few megabytes each.
    stops = np.bitwise_and(words, _U32(0x80808080))
    stops ^= _U32(0x80808080)  # the high bit of each byte that ends a varint
    if not stops.all():
        return None  # a varint of over four bytes
    first = np.negative(stops)
    first &= stops
    first <<= _U32(1)
    first -= _U32(1)  # the bytes up to the first end (all ones when the fourth byte ends it)
    words &= first
    odd = np.bitwise_and(words, _U32(0x7F007F00), out=first)
    odd >>= _U32(1)
    words &= _U32(0x007F007F)
    words |= odd  # 14-bit groups at bits 0 and 16
    high = np.right_shift(words, _U32(2), out=stops)
    high &= _U32(0xFFFC000)
    words &= _U32(0x3FFF)
    words |= high
    return words.reshape(n, count)


_LEAD = 1


def _values_at_ends(flat: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The value of the varint ending at each index ``ends`` of ``flat``, and whether it is longer
    than ten bytes. A varint's bytes are its end and the continuation bytes (>= 0x80) right before
    it, so its value is accumulated backwards from the end, most significant group first, a byte of
    every varint per step (most token ids take two or three bytes, so a step for all beats finding
    the few still going)."""
    value = (flat[ends] & 0x7F).astype(np.uint32)
    going = np.ones(len(ends), np.uint8)  # 1 while the varint has a byte k places before its end
    too_long = np.zeros(len(ends), bool)
    for k in range(1, _MAX_VARINT + 1):
        byte = np.take(flat, ends - k, mode="clip")  # a varint that stopped may look before row 0
        going &= byte >> 7
        if not going.any():
            break
        if k == _MAX_VARINT:
            too_long = going.astype(bool)
            break
        if k == 4:  # past 28 bits
            value = value.astype(np.uint64)
        kind = value.dtype.type
        value = (value << (going * 7).astype(kind)) | ((byte & 0x7F) * going).astype(kind)
    return value.astype(np.uint64).view(np.int64), too_long
