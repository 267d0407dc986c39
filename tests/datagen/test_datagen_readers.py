"""Readers: every input format, each real corpus's quirks, cleaning and bad input."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bert_datagen.datagen.config import ConfigError, DatagenConfig
from bert_datagen.datagen.readers import InputError, RawDocument, block_paragraphs, read_documents


def read(data: bytes | str, fmt: str = "text", path: str = "in.txt", **cfg) -> tuple[list[RawDocument], dict]:
    if isinstance(data, str):
        data = data.encode("utf-8")
    stats: dict[str, int] = {}
    docs = list(read_documents(path, data, DatagenConfig(input_format=fmt, **cfg), stats))
    return docs, stats


def read_file(path, fmt: str) -> tuple[list[RawDocument], dict]:
    return read(path.read_bytes(), fmt, str(path))


# ---------------------------------------------------------------- text


def test_text_documents_are_separated_by_blank_lines():
    docs, stats = read("First doc line one.\nSecond paragraph here.\n\n\n  \nOther doc.\n")
    assert [d.paragraphs for d in docs] == [["First doc line one.", "Second paragraph here."], ["Other doc."]]
    assert [d.index for d in docs] == [0, 1] and docs[0].source == "in.txt"
    assert docs[0].text() == "First doc line one.\nSecond paragraph here."
    assert stats.get("decode_errors", 0) == 0


def test_text_paragraph_per_line_is_kept_and_hard_wraps_are_joined():
    wrapped = (
        "It was the best of times, it was the worst of times, it was the age\n"
        "of wisdom, it was the age of foolishness, it was the epoch of belief,\n"
        "it was the epoch of incredulity.\n"
        "Short line.\n"
        "Another short one.\n"
    )
    paragraphs = block_paragraphs(wrapped.splitlines())
    assert paragraphs[0].startswith("It was the best") and paragraphs[0].endswith("incredulity.")
    assert "age of wisdom" in paragraphs[0]
    assert paragraphs[1:] == ["Short line.", "Another short one."]
    long_lines = ["A paragraph that runs past the wrap width " * 4, "Next paragraph, also long " * 6]
    assert block_paragraphs(long_lines) == [" ".join(line.split()) for line in long_lines]


def test_cleaning_bom_crlf_cr_nul():
    docs, stats = read(b"\xef\xbb\xbfOne\r\ntwo\x00 three\rfour\r\n\r\nfive\n")
    assert [d.paragraphs for d in docs] == [["One", "two three", "four"], ["five"]]
    assert stats["nul_bytes"] == 1


def test_invalid_utf8_is_replaced_and_counted_or_refused_with_strict():
    data = b"good text \xff\xfe here\n\nand \xc3 more\n"
    docs, stats = read(data)
    assert stats["decode_errors"] == 2
    assert docs[0].paragraphs == ["good text \ufffd here"]
    with pytest.raises(InputError, match=r"in\.txt: invalid UTF-8 at byte offset 10"):
        read(data, strict_utf8=True)


@pytest.mark.parametrize("data", [
    b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 64,
    "UTF-16 text is not UTF-8".encode("utf-16"),
    bytes(range(128, 256)) * 100,
])
def test_binary_files_are_refused(data):
    with pytest.raises(InputError, match=r"in\.txt: looks like a binary file"):
        read(data)


def test_empty_documents_are_dropped_and_counted():
    docs, stats = read("   \n\n\t\n")
    assert docs == [] and stats.get("dropped_documents", 0) == 0  # no document at all
    docs, stats = read('{"text": ""}\n{"text": null}\n{"text": "x"}\n', "jsonl")
    assert len(docs) == 1 and docs[0].index == 2
    assert stats["empty_documents"] == 2 and stats["dropped_documents"] == 2


def test_text_layout_override():
    book = "Chapter one starts here and goes on for a while\ncontinues on this line.\n\nSecond paragraph.\n\nThird.\n"
    assert [d.paragraphs for d in read(book)[0]] == [["Chapter one starts here and goes on for a while continues on this line."],
                                                     ["Second paragraph."], ["Third."]]
    as_book = read(book, text_layout="book")[0]
    assert [d.paragraphs for d in as_book] == [["Chapter one starts here and goes on for a while continues on this line.",
                                                "Second paragraph.", "Third."]]
    wiki = " = T = \n \n Body @-@ text 1 @,@ 000 .\n"
    assert [d.paragraphs for d in read(wiki, text_layout="plain")[0]] == [["= T ="], ["Body @-@ text 1 @,@ 000 ."]]
    assert [d.paragraphs for d in read(" Body @-@ text .\n", text_layout="wikitext")[0]] == [["Body-text ."]]
    with pytest.raises(ConfigError, match=r"--text-layout 'novel' is not one of auto, plain, book, wikitext"):
        read(book, text_layout="novel")


# ---------------------------------------------------------------- sentences


def test_sentences_format_is_never_resplit(shared_corpora):
    docs, _ = read_file(shared_corpora / "bert_sample_text" / "sample_text.txt", "sentences")
    assert [len(d.sentences) for d in docs] == [3, 13, 15]
    assert docs[0].paragraphs is None
    assert docs[0].sentences[0].endswith("力加勝北区ᴵᴺᵀᵃছজটডণত")
    two = read("One. Two.\n  Three  \n\nFour.\n", "sentences")[0]
    assert [d.sentences for d in two] == [["One. Two.", "Three"], ["Four."]]


# ---------------------------------------------------------------- jsonl


def test_jsonl_reads_the_chosen_field():
    lines = [json.dumps({"body": "Para one line.\nPara two.\n\nPara three.", "id": 1}), "", json.dumps({"body": "x"})]
    docs, _ = read("\n".join(lines), "jsonl", text_field="body")
    assert [d.paragraphs for d in docs] == [["Para one line.", "Para two.", "Para three."], ["x"]]


@pytest.mark.parametrize("line,message", [
    ('{"text": "ok"', r"data\.jsonl: line 2: not valid JSON"),
    ('["text"]', r"data\.jsonl: line 2: expected a JSON object"),
    ('{"body": "x"}', r"data\.jsonl: line 2: no field 'text'"),
    ('{"text": 5}', r"data\.jsonl: line 2: field 'text' is int"),
])
def test_jsonl_errors_name_file_and_line(line, message):
    with pytest.raises(InputError, match=message):
        read('{"text": "fine"}\n' + line + "\n", "jsonl", path="data.jsonl")


# ---------------------------------------------------------------- wikiextractor


def test_wikiextractor_blocks_title_line_and_empty_articles():
    data = (
        '<doc id="1" url="u" title="Alpha &amp; Beta">\nAlpha & Beta\n\nFirst paragraph.\nSecond.\n</doc>\n'
        '<doc id="2" url="u" title="Empty">\nEmpty\n\n</doc>\n'
        '<doc id="3" url="u" title="Gamma">\nGamma\nGamma is a letter.\n</doc>\n'
    )
    docs, stats = read(data, "wikiextractor")
    assert [d.paragraphs for d in docs] == [["First paragraph.", "Second."], ["Gamma is a letter."]]
    assert [d.index for d in docs] == [0, 2]
    assert stats["empty_documents"] == 1


@pytest.mark.parametrize("data,message", [
    ('<doc id="1" title="A">\nA\ntext\n', r"the <doc> opened at line 1 is never closed"),
    ('stray text\n<doc id="1" title="A">\nA\n</doc>\n', r"line 1: text outside a <doc"),
    ('<doc id="1" title="A">\n<doc id="2" title="B">\n</doc>\n', r"line 2: <doc> opened inside"),
])
def test_wikiextractor_structure_errors(data, message):
    with pytest.raises(InputError, match=r"wiki_00: " + message):
        read(data, "wikiextractor", path="wiki_00")


def test_enwiki_extract(shared_corpora):
    docs, stats = read_file(shared_corpora / "enwiki_extract_2015" / "wiki_00", "wikiextractor")
    assert docs[0].paragraphs[0].startswith("Anarchism is a political philosophy")
    assert not any(p.startswith("<doc") or p == "</doc>" for d in docs for p in d.paragraphs)
    assert stats.get("empty_documents", 0) == 0 and len(docs) > 30


def test_viwiki_empty_articles_are_counted(shared_corpora):
    docs, stats = read_file(shared_corpora / "viwiki_sample" / "wiki_00", "wikiextractor")
    assert len(docs) == 127 and stats["empty_documents"] == 73


def test_zhwiki_blank_lines_between_paragraphs(shared_corpora):
    docs, stats = read_file(shared_corpora / "zhwiki_sample" / "wiki_00", "wikiextractor")
    assert len(docs) == 64 and stats.get("empty_documents", 0) == 0
    assert docs[0].paragraphs[0].startswith("数学是利用符号语言研究")
    assert all(p.strip() == p and p for d in docs for p in d.paragraphs)


# ---------------------------------------------------------------- text-format corpora


@pytest.mark.parametrize("name", ["wiki.valid.raw", "wiki.test.raw"])
def test_wikitext_articles_headings_and_number_splits(shared_corpora, name):
    docs, _ = read_file(shared_corpora / "wikitext2_raw" / name, "text")
    assert len(docs) == 60  # the two formula lines in the test split are not titles
    paragraphs = [p for d in docs for p in d.paragraphs]
    assert not any("@-@" in p or "@,@" in p or "@.@" in p for p in paragraphs)
    looks_like_heading = [p for p in paragraphs if p.startswith("= ") and p.endswith(" =")]
    # Only the formula lines inside a paragraph remain: they are not between blank lines.
    assert looks_like_heading == ([] if name == "wiki.valid.raw" else
                                  ["= 1 rad / s and a nominal impedance k =", "= 1 henry and capacitance C ="])
    assert not any("\r" in p for p in paragraphs)
    if name == "wiki.valid.raw":
        assert docs[0].paragraphs[0].startswith("Homarus gammarus , known as the European lobster")
    else:
        assert any("guest-starring role" in p for p in docs[0].paragraphs)


GUTENBERG = ["gutenberg_en/" + n for n in ("11-0.txt", "2701-0.txt", "76-0.txt", "98-0.txt", "pg1342.txt",
                                          "pg1661.txt", "pg174.txt", "pg345.txt")] + [
    "gutenberg_fr/Candide.txt", "gutenberg_fr/Madame_Bovary_GustaveFlaubert.txt"]


@pytest.mark.parametrize("name", GUTENBERG)
def test_gutenberg_book_is_one_document_without_licence(shared_corpora, name):
    docs, _ = read_file(shared_corpora / name, "text")
    assert len(docs) == 1
    paragraphs = docs[0].paragraphs
    text = "\n".join(paragraphs)
    assert "START OF" not in text and "END OF TH" not in text and "Project Gutenberg-tm" not in text
    assert "End of the Project Gutenberg" not in text and "\ufeff" not in text
    assert not any("\r" in p for p in paragraphs)
    assert len(paragraphs) > 300
    if name.endswith("11-0.txt"):
        assert paragraphs[0] == "ALICE’S ADVENTURES IN WONDERLAND"
        assert any(p.startswith("Alice was beginning to get very tired of sitting by her sister on the bank, "
                                "and of having nothing to do:") for p in paragraphs)
        assert paragraphs[-1] == "THE END"


def test_gutenberg_french(shared_corpora):
    docs, _ = read_file(shared_corpora / "gutenberg_fr" / "Madame_Bovary_GustaveFlaubert.txt", "text")
    assert len(docs) == 1 and any("«" in p for p in docs[0].paragraphs)
    # "au-" ends a line and "dessus" starts the next: the compound is rejoined without a space.
    assert any("au-dessus même de sa dédicace" in p for p in docs[0].paragraphs)


def test_join_wrapped_keeps_compounds_and_dashes_whole():
    from bert_datagen.datagen.readers import join_wrapped

    assert join_wrapped(["a well-", "known fact and a plane;\u2014", "wait -", "no", "x -", "y"]) == \
        "a well-known fact and a plane;\u2014wait - no x - y"


# ---------------------------------------------------------------- properties


@settings(max_examples=150, deadline=None)
@given(data=st.one_of(st.binary(max_size=400), st.text(max_size=400).map(lambda t: t.encode("utf-8", "surrogatepass"))),
       fmt=st.sampled_from(["text", "sentences", "jsonl", "wikiextractor"]))
def test_property_any_bytes_give_documents_or_a_clear_error(data, fmt):
    try:
        docs, stats = read(data, fmt, path="fuzz.bin")
    except InputError as e:
        assert str(e).startswith("fuzz.bin: ")
        return
    for doc in docs:
        parts = doc.sentences if fmt == "sentences" else doc.paragraphs
        assert parts and all(p and p == p.strip() for p in parts)
        assert all("\x00" not in p and "\r" not in p and "\n" not in p for p in parts)
    assert all(v >= 0 for v in stats.values())
