"""Sentence splitters: behaviour, determinism, bounded pieces and linear time on adversarial input."""

from __future__ import annotations

import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bert_datagen.datagen.sentences import (
    MAX_PIECE_CHARS,
    available_splitters,
    get_splitter,
    register_splitter,
    split_bounded,
)

NAMES = ["nupunkt", "rules"]


@pytest.mark.parametrize("name", NAMES)
def test_common_cases(name):
    split = get_splitter(name)
    text = ("Dr. Smith went to Washington. He arrived at 5 p.m. on Jan. 5th. Wow! Really? "
            "数学是一門学科。它很好！对吗？ J. R. R. Tolkien wrote it.")
    assert split(text) == ["Dr. Smith went to Washington.", "He arrived at 5 p.m. on Jan. 5th.", "Wow!", "Really?",
                           "数学是一門学科。", "它很好！", "对吗？", "J. R. R. Tolkien wrote it."]
    assert split("") == [] and split("   ") == []
    assert split("no punctuation at all") == ["no punctuation at all"]


def test_registry(monkeypatch):
    from bert_datagen.datagen import sentences

    assert set(NAMES) <= set(available_splitters())
    with pytest.raises(ValueError, match="unknown sentence splitter 'nope'"):
        get_splitter("nope")
    # Registered for this test only: other tests list the available splitters.
    monkeypatch.setattr(sentences, "_SPLITTERS", dict(sentences._SPLITTERS))
    register_splitter("test-lines", lambda: lambda text: [s for s in text.split("|") if s])
    assert get_splitter("test-lines")("a|b") == ["a", "b"]
    assert "test-lines" in available_splitters()


ADVERSARIAL = ["word ", "?", "!?", "?;' ", ".?1([", "(?", "x", "Hello. ", ". ", "a.b.c. ", "\u3002", "Mr. "]


@pytest.mark.parametrize("name", NAMES)
def test_linear_time_on_adversarial_input(name):
    # Plain Punkt needs 0.75 s for "?" * 16000 and grows quadratically; 600 kB of each pattern must
    # take about as long per byte as 150 kB does.
    split = get_splitter(name)
    for unit in ADVERSARIAL:
        small, big = unit * (150_000 // len(unit)), unit * (600_000 // len(unit))
        t0 = time.process_time()
        split(small)
        t1 = time.process_time()
        sentences = split(big)
        t2 = time.process_time()
        assert t2 - t1 < 8 * (t1 - t0) + 0.5, f"{name} on {unit!r}: {t1 - t0:.2f}s for 150 kB, {t2 - t1:.2f}s for 600 kB"
        assert t2 - t1 < 10, f"{name} on {unit!r}: {t2 - t1:.1f}s for 600 kB"
        assert max(len(s) for s in sentences) <= MAX_PIECE_CHARS


def test_fifty_megabyte_line_without_punctuation():
    line = "lorem ipsum dolor sit amet consectetur " * (50_000_000 // 39)
    t0 = time.process_time()
    sentences = get_splitter("nupunkt")(line)
    assert time.process_time() - t0 < 120
    assert sum(len(s) for s in sentences) >= len(line) * 0.97


def test_split_bounded_cuts_only_overlong_sentences():
    calls = []

    def spans(piece):
        calls.append(len(piece))
        out, start = [], 0
        for i, ch in enumerate(piece):
            if ch == ".":
                out.append((start, i + 1))
                start = i + 1
        out.append((start, len(piece)))
        return out

    text = ("A short sentence here. " * 400)
    result = [text[a:b].strip() for a, b in split_bounded(text, spans, max_chars=1000) if text[a:b].strip()]
    assert result == ["A short sentence here."] * 400  # no sentence was cut at a piece boundary
    assert max(calls) <= 1000
    blob = "x" * 5000
    assert [b - a for a, b in split_bounded(blob, spans, max_chars=1000)] == [1000] * 5


@settings(max_examples=200, deadline=None)
@given(text=st.text(max_size=3000), name=st.sampled_from(NAMES))
def test_property_sentences_are_stripped_ordered_and_deterministic(text, name):
    split = get_splitter(name)
    sentences = split(text)
    assert sentences == split(text)
    assert all(s and s == s.strip() for s in sentences)
    # Sentences are pieces of the text, in order, and only whitespace is lost.
    pos = 0
    for s in sentences:
        found = text.find(s, pos)
        assert found >= 0 and not text[pos:found].strip()
        pos = found + len(s)
    assert not text[pos:].strip()
