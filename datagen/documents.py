"""Tokenized documents: every sentence's WordPiece ids in one array.

A document's identity (``doc_id``) is a 64-bit hash of its sentence texts
(whitespace-normalised), so it depends on content only: not on file names,
how the corpus is split into files, or the order they are read in.  Pools,
the eval split, instance keys and every random draw hang off it.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import numpy as np

from bert_datagen.datagen.config import DatagenConfig
from bert_datagen.datagen.readers import RawDocument
from bert_datagen.datagen.rng import hash64
from bert_datagen.datagen.sentences import get_splitter

# With a word segmenter, a token that continues a segmented word carries this bit in
# ``TokenizedDocument.tokens`` (ids stay far below it): the mark then travels with its token
# through staging, pairing, truncation and packing for free, and is taken off (``split_marks``)
# where rows are laid out for masking. Without a segmenter no token carries it.
WORD_CONTINUES = 1 << 30


def split_marks(ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(token ids without the mark, where the mark was)."""
    ids = np.asarray(ids)
    marked = (ids & WORD_CONTINUES) != 0
    return (ids & ~WORD_CONTINUES).astype(ids.dtype, copy=False), marked


class BatchTokenizer(Protocol):
    def encode_batch_ids(self, texts: Sequence[str]) -> list[np.ndarray]: ...


@runtime_checkable
class StagedTokenizer(BatchTokenizer, Protocol):
    """A batch tokenizer whose ``encode_batch_ids`` is ``finish_batch(b, run_batch(b))`` with
    ``b = start_batch(texts)``, where only ``run_batch`` runs without the GIL (``BertTokenizer``)."""

    def start_batch(self, texts: Sequence[str]) -> Any: ...

    def run_batch(self, batch: Any) -> Any: ...

    def finish_batch(self, batch: Any, encodings: Any) -> list[np.ndarray]: ...


@dataclass
class TokenizedDocument:
    """A document's token ids, all sentences concatenated; ``sentence_ends`` are cumulative ends."""

    doc_id: int
    tokens: np.ndarray  # int32 (with WORD_CONTINUES marks when the config has a word segmenter)
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
    return _pack(per_doc, flat, encoded, tokenizer, config, stats)


def tokenize_document_batches(
    batches: Iterable[Sequence[RawDocument]], tokenizer: BatchTokenizer, config: DatagenConfig,
    stats: dict[str, int], overlap: bool = True,
) -> Iterator[list[TokenizedDocument]]:
    """``tokenize_documents`` of each batch, in order, with the same results.

    With ``overlap``, the tokenizer encodes one batch in a thread of its own while this thread reads
    and splits the next one and packs the one before: the Rust tokenizer releases the GIL, and
    reading and sentence splitting are Python, so a worker that has the machine to itself (its
    tokenizer already free to use every core) keeps a second core busy instead of idle while it
    splits. A ``StagedTokenizer`` keeps its Python steps here too, so the thread only waits on Rust
    and the two threads do not pass the GIL back and forth. Every count in ``stats`` is made here.
    """
    if not overlap:
        for raws in batches:
            yield tokenize_documents(raws, tokenizer, config, stats)
        return
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="tokenize") as encoder:
        pending: tuple[list[list[str]], list[str], Callable[[], Sequence[np.ndarray]]] | None = None
        for raws in batches:
            per_doc = [document_sentences(raw, config) for raw in raws]
            flat = [s for sentences in per_doc for s in sentences]
            encoded = _encode_in(encoder, tokenizer, flat)
            if pending is not None:
                yield _pack(pending[0], pending[1], pending[2](), tokenizer, config, stats)
            pending = (per_doc, flat, encoded)
        if pending is not None:
            yield _pack(pending[0], pending[1], pending[2](), tokenizer, config, stats)


def _encode_in(encoder: ThreadPoolExecutor, tokenizer: BatchTokenizer, texts: list[str]
               ) -> Callable[[], Sequence[np.ndarray]]:
    """Start encoding ``texts`` in ``encoder``; the function returned waits for their ids."""
    if not texts:
        return list
    if isinstance(tokenizer, StagedTokenizer):
        batch = tokenizer.start_batch(texts)
        job = encoder.submit(tokenizer.run_batch, batch)
        return lambda: tokenizer.finish_batch(batch, job.result())
    return encoder.submit(tokenizer.encode_batch_ids, texts).result


