"""BertTokenizer == the original tokenizer (independent reference in test_vocab_reference.py).

Zero mismatched tokens, cased and uncased, on a stress set written here, on random Unicode text,
on every BMP code point (integration: every assigned one), and on every corpus under
../shared/corpora (samples here; every byte of every corpus in benchmarks/bench_vocab.py).
"""

from __future__ import annotations

import pickle
import random
import sys
import unicodedata
from functools import lru_cache

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bert_datagen.vocab import divergence
from bert_datagen.vocab.basic import SURROGATES
from bert_datagen.vocab.tokenizer import BertTokenizer
from bert_datagen.vocab.vocab_file import Vocab
from tests.support.vocab_corpora import CORPUS_FILES, corpus_texts
from tests.support.vocab_reference import ReferenceTokenizer, basic_words, build_vocab, google_reserved

MODES = [pytest.param(True, id="uncased"), pytest.param(False, id="cased")]

SAMPLE_BYTES = 240_000  # per corpus in the default tests
INTEGRATION_BYTES = 1_000_000  # all of three corpora; benchmarks/bench_vocab.py compares every byte of all seven

STRESS = [
    # accents, case, and lowercasing that changes length or needs context
    "Café naïve résumé ÀÉÎÕÜ Ångström Ḱḱ ǅungla ǈ İstanbul ıi ẞtraße ŉ ﬁnal ﬃ Ǆ",
    "ΟΔΟΣ ΣΟΦΟΣ Σ ΑΣ ΑΣ.Β ΑΣ. ΑΣ\x01Β ΑΣ\u200bΒ ΑΣ\u0301Β ΑΣ'Β ΑΣ-Β ὈΔΥΣΣΕΎΣ σΣ ΣΣ Σ́ ΑΣ\ue000",
    "Kelvin K Ohm Ω Ångstrom Å ΐ ΰ ẛ ǰ ᾳ ᾼ ῼ Ⅻ ⅻ Ⓐ ＡＢＣ１２３ 𝐀𝐁𝐂 x² ½ ℌ",
    "Tiếng Việt có dấu: Nguyễn, Hồ Chí Minh, đường phố, ỰỨỪ",
    "हिन्दी भाषा, বাংলা ভাষা, தமிழ் மொழி, ภาษาไทย, ພາສາລາວ, မြန်မာ, ខ្មែរ, සිංහල ඩෝ",
    "العَرَبِيَّة עִבְרִית Ελληνικά Русский ЁЖИК ąčęėįšųūž Ŋŋ ǅ ᏣᎳᎩ ꮳꮃꭹ ᲐᲑᲒ Ⴀ ⴀ",
    # CJK ideographs (all blocks), kana and hangul (not spaced), compatibility ideographs
    "中文字符，漢字。日本語のテキスト、カタカナ 한국어 텍스트 一丁 㐀㐁 𠀀𠀁 𪜀 𫝀 𫠠 𬺰 豈更 丽丸 〇〡",
    "ab中cd 中ab 𠀀x 丽y ｶﾀｶﾅ ㄅㄆ ꀀ 〆 々 〜",
    # control, format and odd whitespace characters
    "a\x00b\x01c\x7fd\x85e\x9ff g\u200bh\u200ci\u200dj\u2060k\ufeffl m\u00adn o\u061cp q\u202er",
    "tab\there new\nline cr\rlf\r\n vt\x0bff\x0c fs\x1cgs\x1drs\x1eus\x1f nbsp\u00a0em\u2003ideo\u3000ls\u2028ps\u2029",
    "\ufffd replacement\ufffdchar \U000e0001tag\U000e0041 \u180emongol \u2066iso\u2069",
    # emoji, symbols, private use, unassigned, surrogates
    "👍🏽 👨‍👩‍👧 🇫🇷 ❤️ ☃ 🀄 ©® ™ € £ ¥ ₹ ‰ † ‡ • … ‽ ⁂ ⸘ ⸻ 〰 ﹏",
    "pua \ue000 ab\uf8ffcd \U000f0000 \U0010fffd x\ue000 \ue000x",
    "unassigned \u0378 a\u0378b \U000e0080 \u2fff \U0002fffe",
    "surrogate \ud800 a\udc00b \udfff",
    "combining alone \u0301 \u0301\u0302 a\u0301\u0302\u0303 e\u20dd \u0e31 \u093e \u0dd9 \u0dda",
    "中\u0301文 \u0301中 a\u0316中\u0301b Σ\u0301 \ue000\u0301 中\ue000 ΑΣ中 ΑΣ\u3000Β ΑΣ\u2028",
    # text that looks like special tokens is ordinary text in the original
    "[SEP] [MASK] [unused3] [CLS]x[PAD] [UNK] [unused993] [[SEP]] [sep] ##ing ## # [ ]",
    # punctuation: Unicode P* and ASCII symbols that are not P*
    "$5+3=8^2 `code` a|b~c <tag> 'quote' \"dq\" «guillemets» „low“ ‹x› ¿qué? ¡sí! a—b a–b a‐b a·b ・",
    # words near the 200-character limit
    "a" * 99 + " " + "b" * 100 + " " + "c" * 101 + " " + "d" * 199 + " " + "e" * 200 + " " + "f" * 201,
    "the" * 66 + " " + "the" * 67 + " " + "un" + "want" * 49 + " " + "x" + "é" * 199 + " " + "ΟΔΟΣ" * 50,
    "Ab" * 100 + "." + "ab" * 101,
    # ASCII only (the no-normalizer path), with and without the control characters it must not take
    "Hello, World! It's U.S.A. e.g. ABC-def_ghi [SEP] x@y.com 3.14 MiXeD CaSe\tTab\r\nCRLF",
    "vt\x0bff\x0cdel\x7fnul\x00soh\x01us\x1f Word\x0bWORD",
    # empty and whitespace-only texts
    "", " ", "\n", "\t \r\n", "\u3000\u00a0\u2028", "\x00\x01\u200b", "\ufffd",
]


