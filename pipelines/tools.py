"""Tools for frozen datasets: verify, inspect, stats, diff.

Everything streams: a shard is read in fixed-size chunks (hashed as it is read), framed records are
collected into batches, and each batch is parsed and checked with NumPy in one go. Shards are spread
over a process pool, so a check uses every core and constant memory per worker.

Datasets without a manifest (made by the original tool) work too: the caller gives the record shape
and the vocab, and the checks that need a manifest (checksums, counts) are skipped.
"""

from __future__ import annotations

import hashlib
import io
import multiprocessing
import os
import struct
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import google_crc32c
import numpy as np
from apache_beam.io.filesystems import FileSystems

from contract.manifest import (
    CARD_NAME,
    MANIFEST_NAME,
    VOCAB_NAME,
    ManifestError,
    load_manifest,
    shape_from_manifest,
    split_names,
)
from datagen.records import (
    FLOAT_FEATURES,
    INT_FEATURES,
    RecordError,
    decode_example,
    feature_spec,
)
from pipelines import fsio

CHUNK_BYTES = 4 << 20
MAX_PROBLEMS_PER_SHARD = 20
# A length field beyond this is corruption, not a record (BERT records are a few KB).
MAX_RECORD_BYTES = 1 << 30
SUSPECT_RECORD_BYTES = 1 << 24
FEATURE_NAMES = INT_FEATURES + FLOAT_FEATURES


class ToolError(ValueError):
    """A dataset the tools cannot open (bad target, missing options, unreadable vocab); says why."""


# ---------------------------------------------------------------- vocab


@dataclass(frozen=True)
class Vocab:
    tokens: tuple[str, ...]
    path: str

    def __len__(self) -> int:
        return len(self.tokens)

    def id_of(self, token: str) -> int | None:
        try:
            return self.tokens.index(token)
        except ValueError:
            return None

    def token(self, i: int) -> str:
        return self.tokens[i] if 0 <= i < len(self.tokens) else f"<id {i}>"


def load_vocab_file(path: str) -> Vocab:
    """The vocab through vocab.vocab_file (same parsing and validation as the generator uses)."""
    from vocab.vocab_file import VocabError, load_vocab

    if not fsio.exists(path):
        raise ToolError(f"{path}: vocab file not found")
    try:
        loaded = load_vocab(path)
    except VocabError as e:
        raise ToolError(str(e)) from e
    return Vocab(tuple(loaded.tokens), path)


# ---------------------------------------------------------------- datasets


@dataclass(frozen=True)
class ShardRef:
    split: str
    name: str  # as the manifest lists it (relative), or the file path for data without a manifest
    path: str  # full path to open
    expected: dict | None = None  # the manifest's entry


@dataclass(frozen=True)
class RecordShape:
    """What a record must look like; small and picklable for the worker processes."""

    max_seq_length: int
    max_predictions: int
    vocab_size: int
    cls_id: int
    sep_id: int
    mask_id: int | None
    pad_id: int | None
    unk_id: int | None
    # From the manifest's config; None for data without one (the masked-count check is skipped).
    masked_lm_prob: float | None = None
    whole_word_mask: bool = False


@dataclass
class Dataset:
    root: str | None  # None for a glob of files without a manifest
    manifest: dict | None
    shards: list[ShardRef]
    vocab: Vocab
    shape: RecordShape

    @property
    def splits(self) -> list[str]:
        return list(dict.fromkeys(s.split for s in self.shards))


def _shape_for(vocab: Vocab, max_seq_length: int, max_predictions: int, config: dict | None = None
               ) -> RecordShape:
    cls_id, sep_id = vocab.id_of("[CLS]"), vocab.id_of("[SEP]")
    if cls_id is None or sep_id is None:
        raise ToolError(f"{vocab.path}: vocab has no [CLS] or [SEP] token; it cannot be a BERT vocab")
    prob = (config or {}).get("masked_lm_prob")
    return RecordShape(max_seq_length, max_predictions, len(vocab), cls_id, sep_id,
                       vocab.id_of("[MASK]"), vocab.id_of("[PAD]"), vocab.id_of("[UNK]"),
                       float(prob) if prob is not None else None,
                       bool((config or {}).get("whole_word_mask", False)))


def _is_dir(path: str) -> bool:
    if "://" in path:
        return FileSystems.exists(fsio.join(path, MANIFEST_NAME))
    return os.path.isdir(path)


def open_dataset(
    target: str,
    *,
    max_seq_length: int | None = None,
    max_predictions_per_seq: int | None = None,
    vocab_path: str | None = None,
) -> Dataset:
    """A dataset directory with a manifest, or (given the record shape and vocab) TFRecords without one.

    Without a manifest, ``target`` is a file glob, or a directory whose files are all shards.
    """
    legacy_opts = (max_seq_length, max_predictions_per_seq, vocab_path)
    has_manifest = fsio.exists(fsio.join(target, MANIFEST_NAME)) if _is_dir(target) else False
    if has_manifest:
        if any(v is not None for v in legacy_opts[:2]):
            raise ToolError(
                f"{target} has a manifest; --max-seq-length/--max-predictions-per-seq are only for "
                "data without one"
            )
        manifest = load_manifest(target, fsio.BEAM_FS)
        vocab = load_vocab_file(vocab_path or fsio.join(target, manifest["vocab"]["path"]))
        seq, preds = shape_from_manifest(manifest)
        shards = [ShardRef(split, s["path"], fsio.join(target, *s["path"].split("/")), s)
                  for split in split_names(manifest) for s in manifest["splits"][split]["shards"]]
        return Dataset(target, manifest, shards, vocab, _shape_for(vocab, seq, preds, manifest["config"]))
    if any(v is None for v in legacy_opts):
        if _is_dir(target):
            raise ManifestError(
                f"{fsio.join(target, MANIFEST_NAME)}: no manifest: not a complete bert-datagen dataset. "
                "For data made by the original tool pass --max-seq-length, --max-predictions-per-seq "
                "and --vocab"
            )
        raise ToolError(
            f"{target}: not a dataset directory; for TFRecords without a manifest pass "
            "--max-seq-length, --max-predictions-per-seq and --vocab"
        )
    pattern = fsio.join(target, "*") if _is_dir(target) else target
    try:
        files = fsio.match_files([pattern])
    except fsio.InputNotFoundError as e:
        raise ToolError(str(e)) from e
    vocab = load_vocab_file(vocab_path)  # type: ignore[arg-type]
    shards = [ShardRef("files", f.path, f.path) for f in files if not _is_hidden(f.path)]
    if not shards:
        raise ToolError(f"{target}: no record files")
    return Dataset(None, None, shards, vocab, _shape_for(vocab, max_seq_length, max_predictions_per_seq))  # type: ignore[arg-type]


