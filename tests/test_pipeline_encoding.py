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
