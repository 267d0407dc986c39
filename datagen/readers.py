"""Raw documents out of input files, one format at a time.

``read_documents`` gets the already-decompressed bytes of one file and yields
``RawDocument``s: either paragraphs (to be split into sentences later) or, for
the original one-sentence-per-line format, sentences that are never re-split.

Cleaning, the same for every format: a leading UTF-8 BOM is dropped, CRLF and
CR become LF, NUL bytes are removed (counted in ``stats["nul_bytes"]``), and
invalid UTF-8 is replaced by U+FFFD, one replacement per run of invalid bytes,
counted in ``stats["decode_errors"]`` (``strict_utf8`` makes it an error that
names the file and the byte offset).  A file that looks binary (many NULs or
mostly invalid UTF-8 in its first 64 KiB) is an error, not a corpus.

Layouts the ``text`` format recognises on its own, per file:

* Project Gutenberg books (a ``*** START OF ... PROJECT GUTENBERG`` line): the
  licence header up to that line and everything from the ``*** END OF`` line
  (and a closing "End of the Project Gutenberg EBook" line) are dropped; the
  whole book is ONE document and each blank-line block is one paragraph (its
  hard-wrapped lines joined with spaces).
* WikiText (Merity et al.; lines `` = Title = `` between blank lines): each
  top-level heading starts a document; headings are dropped (as the original
  BERT Wikipedia text dropped them); every other non-blank line is a paragraph;
  the ``@-@``, ``@,@`` and ``@.@`` number/hyphen splits are joined back.
* Anything else: documents are separated by blank lines.  Inside a document a
  line break is a paragraph break, unless the lines look hard-wrapped (the
  first word of the next line would not have fitted on the line, in a block
  whose longest line has 40 to 120 characters): then the lines are joined.

Joined lines get a space between them, except after a hyphen or dash that
ends a line right after a letter (``au-`` / ``dessus``, ``plane;—`` / ``wait``).

``config.text_layout`` (``--text-layout``) overrides the detection: ``plain`` (blank
lines separate documents, nothing else recognised), ``book`` (the whole file
is one document, blank-line blocks are paragraphs; Gutenberg boilerplate is
still stripped), ``wikitext`` or ``auto`` (the default).

Formats other than ``text``: ``sentences`` (one sentence per line, blank or
whitespace-only lines between documents, as the original tool reads it);
``jsonl`` (one JSON object a line, the text in ``config.text_field``, its
blank-line blocks and lines turned into paragraphs as in ``text``; a missing
field, non-string value or bad JSON is an error naming the line; ``null`` is an
empty document); ``wikiextractor`` (``<doc ...>`` ... ``</doc>`` blocks, one
paragraph per non-blank line, the first line dropped when it repeats the
title; text outside a block or an unclosed block is an error).

Document counts that matter to users: ``stats["empty_documents"]`` (documents
with no text) is added to ``stats["dropped_documents"]`` as well.
"""

from __future__ import annotations

import html
import json
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from bert_datagen.datagen.config import DatagenConfig


class InputError(ValueError):
    """Input that cannot be read as the chosen format; the message names the file and the problem."""


@dataclass
class RawDocument:
    """One document before tokenization: ``paragraphs`` to split, or ``sentences`` as given."""

    source: str
    index: int
    paragraphs: list[str] | None = None
    sentences: list[str] | None = None

    def text(self) -> str:
        parts = self.sentences if self.sentences is not None else self.paragraphs
        return "\n".join(parts or [])


# ---------------------------------------------------------------- cleaning

_SNIFF_BYTES = 1 << 16
_MAX_NUL_FRACTION = 0.01
_MIN_NUL_BINARY = 4
_MAX_INVALID_FRACTION = 0.10
_MIN_INVALID_BINARY = 32  # a short text with a few bad bytes is still text
_ESCAPED = re.compile("[\udc80-\udcff]+")


def _bump(stats: dict[str, int], key: str, n: int = 1) -> None:
    stats[key] = stats.get(key, 0) + n