def _is_hidden(path: str) -> bool:
    return path.rstrip("/").rsplit("/", 1)[-1].startswith(".")


# ---------------------------------------------------------------- streaming a shard


_U64 = struct.Struct("<Q")
_U32 = struct.Struct("<I")


def _mask(crc: int) -> int:
    """TFRecord's masked CRC32C (datagen.records.masked_crc32c) of a computed CRC."""
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def _crc32c_table() -> np.ndarray:
    table = np.zeros(256, np.uint32)
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        table[i] = c
    return table


_CRC32C_TABLE = _crc32c_table()


def _crc32c_rows(rows: np.ndarray) -> np.ndarray:
    """CRC32C of every row of a uint8 matrix (short rows: the 8-byte length headers)."""
    crc = np.full(rows.shape[0], 0xFFFFFFFF, np.uint32)
    for j in range(rows.shape[1]):
        crc = _CRC32C_TABLE[(crc ^ rows[:, j]) & 0xFF] ^ (crc >> np.uint32(8))
    return crc ^ np.uint32(0xFFFFFFFF)


def _mask_array(crc: np.ndarray) -> np.ndarray:
    """TFRecord's masked CRC32C (datagen.records.masked_crc32c) of computed CRCs."""
    c = crc.astype(np.uint64)
    return (((c >> np.uint64(15)) | (c << np.uint64(17))) + np.uint64(0xA282EAD8)) & np.uint64(0xFFFFFFFF)


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
                 chunk_bytes: int = CHUNK_BYTES) -> None:
        self.path, self.name = path, name
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
        framing = True
        buf = b""
        offset = 0  # file offset of buf[0]
        with fsio.open_read(self.path) as f:
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
                                _mask(google_crc32c.value(buf[:8])) != _U32.unpack_from(buf, 8)[0]):
                            what = "corrupt length header (CRC mismatch); the rest of the shard cannot be framed"
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
                    check and _mask(crc(buf[pos:pos + 8])) != _U32.unpack_from(buf, pos + 8)[0])):
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
            bad_head = _mask_array(_crc32c_rows(header[:, :8])) != stored
            if bad_head.any():
                broken_at = int(np.argmax(bad_head))
        if broken_at is None and suspect is not None:
            broken_at = suspect
        problems: list[tuple[int, str]] = []
        m = n if broken_at is None else broken_at
        if broken_at is not None:
            problems.append((base + broken_at, f"record {base + broken_at} at byte {offset + heads[broken_at]}: "
                             "corrupt length header (CRC mismatch); the rest of the shard cannot be framed"))
        good = np.arange(m)
        if self.check_crc and m:
            lengths = header[:m, :8].copy().view("<u8").ravel().astype(np.int64)
            ends = h[:m] + 12 + lengths
            stored = arr[ends[:, None] + np.arange(4)].copy().view("<u4").ravel()
            bad = _mask_array(np.asarray(crcs[:m], np.uint64)) != stored
            for i in np.nonzero(bad)[0]:
                problems.append((base + int(i), f"record {base + int(i)} at byte {offset + heads[i]}: "
                                 "payload CRC mismatch"))
            good = good[~bad]
        return good, problems, broken_at

    def hexdigest(self) -> str:
        return self.sha256.hexdigest()


# ---------------------------------------------------------------- vectorized Example parsing
#
# Protobuf is parsed level by level for a whole batch at once: at every level each message advances
# one field per step, so the Python loop runs (fields per message) times, not (records x fields).
# Anything unusual marks the record "irregular"; those go through datagen.records.decode_example,
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


def _name_tables() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    lengths = [len(name) for name in FEATURE_NAMES]
    assert len(set(lengths)) == len(lengths), "feature names must have distinct lengths"
    by_length = np.full(max(lengths) + 2, -1, np.int64)
    table = np.zeros((len(FEATURE_NAMES), max(lengths)), np.uint8)
    for j, name in enumerate(FEATURE_NAMES):
        by_length[len(name)] = j
        table[j, :len(name)] = np.frombuffer(name.encode(), np.uint8)
    # Feature's tag byte: float_list is field 2, int64_list field 3 (both length-delimited).
    tags = np.array([0x12 if name in FLOAT_FEATURES else 0x1A for name in FEATURE_NAMES], np.uint8)
    return by_length, table, tags


_NAME_BY_LENGTH, _NAME_TABLE, _FEATURE_TAGS = _name_tables()


@dataclass
class Batch:
    """Decoded records of a batch; ``index`` are the record indices in the shard."""

    index: np.ndarray
    features: dict[str, np.ndarray]

    def __len__(self) -> int:
        return len(self.index)


def decode_batch(payloads: list[bytes], indices: list[int], shape: RecordShape
                 ) -> tuple[Batch, list[tuple[int, str]]]:
    """Parse payloads against the feature spec; returns the good records and (index, problem) pairs."""
    lengths = [len(p) for p in payloads]
    starts = np.zeros(len(payloads), np.int64)
    if payloads:
        np.cumsum(lengths[:-1], out=starts[1:])
    return decode_raw(RawBatch(list(indices), b"".join(payloads), starts.tolist(), lengths), shape)


def decode_raw(raw: RawBatch, shape: RecordShape) -> tuple[Batch, list[tuple[int, str]]]:
    """decode_batch on payloads that are ranges of one buffer (as ShardStream.raw_batches gives them)."""
    spec = feature_spec(shape.max_seq_length, shape.max_predictions)
    indices = raw.indices
    n = len(indices)
    lengths = np.asarray(raw.lengths, np.int64)
    rec_start = np.asarray(raw.starts, np.int64)
    buf = np.frombuffer(raw.data, np.uint8)
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

    # Which feature each entry is: the names have distinct lengths; then compare the bytes.
    key_len = key_e - key_s
    guess = _NAME_BY_LENGTH[np.clip(key_len, 0, len(_NAME_BY_LENGTH) - 1)]
    width = _NAME_TABLE.shape[1]
    got = buf[np.minimum(key_s[:, None] + np.arange(width), max(len(buf) - 1, 0))]
    same = (got == _NAME_TABLE[np.maximum(guess, 0)]) | (np.arange(width) >= key_len[:, None])
    name_of = np.where((guess >= 0) & same.all(axis=1) & ok_entry, guess, -1)
    bad[ent_rec[name_of < 0]] = True
    known = name_of >= 0
    per_name = np.bincount(ent_rec[known] * len(FEATURE_NAMES) + name_of[known],
                           minlength=n * len(FEATURE_NAMES)).reshape(n, len(FEATURE_NAMES))
    bad |= (per_name != 1).any(axis=1)

    # Feature{int64_list (3) | float_list (2)} -> List{value (1), packed}
    use = np.nonzero(known & ~bad[ent_rec])[0]
    tags = _FEATURE_TAGS[name_of[use]]
    l_s, l_e = _expect_ld(buf, val_s[use], val_e[use], tags, bad, ent_rec[use])
    d_s_all, d_e_all = _expect_ld(buf, l_s, l_e, 0x0A, bad, ent_rec[use])

    features: dict[str, np.ndarray] = {}
    for j, name in enumerate(FEATURE_NAMES):
        sel = np.nonzero(name_of[use] == j)[0]
        recs = ent_rec[use[sel]]
        ok = ~bad[recs]
        recs, d_s, d_e = recs[ok], d_s_all[sel][ok], d_e_all[sel][ok]
        dtype, count = spec[name]
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
            feats = _decode_one(raw.data[raw.starts[i]:raw.starts[i] + raw.lengths[i]], spec)
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


