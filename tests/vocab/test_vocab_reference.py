"""An independent, deliberately plain reference of the original BERT tokenizer, for the parity tests.

Written from the recipe (../shared/docs/RECIPE.md section 5) and the original's documented
behaviour, one character at a time with Python's own Unicode database, so that it shares no code
and no shortcut with `vocab/` (no regexes, no Rust, no precomputed tables).
"""

from __future__ import annotations

from tests.support.vocab_reference import basic_words, wordpiece


# The reference itself, on behaviour the original documents (its docstrings and README examples).
def test_reference_basic_words_documented_examples():
    assert basic_words(" \tHeLLo!how  \n Are yoU?  ", True) == ["hello", "!", "how", "are", "you", "?"]
    assert basic_words("H\u00e9llo", True) == ["hello"]
    assert basic_words(" \tHeLLo!how  \n Are yoU?  ", False) == ["HeLLo", "!", "how", "Are", "yoU", "?"]
    assert basic_words("ah\u535a\u63a8zz", True) == ["ah", "\u535a", "\u63a8", "zz"]
    assert basic_words("UNwant\u00e9d,running", True) == ["unwanted", ",", "running"]


def test_reference_wordpiece_documented_examples():
    vocab = {t: i for i, t in enumerate(["[UNK]", "[CLS]", "[SEP]", "want", "##want", "##ed", "wa",
                                         "un", "runn", "##ing", "##aff", "##able"])}
    assert wordpiece("unwanted", vocab) == ["un", "##want", "##ed"]
    assert wordpiece("running", vocab) == ["runn", "##ing"]
    assert wordpiece("unwantedX", vocab) == ["[UNK]"]
    assert wordpiece("unaffable", vocab) == ["un", "##aff", "##able"]
    assert wordpiece("wa" * 100, {"wa": 0, "##wa": 1}) == ["wa"] + ["##wa"] * 99
    assert wordpiece("wa" * 100 + "w", {"wa": 0, "##wa": 1, "##w": 2}) == ["[UNK]"]


def test_reference_special_cases_from_the_spec():
    # Lowercasing sees the whole whitespace word: "." is case-ignorable, so this sigma is not final.
    assert basic_words("ΟΔΟΣ ΑΣ.Β ΑΣ.", True) == ["οδος", "ασ", ".", "β", "ας", "."]
    assert basic_words("[SEP] x[MASK]", False) == ["[", "SEP", "]", "x", "[", "MASK", "]"]
    assert basic_words("a\x00b\ufffdc\u200bd e\tf", True) == ["abcd", "e", "f"]
    assert basic_words("a\ue000b", True) == ["a\ue000b"]
    assert basic_words("", True) == [] and basic_words(" \n\t\u3000 ", True) == []


# ----------------------------------------------------------------- test support shared by test_vocab_*


