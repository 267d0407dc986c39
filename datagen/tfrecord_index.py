"""A shard's record index: one text line ``"OFFSET LENGTH"`` per record, in record order.

OFFSET is where the record's frame starts in the shard and LENGTH the whole frame (16 bytes of
header and CRCs plus the payload): the format NVIDIA DALI's TFRecord reader (``index_path``) and the
`tfrecord` package (``index_path``) read, so they use our index without an indexing pass of their
own. Every line of a shard's index has the same width (the numbers are zero-padded to the digits
of the shard's size and of its longest frame), so line ``i`` starts at byte ``i * width``: a reader
fetches the lines of just the records it needs, and ``width`` is the index's size over its records.
Both readers parse the numbers as decimal integers, leading zeros included.

Beside the index, its *block digests* (``part-00000-of-00004.tfrecord.index.blocks``): the first 16
bytes of the sha256 of every `BLOCK_LINES` lines of the index, end to end. The manifest lists the
index and its digests with their sha256, so a reader that needs a few records checks just their
blocks of lines (a rank of N reads about 1/N of the index) and never the whole index: lines that
still chain but name other records (an index shifted by a record) fail their block's digest.
"""

from __future__ import annotations

import hashlib

import numpy as np

INDEX_SUFFIX = ".index"
FRAME_OVERHEAD = 16  # length (8), its CRC (4), the payload's CRC (4)


class RecordIndexError(ValueError):
    """An index that does not describe its shard; says which line and why."""


BLOCKS_SUFFIX = ".blocks"
# Lines a block digest covers: a reader's default chunk (contract/loading/order.py's block size), so
# a rank's chunk of records is one block of lines.
BLOCK_LINES = 64
DIGEST_BYTES = 16  # of each block's sha256: 2**-128 that another block has its digest


def index_name(shard_name: str) -> str:
    """The index file of a shard: ``part-00000-of-00004.tfrecord.index`` beside it."""
    return shard_name + INDEX_SUFFIX


def blocks_name(index_path: str) -> str:
    """The block digests of an index: ``part-00000-of-00004.tfrecord.index.blocks`` beside it."""
    return index_path + BLOCKS_SUFFIX


def block_digests(index: bytes, records: int, lines: int = BLOCK_LINES) -> bytes:
    """The digests of every ``lines`` lines of an index of ``records`` records (the last block may be
    shorter), end to end."""
    if not records:
        return b""
    step = line_width(len(index), records) * lines
    return b"".join(hashlib.sha256(index[a:a + step]).digest()[:DIGEST_BYTES] for a in range(0, len(index), step))


def index_files(lengths: np.ndarray, shard_name: str) -> tuple[dict[str, bytes], dict]:
    """What a writer puts beside a shard whose frames have these lengths: {relative path: bytes} of
    its index and block digests, and the manifest's entry for them."""
    index = index_of_lengths(lengths)
    digests = block_digests(index, len(lengths))
    path = index_name(shard_name)
    entry = {"path": path, "bytes": len(index), "sha256": hashlib.sha256(index).hexdigest(),
             "blocks": {"path": blocks_name(path), "lines": BLOCK_LINES, "bytes": len(digests),
                        "sha256": hashlib.sha256(digests).hexdigest()}}
    return {path: index, blocks_name(path): digests}, entry


def index_of_lengths(lengths: np.ndarray) -> bytes:
    """The index of frames of these lengths laid end to end from byte 0 (what a writer knows)."""
    lengths = np.asarray(lengths, np.int64)
    return format_index(np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64))


def format_index(offsets: np.ndarray) -> bytes:
    """Index lines for records at ``offsets`` (count + 1 entries: the shard's size last)."""
    offsets = np.asarray(offsets, np.int64)
    count = len(offsets) - 1
    if count <= 0:
        return b""
    lengths = np.diff(offsets)
    w_off, w_len = len(str(int(offsets[-1]))), len(str(int(lengths.max())))
    # Digits as a byte matrix (a row per record), then the space and newline columns: no Python per record.
    rows = np.empty((count, w_off + w_len + 2), np.uint8)
    rows[:, :w_off] = _digits(offsets[:-1], w_off)
    rows[:, w_off] = ord(" ")
    rows[:, w_off + 1:-1] = _digits(lengths, w_len)
    rows[:, -1] = ord("\n")
    return rows.tobytes()