def _decode_one(payload: bytes, spec: dict[str, tuple[str, int]]) -> dict[str, np.ndarray]:
    """Slow, exact path for one record; RecordError says what is wrong with it."""
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


# ---------------------------------------------------------------- invariants


@dataclass
class Layout:
    """Per-record quantities derived from a batch (original tokens restored at masked positions)."""

    length: np.ndarray  # real tokens (sum of input_mask)
    first_sep: np.ndarray
    n_masked: np.ndarray
    original: np.ndarray  # input_ids with labels put back at masked positions


def derive(batch: Batch, shape: RecordShape) -> Layout:
    f = batch.features
    ids = f["input_ids"]
    n, s = ids.shape
    length = f["input_mask"].sum(axis=1)
    w = f["masked_lm_weights"]
    n_masked = (w == 1).sum(axis=1)
    pos = f["masked_lm_positions"]
    original = ids.copy()
    active = (w == 1) & (pos >= 0) & (pos < s)
    rows, cols = np.nonzero(active)
    original[rows, pos[rows, cols]] = f["masked_lm_ids"][rows, cols]
    inside = np.arange(s) < length[:, None]
    is_sep = (original == shape.sep_id) & inside
    first_sep = np.where(is_sep.any(axis=1), np.argmax(is_sep, axis=1), -1)
    return Layout(length, first_sep, n_masked, original)


def check_batch(batch: Batch, shape: RecordShape, layout: Layout | None = None,
                limit: int = MAX_PROBLEMS_PER_SHARD) -> tuple[list[tuple[int, str]], int]:
    """Broken invariants as (record index, message), at most ``limit`` per check, and their total count.

    A record gets at most one message per check; checks that depend on the layout are skipped for
    records whose layout is already wrong.
    """
    if len(batch) == 0:
        return [], 0
    lay = layout or derive(batch, shape)
    f = batch.features
    ids, mask, seg = f["input_ids"], f["input_mask"], f["segment_ids"]
    pos, mids, w = f["masked_lm_positions"], f["masked_lm_ids"], f["masked_lm_weights"]
    nsp = f["next_sentence_labels"][:, 0]
    n, s = ids.shape
    p = pos.shape[1]
    v = shape.vocab_size
    ar = np.arange(s)
    arp = np.arange(p)
    length = lay.length
    inside = ar < length[:, None]
    orig = lay.original
    sep1 = lay.first_sep
    rows = np.arange(n)
    checks: list[tuple[np.ndarray, Callable[[int], str]]] = []

    def first(m: np.ndarray, r: int) -> int:
        return int(np.argmax(m[r]))

    bad_ids = (ids < 0) | (ids >= v)
    checks.append((bad_ids.any(1), lambda r: f"input_ids[{first(bad_ids, r)}]={ids[r, first(bad_ids, r)]} "
                   f"is not below the vocab size {v}"))
    bad_mask = mask != inside
    checks.append((bad_mask.any(1), lambda r: f"input_mask is not 1s then 0s (position {first(bad_mask, r)})"))
    bad_pad = ~inside & ((ids != 0) | (seg != 0))
    checks.append((bad_pad.any(1), lambda r: f"padding position {first(bad_pad, r)} has a non-zero "
                   "input_id or segment_id"))
    n_sep = ((orig == shape.sep_id) & inside).sum(1)
    n_cls = ((orig == shape.cls_id) & inside).sum(1)
    last = orig[rows, np.clip(length - 1, 0, s - 1)]
    layout_ok = ((length >= 5) & (orig[:, 0] == shape.cls_id) & (n_cls == 1) & (n_sep == 2)
                 & (last == shape.sep_id) & (sep1 >= 2) & (sep1 <= length - 3))
    checks.append((~layout_ok, lambda r: (
        f"not [CLS] A [SEP] B [SEP]: {int(length[r])} tokens, first token "
        f"{'[CLS]' if orig[r, 0] == shape.cls_id else orig[r, 0]}, {int(n_cls[r])} [CLS], "
        f"{int(n_sep[r])} [SEP] (first at {int(sep1[r])}), last token id {int(last[r])}")))
    special = [t for t in (shape.pad_id, shape.mask_id) if t is not None]
    stray = np.isin(orig, special) & inside
    checks.append((stray.any(1) & layout_ok, lambda r: f"special token id {orig[r, first(stray, r)]} inside "
                   f"the text at position {first(stray, r)}"))
    want_seg = (ar > sep1[:, None]) & inside
    bad_seg = seg != want_seg
    checks.append((bad_seg.any(1) & layout_ok, lambda r: (
        f"segment_ids wrong at position {first(bad_seg, r)} (expected 0 through the first [SEP] at "
        f"{int(sep1[r])}, 1 up to the second at {int(length[r]) - 1}, 0 padding)")))
    k = lay.n_masked
    w_ok = ((w == 0) | (w == 1)) & (w == (arp < k[:, None]))
    checks.append((~w_ok.all(1), lambda r: "masked_lm_weights are not 1s then 0s: "
                   f"{w[r].tolist()}"))
    act = arp < k[:, None]
    out_seq = act & ((pos < 1) | (pos >= length[:, None]))
    checks.append((out_seq.any(1), lambda r: f"masked position {pos[r, first(out_seq, r)]} is not strictly "
                   f"inside the sequence (1..{int(length[r]) - 1})"))
    on_sep = act & ((pos == sep1[:, None]) | (pos == (length - 1)[:, None]))
    checks.append((on_sep.any(1) & layout_ok, lambda r: f"masked position {pos[r, first(on_sep, r)]} is on [SEP]"))
    unsorted = act[:, 1:] & (pos[:, 1:] <= pos[:, :-1])
    checks.append((unsorted.any(1), lambda r: f"masked_lm_positions not strictly increasing: "
                   f"{pos[r, :int(k[r])].tolist()}"))
    bad_label = act & ((mids < 0) | (mids >= v))
    checks.append((bad_label.any(1), lambda r: f"masked_lm_ids[{first(bad_label, r)}]="
                   f"{mids[r, first(bad_label, r)]} is not below the vocab size {v}"))
    bad_tail = ~act & ((pos != 0) | (mids != 0))
    checks.append((bad_tail.any(1), lambda r: f"masked_lm_positions/ids entry {first(bad_tail, r)} has weight 0 "
                   "but is not 0"))
    checks.append(((nsp != 0) & (nsp != 1), lambda r: f"next_sentence_labels is {nsp[r]} (must be 0 or 1)"))
    if shape.masked_lm_prob is not None:
        # The recipe: min(max_predictions, max(1, round(len * masked_lm_prob))) positions (round half to
        # even, as Python and np.round do), fewer only when there are fewer candidates; whole-word
        # masking may take fewer because it skips words that would overshoot.
        want = np.minimum(np.minimum(p, np.maximum(1, np.round(length * shape.masked_lm_prob).astype(np.int64))),
                          length - 3)
        wrong_k = (k > want) if shape.whole_word_mask else (k != want)
        checks.append((wrong_k & layout_ok, lambda r: (
            f"masks {int(k[r])} positions; the recipe gives {'at most ' if shape.whole_word_mask else ''}"
            f"{int(want[r])} for {int(length[r])} tokens at masked_lm_prob {shape.masked_lm_prob}")))

    problems = []
    total = 0
    for failed, message in checks:
        rows_failed = np.nonzero(failed)[0]
        total += len(rows_failed)
        for r in rows_failed[:limit]:
            problems.append((int(batch.index[r]), message(int(r))))
    return problems, total


