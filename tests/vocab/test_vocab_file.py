"""vocab.txt loading and validation, on vocabularies shaped like Google's released ones."""

from __future__ import annotations

import hashlib
import pickle

import numpy as np
import pytest

from bert_datagen.contract.fs import LOCAL_FS
from bert_datagen.contract.vocab_io import load_vocab
from bert_datagen.vocab.tokenizer import BertTokenizer
from bert_datagen.vocab.vocab_file import Vocab, VocabError
from tests.support.vocab_reference import ReferenceTokenizer, google_reserved

LETTERS = "abcdefghijklmnopqrstuvwxyz"


def english_uncased() -> list[str]:
    chars = list(LETTERS + "0123456789!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~") + ["é", "ß"]
    words = ["the", "of", "and", "un", "##want", "##ed", "running", "runn", "##ing", "aff", "##aff", "##able"]
    return unique(google_reserved() + chars + ["##" + c for c in LETTERS] + words)


def unique(tokens: list[str]) -> list[str]:
    return list(dict.fromkeys(tokens))


def english_cased() -> list[str]:
    # Google's cased vocab has fewer unused slots: [unused0..98] then [UNK]..[MASK], then [unused99]...
    chars = list(LETTERS + LETTERS.upper() + "0123456789.,!?'") + ["É", "é"]
    words = ["The", "the", "Paris", "Par", "##is", "##É", "##é"]
    return unique(google_reserved(100) + chars + ["##" + c for c in LETTERS] + words)


def multilingual() -> list[str]:
    chars = list(LETTERS + "中文字漢日本語한국어ひらがなカタカナαβγσςοδΣ.,") + ["é", "ñ"]
    words = ["español", "niño", "##ñ", "οδος", "##δος", "日", "한국", "##어"]
    return unique(google_reserved() + chars + ["##" + c for c in chars] + words)


def chinese() -> list[str]:
    chars = list("中文字漢日本語的一是不了人我在有他这为之大来以个中上们，。！？") + list(LETTERS)
    return unique(google_reserved(99) + chars + ["##" + c for c in chars[:20]] + ["##ing", "china"])


SHAPES = {"english_uncased": (english_uncased, True), "english_cased": (english_cased, False),
          "multilingual": (multilingual, True), "multilingual_cased": (multilingual, False),
          "chinese": (chinese, True)}

TEXTS = ["Hello, the running unaffable PARIS café! Paris Éé", "中文字 漢日本語 한국어 ひらがなカタカナ",
         "ΟΔΟΣ español NIÑO [SEP] [unused3]", "这是中文。我们在上面！China", "", " \t\n"]


def write(tmp_path, tokens, name="vocab.txt", newline="\n", trailing=True) -> str:
    path = tmp_path / name
    text = newline.join(tokens) + (newline if trailing else "")
    path.write_bytes(text.encode("utf-8"))
    return str(path)


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_load_shapes_and_tokenize_like_the_reference(tmp_path, shape):
    build, do_lower_case = SHAPES[shape]
    tokens = build()
    path = write(tmp_path, tokens)
    vocab = load_vocab(path, LOCAL_FS)
    assert vocab.tokens == tuple(tokens) and vocab.size == len(tokens) and vocab.path == path
    assert vocab.sha256 == hashlib.sha256((tmp_path / "vocab.txt").read_bytes()).hexdigest()
    assert (vocab.pad_id, vocab.cls_id, vocab.sep_id, vocab.mask_id) == (
        tokens.index("[PAD]"), tokens.index("[CLS]"), tokens.index("[SEP]"), tokens.index("[MASK]"))
    assert vocab.unk_id == 100 and vocab.token_to_id("[MASK]") == vocab.mask_id
    tokenizer = BertTokenizer(vocab, do_lower_case)
    reference = ReferenceTokenizer(tokens, do_lower_case)
    for text in TEXTS:
        assert tokenizer.tokenize(text) == reference.tokenize(text), text
    assert any(tokenizer.tokenize(t) != ["[UNK]"] * len(tokenizer.tokenize(t)) for t in TEXTS)


def test_google_layout_ids():
    vocab = Vocab.from_tokens(english_uncased())
    assert (vocab.pad_id, vocab.unk_id, vocab.cls_id, vocab.sep_id, vocab.mask_id) == (0, 100, 101, 102, 103)
    assert vocab.tokens[1] == "[unused0]" and vocab.tokens[104] == "[unused99]"
    assert vocab.token_to_id("[unused993]") == 998


def test_is_continuation_mask_and_lookups():
    vocab = Vocab.from_tokens(english_uncased())
    mask = vocab.is_continuation
    assert mask.dtype == np.bool_ and mask.shape == (vocab.size,)
    assert mask[vocab.token_to_id("##want")] and not mask[vocab.token_to_id("un")]
    assert int(mask.sum()) == sum(t.startswith("##") for t in vocab.tokens)
    assert vocab.get_id("nope") is None and vocab.get_id("nope", -1) == -1 and "the" in vocab
    with pytest.raises(KeyError, match="nope"):
        vocab.token_to_id("nope")
    assert set(vocab.special_ids.tolist()) >= {0, 100, 101, 102, 103, 1, 998}
    assert vocab.summary() == {"path": "<memory>", "size": vocab.size, "sha256": vocab.sha256}


