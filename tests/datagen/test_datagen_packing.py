"""Inputs without NSP (``objective`` doc-sentences / full-sentences): packing never exceeds the limit
and loses no sentence, never crosses a document unless asked, seeded order independent of the pool's
order; the records carry no NSP label; dynamic-masking records carry no masks but an identity."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from bert_datagen.datagen.config import ConfigError, DatagenConfig
from bert_datagen.datagen.documents import unique_documents
from bert_datagen.datagen.example_exact import decode_example
from bert_datagen.datagen.instances import build_pool_instances, masked_rows
from bert_datagen.datagen.instances import plan_pool_pass as plan_unique_pool
from bert_datagen.datagen.no_nsp import DOC_SEPARATOR
from bert_datagen.datagen.record_layout import feature_spec
from tests.support.datagen_fakes import FakeVocab, make_doc, synthetic_pool
from tests.support.record_encoding import encode_batch

VOCAB = FakeVocab()


def plan_pool_pass(pool, pass_index, config):
    """The plan of a pool in any order, with duplicates (the pipeline dedupes pools once)."""
    return plan_unique_pool(unique_documents(pool)[0], pass_index, config)


def config(objective: str, **kw) -> DatagenConfig:
    return DatagenConfig(max_seq_length=kw.pop("max_seq_length", 48), max_predictions_per_seq=7,
                         objective=objective, **kw)


def unpack(plan, limit: int) -> list[list[tuple[int, ...]]]:
    """Each row's sentences, recovered from the stream (separators split documents)."""
    rows = []
    for lo, n in zip(plan.lo.tolist(), plan.length.tolist(), strict=True):
        assert 1 <= n <= limit
        rows.append(plan.tokens[lo:lo + n].tolist())
    return rows


def labelled_pool(n_docs: int, seed: int) -> list:
    """Documents whose sentence k is ``len`` copies of the id 1000 + k: rows can be read back."""
    gen = np.random.default_rng(seed)
    docs, k = [], 0
    for d in range(n_docs):
        sentences = []
        for _ in range(int(gen.integers(1, 7))):
            sentences.append([1000 + k] * int(gen.integers(1, 31)))
            k += 1
        docs.append(make_doc(1 + d * 7919, sentences))
    docs.append(make_doc(10**9, [[1000 + k] * 5, [1001 + k] * 60, [1002 + k] * 4]))  # one over the limit
    return docs


@pytest.mark.parametrize("objective", ["doc-sentences", "full-sentences"])
def test_packing_keeps_every_sentence_once_in_order_and_fits(objective):
    pool = labelled_pool(60, seed=3)
    lengths = {s[0]: len(s) for d in pool for s in (d.sentence(i).tolist() for i in range(d.num_sentences))}
    doc_of = {d.sentence(i)[0]: d.doc_id for d in pool for i in range(d.num_sentences)}
    cfg = config(objective)
    limit = cfg.max_seq_length - 2
    plan = plan_pool_pass(pool, 0, cfg)
    seen: list[int] = []
    crossing = 0
    for r, row in enumerate(unpack(plan, limit)):
        runs = [list(g) for _, g in itertools.groupby(row)]
        ids = [run[0] for run in runs if run[0] != DOC_SEPARATOR]
        seps = [run for run in runs if run[0] == DOC_SEPARATOR]
        assert runs[0][0] != DOC_SEPARATOR and runs[-1][0] != DOC_SEPARATOR
        # whole sentences only, but for a sentence over the limit, which is cut to it alone
        for run in runs:
            if run[0] != DOC_SEPARATOR:
                assert len(run) == lengths[run[0]] or (len(runs) == 1 and len(run) == limit < lengths[run[0]])
        docs_in_row = [doc_of[i] for i in ids]
        changes = sum(a != b for a, b in zip(docs_in_row, docs_in_row[1:], strict=False))
        assert len(seps) == changes and all(len(run) == 1 for run in seps)  # one [SEP] per document change
        crossing += changes > 0
        seen += ids
        if r + 1 < len(plan):  # greedy: the next row's first sentence would not have fit
            nxt = plan.tokens[plan.lo[r + 1]]
            extra = lengths[nxt] + (doc_of[nxt] != docs_in_row[-1])
            assert objective == "doc-sentences" and doc_of[nxt] != docs_in_row[-1] or len(row) + extra > limit
    assert seen == sorted(seen, key=lambda i: plan.tokens.tolist().index(i))  # stream order
    assert sorted(seen) == sorted(lengths)  # every sentence, exactly once
    assert plan.stats["truncated_tokens"] == 60 - limit and plan.stats["truncated_instances"] == 1
    assert plan.stats["cross_document_instances"] == crossing
    assert (crossing == 0) == (objective == "doc-sentences")


