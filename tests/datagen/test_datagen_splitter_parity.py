"""The nupunkt splitter's short cut for the common paragraph gives, sentence for sentence, what the
general path (CJK segments, bounded pieces, Punkt) gives, on real text of every kind we ship."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bert_datagen.datagen.config import DatagenConfig
from bert_datagen.datagen.readers import read_documents
from bert_datagen.datagen.sentences import MAX_PIECE_CHARS, _has_cjk_end, _has_punkt_candidate, _make_nupunkt

FAST = _make_nupunkt()
GENERAL = _make_nupunkt(short_cuts=False)

# (corpus folder, file pattern, input format): English Wikipedia, English books (hard-wrapped,
# dialogue, quotes), Chinese Wikipedia (CJK full stops), WikiText (headings, " @-@ " joins).
CORPORA = [
    ("enwiki_extract_2015", "wiki_0[0-3]", "wikiextractor"),
    ("gutenberg_en", "*.txt", "text"),
    ("zhwiki_sample", "wiki_*", "wikiextractor"),
    ("wikitext2_raw", "wiki.*.raw", "text"),
]


def _paragraphs(root, pattern: str, fmt: str) -> list[str]:
    config = DatagenConfig(input_format=fmt)
    files = sorted(p for p in root.glob(pattern) if p.name != "SOURCE.md")
    assert files, f"no {pattern} in {root}"
    return [p for f in files for raw in read_documents(str(f), f.read_bytes(), config, {}) for p in raw.paragraphs]


@pytest.mark.parametrize(("folder", "pattern", "fmt"), CORPORA, ids=[c[0] for c in CORPORA])
def test_short_cut_splits_real_text_as_the_general_path(shared_corpora, folder, pattern, fmt):
    paragraphs = _paragraphs(shared_corpora / folder, pattern, fmt)
    different = [p for p in paragraphs if FAST(p) != GENERAL(p)]
    assert not different, f"{len(different)} of {len(paragraphs)} paragraphs split otherwise, first: {different[0]!r}"
    # Each route of the short cut met here (or, for the CJK corpus, the general path it keeps).
    short = [p for p in paragraphs if len(p) <= MAX_PIECE_CHARS and not _has_cjk_end(p)]
    if folder == "zhwiki_sample":
        assert sum(_has_cjk_end(p) for p in paragraphs) > 100
    else:
        assert sum(not _has_punkt_candidate(p) for p in short) > 10
        assert sum(_has_punkt_candidate(p) for p in short) > 100


# Pieces that move Punkt's decisions: sentence ends of each kind, closers, abbreviations, initials,
# an enumerator, capitalised and lower-case words, CJK full stops, line breaks.
PIECES = [" ", "  ", "\n", "\t", ".", "!", "?", "…", "。", "！", "？", '"', "'", ")", "word", "Word", "Dr.", "U.S.",
          "e.g.", "J.", "1.", "(a)", "the", "The"]


@settings(max_examples=300, deadline=None)
@given(text=st.lists(st.sampled_from(PIECES), max_size=80).map("".join))
def test_short_cut_on_generated_text(text):
    assert FAST(text) == GENERAL(text)


def test_paragraph_without_sentence_punctuation_is_one_sentence():
    assert FAST("  History of the region \t") == GENERAL("  History of the region \t") == ["History of the region"]
    assert FAST(" \t ") == GENERAL(" \t ") == []
    long_line = "word " * (MAX_PIECE_CHARS // 4)  # over the piece bound: cut at whitespace, as before
    assert FAST(long_line) == GENERAL(long_line) and len(FAST(long_line)) > 1
