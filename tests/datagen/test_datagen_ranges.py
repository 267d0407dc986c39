"""Reading a file by byte ranges gives exactly the documents (and counts) of reading it whole."""

from __future__ import annotations

import io
import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bert_datagen.datagen.config import DatagenConfig
from bert_datagen.datagen.ranges import byte_ranges, read_range_documents, splittable
from bert_datagen.datagen.readers import InputError, read_documents

COUNTS = ("decode_errors", "nul_bytes", "empty_documents", "dropped_documents")


def whole(data: bytes, config: DatagenConfig) -> tuple[list, dict]:
    stats: dict[str, int] = {}
    docs = [(d.paragraphs, d.sentences) for d in read_documents("f.txt", data, config, stats)]
    return docs, {k: stats.get(k, 0) for k in COUNTS}


class CountingReader(io.BytesIO):
    """A file that counts the bytes read from it."""

    def __init__(self, data: bytes) -> None:
        super().__init__(data)
        self.bytes_read = 0

    def read(self, n: int = -1) -> bytes:
        out = super().read(n)
        self.bytes_read += len(out)
        return out


def by_ranges(data: bytes, config: DatagenConfig, chunk: int) -> tuple[list, dict]:
    stats: dict[str, int] = {}
    docs = []
    for start, end in byte_ranges(len(data), chunk):
        f = CountingReader(data)
        docs.extend((d.paragraphs, d.sentences)
                    for d in read_range_documents("f.txt", f, len(data), start, end, config, stats))
    return docs, {k: stats.get(k, 0) for k in COUNTS}


def range_errors(data: bytes, config: DatagenConfig, chunk: int) -> set[str]:
    """The input errors the ranges of ``data`` raise, each range read on its own."""
    errors = set()
    for start, end in byte_ranges(len(data), chunk):
        try:
            list(read_range_documents("f.txt", io.BytesIO(data), len(data), start, end, config, {}))
        except InputError as e:
            errors.add(str(e))
    return errors


