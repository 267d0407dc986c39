"""Pair building (RECIPE.md section 2): the vectorized builder against the recipe written out literally,
the recipe's quirks one by one, layout invariants, determinism and a golden checksum."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bert_datagen.datagen.config import DatagenConfig
from bert_datagen.datagen.documents import tokenize_documents
from bert_datagen.datagen.instances import build_pool_instances
from bert_datagen.datagen.readers import RawDocument
from tests.support.datagen_fakes import (
    FakeTokenizer,
    FakeVocab,
    batch_rows,
    make_doc,
    reference_instances,
    synthetic_pool,
)
from tests.support.record_encoding import encode_batch

VOCAB = FakeVocab()


def build(pool, pass_index=0, **cfg):
    config = DatagenConfig(**cfg)
    return build_pool_instances(pool, pass_index, config, VOCAB), config


def check_layout(result, config):
    """Every row: [CLS] A [SEP] B [SEP], segment ids, mask, padding, masked-LM fields."""
    b = result.batch
    seq, npred = config.max_seq_length, config.max_predictions_per_seq
    assert b.input_ids.shape == (len(b), seq) and b.masked_lm_positions.shape == (len(b), npred)
    for r in range(len(b)):
        length = int(b.input_mask[r].sum())
        assert 5 <= length <= seq
        assert b.input_mask[r, :length].all() and not b.input_mask[r, length:].any()
        n_pred = int(b.masked_lm_weights[r].sum())
        positions = b.masked_lm_positions[r, :n_pred]
        ids = b.input_ids[r].copy()
        ids[positions] = b.masked_lm_ids[r, :n_pred]  # undo masking: a random token may even be [SEP]
        assert (ids[length:] == VOCAB.pad_id).all()
        seps = np.nonzero(ids[:length] == VOCAB.sep_id)[0]
        assert ids[0] == VOCAB.cls_id and seps.size == 2 and seps[1] == length - 1
        assert 2 <= seps[0] <= length - 3  # A and B each hold at least one token
        seg = b.segment_ids[r]
        assert (seg[: seps[0] + 1] == 0).all() and (seg[seps[0] + 1 : length] == 1).all() and not seg[length:].any()
        assert (b.masked_lm_weights[r, :n_pred] == 1.0).all() and not b.masked_lm_weights[r, n_pred:].any()
        wanted = min(npred, max(1, int(round(length * config.masked_lm_prob))))
        assert n_pred <= wanted
        if not config.whole_word_mask:
            assert n_pred == min(wanted, length - 3)
        assert (np.diff(positions) > 0).all() and not b.masked_lm_positions[r, n_pred:].any()
        assert not b.masked_lm_ids[r, n_pred:].any()
        assert all(p not in (0, seps[0], length - 1) for p in positions)
    assert result.keys.dtype == np.uint64 and len(np.unique(result.keys)) == len(b)


@pytest.mark.parametrize("cfg", [
    {},
    {"whole_word_mask": True},
    {"max_seq_length": 32, "max_predictions_per_seq": 5, "short_seq_prob": 0.5},
    {"max_seq_length": 16, "masked_lm_prob": 1.0, "mask_ratios": (0.0, 0.5, 0.5), "whole_word_mask": True},
    {"max_seq_length": 8, "random_seed": 7, "max_notnext_tries": 1},
])
def test_matches_the_recipe_written_out_literally(cfg):
    pool = synthetic_pool(12, seed=3)
    for pass_index in (0, 3):
        result, config = build(pool, pass_index, **cfg)
        check_layout(result, config)
        assert batch_rows(result.batch, result.keys) == reference_instances(pool, pass_index, config, VOCAB)


def test_stats_count_what_the_batch_holds():
    pool = synthetic_pool(20, seed=4)
    result, _ = build(pool)
    b = result.batch
    assert result.stats["instances"] == len(b)
    assert result.stats["notnext"] == int(b.next_sentence_labels.sum())
    assert result.stats["masked_tokens"] == int(b.masked_lm_weights.sum())


def test_target_length_is_drawn_once_per_document_per_pass():
    # One long document of 1-token sentences: every chunk but the last has exactly the target length.
    doc = make_doc(11, [[5 + 2 * (i % 90)] for i in range(400)])
    lengths_by_pass = []
    for pass_index in range(30):
        result, config = build([doc], pass_index, short_seq_prob=0.5, max_seq_length=64)
        # IsNext chunks are whole: len(A) + len(B) is the chunk's token count.
        isnext = result.batch.next_sentence_labels == 0
        chunk_tokens = result.batch.input_mask[isnext].sum(axis=1) - 3
        lengths_by_pass.append(set(chunk_tokens[:-1].tolist()))
    assert all(len(s) <= 1 for s in lengths_by_pass), "one target length per document and pass"
    values = set().union(*lengths_by_pass)
    assert 61 in values and len(values) > 3, "short targets (short_seq_prob) appear in some passes"


def test_notnext_puts_unused_sentences_back():
    # 3-token sentences and a 36-token target: no truncation, so the segments show whole sentences.
    # A of every instance plus B of the IsNext ones cover the document once, in order, only
    # because NotNext puts the chunk's unused sentences back.
    doc = make_doc(21, [[5 + 2 * i] * 3 for i in range(60)])
    other = make_doc(22, [[6] * 3 for _ in range(10)])
    result, _ = build([doc, other], max_seq_length=39, short_seq_prob=0.0, mask_ratios=(0.0, 1.0, 0.0))
    b = result.batch
    covered = []
    for r in range(len(b)):
        ids, seg, length = b.input_ids[r], b.segment_ids[r], int(b.input_mask[r].sum())
        if ids[1] == 6:
            continue  # an instance of the other document
        sep = int(np.argmax(seg)) - 1
        covered.extend(ids[1:sep].tolist())
        if b.next_sentence_labels[r] == 0:
            covered.extend(ids[sep + 1 : length - 1].tolist())
        else:
            assert set(ids[sep + 1 : length - 1].tolist()) == {6}
    assert 0 < result.stats["notnext"] < len(b)
    assert covered == [5 + 2 * i for i in range(60) for _ in range(3)]


def test_one_sentence_chunk_is_always_notnext():
    # Sentences longer than the target: every chunk has one sentence, so every instance is NotNext.
    pool = [make_doc(31 + d, [[5 + 2 * d] * 50 for _ in range(4)]) for d in range(3)]
    result, config = build(pool, max_seq_length=32)
    assert len(result.batch) == 12
    assert result.batch.next_sentence_labels.all()
    assert result.stats["notnext_forced"] == 12
    check_layout(result, config)


def test_pool_of_one_document_takes_b_from_itself():
    doc = make_doc(41, [[5 + 2 * i] * 4 for i in range(30)])
    result, config = build([doc], max_seq_length=24)
    check_layout(result, config)
    assert result.stats["notnext"] > 0
    assert result.stats["notnext_same_document"] == result.stats["notnext"]
    one_sentence = make_doc(42, [[9, 11, 13]])
    single, config = build([one_sentence])
    assert len(single.batch) == 1 and single.batch.next_sentence_labels[0] == 1
    check_layout(single, config)


def test_truncation_trims_the_longer_side_from_both_ends():
    pool = [make_doc(51 + d, [[5 + (i + 40 * d) % 190 for i in range(100)]] * 2) for d in range(2)]
    result, config = build(pool, max_seq_length=20, mask_ratios=(0.0, 1.0, 0.0))
    check_layout(result, config)
    for r in range(len(result.batch)):
        length = int(result.batch.input_mask[r].sum())
        sep = int(np.argmax(result.batch.segment_ids[r])) - 1
        len_a, len_b = sep - 1, length - sep - 2
        # Removing from B when equal leaves A one longer for an odd max_num_tokens (17).
        assert length == 20 and (len_a, len_b) == (9, 8)
    # Both ends get trimmed: A does not always start at its sentence's first token.
    firsts = {int(result.batch.input_ids[r, 1]) for r in range(len(result.batch))}
    assert len(firsts) > 1
    assert result.stats["truncated_tokens"] > 0


def test_independent_of_pool_order_and_deterministic():
    pool = synthetic_pool(15, seed=5)
    a, _ = build(pool, 2)
    b, _ = build(list(reversed(pool)), 2)
    assert encode_batch(a.batch) == encode_batch(b.batch)
    assert (a.keys == b.keys).all()
    c, _ = build(pool, 3)
    assert encode_batch(a.batch) != encode_batch(c.batch), "each pass draws afresh"
    d, _ = build(pool, 2, random_seed=1)
    assert encode_batch(a.batch) != encode_batch(d.batch)


def test_instance_keys_do_not_depend_on_the_rest_of_the_pool():
    pool = synthetic_pool(10, seed=6)
    whole, _ = build(pool)
    part, _ = build(pool[:5])
    # A document's instance keys come from (seed, doc_id, pass, ordinal) only.
    assert set(part.keys.tolist()) & set(whole.keys.tolist())


def test_duplicate_documents_are_built_once():
    pool = synthetic_pool(6, seed=8)
    once, _ = build(pool)
    twice, _ = build(pool + pool[:3])
    assert twice.stats["duplicate_documents"] == 3 and once.stats["duplicate_documents"] == 0
    assert encode_batch(once.batch) == encode_batch(twice.batch)


def test_empty_pool():
    result, config = build([])
    assert len(result.batch) == 0 and result.keys.shape == (0,)
    assert encode_batch(result.batch) == []


GOLDEN_TEXT = [
    RawDocument("golden", d, sentences=[
        " ".join(f"w{(d * 7 + s * 3 + w) % 41}x{w % 5}" for w in range(3 + (d + s) % 9)) for s in range(2 + d % 6)
    ])
    for d in range(25)
]
GOLDEN_SHA256 = "47600139b215d2ef30577e5f988a49db413f4bd03f74d372490daecf841dc642"


def test_golden_records():
    stats: dict[str, int] = {}
    config = DatagenConfig(max_seq_length=32, max_predictions_per_seq=6, dupe_factor=2, input_format="sentences",
                           whole_word_mask=True, short_seq_prob=0.2)
    docs = tokenize_documents(GOLDEN_TEXT, FakeTokenizer(), config, stats)
    digest = hashlib.sha256()
    for pass_index in range(config.dupe_factor):
        result = build_pool_instances(docs, pass_index, config, VOCAB)
        for key, record in sorted(zip(result.keys.tolist(), encode_batch(result.batch), strict=True)):
            digest.update(key.to_bytes(8, "little") + record)
    assert digest.hexdigest() == GOLDEN_SHA256


# ---------------------------------------------------------------- properties

configs = st.builds(
    dict,
    max_seq_length=st.integers(5, 48),
    max_predictions_per_seq=st.integers(1, 12),
    masked_lm_prob=st.sampled_from([0.01, 0.15, 0.5, 1.0]),
    short_seq_prob=st.sampled_from([0.0, 0.1, 1.0]),
    whole_word_mask=st.booleans(),
    mask_ratios=st.sampled_from([(0.8, 0.1, 0.1), (1.0, 0.0, 0.0), (0.0, 0.0, 1.0)]),
    random_seed=st.integers(0, 2**40),
    max_notnext_tries=st.integers(1, 10),
)
sentence = st.lists(st.integers(5, FakeVocab().size - 1), min_size=1, max_size=40)
documents = st.lists(st.lists(sentence, min_size=1, max_size=8), min_size=1, max_size=6)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(documents=documents, cfg=configs, pass_index=st.integers(0, 9))
def test_property_matches_reference_and_keeps_invariants(documents, cfg, pass_index):
    pool = [make_doc(1000 + i, sentences) for i, sentences in enumerate(documents)]
    result, config = build(pool, pass_index, **cfg)
    check_layout(result, config)
    assert batch_rows(result.batch, result.keys) == reference_instances(pool, pass_index, config, VOCAB)
    b = result.batch
    for r in range(len(b)):
        n_pred = int(b.masked_lm_weights[r].sum())
        for p, label in zip(b.masked_lm_positions[r, :n_pred], b.masked_lm_ids[r, :n_pred], strict=True):
            assert label not in (VOCAB.cls_id, VOCAB.sep_id, VOCAB.pad_id)
            if config.mask_ratios == (1.0, 0.0, 0.0):
                assert b.input_ids[r, p] == VOCAB.mask_id


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(texts=st.lists(st.text(max_size=300), min_size=1, max_size=6), cfg=configs,
       fmt=st.sampled_from(["text", "sentences"]))
def test_property_unicode_documents_end_to_end(texts, cfg, fmt):
    from bert_datagen.datagen.readers import InputError, read_documents

    config = DatagenConfig(input_format=fmt, sentence_splitter="nupunkt", **cfg)
    stats: dict[str, int] = {}
    raws = []
    for i, text in enumerate(texts):
        try:
            raws.extend(read_documents(f"doc{i}", text.encode("utf-8", "surrogatepass"), config, stats))
        except InputError:
            continue
    docs = tokenize_documents(raws, FakeTokenizer(), config, stats)
    assert all(d.num_sentences and d.num_tokens for d in docs)
    for pass_index in range(2):
        result = build_pool_instances(docs, pass_index, config, VOCAB)
        check_layout(result, config)
        assert len(encode_batch(result.batch)) == len(result.batch)