def stress_set() -> list[str]:
    rng = random.Random(20261129)
    pools = [
        [chr(c) for c in range(32, 127)],
        [chr(c) for c in range(0xA0, 0x250)] + list("ΣσςΑΒΓΔΟΦ"),
        list("中文字漢日本語한국어ひらがなカタカナ𠀀㐀豈"),
        ["\u0301", "\u0308", "\u093e", "\u0dd9", "\u200b", "\x00", "\x85", "\ue000", "\ud800", "\u0378",
         "\ufffd", "\u3000", "\u2028", "\t", "\n", "\r", "Σ", "İ", "ﬁ", "👍🏽"],
    ]
    texts = list(STRESS)
    for _ in range(1500):
        n = rng.randint(1, 40)
        texts.append("".join(rng.choice(rng.choice(pools)) for _ in range(n)))
    for _ in range(300):  # any code point at all
        texts.append("".join(chr(rng.randrange(sys.maxunicode + 1)) for _ in range(rng.randint(1, 12))))
    return texts


@lru_cache(maxsize=4)
def stress_vocab(do_lower_case: bool) -> tuple[str, ...]:
    tokens = build_vocab(stress_set(), do_lower_case, n_words=400, char_share=0.9)
    # Some pieces a PUA-aware vocab could hold: the original then covers words with them.
    return tuple(tokens + [t for t in ("\ue001", "##\ue001") if t not in tokens])


def mismatches(tokenizer: BertTokenizer, reference: ReferenceTokenizer, texts: list[str]) -> list[tuple]:
    ours = tokenizer.encode_batch_ids(texts)
    bad = []
    for text, ids in zip(texts, ours, strict=True):
        expected = reference.encode(text)
        if ids.tolist() != expected:
            bad.append((text[:80], reference.tokenize(text)[:12], tokenizer.convert_ids_to_tokens(ids[:12])))
    return bad


