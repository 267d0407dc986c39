"""Vocabulary training: Google's layout, the tokenizer's own cleaning, bytes independent of threads."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys

import pytest

from bert_datagen.contract.fs import LOCAL_FS
from bert_datagen.contract.vocab_io import load_vocab, write_vocab
from bert_datagen.vocab.tokenizer import BertTokenizer
from bert_datagen.vocab.train import reserved_tokens, resolve_layout, train_vocab
from bert_datagen.vocab.vocab_file import Vocab, VocabError
from tests.support.vocab_reference import ReferenceTokenizer, basic_words, google_reserved

TEXTS = [
    "The quick brown fox jumps over the lazy dog. Dogs and foxes are running, jumping and playing.",
    "Unwanted, unaffable, unbelievable: UNDERSTANDING understood understands!",
    "ΟΔΟΣ ΣΟΦΟΣ ΟΔΟΣ Café CAFÉ naïve résumé résumés",
    "中文字符，漢字。中文 [SEP] [MASK] text \ue000pua",
] * 50


def test_google_layout_from_training():
    tokens = train_vocab(TEXTS * 10, vocab_size=1200, do_lower_case=True, layout="google", min_frequency=1)
    assert tokens[:1103 - 104 + 104][:104] == google_reserved()[:104]
    assert tokens[:999] == google_reserved()
    vocab = Vocab.from_tokens(tokens)
    assert (vocab.pad_id, vocab.unk_id, vocab.cls_id, vocab.sep_id, vocab.mask_id) == (0, 100, 101, 102, 103)
    learned = tokens[999:]
    assert learned and len(tokens) <= 1200
    assert not any(t.startswith("[unused") for t in learned)


def test_auto_layout_and_compact():
    assert resolve_layout("auto", 30522, 994) == ("google", 994)
    assert resolve_layout("auto", 1998, 994) == ("compact", 0)
    assert resolve_layout("auto", 1999, 994) == ("google", 994)
    assert resolve_layout("auto", 30522, 50) == ("compact", 0)
    assert resolve_layout("compact", 500, 3) == ("compact", 3)
    assert reserved_tokens("compact", 2) == ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "[unused0]", "[unused1]"]
    tokens = train_vocab(TEXTS, vocab_size=300, do_lower_case=True, min_frequency=1)
    assert tokens[:5] == ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    assert not any(t.startswith("[unused") for t in tokens)
    with pytest.raises(VocabError, match="at least 99 unused"):
        resolve_layout("google", 30522, 10)
    with pytest.raises(VocabError, match="leaves no room"):
        train_vocab(TEXTS, vocab_size=999, do_lower_case=True, layout="google")
    with pytest.raises(VocabError, match="smaller than the 5 reserved tokens plus"):
        train_vocab(TEXTS, vocab_size=20, do_lower_case=True)


@pytest.mark.parametrize("do_lower_case", [True, False])
def test_learns_from_the_tokenizers_own_words(do_lower_case):
    tokens = train_vocab(TEXTS, vocab_size=400, do_lower_case=do_lower_case, min_frequency=1, limit_alphabet=10_000)
    words = {w for t in TEXTS for w in basic_words(t, do_lower_case)}
    chars = {c for w in words for c in w}
    singles = {t for t in tokens[5:] if len(t) == 1}
    assert singles == chars  # exactly the characters the tokenizer will see, no more, no less
    assert {t for t in tokens if t.startswith("##") and len(t) == 3} == {"##" + c for c in chars}
    if do_lower_case:
        assert "ς" in singles and "é" not in singles and "\ue000" in singles  # final sigma; accents; PUA kept
    else:
        assert "É" in singles and "Σ" in singles
    # every word of the corpus is covered without [UNK]
    tokenizer = BertTokenizer(Vocab.from_tokens(tokens), do_lower_case)
    reference = ReferenceTokenizer(tokens, do_lower_case)
    for text in TEXTS[:4]:
        pieces = tokenizer.tokenize(text)
        assert pieces == reference.tokenize(text) and "[UNK]" not in pieces
    assert any(len(t) > 3 and not t.startswith("[") for t in tokens)  # merges were learned


def test_limit_alphabet_keeps_most_frequent_chars_and_ties_by_code_point():
    texts = ["aaaa bbbb cccc dd ee ff q"] * 3
    tokens = train_vocab(texts, vocab_size=50, do_lower_case=True, min_frequency=1, limit_alphabet=4)
    assert tokens[5:13] == ["a", "b", "c", "d", "##a", "##b", "##c", "##d"]  # d, e, f tie: lowest code point wins
    assert not any("q" in t or "e" in t for t in tokens[5:])


def test_write_vocab_atomic_and_loadable(tmp_path):
    tokens = train_vocab(TEXTS, vocab_size=300, do_lower_case=True, min_frequency=1)
    path = str(tmp_path / "out" / "vocab.txt")
    vocab = write_vocab(tokens, path, LOCAL_FS)
    loaded = load_vocab(path, LOCAL_FS)
    assert loaded.tokens == tuple(tokens) and loaded.sha256 == vocab.sha256
    assert [p.name for p in (tmp_path / "out").iterdir()] == ["vocab.txt"]  # no temp file left behind


_TRAIN_SNIPPET = """
import hashlib, json, sys
from pathlib import Path
from bert_datagen.vocab.train import train_vocab
texts = Path(sys.argv[1]).read_text(encoding="utf-8").split("\\n")
tokens = train_vocab(texts, vocab_size=int(sys.argv[2]), do_lower_case=sys.argv[3] == "1")
print(json.dumps(hashlib.sha256(("\\n".join(tokens) + "\\n").encode()).hexdigest()))
"""


def _train_in_subprocess(corpus_path, vocab_size: int, do_lower_case: bool, threads: int) -> str:
    env = dict(os.environ, RAYON_NUM_THREADS=str(threads), TOKENIZERS_PARALLELISM="true")
    out = subprocess.run([sys.executable, "-c", _TRAIN_SNIPPET, str(corpus_path), str(vocab_size),
                          "1" if do_lower_case else "0"], env=env, capture_output=True, text=True,
                         timeout=300, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_same_bytes_with_one_and_two_threads(shared_corpora, tmp_path):
    """The stock WordPieceTrainer fails this (different token sets from run to run)."""
    parts = []
    for rel, limit in (("gutenberg_en/pg1342.txt", 400_000), ("zhwiki_sample/wiki_00", 150_000),
                       ("gutenberg_fr/Candide.txt", 150_000)):
        parts.append((shared_corpora / rel).read_bytes()[:limit].decode("utf-8", errors="ignore"))
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(parts), encoding="utf-8")
    one = _train_in_subprocess(corpus, 4000, True, threads=1)
    two = _train_in_subprocess(corpus, 4000, True, threads=2)
    again = _train_in_subprocess(corpus, 4000, True, threads=2)
    assert one == two == again
    in_process = train_vocab(corpus.read_text(encoding="utf-8").split("\n"), vocab_size=4000, do_lower_case=True)
    assert hashlib.sha256(("\n".join(in_process) + "\n").encode()).hexdigest() == one


# sha256 of the vocab bytes ("\n"-joined tokens) these English/mixed inputs gave before characters of
# unspaced scripts were kept beside the alphabet: spaced-script vocabularies must not change.
GOLDEN_VOCABS = {
    "texts-google": "5f60d3959d26677e333272873f2c1da154d3808e0e047678e3ab9064610d4fc0",
    "texts-cased": "01b09a9f280b84d7127a66fb126e1f36abc8aa4cc75e688c1607d7dfdd7ac6d1",
    "wikitext2": "9f389ef90b7508caf33fda0a35e73876b01e7fd3a29a6dd3426d1db97ee729d4",
}


def _sha(tokens):
    return hashlib.sha256(("\n".join(tokens) + "\n").encode()).hexdigest()


def test_english_vocab_bytes_unchanged(shared_corpora):
    assert _sha(train_vocab(TEXTS, vocab_size=1200, do_lower_case=True, layout="google",
                            min_frequency=1)) == GOLDEN_VOCABS["texts-google"]
    assert _sha(train_vocab(TEXTS, vocab_size=400, do_lower_case=False, min_frequency=1)) == GOLDEN_VOCABS["texts-cased"]
    text = (shared_corpora / "wikitext2_raw/wiki.valid.raw").read_text(encoding="utf-8")[:300_000]
    assert _sha(train_vocab(text.split("\n"), vocab_size=3000, do_lower_case=True)) == GOLDEN_VOCABS["wikitext2"]


def test_unspaced_script_characters_are_kept_beyond_the_alphabet_limit():
    han = [chr(0x4E00 + i) for i in range(40)]
    texts = ["abc abd abe " + " ".join(han) + " かなかな ไทย", *han[:30], "丑丑 龥"]
    tokens = train_vocab(texts, vocab_size=400, do_lower_case=True, min_frequency=2, limit_alphabet=8)
    # Seen twice or more: kept, however low the limit; seen once (龥): [UNK] as before.
    assert all(ch in tokens for ch in han[:30]) and "龥" not in tokens
    assert not any(ch in tokens for ch in han[30:])
    # A CJK ideograph is always its own word: no "##" form for one kept as a script character (the
    # 8 of the limited alphabet keep both forms, as always)...
    assert sum(f"##{ch}" in tokens for ch in han) <= 8
    # ...kana continue words, so they get both forms (and seen once, ไทย is not kept).
    assert "か" in tokens and "##な" in tokens and "ไ" not in tokens


def test_google_chinese_layout_is_character_level():
    texts = ["中文字符，漢字。中文 text texts 中文", "数学是研究数量的学科 mathematics"] * 5
    tokens = train_vocab(texts, vocab_size=300, do_lower_case=True, layout="google-chinese", min_frequency=2)
    assert tokens[:106] == ["[PAD]", *(f"[unused{i}]" for i in range(1, 100)), "[UNK]", "[CLS]", "[SEP]",
                            "[MASK]", "<S>", "<T>"]
    vocab = Vocab.from_tokens(tokens)
    assert (vocab.pad_id, vocab.unk_id, vocab.cls_id, vocab.sep_id, vocab.mask_id) == (0, 100, 101, 102, 103)
    cjk = [t for t in tokens[106:] if any("\u4e00" <= c <= "\u9fff" for c in t)]
    assert cjk and all(len(t) == 1 for t in cjk)  # one ideograph per token, never "##" or merged
    assert "text" in tokens  # Latin words still get learned pieces
    tok = BertTokenizer(vocab)
    assert tok.tokenize("数学文字") == ["数", "学", "文", "字"]