def _pack(per_doc: list[list[str]], flat: list[str], encoded: Sequence[np.ndarray], tokenizer: BatchTokenizer,
          config: DatagenConfig, stats: dict[str, int]) -> list[TokenizedDocument]:
    """Each document's encoded sentences as one ``TokenizedDocument``; token-less ones dropped."""
    if config.word_segmenter is not None and flat:
        encoded = mark_segmented_words(flat, encoded, tokenizer, config.word_segmenter, stats)
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


def mark_segmented_words(sentences: Sequence[str], encoded: Sequence[np.ndarray], tokenizer: BatchTokenizer,
                         segmenter: str, stats: dict[str, int]) -> list[np.ndarray]:
    """``encoded`` (each sentence's ids) with WORD_CONTINUES on every token after the first of a
    segmented word, for the sentences that hold CJK ideographs (in others the "##" pieces mark the
    words already).

    The ids are never changed; a segmented word only says how many of them it covers. A word of
    CJK ideographs alone is one token per character (basic tokenization makes each ideograph a
    word, and WordPiece gives a one-character word one piece or [UNK]); any other word is
    tokenized on its own to count its tokens (measured: this halves the time against tokenizing
    every word). A sentence whose words do not give exactly its own ids (a segmenter cut inside
    what WordPiece sees as one word) keeps no marks and is counted in
    ``segmenter_unaligned_sentences``. Words the segmenter cut where basic tokenization does not
    (inside a Latin or Greek word: "Gödel" -> "G", "ö", "del") are joined back first.
    """
    from bert_datagen.datagen.segmenters import get_segmenter
    from bert_datagen.vocab.basic import tables

    segment = get_segmenter(segmenter)
    cjk = tables().cjk
    ideographs = re.compile(f"(?:{cjk.pattern})+")
    todo = [i for i, text in enumerate(sentences) if len(encoded[i]) > 1 and cjk.search(text)]
    joins = _joins_words()
    words = [_rejoin(segment(sentences[i]), joins) for i in todo]
    others = [w for ws in words for w in ws if not ideographs.fullmatch(w)]
    other_ids = iter(tokenizer.encode_batch_ids(others) if others else [])
    out = list(encoded)
    unaligned = 0
    for i, ws in zip(todo, words, strict=True):
        ids = np.asarray(encoded[i], dtype=np.int32)
        lengths = np.zeros(len(ws), dtype=np.int64)
        aligned = True
        at = 0
        for k, w in enumerate(ws):
            if ideographs.fullmatch(w):
                lengths[k] = len(w)
            else:
                piece = np.asarray(next(other_ids), dtype=np.int32)
                lengths[k] = piece.shape[0]
                aligned = aligned and np.array_equal(ids[at:at + piece.shape[0]], piece)
            at += int(lengths[k])
        if not aligned or at != ids.shape[0]:
            unaligned += 1
            continue
        continues = np.ones(ids.shape[0], dtype=bool)
        continues[(np.cumsum(lengths) - lengths)[lengths > 0]] = False
        out[i] = np.where(continues, ids | WORD_CONTINUES, ids).astype(np.int32)
    _bump(stats, "segmented_sentences", len(todo) - unaligned)
    if unaligned:
        _bump(stats, "segmenter_unaligned_sentences", unaligned)
    return out


def _joins_words():
    """A test of one character: basic tokenization would keep it in one word with its neighbours
    of the same kind (not whitespace, punctuation or a CJK ideograph)."""
    from bert_datagen.vocab.basic import tables

    t = tables()
    splits = re.compile(f"\\s|{t.cjk.pattern}|{t.punct.pattern}")
    return lambda ch: splits.match(ch) is None


def _rejoin(words: list[str], joins) -> list[str]:
    out: list[str] = []
    for w in words:
        if out and w and out[-1] and joins(out[-1][-1]) and joins(w[0]):
            out[-1] += w
        else:
            out.append(w)
    return out


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