@pytest.mark.parametrize("do_lower_case", MODES)
def test_stress_set_has_zero_mismatches(do_lower_case):
    tokens = stress_vocab(do_lower_case)
    tokenizer = BertTokenizer(Vocab.from_tokens(tokens), do_lower_case)
    texts = stress_set()
    assert mismatches(tokenizer, ReferenceTokenizer(tokens, do_lower_case), texts) == []
    # The set exercises both paths, and real word pieces (not only [UNK]).
    exact = sum(tokenizer.needs_exact_path(t) for t in texts)
    assert 0 < exact < len(texts)
    pieces = tokenizer.tokenize(STRESS[0] + " " + STRESS[3])
    assert any(p.startswith("##") for p in pieces) and pieces.count("[UNK]") < len(pieces) / 2


def test_each_measured_difference_is_fixed():
    """The four causes in MEASUREMENTS.md: stock tokenizers differs from the original, we do not."""
    from tokenizers import BertWordPieceTokenizer

    base = google_reserved() + list("abcdefghijklmnopqrstuvwxyz[]σςοδ") + ["##" + c for c in "abcdefghijklmnopqrstuvwxyzσςοδ"]
    cases = [
        ("x" * 150, True),                       # 101-200 characters: pieces, not [UNK]
        ("a [SEP] b [MASK] [unused3] c", False),  # literal special-token text
        ("ΟΔΟΣ", True),                          # final sigma when lowercasing
        ("ab\ue000cd ef", True),                 # private use: the word becomes [UNK]
    ]
    for text, do_lower_case in cases:
        tokens = base + [t for t in ("SEP", "MASK", "unused3", "##3") if not do_lower_case]
        vocab = Vocab.from_tokens(tokens)
        expected = ReferenceTokenizer(tokens, do_lower_case).tokenize(text)
        stock = BertWordPieceTokenizer(vocab.vocab_dict, lowercase=do_lower_case)
        assert stock.encode(text, add_special_tokens=False).tokens != expected, text
        assert BertTokenizer(vocab, do_lower_case).tokenize(text) == expected, text


@pytest.mark.parametrize("do_lower_case", MODES)
def test_every_bmp_code_point_between_letters(do_lower_case):
    tokens = stress_vocab(do_lower_case)
    tokenizer = BertTokenizer(Vocab.from_tokens(tokens), do_lower_case)
    reference = ReferenceTokenizer(tokens, do_lower_case)
    texts = ["".join(f"a{chr(cp)}b{chr(cp)} " for cp in range(lo, min(lo + 64, 0x10000)))
             for lo in range(0, 0x10000, 64)]
    assert mismatches(tokenizer, reference, texts) == []


@pytest.mark.integration
@pytest.mark.parametrize("do_lower_case", MODES)
def test_every_assigned_code_point_between_letters(do_lower_case):
    tokens = stress_vocab(do_lower_case)
    tokenizer = BertTokenizer(Vocab.from_tokens(tokens), do_lower_case)
    reference = ReferenceTokenizer(tokens, do_lower_case)
    # Every assigned non-BMP code point, and every 61st unassigned or private-use one (the shipped
    # divergence table covers all of them: a sample of it is checked against a fresh scan below,
    # all of it by `make bench`).
    cps = [cp for cp in range(0x10000, sys.maxunicode + 1)
           if cp % 61 == 0 or unicodedata.category(chr(cp)) not in ("Cn", "Co")]
    texts = ["".join(f"a{chr(cp)}b{chr(cp)} " for cp in cps[i:i + 256]) for i in range(0, len(cps), 256)]
    assert mismatches(tokenizer, reference, texts) == []


