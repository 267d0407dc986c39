"""Tokenized documents: one tokenizer call per batch, dropped sentences/documents, content identity."""

from __future__ import annotations

import numpy as np

from bert_datagen.datagen.config import DatagenConfig
from bert_datagen.datagen.documents import TokenizedDocument, document_id, tokenize_documents
from bert_datagen.datagen.readers import RawDocument, read_documents
from tests.support.datagen_fakes import FakeTokenizer


class SilentTokenizer(FakeTokenizer):
    """Like FakeTokenizer, but text made of "~" yields no tokens (as control characters do for BERT)."""

    def encode_ids(self, text: str) -> np.ndarray:
        return super().encode_ids(text.replace("~", " "))


def test_one_batch_call_and_packed_sentences():
    tok = SilentTokenizer()
    raws = [
        RawDocument("a", 0, paragraphs=["One sentence here. Another one!", "A second paragraph."]),
        RawDocument("a", 1, paragraphs=["~~~", "~ ~"]),
        RawDocument("a", 2, paragraphs=["Only ~~~. This one stays."]),
    ]
    stats: dict[str, int] = {}
    docs = tokenize_documents(raws, tok, DatagenConfig(), stats)
    assert tok.calls == 1
    assert len(docs) == 2
    first = docs[0]
    assert first.num_sentences == 3 and first.tokens.dtype == np.int32 and first.sentence_ends.dtype == np.int32
    assert np.array_equal(first.sentence(0), tok.encode_ids("One sentence here."))
    assert np.array_equal(first.sentence(2), tok.encode_ids("A second paragraph."))
    assert int(first.sentence_ends[-1]) == first.tokens.shape[0]
    assert docs[1].num_sentences == 2  # "Only ~~~." keeps the word "only"
    assert stats == {"documents": 2, "sentences": 5, "tokens": int(sum(d.tokens.shape[0] for d in docs)),
                     "dropped_documents": 1}


def test_sentence_without_tokens_is_dropped():
    docs = tokenize_documents([RawDocument("s", 0, sentences=["Hello there.", "~~", "Bye."])], SilentTokenizer(),
                              DatagenConfig(input_format="sentences"), {})
    assert docs[0].num_sentences == 2


def test_identity_is_content_only():
    tok = FakeTokenizer()
    as_paragraphs = RawDocument("x.txt", 5, paragraphs=["First one.  Second   one."])
    as_sentences = RawDocument("y.txt", 0, sentences=["First one.", "Second one."])
    a = tokenize_documents([as_paragraphs], tok, DatagenConfig(), {})[0]
    b = tokenize_documents([as_sentences], tok, DatagenConfig(input_format="sentences"), {})[0]
    assert a.doc_id == b.doc_id == document_id(["First one.", "Second one."])
    assert document_id(["First one.", "Second one"]) != a.doc_id
    assert 0 <= a.doc_id < 2**64


def test_identity_survives_file_splitting_and_order():
    text = "\n\n".join(f"Document number {i}. It has two sentences." for i in range(6)).encode()
    halves = [text[: text.index(b"Document number 3")], text[text.index(b"Document number 3") :]]
    config = DatagenConfig()

    def ids(files):
        raws = [r for name, data in files for r in read_documents(name, data, config, {})]
        return sorted(d.doc_id for d in tokenize_documents(raws, FakeTokenizer(), config, {}))

    assert ids([("all.txt", text)]) == ids([("b.txt", halves[1]), ("a.txt", halves[0])])


def test_real_bert_tokenizer_fits():
    from bert_datagen.vocab.tokenizer import BertTokenizer
    from bert_datagen.vocab.vocab_file import Vocab

    tokens = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "hello", "world", "##s", ".", "the"]
    tok = BertTokenizer(Vocab.from_tokens(tokens), do_lower_case=True)
    docs = tokenize_documents([RawDocument("r", 0, paragraphs=["Hello worlds. The world."])], tok, DatagenConfig(), {})
    assert isinstance(docs[0], TokenizedDocument)
    assert docs[0].tokens.tolist() == [5, 6, 7, 8, 9, 6, 8]
    assert docs[0].sentence_ends.tolist() == [4, 7]
