"""TFRecord framing: the masked CRC32C, writing frames, and the one streaming reader.

A TFRecord is (length u64, masked CRC32C of the length, payload, masked CRC32C of the payload).
`ShardStream` reads a file in fixed-size chunks, hashes every byte as it goes (verify compares the
sha256 with the manifest), frames the records and checks both CRCs; the per-record Python only
follows the lengths and hashes payloads in C, the header CRCs and comparisons are NumPy per chunk.
`iter_tfrecords` is its record-at-a-time view that stops at the first problem.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import BinaryIO

import google_crc32c
import numpy as np

CHUNK_BYTES = 4 << 20
# A length field beyond this is corruption, not a record (BERT records are a few KB).
MAX_RECORD_BYTES = 1 << 30
SUSPECT_RECORD_BYTES = 1 << 24
BROKEN_HEADER = "corrupt length header (CRC mismatch); the rest of the shard cannot be framed"


class RecordError(ValueError):
    """A TFRecord file or record that does not parse; says where."""


# ---------------------------------------------------------------- masked CRC32C


def mask_crc(crc: int) -> int:
    """TFRecord's mask of a computed CRC32C."""
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def masked_crc32c(data: bytes) -> int:
    return mask_crc(google_crc32c.value(data))


def mask_crcs(crcs: np.ndarray) -> np.ndarray:
    """``mask_crc`` on an array of computed CRC32C values (little-endian uint32 out)."""
    c = crcs.astype(np.uint64)
    return ((((c >> np.uint64(15)) | (c << np.uint64(17))) + np.uint64(0xA282EAD8)) & np.uint64(0xFFFFFFFF)).astype("<u4")


def length_crcs(lengths: np.ndarray) -> np.ndarray:
    """Masked CRC32C of every record's 8-byte length header: one C call per distinct length."""
    unique, inverse = np.unique(lengths, return_inverse=True)
    raw = np.fromiter((google_crc32c.value(struct.pack("<Q", int(v))) for v in unique.tolist()),
                      dtype=np.uint64, count=unique.size)
    return mask_crcs(raw)[inverse]


# ---------------------------------------------------------------- writing


def frame_record(payload: bytes) -> bytes:
    length = struct.pack("<Q", len(payload))
    return (
        length
        + struct.pack("<I", masked_crc32c(length))
        + payload
        + struct.pack("<I", masked_crc32c(payload))
    )


def frame_records(payloads: list[bytes]) -> bytes:
    return b"".join(frame_record(p) for p in payloads)


# ---------------------------------------------------------------- reading


def _open_local(path: str) -> BinaryIO:
    return open(path, "rb")


_U64 = struct.Struct("<Q")
_U32 = struct.Struct("<I")


def _crc32c_table() -> np.ndarray:
    table = np.zeros(256, np.uint32)
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        table[i] = c
    return table


_CRC32C_TABLE = _crc32c_table()


def crc32c_rows(rows: np.ndarray) -> np.ndarray:
    """CRC32C of every row of a uint8 matrix (short rows: the 8-byte length headers)."""
    crc = np.full(rows.shape[0], 0xFFFFFFFF, np.uint32)
    for j in range(rows.shape[1]):
        crc = _CRC32C_TABLE[(crc ^ rows[:, j]) & 0xFF] ^ (crc >> np.uint32(8))
    return crc ^ np.uint32(0xFFFFFFFF)


@dataclass
class RawBatch:
    """Framed payloads of one chunk: payload i is data[starts[i]:starts[i] + lengths[i]]."""

    indices: list[int]
    data: bytes
    starts: list[int]
    lengths: list[int]

    def payloads(self) -> list[bytes]:
        return [self.data[s:s + n] for s, n in zip(self.starts, self.lengths, strict=True)]


