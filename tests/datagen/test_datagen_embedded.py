"""The embedded default corpus: deterministic, prose only, readable by our own text reader."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest

from bert_datagen.datagen.config import DatagenConfig
from bert_datagen.datagen.embedded import clean_paragraphs, write_embedded_corpus
from bert_datagen.datagen.readers import read_documents


def digest(paths: list[str]) -> str:
    h = hashlib.sha256()
    for p in paths:
        h.update(Path(p).read_bytes())
    return h.hexdigest()


def read_all(paths: list[str]) -> list:
    stats: dict[str, int] = {}
    docs = [d for p in paths for d in read_documents(p, Path(p).read_bytes(), DatagenConfig(), stats)]
    assert not stats.get("decode_errors")
    return docs


def test_clean_paragraphs_drops_code_doctests_and_underlines():
    text = ("Title\n*****\n\nSome prose that is\nwrapped over lines.\n\n   code = block()\n   more()\n\n"
            ">>> doctest()\n42\n\nLast words.\n")
    # The doctest's output "42" has no letters, so it goes with its doctest.
    assert clean_paragraphs(text) == ["Title", "Some prose that is wrapped over lines.", "Last words."]


def test_small_corpus_is_deterministic_and_readable(tmp_path):
    root = os.path.dirname(json.__file__)  # one stdlib package keeps the test fast
    first = write_embedded_corpus(str(tmp_path / "a"), stdlib_root=root)
    second = write_embedded_corpus(str(tmp_path / "b"), stdlib_root=root)
    assert [Path(p).name for p in first] == [Path(p).name for p in second]
    assert digest(first) == digest(second)
    docs = read_all(first)
    assert len(docs) > 79  # every pydoc topic, plus the json modules
    assert any("JSON" in p for d in docs for p in d.paragraphs)
    assert not list(tmp_path.glob("a/*.tmp-*"))


@pytest.mark.integration
def test_full_corpus_size_and_determinism(tmp_path):
    first = write_embedded_corpus(str(tmp_path / "a"))
    second = write_embedded_corpus(str(tmp_path / "b"))
    assert digest(first) == digest(second)
    size = sum(os.path.getsize(p) for p in first)
    assert 1_000_000 < size < 20_000_000
    assert len(read_all(first)) > 400
