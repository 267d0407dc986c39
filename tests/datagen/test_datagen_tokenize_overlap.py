"""tokenize_document_batches: the next batch is read and split while the tokenizer encodes this one,
and the documents and counts are those of tokenize_documents, batch by batch."""

from __future__ import annotations

import itertools
import string
import threading
from collections.abc import Iterator, Sequence

import numpy as np
import pytest

from bert_datagen.datagen.config import DatagenConfig
from bert_datagen.datagen.documents import TokenizedDocument, tokenize_document_batches, tokenize_documents
from bert_datagen.datagen.readers import RawDocument, read_documents
from bert_datagen.vocab.tokenizer import BertTokenizer
from bert_datagen.vocab.vocab_file import SPECIAL_TOKENS, Vocab


@pytest.fixture(scope="module")
def tokenizer() -> BertTokenizer:
    # Characters and a few words: WordPiece finds real pieces in any English text.
    chars = string.ascii_lowercase + string.digits + string.punctuation
    words = "the of and in to was is for on as by with he that at from his it an were are".split()
    vocab = Vocab.from_tokens([*SPECIAL_TOKENS, *chars, *(f"##{c}" for c in chars), *words, "##ed"])
    return BertTokenizer(vocab)


def _batches(raws: list[RawDocument], size: int) -> list[list[RawDocument]]:
    return [raws[i : i + size] for i in range(0, len(raws), size)]


def _same(a: list[TokenizedDocument], b: list[TokenizedDocument]) -> bool:
    return len(a) == len(b) and all(
        x.doc_id == y.doc_id and np.array_equal(x.tokens, y.tokens) and np.array_equal(x.sentence_ends, y.sentence_ends)
        for x, y in zip(a, b, strict=True))


@pytest.mark.parametrize("overlap", [True, False])
def test_same_documents_and_counts_as_batch_by_batch(shared_corpora, tokenizer, overlap):
    path = shared_corpora / "enwiki_extract_2015" / "wiki_00"
    config = DatagenConfig(input_format="wikiextractor")
    raws = list(read_documents(str(path), path.read_bytes(), config, {}))
    # An empty document and one whose only sentence has no tokens: dropped and counted alike.
    raws[3:3] = [RawDocument("x", 0, paragraphs=[]), RawDocument("x", 1, paragraphs=["\x07"])]
    expected_stats: dict[str, int] = {}
    expected = [tokenize_documents(b, tokenizer, config, expected_stats) for b in _batches(raws, 7)]
    stats: dict[str, int] = {}
    got = list(tokenize_document_batches(iter(_batches(raws, 7)), tokenizer, config, stats, overlap=overlap))
    assert len(got) == len(expected) > 3
    assert all(_same(a, b) for a, b in zip(got, expected, strict=True))
    assert stats == expected_stats and stats["dropped_documents"] == 2


class _WaitsForNextBatch:
    """The real tokenizer, whose encoding of a batch waits until the batch after it has been taken
    from the input: it finishes at once only if encoding runs while the next batch is read."""

    def __init__(self, tokenizer: BertTokenizer) -> None:
        self.tokenizer = tokenizer
        self.taken = [threading.Event() for _ in range(64)]
        self.overlapped: list[bool] = []
        self.calls = 0

    def batches(self, batches: list[list[RawDocument]]) -> Iterator[list[RawDocument]]:
        for k, batch in enumerate(batches):
            self.taken[k].set()
            yield batch

    def encode_batch_ids(self, texts: Sequence[str]) -> list[np.ndarray]:
        k, self.calls = self.calls, self.calls + 1
        last = k == self.last
        self.overlapped.append(last or self.taken[k + 1].wait(timeout=0.5 if self.expect_serial else 30))
        return self.tokenizer.encode_batch_ids(texts)


def test_next_batch_is_read_while_this_one_is_encoded(tokenizer):
    config = DatagenConfig()
    raws = [RawDocument("d", i, paragraphs=[f"Document {i} is here. It has {i} words in all."]) for i in range(20)]
    for overlap in (True, False):
        slow = _WaitsForNextBatch(tokenizer)
        slow.last, slow.expect_serial = 3, not overlap
        out = list(itertools.chain.from_iterable(
            tokenize_document_batches(slow.batches(_batches(raws, 5)), slow, config, {}, overlap=overlap)))
        assert _same(out, tokenize_documents(raws, tokenizer, config, {}))
        # Overlapped, every encoding but the last ran while the next batch was taken; in turn, none did.
        assert slow.overlapped == ([True] * 4 if overlap else [False, False, False, True])
