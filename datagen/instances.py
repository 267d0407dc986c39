"""Pre-training instances of one NotNext pool for one pass (RECIPE.md section 2), masked.

``plan_pool_pass(pool, pass_index, config)`` plans every instance of a pass (where A and B
lie, labels, keys) and ``masked_rows(plan, rows, config, vocab)`` lays out and masks any rows of
it; the pipeline calls both through ``bert_datagen.datagen.framed.encode_pool_pass``, a block at a time in key
order. ``build_pool_instances`` is the whole pass as one batch (tests compare against it). They
follow the original exactly, document by document:

* ``max_num_tokens = max_seq_length - 3``; the target length is drawn ONCE per
  document per pass (``short_seq_prob`` -> uniform in ``[2, max_num_tokens]``);
* the chunk walk, ``a_end``, the NotNext rule (forced for a one-sentence chunk,
  else probability 0.5), the partner document (up to ``max_notnext_tries``
  draws to avoid the current one; when every draw hits it, as in a pool of one
  document, the current document is used, which is what the original does
  after its 10 tries), a uniformly random start sentence, B filled up to
  ``target - len(A)``, the put-back of the chunk's unused sentences;
* truncation of the longer side (B when equal), one token at a time from the
  front or the back with probability 0.5; ``[CLS] A [SEP] B [SEP]``.

The pool is sorted by ``doc_id`` with duplicates dropped (``bert_datagen.datagen.documents.unique_documents``:
once per pool in the pipeline, by ``build_pool_instances`` here), so the result
does not depend on the order documents arrive in.  Only the chunk walk is a Python loop (its steps
depend on each other); partners, truncation, layout and masking are NumPy
over the whole pool.

Randomness (``bert_datagen.datagen.rng``): for each purpose a key ``derive_key(seed,
"instances-v1", purpose)``; a document's stream for that purpose in pass ``t``
has the key ``mix64(mix64(purpose_key ^ doc_id) + (t + 1) * GOLDEN)``, i.e. the
``t + 1``-th draw of the document's own stream; instance ``k`` of the
document uses that stream's draw ``k + 1`` (partner tries: ``k * tries + try +
1``).  Truncation and masking draw from per-instance keys (draw ``k + 1`` of
their document stream) with a counter per token.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from functools import cache
from typing import TYPE_CHECKING

import numpy as np

from bert_datagen.datagen.config import DatagenConfig
from bert_datagen.datagen.documents import TokenizedDocument, split_marks, unique_documents
from bert_datagen.datagen.masking import mask_batch
from bert_datagen.datagen.no_nsp import PackedPlan, plan_packed_pass
from bert_datagen.datagen.record_layout import pack_word_bits, word_bits_length
from bert_datagen.datagen.records import InstanceBatch
from bert_datagen.datagen.rng import GOLDEN, MASK64, derive_key, mix64_array, u64_for_keys

if TYPE_CHECKING:
    from bert_datagen.vocab.vocab_file import Vocab

_U53 = 1.0 / (1 << 53)
_TOP_BIT = np.uint64(63)


@dataclass
class PoolPass:
    """The masked instances of one pool in one pass, with one identity key per instance."""

    batch: InstanceBatch
    keys: np.ndarray  # uint64, one per instance
    stats: dict[str, int] = field(default_factory=dict)


@cache
def _purpose_key(seed: int, purpose: str) -> int:
    return derive_key(seed, "instances-v1", purpose)


def doc_pass_keys(seed: int, purpose: str, doc_ids: np.ndarray, pass_index: int) -> np.ndarray:
    """Key of each document's stream for ``purpose`` in pass ``pass_index`` (see module doc)."""
    doc_key = mix64_array(np.uint64(_purpose_key(seed, purpose)) ^ np.asarray(doc_ids, dtype=np.uint64))
    return mix64_array(doc_key + np.uint64(((pass_index + 1) * GOLDEN) & MASK64))


def _uniform(draws: np.ndarray) -> np.ndarray:
    return (draws >> np.uint64(11)).astype(np.float64) * _U53