class ShardStream:
    """Reads one TFRecord file in chunks: hashes every byte, frames records, checks CRCs.

    ``batches()`` yields (record indices, payloads). Framing problems land in ``problems``; after a
    broken length header the rest is still read (for the hash and size) but no longer framed.
    """

    def __init__(self, path: str, name: str, check_crc: bool = True,
                 chunk_bytes: int = CHUNK_BYTES, opener: Callable[[str], BinaryIO] | None = None) -> None:
        self.path, self.name = path, name
        self.opener = opener or _open_local
        self.check_crc = check_crc
        self.chunk_bytes = chunk_bytes
        self.sha256 = hashlib.sha256()
        self.bytes = 0
        self.records = 0
        self.problems: list[tuple[int | None, str]] = []  # (record index or None, message)

    def batches(self) -> Iterator[tuple[list[int], list[bytes]]]:
        """(record indices, payloads) of the shard, a batch at a time."""
        for raw in self.raw_batches():
            yield raw.indices, raw.payloads()

    def raw_batches(self) -> Iterator[RawBatch]:
        """Framed records a chunk at a time, as ranges of one buffer (no copy per record).

        The Python loop per record only follows the length and hashes the payload (in C); the
        length-header CRCs and all comparisons are checked afterwards for the whole chunk with NumPy.
        """
        with self.opener(self.path) as f:
            yield from self.read_from(f)

    def read_from(self, f: BinaryIO) -> Iterator[RawBatch]:
        """``raw_batches`` of an already open binary stream."""
        framing = True
        buf = b""
        offset = 0  # file offset of buf[0]
        if True:
            while True:
                chunk = f.read(self.chunk_bytes)
                if chunk:
                    self.sha256.update(chunk)
                    self.bytes += len(chunk)
                if not framing:
                    if not chunk:
                        break
                    continue
                buf = buf + chunk if buf else chunk
                heads, crcs, pos, suspect = self._frame(buf)
                good, problems, broken_at = self._check_frames(buf, heads, crcs, offset, suspect)
                base = self.records
                self.problems += problems
                if broken_at is not None:
                    heads = heads[:broken_at]
                    framing = False
                self.records += len(heads)
                if len(good):
                    h = np.asarray(heads, np.int64)[good]
                    lengths = np.frombuffer(buf, np.uint8)[h[:, None] + np.arange(8)].copy().view("<u8").ravel()
                    yield RawBatch((base + good).tolist(), buf, (h + 12).tolist(), lengths.astype(np.int64).tolist())
                if not framing:
                    continue
                buf = buf[pos:]
                offset += pos
                if not chunk:
                    if buf:
                        what = f"truncated ({len(buf)} bytes left at end of file)"
                        if len(buf) >= 12 and self.check_crc and (
                                mask_crc(google_crc32c.value(buf[:8])) != _U32.unpack_from(buf, 8)[0]):
                            what = BROKEN_HEADER
                        self.problems.append((self.records, f"record {self.records} at byte {offset}: {what}"))
                    break

    def _frame(self, buf: bytes) -> tuple[list[int], list[int], int, int | None]:
        """Follow the lengths through buf: record starts, payload CRCs, where the next record starts,
        and the index of a record whose (implausible) length stopped the walk."""
        u64 = _U64
        crc = google_crc32c.value
        check = self.check_crc
        size = len(buf)
        pos = 0
        heads: list[int] = []
        crcs: list[int] = []
        while size - pos >= 12:
            (length,) = u64.unpack_from(buf, pos)
            # Do not wait for gigabytes on a corrupt length: a huge one is checked right away.
            if length > SUSPECT_RECORD_BYTES and (length > MAX_RECORD_BYTES or (
                    check and mask_crc(crc(buf[pos:pos + 8])) != _U32.unpack_from(buf, pos + 8)[0])):
                heads.append(pos)
                return heads, crcs, pos, len(heads) - 1
            end = pos + 12 + length
            if size < end + 4:
                break
            heads.append(pos)
            if check:
                crcs.append(crc(buf[pos + 12:end]))
            pos = end + 4
        return heads, crcs, pos, None

    def _check_frames(self, buf: bytes, heads: list[int], crcs: list[int], offset: int, suspect: int | None
                      ) -> tuple[np.ndarray, list[tuple[int, str]], int | None]:
        """(positions in heads of records with valid CRCs, problems, position where framing broke)."""
        n = len(heads)
        base = self.records
        if n == 0:
            return np.zeros(0, np.int64), [], None
        arr = np.frombuffer(buf, np.uint8)
        h = np.asarray(heads, np.int64)
        header = arr[h[:, None] + np.arange(12)]
        broken_at = None
        if self.check_crc:
            stored = header[:, 8:12].copy().view("<u4").ravel()
            bad_head = mask_crcs(crc32c_rows(header[:, :8])) != stored
            if bad_head.any():
                broken_at = int(np.argmax(bad_head))
        if broken_at is None and suspect is not None:
            broken_at = suspect
        problems: list[tuple[int, str]] = []
        m = n if broken_at is None else broken_at
        if broken_at is not None:
            problems.append((base + broken_at, f"record {base + broken_at} at byte {offset + heads[broken_at]}: "
                             f"{BROKEN_HEADER}"))
        good = np.arange(m)
        if self.check_crc and m:
            lengths = header[:m, :8].copy().view("<u8").ravel().astype(np.int64)
            ends = h[:m] + 12 + lengths
            stored = arr[ends[:, None] + np.arange(4)].copy().view("<u4").ravel()
            bad = mask_crcs(np.asarray(crcs[:m], np.uint64)) != stored
            for i in np.nonzero(bad)[0]:
                problems.append((base + int(i), f"record {base + int(i)} at byte {offset + heads[i]}: "
                                 "payload CRC mismatch"))
            good = good[~bad]
        return good, problems, broken_at

    def hexdigest(self) -> str:
        return self.sha256.hexdigest()


