"""Dynamic masking's masks (``bert_datagen.datagen.dynamic``): a pure function of (seed, record, epoch), new each
epoch, and statistically the static masks of the same records (the same rule, other keys)."""

from __future__ import annotations

import numpy as np
import pytest

from bert_datagen.datagen.config import DatagenConfig
from bert_datagen.datagen.documents import unique_documents
from bert_datagen.datagen.dynamic import dynamic_mask_keys, mask_records
from bert_datagen.datagen.instances import masked_rows
from bert_datagen.datagen.instances import plan_pool_pass as plan_unique_pool
from tests.support.datagen_fakes import FakeVocab, synthetic_pool

VOCAB = FakeVocab()


def plan_pool_pass(pool, pass_index, config):
    """The plan of a pool in any order, with duplicates (the pipeline dedupes pools once)."""
    return plan_unique_pool(unique_documents(pool)[0], pass_index, config)


def records(unit: str, objective: str = "nsp", n_docs: int = 1500):
    """The same instances, once masked statically and once unmasked for dynamic masking."""
    common = dict(max_seq_length=64, max_predictions_per_seq=10, masking_unit=unit, objective=objective,
                  mask_ratios=(0.8, 0.1, 0.1))
    static = DatagenConfig(**common)
    dynamic = DatagenConfig(**common, masking="dynamic", dupe_factor=1)
    pool = synthetic_pool(n_docs, seed=31, max_sentences=10, max_len=20)
    plan = plan_pool_pass(pool, 0, dynamic)
    rows = np.arange(len(plan))
    return masked_rows(plan_pool_pass(pool, 0, static), rows, static, VOCAB), masked_rows(plan, rows, dynamic, VOCAB), static


def test_a_mask_is_a_pure_function_of_seed_record_and_epoch():
    _, unmasked, config = records("word", n_docs=60)
    ids, mask, key = unmasked.input_ids, unmasked.input_mask, unmasked.instance_key
    a = mask_records(ids, mask, key, 3, 7, config, VOCAB)
    order = np.random.default_rng(0).permutation(len(unmasked))  # other batches, other order
    b = mask_records(ids[order], mask[order], key[order], np.full(len(order), 3), 7, config, VOCAB)
    assert np.array_equal(a.input_ids[order], b.input_ids)
    assert np.array_equal(a.masked_lm_positions[order], b.masked_lm_positions)
    one = mask_records(ids[5:6], mask[5:6], key[5:6], 3, 7, config, VOCAB)
    assert np.array_equal(one.input_ids[0], a.input_ids[5])
    for other in (mask_records(ids, mask, key, 4, 7, config, VOCAB), mask_records(ids, mask, key, 3, 8, config, VOCAB)):
        changed = (other.masked_lm_positions != a.masked_lm_positions).any(axis=1).mean()
        assert changed > 0.9  # another epoch or seed: (almost) every record gets another mask
    keys = dynamic_mask_keys(7, key, np.arange(5)[:, None])
    assert len(np.unique(keys)) == keys.size


@pytest.mark.parametrize("unit", ["token", "word", "span"])
def test_dynamic_masks_match_static_masking_statistics(unit):
    static, unmasked, config = records(unit)
    n = len(unmasked)
    assert n > 3000
    dynamic = mask_records(unmasked.input_ids, unmasked.input_mask, unmasked.instance_key, 0, 12345, config, VOCAB)
    assert not np.array_equal(dynamic.masked_lm_positions, static.masked_lm_positions)
    s_count, d_count = static.masked_lm_weights.sum(axis=1), dynamic.masked_lm_weights.sum(axis=1)
    if unit == "token":  # the count is the recipe's num_to_predict: no randomness in it
        assert np.array_equal(s_count, d_count)
    else:  # groups may leave a row short; same rule, so the same mean within sampling error
        se = np.sqrt((s_count.var() + d_count.var()) / n)
        assert abs(s_count.mean() - d_count.mean()) < 4 * se + 1e-9

    def shares(batch):
        rows = np.repeat(np.arange(n), batch.masked_lm_weights.shape[1])
        live = batch.masked_lm_weights.ravel() > 0
        new = batch.input_ids[rows[live], batch.masked_lm_positions.ravel()[live]]
        old = batch.masked_lm_ids.ravel()[live]
        return np.array([(new == VOCAB.mask_id).mean(), (new == old).mean()]), live.sum()

    (s_share, s_n), (d_share, d_n) = shares(static), shares(dynamic)
    # span masking decides per span, so its shares vary more: the span count bounds the effective n
    effective = min(s_n, d_n) / (3.0 if unit == "span" else 1.0)
    assert np.abs(s_share - d_share).max() < 4 * np.sqrt(0.16 * 2 / effective)

    def run_lengths(batch):
        """Lengths of runs of consecutive masked positions (groups and spans show up as runs)."""
        out = []
        for r in range(n):
            k = int(batch.masked_lm_weights[r].sum())
            pos = batch.masked_lm_positions[r, :k]
            breaks = np.nonzero(np.diff(pos) != 1)[0]
            out += np.diff(np.concatenate([[-1], breaks, [k - 1]])).tolist()
        return np.asarray(out)

    s_runs, d_runs = run_lengths(static), run_lengths(dynamic)
    se = np.sqrt(s_runs.var() / s_runs.size + d_runs.var() / d_runs.size)
    assert abs(s_runs.mean() - d_runs.mean()) < 4 * se
    if unit == "span":
        assert s_runs.mean() > 2.0  # spans really are longer than words
