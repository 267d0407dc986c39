"""The inputs of issue #44's memory benchmark (benchmarks/scale_corpora.py) are what they claim: each
further copy of an article or a book is a new document of the same paragraphs, read in the layout
users have (WikiExtractor articles, Gutenberg books one document each)."""

from __future__ import annotations

from collections import Counter

import pytest

from benchmarks.scale_corpora import BOOKS, WIKI, write_book_variants, write_wikiextractor_variants
from bert_datagen.datagen.config import DatagenConfig
from bert_datagen.datagen.readers import read_documents

pytestmark = pytest.mark.skipif(not (WIKI.is_dir() and BOOKS.is_dir()), reason="../shared/corpora is absent")


def _documents(path, input_format: str) -> list[list[str]]:
    config = DatagenConfig(input_format=input_format)
    return [doc.paragraphs for doc in read_documents(str(path), path.read_bytes(), config, {})]


def test_wikiextractor_copies_are_the_articles_reordered(tmp_path) -> None:
    docs = _documents(write_wikiextractor_variants(2, tmp_path / "wiki.xml"), "wikiextractor")
    first, second = docs[:len(docs) // 2], docs[len(docs) // 2:]
    assert len(first) == len(second) == 1034
    assert all(Counter(a) == Counter(b) for a, b in zip(first, second, strict=True))
    reordered = sum(a != b for a, b in zip(first, second, strict=True))
    assert reordered > 0.8 * len(first)  # the rest have a single paragraph, or two in the same order by chance


def test_book_copies_are_whole_books_reordered(tmp_path) -> None:
    sources = sorted(BOOKS.glob("*.txt"))
    paths = write_book_variants(2 * len(sources), tmp_path / "books")
    assert len({p.name for p in paths}) == len(paths) == 16
    assert [p.read_bytes() for p in paths[:8]] == [p.read_bytes() for p in sources]  # copy 0 as it is
    books = [_documents(p, "text") for p in paths]
    assert all(len(book) == 1 for book in books)  # Gutenberg detected: the whole book is one document
    for original, copy in zip(books[:8], books[8:], strict=True):  # every paragraph kept, in another order
        assert Counter(original[0]) == Counter(copy[0]) and original != copy and len(original[0]) > 100