def test_crlf_no_trailing_newline_and_bom_keep_ids(tmp_path):
    tokens = english_uncased()
    plain = load_vocab(write(tmp_path, tokens, "a.txt"), LOCAL_FS)
    crlf = load_vocab(write(tmp_path, tokens, "b.txt", newline="\r\n", trailing=False), LOCAL_FS)
    (tmp_path / "c.txt").write_bytes(b"\xef\xbb\xbf" + (tmp_path / "a.txt").read_bytes())
    bom = load_vocab(str(tmp_path / "c.txt"), LOCAL_FS)
    assert plain.tokens == crlf.tokens == bom.tokens
    assert len({plain.sha256, crlf.sha256, bom.sha256}) == 3  # the checksum is of the bytes as stored


def test_in_memory_vocab_sha_is_of_its_file_bytes(tmp_path):
    tokens = english_uncased()
    assert Vocab.from_tokens(tokens).sha256 == load_vocab(write(tmp_path, tokens), LOCAL_FS).sha256


def test_gzip_vocab_reads_through_fsio(tmp_path):
    import gzip

    tokens = english_uncased()
    path = tmp_path / "vocab.txt.gz"
    path.write_bytes(gzip.compress(("\n".join(tokens) + "\n").encode()))
    assert load_vocab(str(path), LOCAL_FS).tokens == tuple(tokens)


def test_vocab_pickles_small():
    vocab = Vocab.from_tokens(english_uncased())
    vocab.token_to_id("the")  # fills the lookup cache
    _ = vocab.is_continuation
    data = pickle.dumps(vocab)
    assert len(data) < 1.3 * len(vocab.to_bytes()) + 1000  # tokens only: no lookup tables
    clone = pickle.loads(data)
    assert clone == vocab and clone.token_to_id("the") == vocab.token_to_id("the")


def test_unpickling_does_not_check_the_tokens_again(monkeypatch):
    """A pipeline unpickles its vocab once per DoFn: the check of every token ran each time."""
    from bert_datagen.vocab import vocab_file

    vocab = Vocab.from_tokens(english_uncased())
    data = pickle.dumps(vocab)
    checked = []
    monkeypatch.setattr(vocab_file, "_validate_tokens", lambda *args, **kwargs: checked.append(args))
    clone = pickle.loads(data)
    assert checked == [] and clone == vocab and clone.sha256 == vocab.sha256 and clone.size == vocab.size


# ----------------------------------------------------------------- errors name the file and the line

@pytest.mark.parametrize("missing", ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"])
def test_missing_required_token(tmp_path, missing):
    path = write(tmp_path, [t for t in english_uncased() if t != missing])
    with pytest.raises(VocabError, match=rf"vocab\.txt: required token\(s\) \[{missing[1:-1]}\] missing"):
        load_vocab(path, LOCAL_FS)


def test_duplicate_token_names_both_lines(tmp_path):
    tokens = english_uncased()
    first = tokens.index("the") + 1
    tokens.insert(first + 5, "the")
    path = write(tmp_path, tokens)
    with pytest.raises(VocabError, match=rf"vocab\.txt: line {first + 6}: duplicate token 'the' \(first on line {first}\)"):
        load_vocab(path, LOCAL_FS)


def test_empty_line(tmp_path):
    tokens = english_uncased()
    tokens[500] = ""
    with pytest.raises(VocabError, match=r"vocab\.txt: line 501: empty line"):
        load_vocab(write(tmp_path, tokens), LOCAL_FS)
    tokens[500] = "  \t"
    with pytest.raises(VocabError, match=r"line 501: empty line"):
        load_vocab(write(tmp_path, tokens), LOCAL_FS)


def test_bad_utf8(tmp_path):
    data = ("\n".join(english_uncased()) + "\n").encode().replace(b"\nthe\n", b"\nth\xff\xfee\n")
    path = tmp_path / "vocab.txt"
    path.write_bytes(data)
    line = english_uncased().index("the") + 1
    with pytest.raises(VocabError, match=rf"vocab\.txt: line {line}: not valid UTF-8"):
        load_vocab(str(path), LOCAL_FS)


def test_empty_and_missing_files(tmp_path):
    (tmp_path / "empty.txt").write_bytes(b"")
    with pytest.raises(VocabError, match="empty.txt: the vocabulary file is empty"):
        load_vocab(str(tmp_path / "empty.txt"), LOCAL_FS)
    with pytest.raises(VocabError, match="nothere.txt: cannot read"):
        load_vocab(str(tmp_path / "nothere.txt"), LOCAL_FS)


def test_in_memory_errors():
    with pytest.raises(VocabError, match="<memory>: line 2: duplicate"):
        Vocab.from_tokens(["[PAD]", "[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"])
    with pytest.raises(VocabError, match="surrounding whitespace"):
        Vocab.from_tokens(["[PAD]", " a", "[UNK]", "[CLS]", "[SEP]", "[MASK]"])
    with pytest.raises(VocabError, match="lone surrogate"):
        Vocab.from_tokens(["[PAD]", "a\ud800", "[UNK]", "[CLS]", "[SEP]", "[MASK]"])
