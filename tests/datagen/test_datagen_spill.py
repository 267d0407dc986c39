"""The read stage's spill files and the flat pools a pass plans from: each a faster or smaller path to
what the per-document code computes, so each is checked against it."""

from __future__ import annotations

import io

import numpy as np
import pytest

from bert_datagen.datagen.config import DatagenConfig
from bert_datagen.datagen.documents import unique_documents
from bert_datagen.datagen.instances import FlatPool, plan_pool_pass
from bert_datagen.datagen.placement import pool_hashes, pool_of, pool_runs
from bert_datagen.datagen.staging import StagedPool, flat_pool_from_bytes, pool_from_bytes, pool_to_bytes
from tests.support.datagen_fakes import make_doc, synthetic_pool

CONFIG = DatagenConfig(max_seq_length=32, max_predictions_per_seq=5)


def test_flat_pool_from_staged_arrays_equals_the_per_document_one() -> None:
    docs, _ = unique_documents(synthetic_pool(40, seed=3) + [make_doc(5, [[7]]), make_doc(2**64 - 1, [[1, 2], [3]])])
    data = pool_to_bytes(docs)
    flat, slow = flat_pool_from_bytes(data, "pool.bin"), FlatPool.of(docs)
    for name in ("doc_ids", "tokens", "first_sentence", "token_cumsum"):
        assert np.array_equal(getattr(flat, name), getattr(slow, name)), name
    for pass_index in (0, 3):
        fast_plan, slow_plan = plan_pool_pass(flat, pass_index, CONFIG), plan_pool_pass(docs, pass_index, CONFIG)
        assert np.array_equal(fast_plan.keys, slow_plan.keys)
        assert np.array_equal(fast_plan.a_lo, slow_plan.a_lo) and np.array_equal(fast_plan.len_b, slow_plan.len_b)


@pytest.mark.parametrize(("lo", "hi"), [(0, 0), (0, 30), (7, 8), (12, 30), (29, 30)])
def test_a_run_of_a_spill_file_reads_the_same_documents_as_the_whole_file(lo: int, hi: int) -> None:
    docs = synthetic_pool(30, seed=8)
    data = pool_to_bytes(docs)
    whole = pool_from_bytes(data, "spill.bin")
    staged = StagedPool(io.BytesIO(data), "spill.bin")
    assert staged.doc_ids.tolist() == [d.doc_id for d in whole]
    part = staged.documents(lo, hi)
    assert [d.doc_id for d in part] == [d.doc_id for d in whole[lo:hi]]
    for got, want in zip(part, whole[lo:hi], strict=True):
        assert got.tokens.tolist() == want.tokens.tolist()
        assert got.sentence_ends.tolist() == want.sentence_ends.tolist()


def test_a_cut_spill_file_is_named_not_misread() -> None:
    data = pool_to_bytes(synthetic_pool(5, seed=1))
    with pytest.raises(RuntimeError, match="spill.bin: staging file cut short"):
        StagedPool(io.BytesIO(data[:-3]), "spill.bin").documents(0, 5)


@pytest.mark.parametrize("num_pools", [1, 2, 7, 300])
def test_pool_runs_of_hash_sorted_documents_are_each_documents_pool(num_pools: int) -> None:
    ids = np.random.default_rng(5).integers(0, 2**63, 200, dtype=np.uint64) * np.uint64(2) + np.uint64(1)
    ids = ids[np.argsort(pool_hashes(ids, CONFIG), kind="stable")]
    runs = pool_runs(pool_hashes(ids, CONFIG), num_pools)
    got = np.full(ids.shape[0], -1)
    for pool, lo, hi in runs:
        got[lo:hi] = pool
    assert got.tolist() == [pool_of(int(i), num_pools, CONFIG) for i in ids]
    assert [p for p, _, _ in runs] == sorted({p for p, _, _ in runs})