def record_offsets(read: Callable[[int], bytes], count: int, name: str, block: int = 8 << 20) -> np.ndarray:
    """Byte offset of each of ``count`` records of a TFRecord stream, and the end of the last one
    (count + 1 entries), from the length headers alone, every header's CRC checked. ``read(n)``
    returns the next bytes of the stream: large sequential reads, as a small read per record would
    be a request per record on an object store. RecordError names the record and its byte."""
    offsets = np.zeros(count + 1, np.int64)
    u64 = _U64.unpack_from
    pos = base = 0  # pos: the next header's stream offset; base: the stream offset of data[0]
    data = b""
    i = 0
    while i < count:
        while pos + 12 > base + len(data):  # bring the next header in, skipping a long payload
            drop = min(pos - base, len(data))
            data, base = data[drop:], base + drop
            more = read(block)
            if not more:
                raise RecordError(f"{name}: truncated at record {i} (byte {pos}); expected {count} records")
            data += more
        first, heads = i, []
        limit = base + len(data) - 12
        while i < count and pos <= limit:  # the one loop per record: follow the lengths
            heads.append(pos)
            pos += 16 + u64(data, pos - base)[0]
            i += 1
        at = np.asarray(heads, np.int64)
        header = np.frombuffer(data, np.uint8)[(at - base)[:, None] + np.arange(12)]
        bad = mask_crcs(crc32c_rows(header[:, :8])) != header[:, 8:].copy().view("<u4").ravel()
        if bad.any():  # before the next read: a corrupt length must not send the walk far away
            j = int(np.argmax(bad))
            raise RecordError(f"{name}: record {first + j} at byte {heads[j]}: length CRC mismatch")
        offsets[first:i] = at
    offsets[count] = pos
    return offsets


def check_frames_at(data: bytes, heads: np.ndarray, lengths: np.ndarray) -> list[tuple[int, str]]:
    """Frames an index of the file placed: record i's header at ``data[heads[i]:]`` with a payload of
    ``lengths[i]`` bytes. (i, problem) for each frame whose length field says otherwise or whose CRC
    does not match, in record order. Headers and stored CRCs are compared for all records at once;
    the payload CRCs are one C call per record."""
    n = len(heads)
    if n == 0:
        return []
    arr = np.frombuffer(data, np.uint8)
    header = arr[heads[:, None] + np.arange(12)]
    stored_length = header[:, :8].copy().view("<u8").ravel()
    bad_crc = mask_crcs(crc32c_rows(header[:, :8])) != header[:, 8:].copy().view("<u4").ravel()
    moved = stored_length != lengths.astype(np.uint64)  # a sound header of another length: the file changed
    ends = heads + 12 + lengths
    crc = google_crc32c.value
    computed = np.fromiter((crc(data[a:b]) for a, b in zip((heads + 12).tolist(), ends.tolist(), strict=True)),
                           np.uint64, count=n)
    bad_payload = mask_crcs(computed) != arr[ends[:, None] + np.arange(4)].copy().view("<u4").ravel()
    what = np.where(bad_crc, "length CRC mismatch", np.where(moved, "length differs from the shard's index",
                                                             "payload CRC mismatch"))
    return [(int(i), str(what[i])) for i in np.nonzero(bad_crc | moved | bad_payload)[0]]


def iter_tfrecords(stream: BinaryIO, name: str = "<stream>", check_crc: bool = True) -> Iterator[bytes]:
    """Payloads of a TFRecord stream in order; RecordError (naming the stream and record) at the first
    framing or CRC problem, after every record before it."""
    reader = ShardStream(name, name, check_crc=check_crc)
    seen = 0
    for raw in reader.read_from(stream):
        first_bad = min((i for i, _ in reader.problems if i is not None), default=None)
        for index, payload in zip(raw.indices, raw.payloads(), strict=True):
            if first_bad is not None and index > first_bad:
                break
            if index != seen:  # a record before this one was dropped for a bad CRC
                break
            yield payload
            seen += 1
        if reader.problems:
            break
    if reader.problems:
        index, message = min(reader.problems, key=lambda p: -1 if p[0] is None else p[0])
        # A reader that stops at the first problem has no "rest of the shard" to speak of.
        raise RecordError(f"{name}: {message.replace(BROKEN_HEADER, 'length CRC mismatch')}")
