"""Sentence packing for the objectives without NSP (RECIPE.md section 11): contiguous sentences packed up
to the length limit. (Not `packed.py`: the rows of several whole instances that `--packing` writes.)

``objective="doc-sentences"``: each instance is ``[CLS] s_i ... s_j [SEP]``, the most consecutive
sentences of ONE document that fit in ``max_seq_length - 2`` tokens (greedy, in document order);
the last instance of a document may be short. ``objective="full-sentences"``: the same packing
over the pool's documents one after the other, crossing document boundaries, with an extra
``[SEP]`` between the last sentence of one document and the first of the next when both are in
one instance (that ``[SEP]`` counts against the limit).

* Nothing is lost: every sentence is in exactly one instance, in order. A sentence longer than the
  limit on its own becomes an instance of its first ``max_seq_length - 2`` tokens; the rest of it
  is dropped (counted as ``truncated_tokens``), as the original drops a pair's excess tokens.
* Order: a pool (a seeded hash of document identities, see ``pipelines``) is the unit that
  documents are packed across; within it, full-sentences takes the documents in the order of a
  seeded per-pass key of their identity, so neither the input files nor the workers decide which
  documents are neighbours, and each static copy (pass) packs across other neighbours.
* Identity: instance ``k`` among those that start in document ``d`` (its first sentence is from
  ``d``) has the keys of draw ``k + 1`` of ``d``'s streams, as NSP instances do (own purposes).
* There is no randomness in the packing itself; segment ids are all 0; no NSP label.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from bert_datagen.datagen.config import DatagenConfig
from bert_datagen.datagen.documents import TokenizedDocument
from bert_datagen.datagen.rng import u64_for_keys

# Marks the extra separator between two documents in a full-sentences stream ([SEP] at layout).
DOC_SEPARATOR = -1


@dataclass
class PackedPlan:
    """A pool pass of packed instances: rows are ranges ``[lo, lo + length)`` of ``tokens``."""

    tokens: np.ndarray  # int32 stream: the documents in packing order (with DOC_SEPARATORs)
    lo: np.ndarray  # int64 (n,)
    length: np.ndarray  # int64 (n,), at most max_seq_length - 2
    mask_keys: np.ndarray  # uint64 (n,)
    keys: np.ndarray  # uint64 (n,) instance identity keys
    stats: dict[str, int]
    labels: None = None  # no NSP

    def __len__(self) -> int:
        return int(self.keys.shape[0])

    def layout(self, take: np.ndarray, seq: int, vocab: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``[CLS] tokens [SEP]`` rows padded to ``seq``: ids, lengths, segment ids (all 0)."""
        lo, length = self.lo[take], self.length[take]
        pos = np.arange(seq, dtype=np.int64)
        source = np.clip(lo[:, None] - 1 + pos[None, :], 0, max(self.tokens.shape[0] - 1, 0))
        ids = self.tokens[source] if self.tokens.size else np.zeros((take.shape[0], seq), np.int32)
        ids = np.where(ids == DOC_SEPARATOR, vocab.sep_id, ids).astype(np.int32)
        lengths = length + 2
        ids[pos[None, :] >= lengths[:, None]] = vocab.pad_id
        ids[:, 0] = vocab.cls_id
        ids[np.arange(take.shape[0]), lengths - 1] = vocab.sep_id
        return ids, lengths, np.zeros((take.shape[0], seq), dtype=np.int32)


def _stream(docs: Sequence[TokenizedDocument], separators: bool) -> tuple[np.ndarray, ...]:
    """The documents back to back (a DOC_SEPARATOR between two when ``separators``): tokens, and
    per sentence its start and end in the stream and its document's index."""
    n_tokens = np.fromiter((d.num_tokens for d in docs), dtype=np.int64, count=len(docs))
    n_sent = np.fromiter((d.num_sentences for d in docs), dtype=np.int64, count=len(docs))
    gap = 1 if separators else 0
    offsets = np.zeros(len(docs), dtype=np.int64)
    offsets[1:] = np.cumsum(n_tokens + gap)[:-1]
    total = int(offsets[-1] + n_tokens[-1]) if docs else 0
    tokens = np.full(total, DOC_SEPARATOR, dtype=np.int32)
    for doc, at in zip(docs, offsets.tolist(), strict=True):
        tokens[at:at + doc.num_tokens] = doc.tokens
    sent_doc = np.repeat(np.arange(len(docs)), n_sent)
    local_end = np.concatenate([np.asarray(d.sentence_ends, dtype=np.int64) for d in docs])
    ends = offsets[sent_doc] + local_end
    lengths = np.concatenate([d.sentence_lengths() for d in docs]).astype(np.int64)
    return tokens, ends - lengths, ends, sent_doc