def _replace_invalid(path: str, data: bytes, sniffed: int, stats: dict[str, int]) -> str:
    # surrogateescape maps each bad byte to one lone surrogate, in linear time;
    # a run of them is one decoding error.
    text = data.decode("utf-8", errors="surrogateescape")
    bad_head = sum(len(m.group()) for m in _ESCAPED.finditer(text[:sniffed]))
    if bad_head > max(_MIN_INVALID_BINARY, _MAX_INVALID_FRACTION * sniffed):
        raise InputError(
            f"{path}: looks like a binary file ({bad_head} of the first {sniffed} bytes are not "
            "valid UTF-8); expected UTF-8 text"
        )
    errors = 0

    def replace(_: re.Match[str]) -> str:
        nonlocal errors
        errors += 1
        return "\ufffd"

    text = _ESCAPED.sub(replace, text)
    _bump(stats, "decode_errors", errors)
    return text


def decode_text(path: str, data: bytes, strict: bool, stats: dict[str, int], *, offset: int = 0,
                sniff: bool = True) -> str:
    """Clean text of a file: BOM, NUL, CR/CRLF and invalid UTF-8 handled (see module doc).

    ``data`` may be a piece of the file that starts at byte ``offset`` (just after a line break):
    error messages then give file offsets, and the BOM and the binary check, which concern a
    file's first bytes, apply only at offset 0 (the check also only with ``sniff``).
    """
    head = data[:_SNIFF_BYTES] if sniff and offset == 0 else b""
    if head and head.count(0) > max(_MIN_NUL_BINARY, _MAX_NUL_FRACTION * len(head)):
        raise InputError(
            f"{path}: looks like a binary file ({head.count(0)} NUL bytes in the first {len(head)} bytes); "
            "expected UTF-8 text (UTF-16 is not supported)"
        )
    try:
        text = data.decode("utf-8")
        bad_at = -1
    except UnicodeDecodeError as err:
        bad_at = err.start
    if bad_at >= 0:
        if strict:
            raise InputError(
                f"{path}: invalid UTF-8 at byte offset {offset + bad_at} ({data[bad_at:bad_at + 4]!r}); "
                "--strict forbids replacing it"
            )
        text = _replace_invalid(path, data, len(head), stats)
    if offset == 0 and text.startswith("\ufeff"):
        text = text[1:]
    nuls = text.count("\x00")
    if nuls:
        _bump(stats, "nul_bytes", nuls)
        text = text.replace("\x00", "")
    if "\r" in text:
        text = text.replace("\r\n", "\n").replace("\r", "\n")
    return text


# ---------------------------------------------------------------- paragraphs

_WRAP_WIDTH_LIMIT = 120
_MIN_WRAP_WIDTH = 40  # nobody hard-wraps prose narrower; short lines are paragraphs (or list items)


def _squash(line: str) -> str:
    return " ".join(line.split())


def join_wrapped(lines: list[str]) -> str:
    """Lines of one paragraph joined with spaces, except after a hyphen or dash that ends a line
    inside a word (``au-`` + ``dessus``, ``plane;—`` + ``wait``): typesetters break there."""
    out = lines[0] if lines else ""
    for line in lines[1:]:
        if not line:
            continue
        if len(out) > 1 and out[-1] in "-—" and out[-2] not in " -" and line[0].isalpha():
            out += line
        else:
            out += " " + line
    return out


def _is_wrapped(line: str, next_line: str, width: int) -> bool:
    # A typesetter breaks a line only when the next word does not fit; a break
    # before a word that would have fitted is the author's own.
    first_word = next_line.split(" ", 1)[0]
    return len(line) + 1 + len(first_word) > width


def block_paragraphs(lines: list[str]) -> list[str]:
    """Paragraphs of one blank-line-free block of lines (hard wraps joined, see module doc)."""
    lines = [squashed for squashed in (_squash(raw) for raw in lines) if squashed]
    if not lines:
        return []
    raw_width = max(len(line) for line in lines)
    if len(lines) == 1 or not _MIN_WRAP_WIDTH <= raw_width <= _WRAP_WIDTH_LIMIT:
        return lines
    paragraphs: list[str] = []
    current = [lines[0]]
    for line, nxt in zip(lines, lines[1:], strict=False):
        if _is_wrapped(line, nxt, raw_width):
            current.append(nxt)
        else:
            paragraphs.append(join_wrapped(current))
            current = [nxt]
    paragraphs.append(join_wrapped(current))
    return paragraphs


def iter_lines(text: str) -> Iterator[str]:
    """``text.split("\\n")``, a line at a time: a file's lines as str objects take about five times
    its bytes, so the formats read line by line never hold them all at once."""
    start, find = 0, text.find
    while True:
        end = find("\n", start)
        if end < 0:
            yield text[start:]
            return
        yield text[start:end]
        start = end + 1