@pytest.mark.parametrize("do_lower_case", MODES)
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(texts=st.lists(st.text(st.characters(codec=None, exclude_categories=()), max_size=30), min_size=1, max_size=8))
def test_random_unicode_text(do_lower_case, texts):
    tokens = stress_vocab(do_lower_case)
    tokenizer = _cached_tokenizer(tokens, do_lower_case)
    assert mismatches(tokenizer, ReferenceTokenizer(tokens, do_lower_case), texts) == []


@lru_cache(maxsize=4)
def _cached_tokenizer(tokens: tuple[str, ...], do_lower_case: bool) -> BertTokenizer:
    return BertTokenizer(Vocab.from_tokens(tokens), do_lower_case)


# ----------------------------------------------------------------- real corpora


def check_corpus(root, corpus: str, do_lower_case: bool, limit: int | None) -> None:
    texts = corpus_texts(root, corpus, limit)
    tokens = build_vocab(texts[:4000], do_lower_case)
    tokenizer = BertTokenizer(Vocab.from_tokens(tokens), do_lower_case)
    reference = ReferenceTokenizer(tokens, do_lower_case)
    bad = mismatches(tokenizer, reference, texts)
    assert bad == [], f"{corpus}: {len(bad)} of {len(texts)} texts differ, e.g. {bad[:2]}"
    # the vocab is realistic: most tokens are real pieces
    sample = tokenizer.encode_batch_ids(texts[:200])
    n = sum(len(ids) for ids in sample)
    unk = sum(int((ids == tokenizer.vocab.unk_id).sum()) for ids in sample)
    assert n > 0 and unk < 0.2 * n


@pytest.mark.parametrize("corpus", sorted(CORPUS_FILES))
@pytest.mark.parametrize("do_lower_case", MODES)
def test_corpus_sample_has_zero_mismatches(shared_corpora, corpus, do_lower_case):
    check_corpus(shared_corpora, corpus, do_lower_case, SAMPLE_BYTES)


@pytest.mark.integration
@pytest.mark.parametrize("corpus", sorted(CORPUS_FILES))
@pytest.mark.parametrize("do_lower_case", MODES)
def test_large_corpus_sample_has_zero_mismatches(shared_corpora, corpus, do_lower_case):
    check_corpus(shared_corpora, corpus, do_lower_case, INTEGRATION_BYTES)


# ----------------------------------------------------------------- the tokenizer object

def test_pickle_ships_tokens_not_the_rust_object():
    tokens = stress_vocab(True)
    tokenizer = BertTokenizer(Vocab.from_tokens(tokens, path="x/vocab.txt"), True)
    data = pickle.dumps(tokenizer)
    assert len(data) < 1.5 * len(tokenizer.vocab.to_bytes()) + 2000
    clone = pickle.loads(data)
    assert clone.vocab == tokenizer.vocab and clone.vocab.sha256 == tokenizer.vocab.sha256
    texts = STRESS[:6]
    assert [a.tolist() for a in clone.encode_batch_ids(texts)] == [a.tolist() for a in tokenizer.encode_batch_ids(texts)]


def test_encode_batch_ids_shapes_and_dtype():
    tokens = stress_vocab(True)
    tokenizer = BertTokenizer(Vocab.from_tokens(tokens), True)
    out = tokenizer.encode_batch_ids(["", "   ", "hello world", "ΟΔΟΣ", "[SEP]"])
    assert [a.dtype.name for a in out] == ["int32"] * 5
    assert out[0].size == 0 and out[1].size == 0
    assert tokenizer.vocab.cls_id not in out[2] and tokenizer.vocab.sep_id not in out[4]
    assert tokenizer.encode_batch_ids([]) == []


