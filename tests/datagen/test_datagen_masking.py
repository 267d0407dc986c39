"""Static masking (RECIPE.md section 3): counts, ratios, uniform choice, whole-word groups."""

from __future__ import annotations

import numpy as np
import pytest

from bert_datagen.datagen.config import DatagenConfig
from bert_datagen.datagen.masking import mask_batch, num_to_predict
from bert_datagen.datagen.rng import Stream
from tests.support.datagen_fakes import FakeVocab, reference_mask

VOCAB = FakeVocab()


def sequences(n: int, seq: int, length: int, seed: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """``n`` rows of ``[CLS] A [SEP] B [SEP]`` with A of 10 tokens, padded to ``seq``."""
    draws = Stream.for_purpose(seed, "test-masking").u64_array(n * seq)
    ids = (5 + draws % np.uint64(2 * 97)).astype(np.int32).reshape(n, seq)
    ids[:, 0] = VOCAB.cls_id
    ids[:, 11] = VOCAB.sep_id
    ids[:, length - 1] = VOCAB.sep_id
    ids[:, length:] = 0
    return ids, np.full(n, length)


def test_num_to_predict_rounds_half_to_even_and_clamps():
    config = DatagenConfig(max_predictions_per_seq=20, masked_lm_prob=0.15)
    lengths = np.array([5, 10, 30, 50, 128, 300])
    expected = [min(20, max(1, round(n * 0.15))) for n in lengths.tolist()]
    assert num_to_predict(lengths, config).tolist() == expected == [1, 2, 4, 8, 19, 20]


def test_counts_positions_labels_and_padding():
    config = DatagenConfig(max_seq_length=64, max_predictions_per_seq=8)
    ids, lengths = sequences(500, 64, 40)
    keys = Stream(99).u64_array(500)
    out = mask_batch(ids, lengths, keys, config, VOCAB)
    assert (out.masked_lm_weights.sum(axis=1) == 6).all()  # round(40 * 0.15) = 6
    assert (out.masked_lm_positions[:, 6:] == 0).all() and (out.masked_lm_ids[:, 6:] == 0).all()
    for r in range(0, 500, 50):
        pos = out.masked_lm_positions[r, :6]
        assert (np.diff(pos) > 0).all() and not set(pos.tolist()) & {0, 11, 39}
        assert (out.masked_lm_ids[r, :6] == ids[r, pos]).all()
        untouched = np.setdiff1d(np.arange(64), pos)
        assert (out.input_ids[r, untouched] == ids[r, untouched]).all()
        ref = reference_mask(ids[r, :40].tolist(), int(keys[r]), config, VOCAB)
        assert ref["positions"] == pos.tolist() and ref["input_ids"] == out.input_ids[r, :40].tolist()


@pytest.mark.parametrize("ratios", [(0.8, 0.1, 0.1), (1.0, 0.0, 0.0), (0.0, 1.0, 0.0), (0.0, 0.0, 1.0), (0.5, 0.3, 0.2)])
def test_mask_keep_random_ratios(ratios):
    config = DatagenConfig(max_seq_length=64, max_predictions_per_seq=10, mask_ratios=ratios)
    ids, lengths = sequences(4000, 64, 64)
    out = mask_batch(ids, lengths, Stream(7).u64_array(4000), config, VOCAB)
    n = int(out.masked_lm_weights.sum())
    rows = np.repeat(np.arange(4000), 10)
    pos = out.masked_lm_positions.ravel()
    new, old = out.input_ids[rows, pos], out.masked_lm_ids.ravel()
    masked = (new == VOCAB.mask_id).mean()
    same = (new == old).mean()
    p_same_by_chance = ratios[2] / VOCAB.size
    assert n == 40000
    assert abs(masked - ratios[0] - ratios[2] / VOCAB.size) < 0.012
    assert abs(same - ratios[1] - p_same_by_chance) < 0.012
    if ratios[2]:
        replaced = new[(new != VOCAB.mask_id) & (new != old)]
        # Random tokens are uniform over the whole vocabulary, special tokens included.
        assert replaced.min() < 5 and replaced.max() >= VOCAB.size - 3


def test_positions_are_chosen_uniformly():
    config = DatagenConfig(max_seq_length=32, max_predictions_per_seq=4)
    ids, lengths = sequences(20000, 32, 32)
    out = mask_batch(ids, lengths, Stream(3).u64_array(20000), config, VOCAB)
    counts = np.bincount(out.masked_lm_positions.ravel(), minlength=32)
    candidates = [p for p in range(32) if p not in (0, 11, 31)]
    expected = 20000 * 4 / len(candidates)  # round(32 * 0.15) = 5 -> capped at 4
    assert counts[0] == 0 and counts[11] == 0 and counts[31] == 0
    assert np.abs(counts[candidates] - expected).max() < 5 * np.sqrt(expected)


def test_whole_word_groups_are_masked_together():
    config = DatagenConfig(max_seq_length=64, max_predictions_per_seq=12, whole_word_mask=True, masked_lm_prob=0.2)
    ids, lengths = sequences(3000, 64, 60)
    out = mask_batch(ids, lengths, Stream(5).u64_array(3000), config, VOCAB)
    cont = VOCAB.is_continuation
    partial = 0
    for r in range(3000):
        n = int(out.masked_lm_weights[r].sum())
        chosen = set(out.masked_lm_positions[r, :n].tolist())
        assert n <= 12
        for p in range(2, 59):  # a "##" right after [CLS] starts its own group
            if p == 11 or not cont[ids[r, p]]:
                continue
            # A "##" piece and the piece it continues are masked together or not at all
            # (after [SEP] it continues the last piece of A, as in the original).
            q = p - 1 if p - 1 != 11 else 10
            partial += (p in chosen) != (q in chosen)
    assert partial == 0
    # Groups never push the count past num_to_predict; most rows still reach it exactly.
    full = (out.masked_lm_weights.sum(axis=1) == 12).mean()
    assert full > 0.9


def test_whole_word_scan_reaches_groups_far_down_the_order():
    # Two-piece words everywhere but two one-piece words at the end, and an odd num_to_predict
    # (round(61 * 0.15) = 9): a row is filled only by a one-piece word, which is often far down
    # the random order, past the first target + 8 groups that are ordered first.
    config = DatagenConfig(max_seq_length=64, max_predictions_per_seq=20, whole_word_mask=True)
    n = 200
    draws = Stream(12).u64_array(n * 64).reshape(n, 64)
    word = (5 + 2 * (draws % np.uint64(97))).astype(np.int32)
    ids = np.zeros((n, 64), dtype=np.int32)
    for p in range(1, 60):
        starts_word = p % 2 == 1 if p < 11 else (p % 2 == 0 or p == 59)
        ids[:, p] = word[:, p] if starts_word else word[:, p] + 1
    ids[:, 0], ids[:, 11], ids[:, 60] = VOCAB.cls_id, VOCAB.sep_id, VOCAB.sep_id
    keys = Stream(11).u64_array(n)
    out = mask_batch(ids, np.full(n, 61), keys, config, VOCAB)
    counts = out.masked_lm_weights.sum(axis=1)
    assert set(counts.tolist()) == {8.0, 9.0}  # 8 when both one-piece words come early
    for r in range(n):
        ref = reference_mask(ids[r, :61].tolist(), int(keys[r]), config, VOCAB)
        assert out.masked_lm_positions[r, : int(counts[r])].tolist() == ref["positions"]
        assert out.input_ids[r, :61].tolist() == ref["input_ids"]