# ---------------------------------------------------------------- verify


@dataclass
class ShardTask:
    ref: ShardRef
    shape: RecordShape
    check_records: bool = True
    max_problems: int = MAX_PROBLEMS_PER_SHARD


@dataclass
class ShardResult:
    ref: ShardRef
    records: int = 0
    bytes: int = 0
    sha256: str = ""
    problems: list[str] = field(default_factory=list)
    problem_count: int = 0
    notnext: int = 0
    masked: int = 0
    seconds: float = 0.0


def _add(result: ShardResult, index: int | None, message: str, limit: int) -> None:
    result.problem_count += 1
    if len(result.problems) < limit:
        where = f"record {index}: " if index is not None and not message.startswith("record ") else ""
        result.problems.append(f"{result.ref.name}: {where}{message}")


def verify_shard(task: ShardTask) -> ShardResult:
    """Hash, frame, parse and check one shard; compare with its manifest entry when there is one."""
    t0 = time.perf_counter()
    ref = task.ref
    res = ShardResult(ref)
    if not fsio.exists(ref.path):
        _add(res, None, "shard is missing", task.max_problems)
        return res
    stream = ShardStream(ref.path, ref.name)
    try:
        for raw in stream.raw_batches():
            if not task.check_records:
                continue
            batch, problems = decode_raw(raw, task.shape)
            checked, total = check_batch(batch, task.shape, limit=task.max_problems)
            for index, message in sorted(problems + checked):
                _add(res, index, message, task.max_problems)
            res.problem_count += total - len(checked)
            res.notnext += int((batch.features["next_sentence_labels"] == 1).sum())
            res.masked += int((batch.features["masked_lm_weights"] == 1).sum())
    except OSError as e:
        _add(res, None, f"cannot read: {e}", task.max_problems)
    for index, message in stream.problems:
        _add(res, index, message, task.max_problems)
    res.records, res.bytes, res.sha256 = stream.records, stream.bytes, stream.hexdigest()
    exp = ref.expected
    if exp is not None:
        if res.bytes != exp["bytes"]:
            _add(res, None, f"size is {res.bytes} bytes, manifest says {exp['bytes']}", task.max_problems)
        if res.sha256 != exp["sha256"]:
            _add(res, None, f"sha256 is {res.sha256}, manifest says {exp['sha256']}", task.max_problems)
        if res.records != exp["records"]:
            _add(res, None, f"holds {res.records} records, manifest says {exp['records']}", task.max_problems)
    res.seconds = time.perf_counter() - t0
    return res


def pool_start_method(tasks: list) -> str:
    """'fork' for local files (cheap); 'spawn' when a task reads a remote filesystem, because a forked
    child would share the parent's open HTTP connections (the manifest and vocab were read with them)."""
    remote = any("://" in getattr(t.ref, "path", "") for t in tasks)
    return "spawn" if remote else "fork"


def map_shards(fn: Callable, tasks: list, workers: int | None = None) -> list:
    """fn over tasks in order, on a process pool when there is more than one worker and task."""
    workers = workers or os.cpu_count() or 1
    workers = min(workers, len(tasks))
    if workers <= 1:
        return [fn(t) for t in tasks]
    with multiprocessing.get_context(pool_start_method(tasks)).Pool(workers) as pool:
        return list(pool.imap(fn, tasks, chunksize=1))


@dataclass
class VerifyReport:
    problems: list[str]
    shards: list[ShardResult]
    problem_count: int
    seconds: float
    has_manifest: bool

    @property
    def ok(self) -> bool:
        return self.problem_count == 0

    @property
    def records(self) -> int:
        return sum(s.records for s in self.shards)

    @property
    def bytes(self) -> int:
        return sum(s.bytes for s in self.shards)


def _list_dir(directory: str) -> list[str]:
    result = FileSystems.match([fsio.join(directory, "*")])[0]
    return [m.path for m in result.metadata_list]