def _blocks(lines: Iterable[str]) -> Iterator[list[str]]:
    """Runs of non-blank lines (whitespace-only lines count as blank)."""
    block: list[str] = []
    for line in lines:
        if line.strip():
            block.append(line)
        elif block:
            yield block
            block = []
    if block:
        yield block


# ---------------------------------------------------------------- text layouts

_GUTENBERG_START = re.compile(r"^\s*\*{3}\s*START OF (THE|THIS) PROJECT GUTENBERG", re.IGNORECASE)
_GUTENBERG_END = re.compile(r"^\s*\*{3}\s*END OF (THE|THIS) PROJECT GUTENBERG", re.IGNORECASE)
_GUTENBERG_CLOSING = re.compile(r"^\s*End of (the )?Project Gutenberg", re.IGNORECASE)
_WIKITEXT_TITLE = re.compile(r"^ = (?!=)(.*[^=]) = $")
_WIKITEXT_HEADING = re.compile(r"^ (= )+.*( =)+ $")
_WIKITEXT_JOINS = re.compile(r" @([-,.])@ ")


def _gutenberg_body(lines: list[str]) -> list[str] | None:
    start = next((i for i, line in enumerate(lines) if _GUTENBERG_START.match(line)), None)
    if start is None:
        return None
    end = next((i for i in range(start + 1, len(lines)) if _GUTENBERG_END.match(lines[i])), len(lines))
    body = lines[start + 1 : end]
    closing = next((i for i, line in enumerate(body) if _GUTENBERG_CLOSING.match(line)), None)
    return body[:closing] if closing is not None else body


def _wikitext_titles(lines: list[str]) -> list[int]:
    # A title sits between blank lines; the test split has formula lines that
    # look like titles but sit inside a wrapped paragraph.
    def blank(i: int) -> bool:
        return _blank_at(lines, i)

    return [
        i for i, line in enumerate(lines) if _WIKITEXT_TITLE.match(line) and blank(i - 1) and blank(i + 1)
    ]


def _blank_at(lines: list[str], i: int) -> bool:
    return i < 0 or i >= len(lines) or not lines[i].strip()


def _wikitext_documents(lines: list[str], titles: list[int]) -> Iterator[list[str]]:
    def blank(i: int) -> bool:
        return _blank_at(lines, i)

    bounds = [*titles, len(lines)]
    if not titles or any(line.strip() for line in lines[: titles[0]]):
        bounds = [0, *bounds]
    for start, end in zip(bounds, bounds[1:], strict=False):
        paragraphs = []
        for i in range(start, end):
            line = lines[i]
            if not line.strip() or (_WIKITEXT_HEADING.match(line) and blank(i - 1) and blank(i + 1)):
                continue
            paragraphs.append(_squash(_WIKITEXT_JOINS.sub(r"\1", line)))
        yield paragraphs


def _book(lines: list[str]) -> list[str]:
    # Book paragraphs are hard-wrapped and may hold verse or letters whose
    # short lines would fool the wrap heuristic: a block is a paragraph.
    return [join_wrapped([_squash(line) for line in block]) for block in _blocks(lines)]


def _read_text(path: str, text: str, layout: str = "auto") -> Iterator[list[str]]:
    lines = text.split("\n")
    if layout in ("auto", "book"):
        body = _gutenberg_body(lines)
        if body is not None or layout == "book":
            yield _book(body if body is not None else lines)
            return
    if layout in ("auto", "wikitext"):
        titles = _wikitext_titles(lines)
        if titles or layout == "wikitext":
            yield from _wikitext_documents(lines, titles)
            return
    for block in _blocks(lines):
        yield block_paragraphs(block)


def sentence_documents(path: str, text: str | Iterable[str]) -> Iterator[list[str]]:
    """Documents of the original one-sentence-per-line format, from its text or its lines."""
    # The original strips every line and starts a new document at an empty one.
    for block in _blocks(iter_lines(text) if isinstance(text, str) else text):
        yield [_squash(line) for line in block]


def _text_paragraphs(text: str) -> list[str]:
    return [p for block in _blocks(text.split("\n")) for p in block_paragraphs(block)]


def json_error_text(err: json.JSONDecodeError) -> str:
    """json's message with its column: some messages end in "starting at", which the column completes."""
    where = f"column {err.colno}"
    return f"{err.msg} {where}" if err.msg.endswith(" at") else f"{err.msg} at {where}"