def _randint(draws: np.ndarray, low: int | np.ndarray, high: int | np.ndarray) -> np.ndarray:
    """Integers in ``[low, high]`` from u64 draws, as ``Stream.randint`` makes them."""
    span = (np.asarray(high, dtype=np.int64) - np.asarray(low, dtype=np.int64) + 1).astype(np.uint64)
    return np.asarray(low, dtype=np.int64) + (draws % span).astype(np.int64)


@dataclass
class FlatPool:
    """The pool flattened: global sentence indices and a global token cumsum. The pipeline builds it
    from a staged pool's arrays (``of_arrays``) once per pass, with no per-document work."""

    doc_ids: np.ndarray  # uint64 (d,)
    tokens: np.ndarray  # int32, every document's tokens concatenated
    first_sentence: np.ndarray  # int64 (d + 1,), global index of each document's first sentence
    token_cumsum: np.ndarray  # int64 (total sentences + 1,)

    @classmethod
    def of(cls, docs: Sequence[TokenizedDocument]) -> FlatPool:
        counts = np.fromiter((d.num_sentences for d in docs), dtype=np.int64, count=len(docs))
        first = np.zeros(len(docs) + 1, dtype=np.int64)
        np.cumsum(counts, out=first[1:])
        lengths = np.concatenate([d.sentence_lengths() for d in docs]).astype(np.int64)
        cumsum = np.zeros(lengths.shape[0] + 1, dtype=np.int64)
        np.cumsum(lengths, out=cumsum[1:])
        tokens = np.concatenate([np.asarray(d.tokens, dtype=np.int32) for d in docs])
        ids = np.fromiter((d.doc_id for d in docs), dtype=np.uint64, count=len(docs))
        return cls(ids, tokens, first, cumsum)

    @classmethod
    def of_arrays(cls, doc_ids: np.ndarray, n_sentences: np.ndarray, tokens: np.ndarray,
                  sentence_ends: np.ndarray) -> FlatPool:
        """The same as ``of`` for documents stored as ``bert_datagen.datagen.staging.pool_to_bytes``
        stores them: per document its sentence count, and every document's tokens and cumulative
        sentence ends one after the other."""
        first = np.zeros(len(doc_ids) + 1, dtype=np.int64)
        np.cumsum(n_sentences, out=first[1:])
        ends = np.asarray(sentence_ends, dtype=np.int64)
        starts = np.empty_like(ends)  # each sentence's start within its document
        if ends.size:
            starts[0] = 0
            starts[1:] = ends[:-1]
            starts[first[:-1][np.asarray(n_sentences) > 0]] = 0
        cumsum = np.zeros(ends.shape[0] + 1, dtype=np.int64)
        np.cumsum(ends - starts, out=cumsum[1:])
        return cls(np.asarray(doc_ids, dtype=np.uint64), np.asarray(tokens, dtype=np.int32), first, cumsum)

    def __len__(self) -> int:
        return int(self.doc_ids.shape[0])


def _target_lengths(pool: FlatPool, pass_index: int, config: DatagenConfig) -> np.ndarray:
    max_num_tokens = config.max_seq_length - 3
    keys = doc_pass_keys(config.random_seed, "target_length", pool.doc_ids, pass_index)
    short = _uniform(u64_for_keys(keys, np.ones_like(keys))) < config.short_seq_prob
    short_len = _randint(u64_for_keys(keys, np.full_like(keys, 2)), 2, max_num_tokens)
    return np.where(short, short_len, max_num_tokens).astype(np.int64)


def _walk_draws(pool: FlatPool, seed: int, purpose: str, pass_index: int) -> np.ndarray:
    """Draw ``k + 1`` of each document's stream for k < its sentence count, flat in global sentence order."""
    counts = np.diff(pool.first_sentence)
    keys = np.repeat(doc_pass_keys(seed, purpose, pool.doc_ids, pass_index), counts)
    ordinal = np.arange(keys.shape[0], dtype=np.int64) - np.repeat(pool.first_sentence[:-1], counts)
    return u64_for_keys(keys, (ordinal + 1).astype(np.uint64))