def _digits(values: np.ndarray, width: int) -> np.ndarray:
    powers = 10 ** np.arange(width - 1, -1, -1, dtype=np.int64)
    return (values[:, None] // powers % 10 + ord("0")).astype(np.uint8)


def line_width(index_size: int, records: int) -> int:
    """The width of every line of an index of ``index_size`` bytes over ``records`` records."""
    if records == 0 or index_size % records:
        raise RecordIndexError(f"an index of {index_size} bytes does not hold {records} lines of one width")
    return index_size // records


def parse_lines(data: bytes, width: int, first: int = 0, name: str = "<index>") -> tuple[np.ndarray, np.ndarray]:
    """(offsets, lengths) of the whole lines in ``data`` (lines ``first``, ``first + 1``, ... of the
    index; every line ``width`` bytes). RecordIndexError names the line of a malformed one."""
    if len(data) % width or width < 4:
        raise RecordIndexError(f"{name}: {len(data)} bytes are not whole lines of {width} bytes")
    rows = np.frombuffer(data, np.uint8).reshape(-1, width)
    if not len(rows):
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    space = int(np.argmax(rows[0] == ord(" ")))
    digits = np.ones(width, bool)
    digits[[space, width - 1]] = False
    bad = ((rows[:, space] != ord(" ")) | (rows[:, -1] != ord("\n"))
           | ((rows[:, digits] < ord("0")) | (rows[:, digits] > ord("9"))).any(axis=1))
    if space == 0 or space >= width - 2 or bad.any():
        line = first + (int(np.argmax(bad)) if bad.any() else 0)
        raise RecordIndexError(f"{name}: line {line} is not \"OFFSET LENGTH\" in {width} bytes")
    values = rows.astype(np.int64) - ord("0")
    offsets = values[:, :space] @ 10 ** np.arange(space - 1, -1, -1, dtype=np.int64)
    lengths = values[:, space + 1:-1] @ 10 ** np.arange(width - space - 3, -1, -1, dtype=np.int64)
    return offsets, lengths


def check_run(offsets: np.ndarray, lengths: np.ndarray, last: bool, shard_size: int | None,
              first: int = 0, name: str = "<index>") -> None:
    """That index lines of consecutive records describe consecutive frames inside the shard (and,
    when ``last`` holds the shard's last record, end exactly at its size)."""
    if not len(offsets):
        return
    ends = offsets + lengths
    broken = np.flatnonzero((lengths < FRAME_OVERHEAD) | np.append(ends[:-1] != offsets[1:], False))
    if len(broken):
        raise RecordIndexError(f"{name}: line {first + int(broken[0])} does not end where the next record starts")
    if first == 0 and int(offsets[0]) != 0:
        raise RecordIndexError(f"{name}: the first record starts at byte {int(offsets[0])}, not 0")
    if shard_size is not None and (int(ends[-1]) > shard_size or last and int(ends[-1]) != shard_size):
        raise RecordIndexError(f"{name}: the records end at byte {int(ends[-1])}, the shard has {shard_size} bytes")


def check_runs(offsets: np.ndarray, lengths: np.ndarray, firsts: np.ndarray, sizes: np.ndarray, records: int,
               shard_size: int | None, name: str = "<index>") -> None:
    """`check_run` on several runs of index lines laid end to end (run i: ``sizes[i]`` lines from
    line ``firsts[i]`` of a shard of ``records`` records) at once; the first run that fails raises
    check_run's own error."""
    if not len(offsets):
        return
    ends = offsets + lengths
    run_of = np.repeat(np.arange(len(sizes)), sizes)
    broken = lengths < FRAME_OVERHEAD
    broken[:-1] |= (ends[:-1] != offsets[1:]) & (run_of[:-1] == run_of[1:])
    first_line = np.cumsum(sizes) - sizes
    last_line = first_line + sizes - 1
    bad = np.bincount(run_of[broken], minlength=len(sizes)) > 0
    bad |= (firsts == 0) & (offsets[first_line] != 0)
    if shard_size is not None:
        bad |= (ends[last_line] > shard_size) | ((firsts + sizes == records) & (ends[last_line] != shard_size))
    for i in np.flatnonzero(bad)[:1].tolist():
        a, b = int(first_line[i]), int(last_line[i]) + 1
        check_run(offsets[a:b], lengths[a:b], int(firsts[i] + sizes[i]) == records, shard_size, int(firsts[i]), name)