def test_plain_ascii_text_skips_the_normalizer_and_controls_do_not(monkeypatch):
    tokenizer = BertTokenizer(Vocab.from_tokens(stress_vocab(True)), True)
    calls: list[list[str]] = []
    real = tokenizer._full.encode_batch_fast

    class Spy:
        def __getattr__(self, name):
            return getattr(tokenizer_full, name)

        def encode_batch_fast(self, texts, **kw):
            calls.append(list(texts))
            return real(texts, **kw)

    tokenizer_full = tokenizer._full
    monkeypatch.setattr(tokenizer, "_full", Spy())
    tokenizer.encode_batch_ids(["Plain ASCII, Mixed Case.", "del\x7fhere", "naïve"])
    assert calls == [["del\x7fhere", "naïve"]]


def test_basic_tokenize_matches_reference_words():
    for do_lower_case in (True, False):
        tokenizer = BertTokenizer(Vocab.from_tokens(stress_vocab(do_lower_case)), do_lower_case)
        for text in STRESS:
            words = tokenizer.basic_tokenize(text)
            expected = basic_words(text, do_lower_case)
            if "\ud800" <= max(text, default="a") and any(0xD800 <= ord(c) <= 0xDFFF for c in text):
                continue  # words with lone surrogates: compared through ids in the stress test
            assert words == expected, text


def test_shipped_divergence_table_is_for_these_versions():
    """A stale table still works (it is recomputed), but costs seconds per process: regenerate it
    with `python -m bert_datagen.vocab.divergence` after upgrading tokenizers or Python."""
    import json

    table = json.loads(divergence.TABLE_PATH.read_text())
    assert {k: table[k] for k in divergence.versions()} == divergence.versions()


def covered(ranges, cps) -> set[int]:
    """The code points of `cps` inside any of the inclusive `ranges`."""
    mask = np.zeros(sys.maxunicode + 1, dtype=bool)
    for lo, hi in ranges:
        mask[lo:hi + 1] = True
    return {cp for cp in cps if mask[cp]}


@pytest.mark.integration
def test_shipped_divergence_table_matches_a_fresh_scan_of_a_sample():
    """Every 13th code point and both sides of every edge of the shipped ranges, probed afresh (the
    whole scan takes about 20 s; `make bench` compares all of it: benchmarks/bench_vocab.py)."""
    shipped = divergence._table()
    lo_sur, hi_sur = SURROGATES
    for mode, do_lower_case in (("uncased", True), ("cased", False)):
        edges = {cp for lo, hi in shipped[mode] for cp in (lo - 1, lo, hi, hi + 1)}
        probe = sorted(cp for cp in edges.union(range(0, sys.maxunicode + 1, 13))
                       if 0 <= cp <= sys.maxunicode and not lo_sur <= cp <= hi_sur and cp != divergence.CAPITAL_SIGMA)
        assert len(probe) > 80_000
        found = covered(divergence.scan(do_lower_case, probe), probe)
        assert found == covered(shipped[mode], probe), mode
        assert found  # the sample reaches divergent characters, not only agreeing ones


def test_stale_divergence_table_is_recomputed_with_a_warning(monkeypatch, caplog):
    fresh = {"uncased": [[0xE000, 0xE000]], "cased": []}
    monkeypatch.setattr(divergence, "versions", lambda: {"tokenizers": "0.0.0", "unicodedata": "1.0"})
    monkeypatch.setattr(divergence, "compute_table", lambda: fresh)
    divergence._table.cache_clear()
    try:
        with caplog.at_level("WARNING", logger="bert_datagen.vocab.divergence"):
            assert divergence._table() is fresh
        assert "rescanning every code point" in caplog.text
    finally:
        divergence._table.cache_clear()


def test_batch_flags_equal_single_text_checks():
    for do_lower_case in (True, False):
        tokenizer = BertTokenizer(Vocab.from_tokens(stress_vocab(do_lower_case)), do_lower_case)
        texts = stress_set()[:400]
        flags = tokenizer.basic.exact_path_flags(texts)
        assert flags.tolist() == [tokenizer.needs_exact_path(t) for t in texts]
        assert flags.any() and not flags.all()
