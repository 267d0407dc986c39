"""Sentence splitters: a small registry of ``str -> list[str]`` functions.

``nupunkt`` (the default) is a Punkt implementation (pure Python, MIT) that
measured best among the fast splitters here (MEASUREMENTS.md).  ``rules`` is a
regex splitter with no dependency, linear by construction, for when speed or
predictability matters more than abbreviation handling.

Guarantees every registered splitter keeps (tests check them):

* deterministic: the same text gives the same sentences;
* linear time on any input.  Punkt is quadratic on runs of punctuation
  (measured: ``"?" * 16000`` takes 0.75 s), so ``nupunkt`` sees bounded pieces
  only (``MAX_PIECE_CHARS``, cut at whitespace), and a piece denser in sentence
  punctuation than any prose (``DENSE_PUNCT_FRACTION``) goes to ``rules``;
* no sentence is longer than ``MAX_PIECE_CHARS`` characters: text without
  sentence punctuation is cut at whitespace (at a hard limit if it has none),
  so one pathological line cannot become one giant "sentence";
* CJK full stops (``。！？``) always end a sentence: Punkt knows only Latin
  punctuation followed by whitespace;
* sentences are stripped and never empty.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from functools import cache

Splitter = Callable[[str], list[str]]
Spans = list[tuple[int, int]]

MAX_PIECE_CHARS = 4000
DENSE_PUNCT_FRACTION = 0.05

_SPLITTERS: dict[str, Callable[[], Splitter]] = {}


def register_splitter(name: str, factory: Callable[[], Splitter]) -> None:
    """Make ``factory()`` available as ``get_splitter(name)`` (a plug-in point)."""
    _SPLITTERS[name] = factory


def available_splitters() -> list[str]:
    return sorted(_SPLITTERS)


@cache
def get_splitter(name: str) -> Splitter:
    """The splitter registered as ``name`` (built once per process)."""
    if name not in _SPLITTERS:
        raise ValueError(f"unknown sentence splitter {name!r}; available: {', '.join(available_splitters())}")
    return _SPLITTERS[name]()


# ---------------------------------------------------------------- shared pieces

_CLOSERS = "\"'”’»)\\]」』）》】〕"
_CJK_END = re.compile(f"(?<![。！？])[。！？]++[{_CLOSERS}]*+")
_SENTENCE_MARKS = ".!?…。！？"


def _has_cjk_end(text: str) -> bool:
    return "。" in text or "！" in text or "？" in text


def _has_punkt_candidate(text: str) -> bool:
    """Whether Punkt can find a sentence end candidate in ``text`` (it looks at these four only)."""
    return "." in text or "!" in text or "?" in text or "…" in text


def _punctuation_marks(text: str) -> int:
    return sum(text.count(mark) for mark in _SENTENCE_MARKS)


def _cjk_segments(text: str) -> list[tuple[int, int]]:
    """Spans of ``text`` cut after each run of CJK sentence-final punctuation."""
    if not _has_cjk_end(text):
        return [(0, len(text))]  # the common case, without the regex scan
    spans, start = [], 0
    for match in _CJK_END.finditer(text):
        spans.append((start, match.end()))
        start = match.end()
    spans.append((start, len(text)))
    return spans


def _strip_spans(text: str, spans: Spans) -> list[str]:
    out = []
    for start, end in spans:
        sentence = text[start:end].strip()
        if sentence:
            out.append(sentence)
    return out


def _cut_point(text: str, pos: int, limit: int) -> int:
    """Last whitespace in the second half of ``text[pos:limit]``, else ``limit`` (a hard cut)."""
    for i in range(limit - 1, pos + (limit - pos) // 2, -1):
        if text[i].isspace():
            return i
    return limit


def split_bounded(text: str, spans_of: Callable[[str], Spans], max_chars: int = MAX_PIECE_CHARS) -> Spans:
    """Sentence spans of ``text``, calling ``spans_of`` on pieces of at most ``max_chars``.

    The last sentence of a piece may continue in the next piece, so it is
    re-read there, unless it began in the piece's first half: every step
    advances at least ``max_chars // 2``, which keeps the total linear.  A
    sentence is therefore only ever cut when it is longer than
    ``max_chars // 2`` characters (far beyond any ``max_seq_length``).
    """
    if len(text) <= max_chars:
        return list(spans_of(text))
    spans: Spans = []
    pos, n = 0, len(text)
    while pos < n:
        if n - pos <= max_chars:
            end, final = n, True
        else:
            end, final = _cut_point(text, pos, pos + max_chars), False
        piece = [(pos + s, pos + e) for s, e in spans_of(text[pos:end])]
        if final or len(piece) < 2 or piece[-1][0] - pos < max_chars // 2:
            spans.extend(piece)
            pos = end
        else:
            spans.extend(piece[:-1])
            pos = piece[-1][0]
    return spans


# ---------------------------------------------------------------- rules

_ABBREVIATIONS = frozenset(
    """mr mrs ms dr prof sr jr st mt vs etc fig figs no nos vol op inc ltd co corp dept est approx
    jan feb mar apr jun jul aug sep sept oct nov dec gen col capt lt sgt rev gov sen rep ave
    e.g i.e cf al ca""".split()
)
# Possessive quantifiers and the look-behind keep a long run of punctuation
# from being rescanned at every position (that would be quadratic).
_LATIN_END = re.compile(f"(?<![.!?…])[.!?…]++[{_CLOSERS}]*+(?=\\s)")
_LONGEST_ABBREVIATION = 12
_WORD_OPENERS = "\"'“‘«([{¿¡"


def _is_abbreviation(text: str, end_of_word: int) -> bool:
    # Look back a bounded window only: an unbounded search for the previous
    # space would make text without spaces quadratic.
    window = text[max(0, end_of_word - _LONGEST_ABBREVIATION) : end_of_word]
    word = window.split()[-1] if window.strip() else ""
    if len(window) == _LONGEST_ABBREVIATION and word == window:
        return False  # the word is longer than the window
    word = word.lstrip(_WORD_OPENERS).lower()
    if len(word) == 1 and word.isalpha():
        return True  # an initial: "J. R. R. Tolkien"
    return word in _ABBREVIATIONS or ("." in word and len(word) <= 6 and word.replace(".", "").isalpha())


def rules_spans(text: str) -> Spans:
    """Sentence spans by punctuation rules (linear time; no model)."""
    cuts = [end for _, end in _cjk_segments(text)[:-1]]
    for match in _LATIN_END.finditer(text):
        after = match.end()
        while after < len(text) and text[after].isspace():
            after += 1
        if after >= len(text):
            continue
        nxt = text[after]
        if nxt.islower():
            continue
        if text[match.start()] == "." and match.group().rstrip(_CLOSERS) == "." and _is_abbreviation(text, match.start()):
            continue
        cuts.append(match.end())
    cuts = sorted(set(cuts))
    bounds = [0, *cuts, len(text)]
    return list(zip(bounds, bounds[1:], strict=False))


def split_rules(text: str) -> list[str]:
    return _strip_spans(text, split_bounded(text, rules_spans))


# ---------------------------------------------------------------- nupunkt


def _make_nupunkt(short_cuts: bool = True) -> Splitter:
    """Punkt behind the guards above; ``short_cuts=False``: without the fast path for the common
    paragraph (the same sentences, slower; tests compare the two)."""
    import nupunkt

    tokenizer = nupunkt.load("default")

    def punkt_spans(piece: str) -> Spans:
        if len(piece) > 200 and _punctuation_marks(piece) > DENSE_PUNCT_FRACTION * len(piece):
            return rules_spans(piece)  # no prose is this dense; Punkt would be quadratic on it
        return list(tokenizer.span_tokenize(piece))

    def split_segments(text: str) -> list[str]:
        sentences: list[str] = []
        for start, end in _cjk_segments(text):
            segment = text[start:end]
            sentences.extend(_strip_spans(segment, split_bounded(segment, punkt_spans)))
        return sentences

    def split(text: str) -> list[str]:
        # Most paragraphs are one piece without CJK full stops, and one in ten has no sentence
        # punctuation at all (a heading, a list item): Punkt finds no candidate there and keeps the
        # paragraph whole, so that is done here without the calls around it. Same sentences.
        if len(text) > MAX_PIECE_CHARS or _has_cjk_end(text):
            return split_segments(text)
        if _has_punkt_candidate(text):
            return _strip_spans(text, punkt_spans(text))
        sentence = text.strip()
        return [sentence] if sentence else []

    return split if short_cuts else split_segments


register_splitter("nupunkt", _make_nupunkt)
register_splitter("rules", lambda: split_rules)