def _manifest_problems(ds: Dataset, vocab_bytes: bytes | None) -> list[str]:
    """Edits to the manifest that make it disagree with itself, the vocab or the directory."""
    m = ds.manifest
    assert m is not None and ds.root is not None
    src = fsio.join(ds.root, MANIFEST_NAME)
    problems = []
    cfg = m["config"]
    seq, preds = shape_from_manifest(m)
    if cfg.get("max_seq_length", seq) != seq or cfg.get("max_predictions_per_seq", preds) != preds:
        problems.append(f"{src}: config max_seq_length/max_predictions_per_seq ({cfg.get('max_seq_length')}/"
                        f"{cfg.get('max_predictions_per_seq')}) disagree with features ({seq}/{preds})")
    if "random_seed" in cfg and m["seed"] != cfg["random_seed"]:
        problems.append(f"{src}: seed {m['seed']} disagrees with config.random_seed {cfg['random_seed']}")
    for name, (dtype, count) in feature_spec(seq, preds).items():
        if list(m["features"][name]) != [dtype, count]:
            problems.append(f"{src}: features.{name} is {m['features'][name]}, expected {[dtype, count]}")
    seen: set[str] = set()
    for split, info in m["splits"].items():
        shards = info["shards"]
        for s in shards:
            if s["path"] in seen:
                problems.append(f"{src}: shard {s['path']} is listed twice")
            seen.add(s["path"])
            if not s["path"].startswith(split + "/"):
                problems.append(f"{src}: shard {s['path']} of split {split} is not under {split}/")
        for key in ("records", "bytes"):
            total = sum(s[key] for s in shards)
            if info[key] != total:
                problems.append(f"{src}: splits.{split}.{key} is {info[key]} but its shards sum to {total}")
    vocab = m["vocab"]
    if vocab_bytes is not None:
        digest = hashlib.sha256(vocab_bytes).hexdigest()
        if digest != vocab["sha256"]:
            problems.append(f"{ds.vocab.path}: sha256 is {digest}, manifest says {vocab['sha256']}")
        if len(ds.vocab) != vocab["size"]:
            problems.append(f"{ds.vocab.path}: {len(ds.vocab)} tokens, manifest says vocab.size {vocab['size']}")
    # Files in the split directories that the manifest does not list (and shards it lists that are gone
    # show up per shard as missing).
    for split in m["splits"]:
        split_dir = fsio.join(ds.root, split)
        for path in _list_dir(split_dir):
            rel = f"{split}/{path.rstrip('/').rsplit('/', 1)[-1]}"
            if rel not in seen:
                kind = ("leftover temp file of an interrupted write" if fsio.TMP_MARKER in rel
                        else "stray file not listed in the manifest")
                problems.append(f"{rel}: {kind}")
    for path in _list_dir(ds.root):
        name = path.rstrip("/").rsplit("/", 1)[-1]
        if name not in (MANIFEST_NAME, CARD_NAME, vocab["path"], VOCAB_NAME):
            problems.append(f"{name}: stray file not listed in the manifest")
    return problems


def _totals_problems(ds: Dataset, shards: list[ShardResult], records_checked: bool) -> list[str]:
    """The manifest's totals against what the shards hold (only when every record parsed)."""
    m = ds.manifest
    assert m is not None and ds.root is not None
    src = fsio.join(ds.root, MANIFEST_NAME)
    totals = m["totals"]
    records = sum(s.records for s in shards)
    problems = []
    if "instances" in totals and totals["instances"] != records:
        problems.append(f"{src}: totals.instances is {totals['instances']} but the shards hold {records} records")
    if not records_checked:
        return problems
    if "masked_tokens" in totals:
        masked = sum(s.masked for s in shards)
        if totals["masked_tokens"] != masked:
            problems.append(f"{src}: totals.masked_tokens is {totals['masked_tokens']} but the records "
                            f"mask {masked} tokens")
    if "notnext_fraction" in totals and records:
        share = sum(s.notnext for s in shards) / records
        if abs(float(totals["notnext_fraction"]) - share) > 1e-6:
            problems.append(f"{src}: totals.notnext_fraction is {totals['notnext_fraction']} but the "
                            f"records' NotNext share is {share:.6f}")
    return problems


def verify(ds: Dataset, *, workers: int | None = None, check_records: bool = True,
           max_problems: int = MAX_PROBLEMS_PER_SHARD) -> VerifyReport:
    """Check a dataset end to end; the report lists every problem found (bounded per shard)."""
    t0 = time.perf_counter()
    pre: list[str] = []
    if ds.manifest is not None:
        vocab_bytes = fsio.read_bytes(ds.vocab.path)
        pre = _manifest_problems(ds, vocab_bytes)
    tasks = [ShardTask(ref, ds.shape, check_records, max_problems) for ref in ds.shards]
    shards = map_shards(verify_shard, tasks, workers)
    problems = list(pre)
    count = len(pre)
    for r in shards:
        problems += r.problems
        count += r.problem_count
        if r.problem_count > len(r.problems):
            problems.append(f"{r.ref.name}: ... and {r.problem_count - len(r.problems)} more problems")
    if ds.manifest is not None and count == 0:
        post = _totals_problems(ds, shards, check_records)
        problems += post
        count += len(post)
    return VerifyReport(problems, shards, count, time.perf_counter() - t0, ds.manifest is not None)


# ---------------------------------------------------------------- reading particular records


def read_records(ref: ShardRef, shape: RecordShape, start: int, count: int) -> tuple[Batch, list[str]]:
    """Records [start, start+count) of a shard, decoded; problems met on the way as strings."""
    stream = ShardStream(ref.path, ref.name, chunk_bytes=1 << 20)
    got_idx: list[int] = []
    got: list[bytes] = []
    for indices, payloads in stream.batches():
        for i, p in zip(indices, payloads, strict=True):
            if start <= i < start + count:
                got_idx.append(i)
                got.append(p)
        if indices and indices[-1] >= start + count - 1:
            break
    if not got:
        empty = {k: np.zeros((0, c), np.float32 if d == "float32" else np.int64)
                 for k, (d, c) in feature_spec(shape.max_seq_length, shape.max_predictions).items()}
        return Batch(np.zeros(0, np.int64), empty), [f"{ref.name}: {m}" for _, m in stream.problems]
    batch, problems = decode_batch(got, got_idx, shape)
    msgs = [f"{ref.name}: record {i}: {m}" for i, m in problems] + [f"{ref.name}: {m}" for _, m in stream.problems]
    return batch, msgs


def iter_payloads(ref: ShardRef) -> Iterator[tuple[int, bytes]]:
    stream = ShardStream(ref.path, ref.name)
    for indices, payloads in stream.batches():
        yield from zip(indices, payloads, strict=True)




# ---------------------------------------------------------------- inspect


