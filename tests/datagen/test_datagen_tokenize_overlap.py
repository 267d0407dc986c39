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
    """The real tokenizer in its three steps, whose Rust step for a batch waits until the batch after
    it has been taken from the input: it finishes at once only if encoding runs while the next
    batch is read. Records the thread of every step."""

    def __init__(self, tokenizer: BertTokenizer, last: int, expect_serial: bool) -> None:
        self.tokenizer, self.last, self.expect_serial = tokenizer, last, expect_serial
        self.taken = [threading.Event() for _ in range(64)]
        self.overlapped: list[bool] = []
        self.threads: dict[str, set[str]] = {"start": set(), "run": set(), "finish": set()}
        self.calls = 0

    def batches(self, batches: list[list[RawDocument]]) -> Iterator[list[RawDocument]]:
        for k, batch in enumerate(batches):
            self.taken[k].set()
            yield batch

    def encode_batch_ids(self, texts: Sequence[str]) -> list[np.ndarray]:
        batch = self.start_batch(texts)
        return self.finish_batch(batch, self.run_batch(batch))

    def start_batch(self, texts: Sequence[str]):
        self.threads["start"].add(threading.current_thread().name)
        return self.tokenizer.start_batch(texts)

    def run_batch(self, batch):
        self.threads["run"].add(threading.current_thread().name)
        k, self.calls = self.calls, self.calls + 1
        self.overlapped.append(k == self.last or self.taken[k + 1].wait(timeout=0.5 if self.expect_serial else 30))
        return self.tokenizer.run_batch(batch)

    def finish_batch(self, batch, encodings) -> list[np.ndarray]:
        self.threads["finish"].add(threading.current_thread().name)
        return self.tokenizer.finish_batch(batch, encodings)


def test_next_batch_is_read_while_this_one_is_encoded(tokenizer):
    config = DatagenConfig()
    raws = [RawDocument("d", i, paragraphs=[f"Document {i} is here. It has {i} words in all."]) for i in range(20)]
    here = threading.current_thread().name
    for overlap in (True, False):
        slow = _WaitsForNextBatch(tokenizer, last=3, expect_serial=not overlap)
        out = list(itertools.chain.from_iterable(
            tokenize_document_batches(slow.batches(_batches(raws, 5)), slow, config, {}, overlap=overlap)))
        assert _same(out, tokenize_documents(raws, tokenizer, config, {}))
        # Overlapped, every encoding but the last ran while the next batch was taken; in turn, none did.
        assert slow.overlapped == ([True] * 4 if overlap else [False, False, False, True])
        # Only the Rust step leaves this thread: the Python steps never contend for the GIL with it.
        assert slow.threads["start"] == slow.threads["finish"] == {here}
        assert (slow.threads["run"] != {here}) == overlap


def test_staged_steps_give_encode_batch_ids(tokenizer):
    texts = ["Plain ASCII text.", "Café au lait, naïve.", "\ue000 private use", "ΣΊΣΥΦΟΣ", "", "tab\there\x07"]
    batch = tokenizer.start_batch(texts)
    staged = tokenizer.finish_batch(batch, tokenizer.run_batch(batch))
    assert [a.tolist() for a in staged] == [tokenizer.encode_ids(t).tolist() for t in texts]
    assert len({call[0] for call in batch.calls}) == 3  # the plain, full and exact paths all taken