def _walk(pool: FlatPool, targets: np.ndarray, pass_index: int, config: DatagenConfig) -> dict[str, np.ndarray]:
    """The chunk walk of every document: which sentences make A (and B when IsNext).

    Sentence indices are global (into the flattened pool): A is ``[a_lo, a_hi)``,
    an IsNext B is ``[a_hi, b_hi)``, and the chunk was ``[a_lo, b_hi)``.
    """
    seed = config.random_seed
    a_draws = _walk_draws(pool, seed, "a_end", pass_index)
    random_next = _walk_draws(pool, seed, "is_random_next", pass_index) < np.uint64(1 << 63)  # uniform < 0.5
    first = pool.first_sentence.tolist()
    targets_l = targets.tolist()
    rows: list[tuple[int, int, int, bool]] = []
    append = rows.append
    per_doc = []
    for d in range(len(first) - 1):
        start, end, target = first[d], first[d + 1], targets_l[d]
        # Python lists of one document at a time: fast to index, and memory
        # stays bounded by the largest document rather than the pool.
        cumsum = pool.token_cumsum[start : end + 1].tolist()
        draws = a_draws[start:end].tolist()
        coins = random_next[start:end].tolist()
        n = end - start
        i, k = 0, 0
        while i < n:
            # The chunk ends at the first sentence that brings it to the target, or the document's end.
            j = bisect_left(cumsum, cumsum[i] + target, i + 1, n + 1)
            j = (j if j < n else n) - 1
            m = j - i + 1
            a_end = 1 if m == 1 else 1 + draws[k] % (m - 1)  # instance k never exceeds the sentence count
            is_random = m == 1 or coins[k]
            append((start + i, start + i + a_end, start + j + 1, is_random))
            # NotNext puts the chunk's unused sentences back: the walk resumes after A.
            i = i + a_end if is_random else j + 1
            k += 1
        per_doc.append(k)
    table = np.array(rows, dtype=np.int64).reshape(-1, 4)
    counts = np.asarray(per_doc, dtype=np.int64)
    return {
        "doc": np.repeat(np.arange(counts.shape[0]), counts),
        "ordinal": np.arange(table.shape[0]) - np.repeat(np.cumsum(counts) - counts, counts),
        "a_lo": table[:, 0],
        "a_hi": table[:, 1],
        "b_hi": table[:, 2],
        "random_next": table[:, 3].astype(bool),
    }


def _partners(pool: FlatPool, walk: dict[str, np.ndarray], pass_index: int, config: DatagenConfig) -> tuple[np.ndarray, np.ndarray]:
    """(partner document, tries exhausted) of each NotNext instance."""
    which = np.nonzero(walk["random_next"])[0]
    doc = walk["doc"][which]
    tries = config.max_notnext_tries
    keys = doc_pass_keys(config.random_seed, "partner", pool.doc_ids[doc], pass_index)
    counters = (walk["ordinal"][which][:, None] * tries + np.arange(1, tries + 1)[None, :]).astype(np.uint64)
    candidates = (u64_for_keys(keys[:, None], counters) % np.uint64(len(pool.doc_ids))).astype(np.int64)
    other = candidates != doc[:, None]
    found = other.any(axis=1)
    pick = np.where(found, np.argmax(other, axis=1), tries - 1)
    return candidates[np.arange(which.shape[0]), pick], ~found