def test_doc_sentences_are_greedy_within_a_document():
    a = make_doc(1, [[5] * 20, [7] * 20, [9] * 10, [11] * 30])
    b = make_doc(2, [[13] * 3])
    plan = plan_pool_pass([b, a], 0, config("doc-sentences"))  # limit 46
    rows = [plan.tokens[lo:lo + n].tolist() for lo, n in zip(plan.lo, plan.length, strict=True)]
    assert [len(r) for r in rows] == [40, 40, 3]  # 20+20 (adding 10 would give 50), 10+30, b alone
    assert rows[2] == [13] * 3


def test_full_sentences_cross_documents_with_a_separator_in_a_seeded_order():
    pool = synthetic_pool(30, seed=9, max_sentences=3, max_len=8)
    cfg = config("full-sentences")
    plan = plan_pool_pass(pool, 0, cfg)
    shuffled = plan_pool_pass(pool[::-1], 0, cfg)
    for name in ("tokens", "lo", "length", "keys", "mask_keys"):
        assert np.array_equal(getattr(plan, name), getattr(shuffled, name)), name
    other_pass = plan_pool_pass(pool, 1, cfg)
    assert not np.array_equal(plan.tokens, other_pass.tokens)  # another order of documents
    assert len(np.unique(plan.keys)) == len(plan)
    assert plan.stats["cross_document_instances"] > len(plan) // 2  # short documents share rows


def test_layout_records_have_no_nsp_label_and_one_segment():
    pool = synthetic_pool(12, seed=4)
    cfg = config("full-sentences")
    result = build_pool_instances(pool, 0, cfg, VOCAB)
    batch = result.batch
    assert batch.next_sentence_labels is None and (batch.segment_ids == 0).all()
    lengths = batch.input_mask.sum(axis=1)
    assert (batch.input_ids[:, 0] == VOCAB.cls_id).all()
    assert (batch.input_ids[np.arange(len(batch)), lengths - 1] == VOCAB.sep_id).all()
    assert (batch.input_ids >= 0).all()  # separators became [SEP]
    records = encode_batch(batch)
    decoded = decode_example(records[0])
    assert set(decoded) == set(feature_spec(48, 7, "full-sentences"))
    assert "next_sentence_labels" not in decoded and decoded["masked_lm_ids"].size == 7
    assert result.stats["notnext"] == 0 and result.stats["masked_tokens"] == int(batch.masked_lm_weights.sum())


@pytest.mark.parametrize("objective", ["nsp", "doc-sentences"])
def test_dynamic_records_are_unmasked_with_their_identity(objective):
    pool = synthetic_pool(12, seed=6)
    dynamic = config(objective, masking="dynamic", dupe_factor=1)
    static = config(objective)
    plan = plan_pool_pass(pool, 0, dynamic)
    rows = np.arange(len(plan))
    unmasked = masked_rows(plan, rows, dynamic, VOCAB)
    masked = masked_rows(plan_pool_pass(pool, 0, static), rows, static, VOCAB)
    assert unmasked.masked_lm_positions is None and unmasked.masked_lm_weights is None
    assert np.array_equal(unmasked.instance_key.view(np.uint64), plan.keys)
    assert not (unmasked.input_ids == VOCAB.mask_id).any()
    # the same instances: equal wherever static masking left a token alone
    untouched = masked.input_ids == unmasked.input_ids
    assert untouched.mean() > 0.8 and np.array_equal(masked.input_mask, unmasked.input_mask)
    decoded = decode_example(encode_batch(unmasked)[0])
    assert set(decoded) == set(feature_spec(48, 7, objective, "dynamic"))
    assert int(decoded["instance_key"][0]) == int(unmasked.instance_key[0])


def test_option_validation():
    with pytest.raises(ConfigError, match="--objective 'pairs'"):
        DatagenConfig(objective="pairs")
    with pytest.raises(ConfigError, match="--masking 'later'"):
        DatagenConfig(masking="later")
    with pytest.raises(ConfigError, match="--dupe-factor 10 with --masking dynamic"):
        DatagenConfig(masking="dynamic")
