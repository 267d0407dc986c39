"""Which characters the Rust `tokenizers` normalizer handles differently from the original.

`tokenizers`' BertNormalizer + BertPreTokenizer agree with the original BERT tokenizer on almost
all text, but not on every character: it drops private-use and unassigned code points (the
original keeps them, so the word becomes [UNK]), strips spacing marks (Mc, Me) as accents when
lowercasing (the original strips only Mn), lowercases Greek capital sigma without the final-form
rule, and its Unicode tables are of a different Unicode version than Python's. Texts holding none
of these characters take the fast Rust path; the others take the exact Python path (`basic.py`).

The character set is found by measurement, not by a list of known causes: every code point is put
through both paths in the context "a<char>b" and kept when the words differ. The result depends
only on the `tokenizers` version and Python's Unicode version; it is shipped in
`divergent_chars.json` and recomputed (a few seconds, once per process) when either differs.
"""

from __future__ import annotations

import json
import logging
import sys
import unicodedata
from collections.abc import Sequence
from functools import lru_cache
from pathlib import Path

import numpy as np
import tokenizers
from tokenizers import normalizers, pre_tokenizers

from bert_datagen.vocab.basic import SURROGATES, basic_tokenize

TABLE_PATH = Path(__file__).with_name("divergent_chars.json")
log = logging.getLogger(__name__)
CAPITAL_SIGMA = 0x03A3
_SEPARATOR = "0"  # a word neither path changes: marks where one probe's words end
_CHUNK = 2048


def rust_normalizer(do_lower_case: bool) -> normalizers.Normalizer:
    return normalizers.BertNormalizer(
        clean_text=True, handle_chinese_chars=True, strip_accents=do_lower_case, lowercase=do_lower_case
    )


def rust_words(text: str, do_lower_case: bool) -> list[str]:
    """Words the Rust normalizer + BertPreTokenizer produce for one text."""
    normalized = rust_normalizer(do_lower_case).normalize_str(text)
    return [w for w, _ in pre_tokenizers.BertPreTokenizer().pre_tokenize_str(normalized)]


def _probe_chars() -> list[int]:
    lo, hi = SURROGATES
    return [cp for cp in range(sys.maxunicode + 1) if not (lo <= cp <= hi) and cp != CAPITAL_SIGMA]


def _split_at_separator(words: list[str]) -> list[list[str]]:
    groups: list[list[str]] = [[]]
    for w in words:
        if w == _SEPARATOR:
            groups.append([])
        else:
            groups[-1].append(w)
    return groups[:-1]


def _differs(cp: int, do_lower_case: bool) -> bool:
    probe = f"a{chr(cp)}b"
    return basic_tokenize(probe, do_lower_case) != rust_words(probe, do_lower_case)


def scan(do_lower_case: bool, chars: Sequence[int] | None = None) -> list[tuple[int, int]]:
    """Inclusive code point ranges where the Rust path's words differ from the original's.

    Surrogates (the Rust side cannot take them at all) and, when lowercasing, capital sigma
    (its lowercase depends on context) are always included. `chars` probes only those code points
    (none of them a surrogate or capital sigma), so that a test can check a sample of the table in
    a second; by default every other code point is probed.
    """
    chars = _probe_chars() if chars is None else list(chars)
    bad: list[int] = [cp for cp in range(SURROGATES[0], SURROGATES[1] + 1)]
    if do_lower_case:
        bad.append(CAPITAL_SIGMA)
    normalizer = rust_normalizer(do_lower_case)
    pre = pre_tokenizers.BertPreTokenizer()
    for start in range(0, len(chars), _CHUNK):
        chunk = chars[start:start + _CHUNK]
        text = "".join(f"a{chr(cp)}b {_SEPARATOR} " for cp in chunk)
        py_groups = _split_at_separator(basic_tokenize(text, do_lower_case))
        rs_groups = _split_at_separator([w for w, _ in pre.pre_tokenize_str(normalizer.normalize_str(text))])
        if len(py_groups) == len(rs_groups) == len(chunk):
            bad.extend(cp for cp, p, r in zip(chunk, py_groups, rs_groups, strict=True) if p != r)
        else:  # a probe's output ran into the separator: fall back to one probe per character
            bad.extend(cp for cp in chunk if _differs(cp, do_lower_case))
    return _to_ranges(sorted(set(bad)))


def _to_ranges(cps: list[int]) -> list[tuple[int, int]]:
    ranges: list[tuple[int, int]] = []
    for cp in cps:
        if ranges and ranges[-1][1] == cp - 1:
            ranges[-1] = (ranges[-1][0], cp)
        else:
            ranges.append((cp, cp))
    return ranges


def versions() -> dict[str, str]:
    return {"tokenizers": tokenizers.__version__, "unicodedata": unicodedata.unidata_version}


def compute_table() -> dict[str, object]:
    return {**versions(), "uncased": scan(True), "cased": scan(False)}


def write_table(path: Path = TABLE_PATH) -> None:
    """Regenerate the shipped table (`python -m bert_datagen.vocab.divergence`)."""
    table = compute_table()
    path.write_text(json.dumps(table, separators=(",", ":")) + "\n")


@lru_cache(maxsize=1)
def _table() -> dict[str, object]:
    if TABLE_PATH.exists():
        table = json.loads(TABLE_PATH.read_text())
        if all(table.get(k) == v for k, v in versions().items()):
            return table
        shipped = {k: table.get(k) for k in versions()}
    else:
        shipped = None
    log.warning("%s is for %s, this process has %s: rescanning every code point (about 30 s, once per "
                "process); run `python -m bert_datagen.vocab.divergence` to refresh it", TABLE_PATH.name, shipped, versions())
    return compute_table()


@lru_cache(maxsize=2)
def divergent_mask(do_lower_case: bool) -> np.ndarray:
    """Boolean lookup over all code points: True where the text must take the exact path."""
    mask = np.zeros(sys.maxunicode + 1, dtype=bool)
    for lo, hi in _table()["uncased" if do_lower_case else "cased"]:
        mask[lo:hi + 1] = True
    return mask


if __name__ == "__main__":
    write_table()
    print(f"wrote {TABLE_PATH}")