def _b_ranges(pool: FlatPool, walk: dict[str, np.ndarray], targets: np.ndarray, pass_index: int,
              config: DatagenConfig) -> tuple[np.ndarray, np.ndarray, dict[str, int]]:
    """Global token range ``[lo, hi)`` of every instance's B."""
    cum = pool.token_cumsum
    b_lo = cum[walk["a_hi"]].copy()
    b_hi = cum[walk["b_hi"]].copy()
    which = np.nonzero(walk["random_next"])[0]
    partner, same_doc = _partners(pool, walk, pass_index, config)
    keys = doc_pass_keys(config.random_seed, "b_start", pool.doc_ids[walk["doc"][which]], pass_index)
    p_first, p_end = pool.first_sentence[partner], pool.first_sentence[partner + 1]
    start = p_first + _randint(u64_for_keys(keys, (walk["ordinal"][which] + 1).astype(np.uint64)), 0, p_end - p_first - 1)
    len_a = cum[walk["a_hi"][which]] - cum[walk["a_lo"][which]]
    target_b = targets[walk["doc"][which]] - len_a
    # B takes sentences from ``start`` until it reaches target_b (at least one).
    stop = np.maximum(np.searchsorted(cum, cum[start] + target_b, side="left"), start + 1)
    stop = np.minimum(stop, p_end)
    b_lo[which] = cum[start]
    b_hi[which] = cum[stop]
    return b_lo, b_hi, {"notnext_same_document": int(same_doc.sum())}


def _truncate(len_a: np.ndarray, len_b: np.ndarray, keys: np.ndarray, max_num_tokens: int) -> tuple[np.ndarray, ...]:
    """Tokens cut from the front and back of A and B, one coin per removed token.

    The original removes one token at a time from the longer side (B when
    equal): first the longer side alone until both are equal, then B, A, B, ...
    Only the front/back coin is random, so the counts follow in closed form
    from the coins of each side's removals (removal ``r`` uses draw ``r + 1``
    of the instance's truncation key; front when the top bit is clear).
    """
    excess = np.maximum(len_a + len_b - max_num_tokens, 0)
    diff = np.abs(len_a - len_b)
    phase1 = np.minimum(diff, excess)
    n = len_a.shape[0]
    zeros = np.zeros(n, dtype=np.int64)
    if not excess.any():
        return zeros, zeros, zeros, zeros
    inst = np.repeat(np.arange(n), excess)
    removal = np.arange(inst.shape[0], dtype=np.int64) - np.repeat(np.cumsum(excess) - excess, excess)
    in_phase1 = removal < phase1[inst]
    a_longer = (len_a > len_b)[inst]
    from_a = np.where(in_phase1, a_longer, (removal - phase1[inst]) % 2 == 1)
    front = (u64_for_keys(keys[inst], (removal + 1).astype(np.uint64)) >> _TOP_BIT) == 0
    a_front = np.bincount(inst, weights=from_a & front, minlength=n).astype(np.int64)
    a_total = np.bincount(inst, weights=from_a, minlength=n).astype(np.int64)
    b_front = np.bincount(inst, weights=~from_a & front, minlength=n).astype(np.int64)
    b_total = excess - a_total
    return a_front, a_total - a_front, b_front, b_total - b_front


def _layout(tokens: np.ndarray, a_lo: np.ndarray, len_a: np.ndarray, b_lo: np.ndarray, len_b: np.ndarray,
            seq: int, vocab: Vocab) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``[CLS] A [SEP] B [SEP]`` rows padded to ``seq``: ids, lengths, segment ids."""
    n = a_lo.shape[0]
    pos = np.arange(seq, dtype=np.int64)
    sep_a = len_a + 1
    lengths = len_a + len_b + 3
    after_a = pos[None, :] > sep_a[:, None]
    # Position p reads token a_lo + p - 1 inside A and b_lo + p - sep_a - 1 inside B.
    source = np.where(after_a, (b_lo - sep_a - 1)[:, None], (a_lo - 1)[:, None])
    source += pos
    np.clip(source, 0, tokens.shape[0] - 1, out=source)
    ids = tokens[source]
    ids[pos[None, :] >= (lengths - 1)[:, None]] = vocab.pad_id
    rows = np.arange(n)
    ids[:, 0] = vocab.cls_id
    ids[rows, sep_a] = vocab.sep_id
    ids[rows, lengths - 1] = vocab.sep_id
    segments = (after_a & (pos[None, :] < lengths[:, None])).astype(np.int32)
    return ids, lengths, segments


ROWS_PER_BLOCK = 4096  # rows laid out and masked together: temporaries stay in cache


@dataclass
class PoolPlan:
    """Everything about a pool's instances in one pass except their layout and masking: where A
    and B lie in the pool's tokens, the NotNext labels, and the keys (identity and masking).

    Rows can then be laid out and masked in any order and any blocks (``masked_rows``), e.g. in
    key order, straight into the record encoder, without a full-size batch in between.
    """

    tokens: np.ndarray
    a_lo: np.ndarray
    len_a: np.ndarray
    b_lo: np.ndarray
    len_b: np.ndarray
    mask_keys: np.ndarray
    labels: np.ndarray  # int32, 1 = NotNext
    keys: np.ndarray  # uint64 instance identity keys
    stats: dict[str, int]

    def __len__(self) -> int:
        return int(self.keys.shape[0])

    def layout(self, take: np.ndarray, seq: int, vocab: Vocab) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``[CLS] A [SEP] B [SEP]`` rows ``take``: ids, lengths, segment ids."""
        return _layout(self.tokens, self.a_lo[take], self.len_a[take], self.b_lo[take], self.len_b[take], seq, vocab)


