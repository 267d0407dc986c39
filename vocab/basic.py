"""The original BERT basic tokenization (text -> words), in Python, with C-speed string operations.

This is the exact path: it follows the original's rules with Python's own `unicodedata` and
`str.lower()`, so it is what the fast Rust path is checked against, and what the tokenizer falls
back to for the few texts the Rust normalizer would treat differently (see `divergence.py`).

The original's steps, per text:
1. clean: drop NUL, U+FFFD and control/format characters (categories Cc, Cf; tab, newline and
   carriage return are whitespace, not control);
2. put spaces around CJK ideographs;
3. split on whitespace (`str.split()`);
4. per word, when lowercasing: `str.lower()` (whole word: Greek final sigma), NFD, drop Mn marks;
5. split every punctuation character (Unicode P* or an ASCII symbol) off as its own word.
"""

from __future__ import annotations

import re
import sys
import unicodedata
from functools import lru_cache

import numpy as np

# The CJK Unified Ideograph blocks the original spaces out (not Hangul, Hiragana or Katakana).
CJK_RANGES = (
    (0x4E00, 0x9FFF),
    (0x3400, 0x4DBF),
    (0x20000, 0x2A6DF),
    (0x2A700, 0x2B73F),
    (0x2B740, 0x2B81F),
    (0x2B820, 0x2CEAF),
    (0xF900, 0xFAFF),
    (0x2F800, 0x2FA1F),
)
# ASCII symbols that are not Unicode P* (e.g. "$", "+", "^", "`") but count as punctuation.
ASCII_PUNCT_RANGES = ((33, 47), (58, 64), (91, 96), (123, 126))
SURROGATES = (0xD800, 0xDFFF)


def ranges_to_class(ranges: list[tuple[int, int]]) -> str:
    """A regex character-class body for inclusive code point ranges."""
    parts = []
    for lo, hi in ranges:
        parts.append(re.escape(chr(lo)) if lo == hi else f"{re.escape(chr(lo))}-{re.escape(chr(hi))}")
    return "".join(parts)


class _Tables:
    """Compiled regexes over Python's own Unicode database (built once per process, ~0.3 s)."""

    def __init__(self) -> None:
        n = sys.maxunicode + 1
        cats = np.array(list(map(unicodedata.category, map(chr, range(n)))))
        cps = np.arange(n)
        ascii_punct = np.zeros(n, dtype=bool)
        for lo, hi in ASCII_PUNCT_RANGES:
            ascii_punct[lo:hi + 1] = True
        removed = _runs(((cats == "Cc") | (cats == "Cf")) & ~np.isin(cps, (9, 10, 13))
                        | np.isin(cps, (0, 0xFFFD)))
        punct = _runs((np.char.startswith(cats, "P")) | ascii_punct)
        nonspacing = _runs(cats == "Mn")
        self.removed = re.compile(f"{char_in(removed)}+")
        self.nonspacing = re.compile(f"{char_in(nonspacing)}+")
        # A word is a run of anything but punctuation and the joining space; punctuation stands alone.
        self.words = re.compile(f"{char_in(punct)}|{chars_not_in(punct, ' ')}")
        self.cjk = re.compile(char_in(list(CJK_RANGES)))
        self.punct = re.compile(char_in(punct))  # one character the original splits off as a word
        self.surrogate = re.compile(char_in([SURROGATES]))


_ASTRAL = (0x10000, sys.maxunicode)


def _split_bmp(ranges: list[tuple[int, int]]) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    bmp = [(lo, min(hi, 0xFFFF)) for lo, hi in ranges if lo <= 0xFFFF]
    astral = [(max(lo, 0x10000), hi) for lo, hi in ranges if hi >= 0x10000]
    return bmp, astral


def char_in(ranges: list[tuple[int, int]]) -> str:
    """Regex for one character in the ranges, fast on Python's `re`.

    `re` tests BMP members with a bitmap but walks non-BMP ranges one by one for every
    character; a lookahead on the whole non-BMP plane keeps that walk off BMP text.
    """
    bmp, astral = _split_bmp(ranges)
    parts = []
    if bmp:
        parts.append(f"[{ranges_to_class(bmp)}]")
    if astral:
        parts.append(f"(?=[{ranges_to_class([_ASTRAL])}])[{ranges_to_class(astral)}]")
    return "(?:" + "|".join(parts) + ")" if parts else "(?!)"


def chars_not_in(ranges: list[tuple[int, int]], also: str = "") -> str:
    """Regex for a run of characters outside the ranges and not in `also` (BMP characters)."""
    bmp, astral = _split_bmp(ranges)
    plane = ranges_to_class([_ASTRAL])
    excluded = ranges_to_class(bmp) + re.escape(also) + plane
    outside_astral = f"(?![{ranges_to_class(astral)}])" if astral else ""
    # `[^...]+` runs at C speed; a non-BMP character is checked on its own.
    return f"(?:[^{excluded}]+|{outside_astral}[{plane}])+"


def _runs(flags: np.ndarray) -> list[tuple[int, int]]:
    """Inclusive index ranges where the boolean array is true."""
    edges = np.diff(np.concatenate(([0], flags.astype(np.int8), [0])))
    starts, ends = np.flatnonzero(edges == 1), np.flatnonzero(edges == -1) - 1
    return list(zip(starts.tolist(), ends.tolist(), strict=True))


@lru_cache(maxsize=1)
def tables() -> _Tables:
    return _Tables()


def basic_tokenize(text: str, do_lower_case: bool) -> list[str]:
    """The original's BasicTokenizer output (words before WordPiece) for one text."""
    t = tables()
    text = t.removed.sub("", text)
    text = t.cjk.sub(r" \g<0> ", text)
    # Joining the whitespace-split words with single spaces keeps every per-word step exact:
    # a space is neither cased nor case-ignorable (final sigma), and is an NFD starter.
    joined = " ".join(text.split())
    if do_lower_case:
        joined = t.nonspacing.sub("", unicodedata.normalize("NFD", joined.lower()))
    return t.words.findall(joined)