def record_view(batch: Batch, row: int, vocab: Vocab, shape: RecordShape) -> dict:
    """One record as plain data: tokens of A and B, masked positions with their kind and label."""
    f = {k: v[row] for k, v in batch.features.items()}
    one = Batch(batch.index[row:row + 1], {k: v[row:row + 1] for k, v in batch.features.items()})
    lay = derive(one, shape)
    length, sep1 = int(lay.length[0]), int(lay.first_sep[0])
    k = int(lay.n_masked[0])
    masked = {}
    for j in range(k):
        pos, label = int(f["masked_lm_positions"][j]), int(f["masked_lm_ids"][j])
        shown = int(f["input_ids"][pos]) if 0 <= pos < len(f["input_ids"]) else -1
        kind = "mask" if shown == shape.mask_id else ("kept" if shown == label else "random")
        masked[pos] = {"position": pos, "kind": kind, "shown": vocab.token(shown), "label": vocab.token(label)}
    tokens = []
    for i in range(length):
        entry = {"token": vocab.token(int(lay.original[0, i])), "segment": int(f["segment_ids"][i])}
        if i in masked:
            entry["masked"] = masked[i]
        tokens.append(entry)
    nsp = int(f["next_sentence_labels"][0])
    a_end = sep1 if sep1 > 0 else length
    return {
        "index": int(batch.index[row]),
        "length": length,
        "next_sentence_label": nsp,
        "relation": {0: "IsNext", 1: "NotNext"}.get(nsp, "invalid"),
        "tokens": tokens,
        "a": [t["token"] for t in tokens[1:a_end]],
        "b": [t["token"] for t in tokens[a_end + 1:length - 1]],
        "masked": [masked[p] for p in sorted(masked)],
    }


def _shown(entry: dict) -> str:
    m = entry.get("masked")
    if m is None:
        return entry["token"]
    if m["kind"] == "mask":
        return f"{{MASK:{m['label']}}}"
    if m["kind"] == "kept":
        return f"{{kept:{m['label']}}}"
    return f"{{random {m['shown']}:{m['label']}}}"


def _segment_text(tokens: list[dict], words: bool) -> str:
    if not words:
        return " ".join(_shown(t) for t in tokens)
    # Join WordPiece continuations to the word before them; a masked piece keeps its marker.
    out: list[str] = []
    for t in tokens:
        shown = _shown(t)
        if t["token"].startswith("##") and out:
            out[-1] += shown if "masked" in t else shown[2:]
        else:
            out.append(shown)
    return " ".join(out)


def format_record(view: dict, shard_name: str, words: bool = False) -> str:
    """Human-readable text of a record_view (``words``: ## pieces joined into words)."""
    tokens = view["tokens"]
    a_end = 1 + len(view["a"])
    nsp = view["next_sentence_label"]
    why = {0: "B follows A in the document", 1: "B comes from another document"}.get(nsp, "")
    lines = [
        f"{shard_name} record {view['index']}: {view['length']} tokens, {len(view['masked'])} masked, "
        f"NSP label {nsp} = {view['relation']}" + (f" ({why})" if why else ""),
        "  A: " + _segment_text(tokens[1:a_end], words),
        "  B: " + _segment_text(tokens[a_end + 1:view["length"] - 1], words),
        "  masked: " + ", ".join(
            f"{m['position']} {'[MASK]' if m['kind'] == 'mask' else m['kind']}"
            + (f" ({m['shown']})" if m["kind"] == "random" else "") + f" -> {m['label']}"
            for m in view["masked"]),
    ]
    return "\n".join(lines)


def pick_shard(ds: Dataset, split: str | None, shard: int) -> ShardRef:
    if split is None:
        split = "train" if "train" in ds.splits else ds.splits[0]
    refs = [r for r in ds.shards if r.split == split]
    if not refs:
        known = ", ".join(ds.splits)
        raise ToolError(f"no shards in split {split!r} (splits: {known})")
    if not 0 <= shard < len(refs):
        raise ToolError(f"--shard {shard} is out of range: split {refs[0].split!r} has {len(refs)} shards")
    return refs[shard]


def inspect_records(ds: Dataset, *, split: str | None, shard: int, index: int, count: int
                    ) -> tuple[ShardRef, list[dict], list[str]]:
    ref = pick_shard(ds, split, shard)
    batch, problems = read_records(ref, ds.shape, index, count)
    views = [record_view(batch, r, ds.vocab, ds.shape) for r in range(len(batch))]
    return ref, views, problems


# ---------------------------------------------------------------- stats