def masked_rows(plan: PoolPlan | PackedPlan, rows: np.ndarray, config: DatagenConfig, vocab: Vocab) -> InstanceBatch:
    """The instances ``rows`` (indices into ``plan``), laid out and masked, in that order.

    With ``masking="dynamic"`` they stay unmasked and carry their identity key instead.
    """
    blocks = [_masked_block(plan, rows[lo:lo + ROWS_PER_BLOCK], config, vocab)
              for lo in range(0, rows.shape[0], ROWS_PER_BLOCK)]
    if len(blocks) == 1:  # the pipeline's case: no copy into a second batch
        return blocks[0]
    if not blocks:
        return empty_batch(config)
    return InstanceBatch(**{f.name: np.concatenate([getattr(b, f.name) for b in blocks])
                            for f in fields(InstanceBatch) if getattr(blocks[0], f.name) is not None})


def _masked_block(plan: PoolPlan | PackedPlan, take: np.ndarray, config: DatagenConfig, vocab: Vocab) -> InstanceBatch:
    seq = config.max_seq_length
    ids, lengths, segments = plan.layout(take, seq, vocab)
    continues = None
    if config.word_segmenter is not None:
        ids, continues = split_marks(ids)
    common = dict(
        input_mask=(np.arange(seq)[None, :] < lengths[:, None]).astype(np.int32),
        segment_ids=segments,
        next_sentence_labels=None if plan.labels is None else plan.labels[take],
    )
    if config.masking == "dynamic":
        # The trainer masks these records: they keep the segmented words static masking would group.
        return InstanceBatch(input_ids=ids.astype(np.int32, copy=False), **common,
                             instance_key=plan.keys[take].view(np.int64),
                             word_continues_bits=None if continues is None else pack_word_bits(continues))
    masked = mask_batch(ids, lengths, plan.mask_keys[take], config, vocab, continues)
    return InstanceBatch(
        input_ids=masked.input_ids,
        masked_lm_positions=masked.masked_lm_positions,
        masked_lm_ids=masked.masked_lm_ids,
        masked_lm_weights=masked.masked_lm_weights,
        **common,
    )


def empty_batch(config: DatagenConfig) -> InstanceBatch:
    """No instances, with the features of ``config``'s records."""
    s, p = config.max_seq_length, config.max_predictions_per_seq
    dynamic = config.masking == "dynamic"
    return InstanceBatch(
        input_ids=np.zeros((0, s), np.int32), input_mask=np.zeros((0, s), np.int32),
        segment_ids=np.zeros((0, s), np.int32),
        masked_lm_positions=None if dynamic else np.zeros((0, p), np.int32),
        masked_lm_ids=None if dynamic else np.zeros((0, p), np.int32),
        masked_lm_weights=None if dynamic else np.zeros((0, p), np.float32),
        next_sentence_labels=np.zeros((0,), np.int32) if config.objective == "nsp" else None,
        instance_key=np.zeros((0,), np.int64) if dynamic else None,
        word_continues_bits=(np.zeros((0, word_bits_length(s)), np.int64)
                             if dynamic and config.word_segmenter is not None else None),
    )


