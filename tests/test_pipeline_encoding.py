"""The vectorized record encoder the pipeline uses equals the one-record-at-a-time reference."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from datagen import records


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
    assert records.encode_batch(batch) == records.encode_batch_reference(batch)


@given(st.integers(0, 30), st.integers(1, 40), st.integers(0, 2**32 - 1), st.sampled_from([2, 2**14, 30522, 2**63]))
@settings(max_examples=40, deadline=None)
def test_framed_encoder_equals_frame_record(n: int, seq: int, seed: int, high: int) -> None:
    rng = np.random.default_rng(seed)
    batch = records.InstanceBatch(rng.integers(0, high, (n, seq), dtype=np.int64), rng.integers(0, 2, (n, seq)),
                                  rng.integers(0, 2, (n, seq)), rng.integers(0, seq, (n, 3)),
                                  rng.integers(0, high, (n, 3), dtype=np.int64),
                                  rng.random((n, 3)).astype(np.float32), rng.integers(0, 2, n))
    framed, lengths = records.encode_framed(batch)
    expected = [records.frame_record(p) for p in records.encode_batch_reference(batch)]
    assert framed == b"".join(expected)
    assert lengths.tolist() == [len(r) for r in expected]


def test_encode_records_sorts_by_key_and_slices_shards() -> None:
    from pipelines.run import encode_records

    rng = np.random.default_rng(3)
    n = 50
    batch = records.InstanceBatch(rng.integers(0, 999, (n, 8)), np.ones((n, 8), np.int64), np.zeros((n, 8), np.int64),
                                  rng.integers(0, 8, (n, 2)), rng.integers(0, 999, (n, 2)),
                                  np.ones((n, 2), np.float32), rng.integers(0, 2, n))
    keys = rng.integers(0, 2**64 - 1, n, dtype=np.uint64)
    encoded, order = encode_records(batch, keys)
    assert (np.diff(encoded.keys.astype(object)) > 0).all() and (keys[order] == encoded.keys).all()
    expected = [records.frame_record(p) for p in records.encode_batch_reference(batch)]
    assert encoded.blob == b"".join(expected[i] for i in order)
    part = encoded.slice(10, 20)
    assert part.blob == b"".join(expected[i] for i in order[10:20]) and part.keys.tolist() == keys[order[10:20]].tolist()