def jsonl_objects(path: str, text: str, first_line: int = 1, error: type[InputError] = InputError
                  ) -> Iterator[tuple[int, dict]]:
    """(line number, object) of every non-blank line of JSON lines (pre-training documents and task
    examples alike); `error`, naming the file and line, for a line that is not a JSON object."""
    for lineno, line in enumerate(iter_lines(text), start=first_line):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as err:
            raise error(f"{path}: line {lineno}: not valid JSON ({json_error_text(err)})") from None
        if not isinstance(obj, dict):
            raise error(f"{path}: line {lineno}: expected a JSON object, got {type(obj).__name__}")
        yield lineno, obj


def jsonl_documents(path: str, text: str, field: str, first_line: int = 1) -> Iterator[list[str]]:
    for lineno, obj in jsonl_objects(path, text, first_line):
        if field not in obj:
            raise InputError(f"{path}: line {lineno}: no field {field!r} (fields: {', '.join(sorted(obj)) or 'none'})")
        value = obj[field]
        if value is None:
            value = ""
        if not isinstance(value, str):
            raise InputError(f"{path}: line {lineno}: field {field!r} is {type(value).__name__}, not a string")
        yield _text_paragraphs(value)


DOC_OPEN = re.compile(r"^<doc\b[^>]*>\s*$")
_DOC_TITLE = re.compile(r"""\btitle=(?:"([^"]*)"|'([^']*)')""")


def wikiextractor_documents(path: str, text: str, first_line: int = 1) -> Iterator[list[str]]:
    title: str | None = None
    body: list[str] = []
    opened_at = 0
    for lineno, line in enumerate(iter_lines(text), start=first_line):
        stripped = line.strip()
        if title is None:
            if DOC_OPEN.match(stripped):
                match = _DOC_TITLE.search(stripped)
                title = html.unescape(match.group(1) or match.group(2) or "") if match else ""
                body, opened_at = [], lineno
            elif stripped:
                raise InputError(
                    f"{path}: line {lineno}: text outside a <doc ...> block; is this WikiExtractor output?"
                )
        elif stripped == "</doc>":
            yield _wikiextractor_paragraphs(body, title)
            title = None
        elif DOC_OPEN.match(stripped):
            raise InputError(f"{path}: line {lineno}: <doc> opened inside the <doc> of line {opened_at}")
        else:
            body.append(line)
    if title is not None:
        raise InputError(f"{path}: the <doc> opened at line {opened_at} is never closed (truncated file?)")


def _wikiextractor_paragraphs(body: list[str], title: str) -> list[str]:
    paragraphs = [_squash(line) for line in body if line.strip()]
    if paragraphs and title and paragraphs[0] == _squash(title):
        paragraphs = paragraphs[1:]
    return paragraphs


# ---------------------------------------------------------------- entry point


def read_documents(path: str, data: bytes, config: DatagenConfig, stats: dict[str, int]) -> Iterator[RawDocument]:
    """Documents of one file's (decompressed) bytes, in file order; empty ones dropped and counted."""
    text = decode_text(path, data, config.strict_utf8, stats)
    fmt = config.input_format
    if fmt == "text":
        groups, as_sentences = _read_text(path, text, config.text_layout), False
    elif fmt == "sentences":
        groups, as_sentences = sentence_documents(path, text), True
    elif fmt == "jsonl":
        groups, as_sentences = jsonl_documents(path, text, config.text_field), False
    elif fmt == "wikiextractor":
        groups, as_sentences = wikiextractor_documents(path, text), False
    else:  # DatagenConfig validates it; a hand-built config may not
        raise InputError(f"{path}: unknown input format {fmt!r}")
    yield from raw_documents(path, groups, as_sentences, stats)


def raw_documents(path: str, groups: Iterable[list[str]], as_sentences: bool,
                  stats: dict[str, int]) -> Iterator[RawDocument]:
    """``RawDocument``s of a format's groups of lines; empty ones dropped and counted."""
    for index, parts in enumerate(groups):
        parts = [p for p in parts if p]
        if not parts:
            _bump(stats, "empty_documents")
            _bump(stats, "dropped_documents")
            continue
        if as_sentences:
            yield RawDocument(source=path, index=index, sentences=parts)
        else:
            yield RawDocument(source=path, index=index, paragraphs=parts)
