"""The vectorized record encoder the pipeline uses equals the one-record-at-a-time reference."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bert_datagen.datagen import records, tfrecord
from tests.support.record_encoding import encode_batch, encode_batch_reference


@given(st.integers(0, 40), st.integers(1, 70), st.integers(1, 12), st.integers(0, 2**32 - 1),
       st.sampled_from([2**7, 2**14, 30522, 2**40, 2**63]))
@settings(max_examples=60, deadline=None)
def test_vectorized_encoder_equals_reference(n: int, seq: int, pred: int, seed: int, high: int) -> None:
    rng = np.random.default_rng(seed)
    batch = records.InstanceBatch(
        input_ids=rng.integers(0, high, (n, seq), dtype=np.int64),
        input_mask=rng.integers(0, 2, (n, seq)),
        segment_ids=rng.integers(0, 2, (n, seq)),
        masked_lm_positions=rng.integers(0, seq, (n, pred)),
        masked_lm_ids=rng.integers(-3, high, (n, pred), dtype=np.int64),
        masked_lm_weights=rng.random((n, pred)).astype(np.float32),
        next_sentence_labels=rng.integers(0, 2, n),
    )
    assert encode_batch(batch) == encode_batch_reference(batch)


@given(st.integers(0, 30), st.integers(1, 40), st.integers(0, 2**32 - 1), st.sampled_from([2, 2**14, 30522, 2**63]))
@settings(max_examples=40, deadline=None)
def test_framed_encoder_equals_frame_record(n: int, seq: int, seed: int, high: int) -> None:
    rng = np.random.default_rng(seed)
    batch = records.InstanceBatch(rng.integers(0, high, (n, seq), dtype=np.int64), rng.integers(0, 2, (n, seq)),
                                  rng.integers(0, 2, (n, seq)), rng.integers(0, seq, (n, 3)),
                                  rng.integers(0, high, (n, 3), dtype=np.int64),
                                  rng.random((n, 3)).astype(np.float32), rng.integers(0, 2, n))
    framed, lengths = records.frame_columns(batch.columns())
    expected = [tfrecord.frame_record(p) for p in encode_batch_reference(batch)]
    assert framed == b"".join(expected)
    assert lengths.tolist() == [len(r) for r in expected]


def _random_pool_setup(seed: int, documents: int):
    """A small vocab, a pool of ``documents`` random documents (sorted, unique) and a short-sequence config."""
    from bert_datagen.datagen.config import DatagenConfig
    from bert_datagen.datagen.documents import TokenizedDocument
    from bert_datagen.vocab.vocab_file import Vocab

    vocab = Vocab(("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *[f"w{i}" for i in range(995)]), "v")
    rng = np.random.default_rng(seed)
    docs = []
    for _ in range(documents):
        lengths = rng.integers(1, 30, rng.integers(1, 12))
        docs.append(TokenizedDocument(doc_id=int(rng.integers(1, 2**63)), tokens=rng.integers(5, 1000, lengths.sum()),
                                      sentence_ends=np.cumsum(lengths).astype(np.int32)))
    return vocab, docs, DatagenConfig(max_seq_length=32, max_predictions_per_seq=5)


def test_encode_pool_pass_writes_records_in_key_order_equal_to_the_batch(monkeypatch) -> None:
    from bert_datagen.datagen import framed
    from bert_datagen.datagen.documents import unique_documents
    from bert_datagen.datagen.instances import build_pool_instances

    vocab, docs, config = _random_pool_setup(3, 40)
    monkeypatch.setattr(framed, "ENCODE_CHUNK_ROWS", 7)  # several blocks, and a ragged last one
    built = framed.encode_pool_pass(unique_documents(docs)[0], 1, config, vocab)
    encoded, labels, masked = built.records, built.labels, built.masked
    whole = build_pool_instances(docs, 1, config, vocab)  # the same instances, in plan order
    order = np.argsort(whole.keys, kind="stable")
    assert len(encoded) == len(order) > 7
    assert (np.diff(encoded.keys.astype(object)) > 0).all() and (encoded.keys == whole.keys[order]).all()
    expected = [tfrecord.frame_record(p) for p in encode_batch_reference(whole.batch)]
    assert encoded.blob == b"".join(expected[i] for i in order)
    assert labels.tolist() == np.asarray(whole.batch.next_sentence_labels)[order].tolist()
    assert masked.tolist() == (whole.batch.masked_lm_weights[order] > 0).sum(axis=1).tolist()
    part = encoded.slice(10, 20)
    assert part.blob == b"".join(expected[i] for i in order[10:20])


@pytest.mark.parametrize(("chunk_rows", "num_shards"), [(7, 5), (200, 5), (3, 40), (1000, 1)])
def test_a_pass_handed_over_by_shard_is_the_whole_pass_cut_by_shard(monkeypatch, chunk_rows, num_shards) -> None:
    """A shard's run may span blocks, and a block several shards' runs (or ends one exactly): the runs,
    in order, are the whole pass cut where ``shard_of_keys`` cuts it, and the counters ride on the first."""
    from bert_datagen.datagen import framed
    from bert_datagen.datagen.documents import unique_documents
    from bert_datagen.datagen.instances import plan_pool_pass
    from bert_datagen.datagen.placement import shard_of_keys

    vocab, docs, config = _random_pool_setup(5, 60)
    pool = unique_documents(docs)[0]
    whole = framed.encode_pool_pass(pool, 2, config, vocab)  # one block of 4096 rows: the reference
    monkeypatch.setattr(framed, "ENCODE_CHUNK_ROWS", chunk_rows)
    runs = list(framed.pass_shard_records(plan_pool_pass(pool, 2, config), config, vocab, num_shards))
    shards = shard_of_keys(whole.records.keys, num_shards)
    assert [s for s, _ in runs] == sorted(set(shards.tolist()))
    at = 0
    for shard, part in runs:
        n = int((shards == shard).sum())
        expected = whole.records.slice(at, at + n)
        assert bytes(part.records.blob) == bytes(expected.blob)
        assert (part.records.keys == expected.keys).all() and (part.records.lengths == expected.lengths).all()
        assert (part.labels == whole.labels[at:at + n]).all() and (part.masked == whole.masked[at:at + n]).all()
        at += n
    assert at == len(whole.records) > 100
    assert runs[0][1].stats == whole.stats and all(part.stats == {} for _, part in runs[1:])