def assert_same_every_chunk(data: bytes, config: DatagenConfig) -> None:
    expected = whole(data, config)
    assert expected[0], "the sample must hold documents"
    for chunk in sorted({1, 2, 3, 5, 8, 13, 64, len(data) // 3 or 1, len(data)}):
        assert by_ranges(data, config, chunk) == expected, f"chunk {chunk}"


SENTENCES = (
    "\ufeffFirst doc, line one.\r\nLine two \x00with a NUL.\r\n\r\n"
    "   \n\u3000\nSecond doc after Unicode-space lines.\nbad \xff\xfe bytes here\n\n\n"
    "Third doc\rwith a lone CR inside.\n \t \n中文。\n\u00a0é\u00a0\ncontinues after lines without ASCII.\n\nFourth: " + "x" * 300 + "\nlast line without newline"
)


def test_sentences_every_boundary() -> None:
    assert_same_every_chunk(_bytes(SENTENCES), DatagenConfig(input_format="sentences"))


def _bytes(text: str) -> bytes:
    # \xff and \xfe in the sample stand for raw invalid bytes, the rest is UTF-8.
    return text.replace("\xff\xfe", "\udcff\udcfe").encode("utf-8", "surrogateescape")


def test_jsonl_every_boundary() -> None:
    rows = [json.dumps({"text": t}) for t in ("One.\n\nTwo paragraphs.", "Ünïcode ✓ 中文。", "", "x" * 200)]
    data = ("\n".join(rows[:2]) + "\r\n\n" + rows[2] + "\n" + json.dumps({"text": None}) + "\n" + rows[3]).encode()
    assert_same_every_chunk(data, DatagenConfig(input_format="jsonl"))


WIKI = (
    '<doc id="1" title="Alpha">\nAlpha\n\nAlpha is first.\nIt has two lines.\n</doc>\n\n'
    '<doc id="2" title="Beta">\r\nBeta\r\nBeta \x00second.\r\n</doc>\r\n'
    '<doc id="3" title="Empty">\nEmpty\n</doc>\n'
    '<doc id="4" title="Gamma">\nGamma has \xff\xfe bad bytes.\n</doc>'
)


def test_wikiextractor_every_boundary() -> None:
    assert_same_every_chunk(_bytes(WIKI), DatagenConfig(input_format="wikiextractor"))


def test_a_range_reads_its_own_bytes_not_the_file() -> None:
    line = json.dumps({"text": "A sentence of some length. " * 4}) + "\n"
    data = (line * 20_000).encode()
    config = DatagenConfig(input_format="jsonl")
    chunk = 100_000
    ranges = byte_ranges(len(data), chunk)
    f = CountingReader(data)
    docs = list(read_range_documents("f.jsonl", f, len(data), *ranges[len(ranges) // 2], config, {}))
    assert len(docs) in (chunk // len(line), chunk // len(line) + 1)
    # Its chunk plus the two short scans for its first and its next range's first line start.
    assert f.bytes_read < chunk + 2 * 4096


@pytest.mark.parametrize("fmt, data, line", [
    ("jsonl", b'{"text": "a"}\n' * 50 + b"{not json\n" + b'{"text": "b"}\n' * 50, 51),
    ("jsonl", b'{"text": "a"}\r\n' * 30 + b'{"text": "a"}\r' * 20 + b'{"x": 1}\n', 51),
    ("wikiextractor", b'<doc id="1" title="T">\nT\ntext\n</doc>\n' * 20 + b"stray text\n"
     + b'<doc id="2" title="U">\nU\nmore\n</doc>\n' * 20, 81),
    ("wikiextractor", b'<doc id="1" title="T">\nT\ntext\n</doc>\n' * 20 + b'<doc id="2" title="U">\nU\nno end\n', 81),
])
def test_errors_name_the_files_own_line(fmt: str, data: bytes, line: int) -> None:
    config = DatagenConfig(input_format=fmt)
    with pytest.raises(InputError) as whole_error:
        list(read_documents("f.txt", data, config, {}))
    assert f"line {line}" in str(whole_error.value)
    for chunk in (7, 64, 200):
        assert range_errors(data, config, chunk) == {str(whole_error.value)}, f"chunk {chunk}"


def test_strict_utf8_error_gives_the_file_offset() -> None:
    data = b'{"text": "ok"}\n' * 20 + b'{"text": "bad \xff"}\n'
    config = DatagenConfig(input_format="jsonl", strict_utf8=True)
    with pytest.raises(InputError, match="byte offset 314"):
        list(read_documents("f.txt", data, config, {}))
    with pytest.raises(InputError, match="byte offset 314"):
        list(read_range_documents("f.txt", io.BytesIO(data), len(data), 300, len(data), config, {}))


def test_which_files_are_split() -> None:
    assert splittable("a.jsonl", "jsonl") and splittable("gs://b/wiki_00", "wikiextractor")
    assert splittable("a.txt", "sentences")
    assert not splittable("a.txt", "text")  # layouts are per-file decisions
    assert not splittable("a.jsonl.gz", "jsonl") and not splittable("a.bz2", "sentences")
    assert byte_ranges(10, 4) == [(0, 4), (4, 8), (8, 10)]
    assert byte_ranges(0, 4) == [(0, 0)]
    with pytest.raises(ValueError):
        byte_ranges(10, 0)


PIECES = st.sampled_from(["a", "b c", ".", " ", "\t", "\n", "\n\n", "\r\n", "\r", "\x00", "\u3000", "\u00a0",
                          "é", "中", "\udcff", "\ufeff", "word. Next"])


def same_outcome(data: bytes, config: DatagenConfig, chunk: int) -> None:
    """Ranges give the whole read's documents and counts, or, where it fails, its error."""
    try:
        expected = whole(data, config)
    except InputError as e:
        assert str(e) in range_errors(data, config, chunk)
        return
    assert by_ranges(data, config, chunk) == expected


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(parts=st.lists(PIECES, min_size=1, max_size=40), chunk=st.integers(1, 40))
def test_sentences_by_ranges_match_whole_reads(parts: list[str], chunk: int) -> None:
    same_outcome("".join(parts).encode("utf-8", "surrogateescape"), DatagenConfig(input_format="sentences"), chunk)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(docs=st.lists(st.lists(PIECES, max_size=8), min_size=1, max_size=6), junk=st.lists(PIECES, max_size=3),
       chunk=st.integers(1, 60))
def test_wikiextractor_by_ranges_match_whole_reads(docs: list[list[str]], junk: list[str], chunk: int) -> None:
    body = "".join(f'<doc id="{i}" title="T{i}">\nT{i}\n{"".join(d)}\n</doc>\n{"".join(junk) if i == 1 else ""}'
                   for i, d in enumerate(docs))
    same_outcome(body.encode("utf-8", "surrogateescape"), DatagenConfig(input_format="wikiextractor"), chunk)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rows=st.lists(st.lists(PIECES, max_size=6), min_size=1, max_size=8), chunk=st.integers(1, 60))
def test_jsonl_by_ranges_match_whole_reads(rows: list[list[str]], chunk: int) -> None:
    # Raw pieces between the rows too: CRs, NULs and bad bytes where lines break.
    text = "".join(json.dumps({"text": "".join(r)}) + "".join(r[:1]).replace("a", "") + "\n" for r in rows)
    same_outcome(text.encode("utf-8", "surrogateescape"), DatagenConfig(input_format="jsonl"), chunk)