def pack_sentences(starts: np.ndarray, ends: np.ndarray, sent_doc: np.ndarray, limit: int,
                   cross_documents: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray, int, int]:
    """Greedy packing: (row start, row length, index of the row's first sentence, rows cut, tokens cut).

    A row takes sentences ``i..j`` while ``ends[j] - starts[i] <= limit`` (the stream positions
    between them include any document separator); ``cross_documents=False`` also stops it at the
    last sentence of ``i``'s document.
    """
    n = int(starts.shape[0])
    if not cross_documents:
        last = np.searchsorted(sent_doc, sent_doc, side="right")  # per sentence: past its document's last
    starts_l, ends_l = starts.tolist(), ends.tolist()
    last_l = last.tolist() if not cross_documents else None
    rows_lo: list[int] = []
    rows_len: list[int] = []
    rows_first: list[int] = []
    cut_rows = cut = 0
    i = 0
    while i < n:
        lo = starts_l[i]
        bound = n if last_l is None else last_l[i]
        j = bisect_right(ends_l, lo + limit, i, bound) - 1
        if j < i:  # one sentence over the limit: its head, alone
            rows_lo.append(lo)
            rows_len.append(limit)
            cut += ends_l[i] - lo - limit
            cut_rows += 1
            j = i
        elif ends_l[j] > lo:  # (an empty sentence on its own makes no row)
            rows_lo.append(lo)
            rows_len.append(ends_l[j] - lo)
        else:
            i = j + 1
            continue
        rows_first.append(i)
        i = j + 1
    return (np.asarray(rows_lo, dtype=np.int64), np.asarray(rows_len, dtype=np.int64),
            np.asarray(rows_first, dtype=np.int64), cut_rows, cut)


def plan_packed_pass(docs: Sequence[TokenizedDocument], pass_index: int, config: DatagenConfig,
                     doc_pass_keys: Any) -> PackedPlan | None:
    """The packed instances of one pool (sorted, distinct documents) in one pass.

    ``doc_pass_keys`` is ``bert_datagen.datagen.instances.doc_pass_keys`` (passed in: that module imports this).
    """
    docs = [d for d in docs if d.num_sentences]
    if not docs:
        return None
    seed = config.random_seed
    full = config.objective == "full-sentences"
    doc_ids = np.fromiter((d.doc_id for d in docs), dtype=np.uint64, count=len(docs))
    if full:
        order = np.argsort(doc_pass_keys(seed, "packing-order", doc_ids, pass_index), kind="stable")
        docs = [docs[i] for i in order.tolist()]
        doc_ids = doc_ids[order]
    tokens, starts, ends, sent_doc = _stream(docs, separators=full)
    limit = config.max_seq_length - 2
    lo, length, first, cut_rows, cut = pack_sentences(starts, ends, sent_doc, limit, cross_documents=full)
    row_doc = sent_doc[first]
    # rows come in stream order, so each document's rows are one run: k-th row of the run -> k
    run_start = np.searchsorted(row_doc, row_doc, side="left")
    ordinal = (np.arange(row_doc.shape[0]) - run_start + 1).astype(np.uint64)
    start_ids = doc_ids[row_doc]
    keys = u64_for_keys(doc_pass_keys(seed, "packed-instance", start_ids, pass_index), ordinal)
    mask_keys = u64_for_keys(doc_pass_keys(seed, "packed-mask", start_ids, pass_index), ordinal)
    last_sentence = np.searchsorted(ends, lo + length, side="left")  # a cut row: its only sentence
    stats = {
        "instances": int(keys.shape[0]),
        "notnext": 0,
        "truncated_instances": int(cut_rows),
        "truncated_tokens": int(cut),
        "cross_document_instances": int((sent_doc[last_sentence] != row_doc).sum()),
    }
    return PackedPlan(tokens, lo, length, mask_keys, keys, stats)
