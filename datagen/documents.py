"""Tokenized documents: every sentence's WordPiece ids in one array.

A document's identity (``doc_id``) is a 64-bit hash of its sentence texts
(whitespace-normalised), so it depends on content only: not on file names,
how the corpus is split into files, or the order they are read in.  Pools,
the eval split, instance keys and every random draw hang off it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from bert_datagen.datagen.config import DatagenConfig
from bert_datagen.datagen.readers import RawDocument
from bert_datagen.datagen.rng import hash64
from bert_datagen.datagen.sentences import get_splitter


class BatchTokenizer(Protocol):
    def encode_batch_ids(self, texts: Sequence[str]) -> list[np.ndarray]: ...


@dataclass
class TokenizedDocument:
    """A document's token ids, all sentences concatenated; ``sentence_ends`` are cumulative ends."""

    doc_id: int
    tokens: np.ndarray  # int32
    sentence_ends: np.ndarray  # int32, sentence i is tokens[ends[i-1]:ends[i]]

    @property
    def num_sentences(self) -> int:
        return int(self.sentence_ends.shape[0])

    @property
    def num_tokens(self) -> int:
        return int(self.tokens.shape[0])

    def sentence(self, i: int) -> np.ndarray:
        start = int(self.sentence_ends[i - 1]) if i > 0 else 0
        return self.tokens[start : int(self.sentence_ends[i])]

    def sentence_lengths(self) -> np.ndarray:
        return np.diff(self.sentence_ends, prepend=np.int32(0)).astype(np.int32)


def document_id(sentences: Sequence[str]) -> int:
    """Content identity of a document: a hash of its whitespace-normalised sentences."""
    return hash64("doc-v1", "\n".join(" ".join(s.split()) for s in sentences))


def _bump(stats: dict[str, int], key: str, n: int) -> None:
    stats[key] = stats.get(key, 0) + n


def document_sentences(raw: RawDocument, config: DatagenConfig) -> list[str]:
    """Sentences of a raw document: as given (``sentences`` format) or split from its paragraphs."""
    if raw.sentences is not None:
        return [s for s in raw.sentences if s.strip()]
    split = get_splitter(config.sentence_splitter)
    return [s for paragraph in raw.paragraphs or [] for s in split(paragraph)]


def tokenize_documents(
    raws: Sequence[RawDocument], tokenizer: BatchTokenizer, config: DatagenConfig, stats: dict[str, int]
) -> list[TokenizedDocument]:
    """Split, tokenize (one batch call for all sentences) and pack documents; token-less ones dropped."""
    per_doc = [document_sentences(raw, config) for raw in raws]
    flat = [s for sentences in per_doc for s in sentences]
    encoded = tokenizer.encode_batch_ids(flat) if flat else []
    docs: list[TokenizedDocument] = []
    at = 0
    for sentences in per_doc:
        pieces = encoded[at : at + len(sentences)]
        at += len(sentences)
        kept = [i for i, ids in enumerate(pieces) if len(ids)]
        if not kept:
            _bump(stats, "dropped_documents", 1)
            continue
        arrays = [np.asarray(pieces[i], dtype=np.int32) for i in kept]
        lengths = np.fromiter((a.shape[0] for a in arrays), dtype=np.int64, count=len(arrays))
        tokens = np.concatenate(arrays).astype(np.int32, copy=False)
        doc = TokenizedDocument(
            doc_id=document_id([sentences[i] for i in kept]),
            tokens=tokens,
            sentence_ends=np.cumsum(lengths).astype(np.int32),
        )
        docs.append(doc)
        _bump(stats, "documents", 1)
        _bump(stats, "sentences", doc.num_sentences)
        _bump(stats, "tokens", doc.num_tokens)
    return docs


def unique_documents(pool: Sequence[TokenizedDocument]) -> tuple[list[TokenizedDocument], int]:
    """The pool sorted by ``doc_id``, one document per id, and how many duplicates were dropped.

    Equal ids mean equal content (a 64-bit content hash), so which copy stays
    does not matter; ties are still broken by the token bytes, so the result
    never depends on the order of the pool even after a hash collision.
    """
    docs = sorted((d for d in pool if len(d.sentence_ends)), key=lambda d: int(d.doc_id))
    unique: list[TokenizedDocument] = []
    for doc in docs:
        if unique and int(unique[-1].doc_id) == int(doc.doc_id):
            if doc.tokens.tobytes() < unique[-1].tokens.tobytes():
                unique[-1] = doc
            continue
        unique.append(doc)
    return unique, len(docs) - len(unique)