def plan_pool_pass(pool: Sequence[TokenizedDocument] | FlatPool, pass_index: int,
                   config: DatagenConfig) -> PoolPlan | PackedPlan | None:
    """The plan of every instance of ``pool`` in one pass (None for a pool without documents).

    ``pool`` is sorted by ``doc_id`` with one document per identity (``unique_documents``): the
    pipeline dedupes each pool once, when it is built, not once per pass. Sentence pairs for
    ``objective="nsp"``; packed sentences (``bert_datagen.datagen.no_nsp``) otherwise. A ``FlatPool``
    (the same documents, flattened) is taken as it is, for ``nsp`` only.
    """
    if not len(pool):
        return None
    if config.objective != "nsp":
        if isinstance(pool, FlatPool):
            raise TypeError(f"objective {config.objective!r} plans from the documents, not a FlatPool")
        return plan_packed_pass(pool, pass_index, config, doc_pass_keys)
    flat = pool if isinstance(pool, FlatPool) else FlatPool.of(pool)
    max_num_tokens = config.max_seq_length - 3
    targets = _target_lengths(flat, pass_index, config)
    walk = _walk(flat, targets, pass_index, config)
    doc_ids = flat.doc_ids[walk["doc"]]
    ordinal = (walk["ordinal"] + 1).astype(np.uint64)
    seed = config.random_seed

    a_lo = flat.token_cumsum[walk["a_lo"]]
    len_a = flat.token_cumsum[walk["a_hi"]] - a_lo
    b_lo, b_hi, stats = _b_ranges(flat, walk, targets, pass_index, config)
    len_b = b_hi - b_lo
    trunc_keys = u64_for_keys(doc_pass_keys(seed, "truncate", doc_ids, pass_index), ordinal)
    a_front, a_back, b_front, b_back = _truncate(len_a, len_b, trunc_keys, max_num_tokens)
    a_lo, len_a = a_lo + a_front, len_a - a_front - a_back
    b_lo, len_b = b_lo + b_front, len_b - b_front - b_back

    mask_keys = u64_for_keys(doc_pass_keys(seed, "mask", doc_ids, pass_index), ordinal)
    labels = walk["random_next"].astype(np.int32)
    keys = u64_for_keys(doc_pass_keys(seed, "instance", doc_ids, pass_index), ordinal)
    m_len = walk["b_hi"] - walk["a_lo"]
    stats.update(
        instances=int(keys.shape[0]),
        notnext=int(labels.sum()),
        notnext_forced=int((m_len == 1).sum()),
        truncated_instances=int(((a_front + a_back + b_front + b_back) > 0).sum()),
        truncated_tokens=int((a_front + a_back + b_front + b_back).sum()),
        short_target_documents=int((targets < max_num_tokens).sum()),
    )
    return PoolPlan(flat.tokens, a_lo, len_a, b_lo, len_b, mask_keys, labels, keys, stats)


def build_pool_instances(pool: Sequence[TokenizedDocument], pass_index: int, config: DatagenConfig,
                         vocab: Vocab) -> PoolPass:
    """Masked instances of every document of ``pool`` for one pass; NotNext partners come from ``pool``.

    The whole pass as one batch, in plan order (the pipeline encodes it in key order, a block at a
    time: ``bert_datagen.datagen.framed.encode_pool_pass``); any order of ``pool`` and any duplicates give the same.
    """
    docs, duplicates = unique_documents(pool)
    plan = plan_pool_pass(docs, pass_index, config)
    if plan is None:
        return PoolPass(empty_batch(config), np.zeros(0, np.uint64), {"instances": 0})
    batch = masked_rows(plan, np.arange(len(plan)), config, vocab)
    masked = 0 if batch.masked_lm_weights is None else int(batch.masked_lm_weights.sum())
    return PoolPass(batch, plan.keys, {**plan.stats, "duplicate_documents": duplicates, "masked_tokens": masked})
