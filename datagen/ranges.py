"""One byte range of a big input file: the documents that start in it, read without the rest.

A file bigger than the read chunk is cut into byte ranges ``[start, end)`` so that several workers
read it at once and none holds more of it than a range. A range owns every document whose first
line starts inside it; it reads a little past ``end`` to finish its last document, and skips
what, at its own start, continues a document of the range before. So every document is read
exactly once and whole, and because a document's identity is a hash of its text, the dataset is
the same byte for byte whatever the chunk size (tests check every boundary of small files).

Boundaries are line starts (just after a ``\\n`` byte, which never occurs inside a UTF-8
sequence), so cleaning a range gives the same text as cleaning the whole file: invalid-byte runs,
CRLF pairs and NULs never straddle one. Each range counts cleaning events (decode errors, NULs) in
its own bytes only, so the totals add up to the whole file's. Only the layouts whose documents
have a start that one line shows are split:

* ``jsonl``: a document is a line.
* ``sentences``: a document is a run of non-blank lines; it starts at a non-blank line after a
  blank one (or at the file's start).
* ``wikiextractor``: a document starts at a ``<doc ...>`` line.

``text`` files are read whole (its layouts are decided per file: a Gutenberg body, WikiText
titles), as are compressed files (``.gz`` and ``.bz2`` streams cannot be entered midway).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import BinaryIO

from bert_datagen.datagen.config import DatagenConfig
from bert_datagen.datagen.readers import (
    DOC_OPEN,
    InputError,
    RawDocument,
    decode_text,
    jsonl_documents,
    raw_documents,
    sentence_documents,
    wikiextractor_documents,
)

SPLITTABLE_FORMATS = ("jsonl", "sentences", "wikiextractor")
COMPRESSED_SUFFIXES = (".gz", ".bz2")
_SCAN_BYTES = 1 << 16


def splittable(path: str, input_format: str) -> bool:
    return input_format in SPLITTABLE_FORMATS and not path.endswith(COMPRESSED_SUFFIXES)


def byte_ranges(size: int, chunk_bytes: int) -> list[tuple[int, int]]:
    """``[start, end)`` ranges of at most ``chunk_bytes`` that cover ``size`` bytes (at least one)."""
    if chunk_bytes < 1:
        raise ValueError(f"chunk size {chunk_bytes} must be >= 1 byte")
    if size <= chunk_bytes:
        return [(0, size)]
    return [(lo, min(size, lo + chunk_bytes)) for lo in range(0, size, chunk_bytes)]


def read_range_documents(path: str, f: BinaryIO, size: int, start: int, end: int,
                         config: DatagenConfig, stats: dict[str, int]) -> Iterator[RawDocument]:
    """The documents of ``path`` (open as ``f``, ``size`` bytes) whose first line starts in
    ``[start, end)``, cleaned and counted exactly as ``read_documents`` does for the whole file."""
    fmt = config.input_format
    if fmt not in SPLITTABLE_FORMATS:
        raise InputError(f"{path}: the {fmt} format is read whole, not by byte range")
    first = _line_start_at_or_after(f, start, size)
    stop = _line_start_at_or_after(f, end, size) if end < size else size
    if first >= stop:
        return
    whole_head = first > 0 or stop == size
    if not whole_head:
        # The binary check looks at the file's first 64 KiB, as a whole-file read does, even when
        # the first range is shorter (not strict: those bytes may end inside a character).
        f.seek(0)
        decode_text(path, f.read(_SCAN_BYTES), False, {})
    f.seek(first)
    text = decode_text(path, f.read(stop - first), config.strict_utf8, stats, offset=first, sniff=whole_head)
    lines = text.split("\n")
    if lines and lines[-1] == "" and stop < size:
        lines.pop()  # the piece ends with its last line's break
    if fmt == "jsonl":
        groups = _lines_or_error(f, first, lines, 0,
                                 lambda ls, n: jsonl_documents(path, "\n".join(ls), config.text_field, n))
        yield from raw_documents(path, groups, False, stats)
    elif fmt == "sentences":
        continues = first > 0 and bool(lines) and bool(lines[0].strip()) and not _previous_line_blank(path, f, first)
        if stop < size and lines and lines[-1].strip():  # a document is still open at ``stop``
            lines.extend(_until_blank(_lines_from(path, f, stop, config.strict_utf8)))
        groups = sentence_documents(path, lines)
        yield from raw_documents(path, itertools.islice(groups, int(continues), None), True, stats)
    else:
        skipped = 0
        if first > 0:  # what comes before the first <doc> line belongs to the range before
            skipped = next((i for i, line in enumerate(lines) if DOC_OPEN.match(line.strip())), len(lines))
            lines = lines[skipped:]
            if not lines:
                return
        if stop < size:
            lines.extend(_wikiextractor_tail(_lines_from(path, f, stop, config.strict_utf8), _doc_open_at_end(lines)))
        groups = _lines_or_error(f, first, lines, skipped,
                                 lambda ls, n: wikiextractor_documents(path, "\n".join(ls), n))
        yield from raw_documents(path, groups, False, stats)


def _lines_or_error(f: BinaryIO, first: int, lines: list[str], skipped: int, parse) -> Iterator[list[str]]:
    """The parser's groups; on an input error, the same error with the file's own line numbers
    (counted only then: it means reading the file up to the range)."""
    try:
        yield from parse(lines, 1)
    except InputError:
        base = _lines_before(f, first) + skipped
        for _ in parse(lines, base + 1):  # raises the same error, numbered from the file's start
            pass
        raise


def _line_start_at_or_after(f: BinaryIO, pos: int, size: int) -> int:
    """The first line start at or after ``pos``: 0, or just past the first ``\\n`` at ``pos - 1`` or later."""
    if pos <= 0:
        return 0
    at, step = pos - 1, 4096  # lines are usually short: read little first, more as needed
    while at < size:
        f.seek(at)
        block = f.read(step)
        if not block:
            break
        found = block.find(b"\n")
        if found >= 0:
            return at + found + 1
        at += len(block)
        step = min(2 * step, _SCAN_BYTES)
    return size


def _previous_line_blank(path: str, f: BinaryIO, line_start: int) -> bool:
    """Whether the last line before ``line_start`` is blank once cleaned (a lone CR ends a line
    too, so that line may be the tail of the previous raw line)."""
    end = _crlf_start(f, line_start - 1)  # the previous line's \n, or the CR of its CRLF
    pieces: list[bytes] = []
    at, piece_start = end, 0
    while at > 0:
        lo = max(0, at - _SCAN_BYTES)
        f.seek(lo)
        block = f.read(at - lo)
        found = max(block.rfind(b"\n"), block.rfind(b"\r"))
        piece = block[found + 1:] if found >= 0 else block
        # Any visible ASCII byte settles it; other bytes may be Unicode spaces and need decoding.
        if piece.translate(None, _MAYBE_BLANK_BYTES):
            return False
        pieces.append(piece)
        if found >= 0:
            piece_start = lo + found + 1
            break
        at = lo
    raw = b"".join(reversed(pieces))
    return not decode_text(path, raw, False, {}, offset=piece_start, sniff=False).strip()


def _crlf_start(f: BinaryIO, newline_at: int) -> int:
    """Where the line break at ``newline_at`` (a \\n) starts: at the CR of a CRLF (NULs between them
    are removed before CRLF pairs are found, so they do not part them), else at the \\n."""
    at = newline_at
    while at > 0:
        lo = max(0, at - _SCAN_BYTES)
        f.seek(lo)
        block = f.read(at - lo).rstrip(b"\x00")
        if block:
            return lo + len(block) - 1 if block.endswith(b"\r") else newline_at
        at = lo
    return newline_at


_MAYBE_BLANK_BYTES = b" \t\r\x00\x0b\x0c\x1c\x1d\x1e\x1f" + bytes(range(0x80, 0x100))


def _clean_lines(path: str, raw: bytes, offset: int, strict: bool) -> list[str]:
    """One line's raw bytes (no ``\\n``), starting at byte ``offset``, cleaned as the whole file
    would be: a lone CR inside it still breaks it, the CR of a CRLF does not."""
    # Cleaning removes NULs before it pairs CR with LF: a CR, then NULs, then the \n is one CRLF.
    bare = raw.rstrip(b"\x00")
    if bare.endswith(b"\r"):
        raw = bare[:-1]
    return decode_text(path, raw, strict, {}, offset=offset, sniff=False).split("\n")


def _lines_from(path: str, f: BinaryIO, pos: int, strict: bool) -> Iterator[str]:
    """Cleaned lines from the line start ``pos`` on, read a block at a time, until the file ends.

    Their decode errors and NULs are not counted: those bytes belong to the next range.
    """
    f.seek(pos)
    pending = b""
    at = pos
    while True:
        block = f.read(_SCAN_BYTES)
        if not block:
            if pending:
                yield from decode_text(path, pending, strict, {}, offset=at, sniff=False).split("\n")
            return
        pending += block
        *raws, pending = pending.split(b"\n")
        for raw in raws:
            yield from _clean_lines(path, raw, at, strict)
            at += len(raw) + 1


def _until_blank(lines: Iterator[str]) -> Iterator[str]:
    for line in lines:
        if not line.strip():
            return
        yield line


def _doc_open_at_end(lines: list[str]) -> bool:
    for line in reversed(lines):
        stripped = line.strip()
        if stripped == "</doc>":
            return False
        if DOC_OPEN.match(stripped):
            return True
    return False


def _wikiextractor_tail(lines: Iterator[str], inside: bool) -> Iterator[str]:
    """Lines after the range's end up to the next ``<doc>`` line outside a document: the rest of
    an open document and any stray text after it (so the parser reports that text, as it would
    for the whole file); a ``<doc>`` inside the open document is kept, for the same reason."""
    for line in lines:
        stripped = line.strip()
        if DOC_OPEN.match(stripped):
            if inside:
                yield line
            return
        if stripped == "</doc>":
            inside = False
        yield line


def _lines_before(f: BinaryIO, pos: int) -> int:
    """How many lines the cleaned text has before byte ``pos`` (a line start): each \\n, CRLF or
    lone CR ends one."""
    f.seek(0)
    count, left, last_cr = 0, pos, False
    while left > 0:
        block = f.read(min(1 << 20, left))
        if not block:
            break
        left -= len(block)
        block = block.replace(b"\x00", b"")  # removed before CR and LF are paired
        if not block:
            continue
        count += block.count(b"\n") + block.count(b"\r") - block.count(b"\r\n")
        if last_cr and block[:1] == b"\n":
            count -= 1  # a CRLF cut by the block boundary was counted twice
        last_cr = block[-1:] == b"\r"
    return count