@dataclass
class StatsAccum:
    seq_len: np.ndarray
    a_len: np.ndarray
    b_len: np.ndarray
    masked: np.ndarray
    token_counts: np.ndarray
    mask_kinds: np.ndarray  # [MASK], kept, random
    records: int = 0
    notnext: int = 0
    pad_positions: int = 0
    positions: int = 0
    text_tokens: int = 0
    unk: int = 0
    unreadable: int = 0
    problems: list[str] = field(default_factory=list)

    @classmethod
    def empty(cls, shape: RecordShape) -> StatsAccum:
        s, p = shape.max_seq_length, shape.max_predictions
        return cls(np.zeros(s + 1, np.int64), np.zeros(s + 1, np.int64), np.zeros(s + 1, np.int64),
                   np.zeros(p + 1, np.int64), np.zeros(shape.vocab_size, np.int64), np.zeros(3, np.int64))

    def add(self, other: StatsAccum) -> None:
        for name in ("seq_len", "a_len", "b_len", "masked", "token_counts", "mask_kinds"):
            getattr(self, name)[:] += getattr(other, name)
        for name in ("records", "notnext", "pad_positions", "positions", "text_tokens", "unk", "unreadable"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.problems += other.problems[: max(0, MAX_PROBLEMS_PER_SHARD - len(self.problems))]

    def add_batch(self, batch: Batch, shape: RecordShape) -> None:
        if len(batch) == 0:
            return
        lay = derive(batch, shape)
        f = batch.features
        s = shape.max_seq_length
        length = np.clip(lay.length, 0, s)
        sep1 = lay.first_sep
        a = np.clip(sep1 - 1, 0, s)
        b = np.clip(length - sep1 - 2, 0, s)
        self.seq_len += np.bincount(length, minlength=s + 1)[: s + 1]
        self.a_len += np.bincount(a, minlength=s + 1)[: s + 1]
        self.b_len += np.bincount(b, minlength=s + 1)[: s + 1]
        self.masked += np.bincount(np.clip(lay.n_masked, 0, shape.max_predictions),
                                   minlength=shape.max_predictions + 1)
        self.records += len(batch)
        self.notnext += int((f["next_sentence_labels"][:, 0] == 1).sum())
        self.pad_positions += int((s - length).sum())
        self.positions += len(batch) * s
        inside = np.arange(s) < length[:, None]
        text = inside & (lay.original != shape.cls_id) & (lay.original != shape.sep_id)
        ids = lay.original[text]
        ids = ids[(ids >= 0) & (ids < shape.vocab_size)]
        self.token_counts += np.bincount(ids, minlength=shape.vocab_size)
        self.text_tokens += int(text.sum())
        if shape.unk_id is not None:
            self.unk += int((lay.original[text] == shape.unk_id).sum())
        w = f["masked_lm_weights"] == 1
        pos = np.clip(f["masked_lm_positions"], 0, s - 1)
        shown = np.take_along_axis(f["input_ids"], pos, axis=1)[w]
        label = f["masked_lm_ids"][w]
        is_mask = shown == (shape.mask_id if shape.mask_id is not None else -1)
        kept = ~is_mask & (shown == label)
        self.mask_kinds += np.array([is_mask.sum(), kept.sum(), (~is_mask & ~kept).sum()], np.int64)


@dataclass
class StatsTask:
    ref: ShardRef
    shape: RecordShape


def stats_shard(task: StatsTask) -> StatsAccum:
    acc = StatsAccum.empty(task.shape)
    stream = ShardStream(task.ref.path, task.ref.name)
    for raw in stream.raw_batches():
        batch, problems = decode_raw(raw, task.shape)
        acc.unreadable += len(problems)
        acc.problems += [f"{task.ref.name}: record {i}: {m}" for i, m in problems][:MAX_PROBLEMS_PER_SHARD]
        acc.add_batch(batch, task.shape)
    acc.unreadable += len(stream.problems)
    acc.problems += [f"{task.ref.name}: {m}" for _, m in stream.problems]
    return acc


def _hist_summary(hist: np.ndarray) -> dict:
    total = int(hist.sum())
    if total == 0:
        return {"mean": None, "min": None, "p50": None, "p95": None, "max": None, "histogram": hist.tolist()}
    values = np.arange(len(hist))
    cum = np.cumsum(hist)
    nz = np.nonzero(hist)[0]
    return {
        "mean": round(float((values * hist).sum() / total), 3),
        "min": int(nz[0]),
        "p50": int(np.searchsorted(cum, 0.5 * total)),
        "p95": int(np.searchsorted(cum, 0.95 * total)),
        "max": int(nz[-1]),
        "histogram": hist.tolist(),
    }


def compute_stats(ds: Dataset, *, split: str | None = None, workers: int | None = None, top: int = 20) -> dict:
    refs = [r for r in ds.shards if split is None or r.split == split]
    if not refs:
        raise ToolError(f"no shards in split {split!r} (splits: {', '.join(ds.splits)})")
    acc = StatsAccum.empty(ds.shape)
    for part in map_shards(stats_shard, [StatsTask(r, ds.shape) for r in refs], workers):
        acc.add(part)
    n = max(acc.records, 1)
    order = np.argsort(-acc.token_counts, kind="stable")[:top]
    kinds = max(int(acc.mask_kinds.sum()), 1)
    return {
        "dataset": ds.root or ",".join(r.name for r in refs[:3]) + (" ..." if len(refs) > 3 else ""),
        "split": split or "all",
        "shards": len(refs),
        "records": acc.records,
        "unreadable_records": acc.unreadable,
        "max_seq_length": ds.shape.max_seq_length,
        "max_predictions_per_seq": ds.shape.max_predictions,
        "seq_length": _hist_summary(acc.seq_len),
        "a_length": _hist_summary(acc.a_len),
        "b_length": _hist_summary(acc.b_len),
        "masked_count": _hist_summary(acc.masked),
        "notnext_share": round(acc.notnext / n, 6),
        "padding_share": round(acc.pad_positions / max(acc.positions, 1), 6),
        "unk_rate": round(acc.unk / max(acc.text_tokens, 1), 6),
        "text_tokens": acc.text_tokens,
        "mask_kinds": {"mask": round(int(acc.mask_kinds[0]) / kinds, 6),
                       "kept": round(int(acc.mask_kinds[1]) / kinds, 6),
                       "random": round(int(acc.mask_kinds[2]) / kinds, 6)},
        "top_tokens": [{"token": ds.vocab.token(int(i)), "id": int(i), "count": int(acc.token_counts[i]),
                        "share": round(int(acc.token_counts[i]) / max(acc.text_tokens, 1), 6)}
                       for i in order if acc.token_counts[i] > 0],
        "problems": acc.problems,
    }


def format_stats(st: dict) -> str:
    lines = [f"{st['dataset']}  split {st['split']}: {st['records']} records in {st['shards']} shards "
             f"(max_seq_length {st['max_seq_length']}, max_predictions_per_seq {st['max_predictions_per_seq']})"]
    if st["unreadable_records"]:
        lines.append(f"WARNING: {st['unreadable_records']} records could not be read (run verify)")
    lines.append(f"{'':<22}{'mean':>9}{'min':>7}{'p50':>7}{'p95':>7}{'max':>7}")
    for label, key in (("sequence length", "seq_length"), ("A length", "a_length"), ("B length", "b_length"),
                       ("masked tokens", "masked_count")):
        h = st[key]
        if h["mean"] is None:
            lines.append(f"{label:<22}{'-':>9}")
            continue
        lines.append(f"{label:<22}{h['mean']:>9.2f}{h['min']:>7}{h['p50']:>7}{h['p95']:>7}{h['max']:>7}")
    mk = st["mask_kinds"]
    lines += [
        f"{'NotNext share':<22}{st['notnext_share']:>9.4f}",
        f"{'padding share':<22}{st['padding_share']:>9.4f}",
        f"{'[UNK] rate':<22}{st['unk_rate']:>9.4f}   of {st['text_tokens']} text tokens",
        f"{'masked as':<22}[MASK] {mk['mask']:.3f}  kept {mk['kept']:.3f}  random {mk['random']:.3f}",
        "most frequent tokens: " + ", ".join(f"{t['token']} {t['share']:.4f}" for t in st["top_tokens"][:10]),
    ]
    return "\n".join(lines)


def plot_stats(st: dict, path: str) -> str:
    """Histograms of the stats in a PNG. Needs matplotlib (the `plot` extra)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        raise ToolError("--plot needs matplotlib: pip install 'bert-datagen[plot]'") from e
    fig, axes = plt.subplots(2, 2, figsize=(10, 7))
    for ax, (label, key) in zip(axes.flat, (("sequence length", "seq_length"), ("A length", "a_length"),
                                             ("B length", "b_length"), ("masked tokens", "masked_count")),
                                strict=True):
        hist = st[key]["histogram"]
        ax.bar(range(len(hist)), hist, width=1.0)
        ax.set_title(f"{label} (mean {st[key]['mean']})")
        ax.set_xlabel("tokens")
        ax.set_ylabel("records")
    fig.suptitle(f"{st['dataset']} [{st['split']}]: {st['records']} records, NotNext {st['notnext_share']:.3f}, "
                 f"padding {st['padding_share']:.3f}")
    fig.tight_layout()
    out = io.BytesIO()
    fig.savefig(out, format="png", dpi=100)
    plt.close(fig)
    fsio.write_atomic(path, out.getvalue())
    return path


# ---------------------------------------------------------------- diff


# Manifest fields that say how or from where a dataset was made, not what it holds: two datasets that
# differ only here are the same data (the input's content is pinned by input.fingerprint).
INFORMATIONAL = ("created_by", "tool", "input.patterns")


@dataclass
class DiffReport:
    fields: list[tuple[str, object, object]]  # manifest fields (config.*, vocab.*, ...) that differ
    shards: list[tuple[str, str | None, str | None]]  # (path, sha256 in A or None, sha256 in B or None)
    first_record: dict | None = None
    notes: list[tuple[str, object, object]] = field(default_factory=list)  # informational differences

    @property
    def identical(self) -> bool:
        return not self.fields and not self.shards


def _flat(d: object, prefix: str = "") -> dict[str, object]:
    if isinstance(d, dict):
        out: dict[str, object] = {}
        for k, v in d.items():
            out.update(_flat(v, f"{prefix}{k}."))
        return out if out or not prefix else {prefix[:-1]: {}}
    return {prefix[:-1]: d}


def _split_records(ds: Dataset, split: str) -> Iterator[tuple[ShardRef, int, bytes]]:
    for ref in ds.shards:
        if ref.split == split:
            for i, payload in iter_payloads(ref):
                yield ref, i, payload


def _first_difference(a: Dataset, b: Dataset, splits: list[str]) -> dict | None:
    """The first record that differs between the two datasets, split by split, across shard boundaries."""
    for split in splits:
        ia, ib = _split_records(a, split), _split_records(b, split)
        n = 0
        while True:
            ra, rb = next(ia, None), next(ib, None)
            if ra is None and rb is None:
                break
            if ra is not None and rb is not None and ra[2] == rb[2]:
                n += 1
                continue
            side = {}
            for key, ds, rec in (("a", a, ra), ("b", b, rb)):
                if rec is None:
                    side[key] = None
                    continue
                batch, problems = decode_batch([rec[2]], [rec[1]], ds.shape)
                view = record_view(batch, 0, ds.vocab, ds.shape) if len(batch) else None
                side[key] = {"shard": rec[0].name, "index": rec[1], "view": view,
                             "problem": problems[0][1] if problems else None}
            return {"split": split, "position": n, **side}
    return None


def diff_datasets(a: Dataset, b: Dataset, *, records: bool = True) -> DiffReport:
    if a.manifest is None or b.manifest is None:
        raise ToolError("diff compares two datasets with manifests")
    fa = {k: v for k, v in _flat(a.manifest).items() if ".shards" not in k}
    fb = {k: v for k, v in _flat(b.manifest).items() if ".shards" not in k}
    differ = [(k, fa.get(k), fb.get(k)) for k in sorted(set(fa) | set(fb)) if fa.get(k) != fb.get(k)]
    info = [d for d in differ if any(d[0] == p or d[0].startswith(p + ".") for p in INFORMATIONAL)]
    fields = [d for d in differ if d not in info]
    sha_a = {s.name: s.expected["sha256"] for s in a.shards if s.expected}
    sha_b = {s.name: s.expected["sha256"] for s in b.shards if s.expected}
    shards = [(p, sha_a.get(p), sha_b.get(p)) for p in sorted(set(sha_a) | set(sha_b), key=_shard_order(a, b))
              if sha_a.get(p) != sha_b.get(p)]
    report = DiffReport(fields, shards, notes=info)
    if records and shards:
        splits = list(dict.fromkeys(a.splits + b.splits))
        report.first_record = _first_difference(a, b, splits)
    return report


def _shard_order(a: Dataset, b: Dataset) -> Callable[[str], int]:
    order = {s.name: i for i, s in enumerate(a.shards + b.shards) if s.name}
    return lambda p: order.get(p, 0)


def _side_by_side(first: dict, width: int = 28) -> list[str]:
    va = first["a"]["view"] if first["a"] else None
    vb = first["b"]["view"] if first["b"] else None
    lines = [f"{'pos':>5} {'seg':>3}  {'A':<{width}} {'B':<{width}}"]
    ta = va["tokens"] if va else []
    tb = vb["tokens"] if vb else []
    for i in range(max(len(ta), len(tb))):
        x = _shown(ta[i]) if i < len(ta) else ""
        y = _shown(tb[i]) if i < len(tb) else ""
        seg = ta[i]["segment"] if i < len(ta) else tb[i]["segment"]
        mark = " " if x == y and (i >= len(ta) or i >= len(tb) or ta[i]["segment"] == tb[i]["segment"]) else "*"
        lines.append(f"{i:>5} {seg:>3}{mark} {x[:width]:<{width}} {y[:width]:<{width}}")
    la = f"{va['next_sentence_label']} {va['relation']}" if va else "-"
    lb = f"{vb['next_sentence_label']} {vb['relation']}" if vb else "-"
    lines.append(f"{'NSP':>9}  {la:<{width}} {lb:<{width}}")
    return lines


def format_diff(report: DiffReport, a_name: str, b_name: str) -> str:
    notes = [f"  (informational) {k}: {va!r} -> {vb!r}" for k, va, vb in report.notes]
    if report.identical:
        return "\n".join([f"identical: {a_name} and {b_name} hold the same data (same config, vocab, counts "
                          "and shard checksums)"] + notes)
    lines = [f"different: {a_name} (A) and {b_name} (B)"] + notes
    if report.fields:
        lines.append(f"{len(report.fields)} manifest field(s) differ:")
        lines += [f"  {k}: {va!r} -> {vb!r}" for k, va, vb in report.fields]
    if report.shards:
        lines.append(f"{len(report.shards)} shard(s) differ:")
        for path, x, y in report.shards:
            if x is None or y is None:
                lines.append(f"  {path}: only in {'B' if x is None else 'A'}")
            else:
                lines.append(f"  {path}: sha256 {x[:16]}... -> {y[:16]}...")
    first = report.first_record
    if first:
        where = ", ".join(f"{k.upper()} {first[k]['shard']} record {first[k]['index']}"
                          for k in ("a", "b") if first[k])
        lines.append(f"first differing record: split {first['split']}, record {first['position']} of the split "
                     f"({where})")
        for k in ("a", "b"):
            if first[k] is None:
                lines.append(f"  {k.upper()} has no record there (the split ends)")
            elif first[k]["problem"]:
                lines.append(f"  {k.upper()} record does not parse: {first[k]['problem']}")
        lines += ["  " + line for line in _side_by_side(first)]
    return "\n".join(lines)
