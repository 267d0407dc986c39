"""Packing's row plan (bert_datagen.datagen.packed): bounded rows, nothing lost, deterministic."""

from __future__ import annotations

import numpy as np
import pytest

from bert_datagen.datagen.config import ConfigError, DatagenConfig
from bert_datagen.datagen.packed import plan_rows


def test_plan_is_best_fit_decreasing_within_capacity_and_sequence_bound():
    row, offset = plan_rows(np.array([10, 100, 20, 120, 5, 64, 64]), 128, 3, 100)
    # Opened as: 120 (+5), 100 (+20), 64 + 64, 10; numbered by their first instance's key order.
    assert row.tolist() == [0, 1, 1, 2, 2, 3, 3]
    assert offset.tolist() == [0, 0, 100, 0, 120, 0, 64]


@pytest.mark.parametrize("group", [1, 7, 1000])
def test_random_lengths_fit_and_keep_key_order_inside_rows(group):
    lengths = np.random.default_rng(3).integers(3, 129, 500)
    row, offset = plan_rows(lengths, 128, 3, group)
    assert (offset + lengths <= 128).all()
    counts = np.bincount(row)
    assert counts.min() >= 1 and counts.max() <= 3
    for r in range(len(counts)):  # sequences of a row: in key order, back to back from 0
        members = np.nonzero(row == r)[0]
        assert offset[members].tolist() == np.r_[0, np.cumsum(lengths[members])[:-1]].tolist()
    firsts = [int(np.nonzero(row == r)[0][0]) for r in range(len(counts))]
    assert firsts == sorted(firsts)  # rows in the key order of their first sequence
    # Groups: no row mixes instances of two groups.
    assert all(len(set((np.nonzero(row == r)[0] // group).tolist())) == 1 for r in range(len(counts)))
    again = plan_rows(lengths, 128, 3, group)
    assert (again[0] == row).all() and (again[1] == offset).all()


def test_packing_options_are_checked():
    with pytest.raises(ConfigError, match="max-sequences-per-row"):
        DatagenConfig(packing=True, max_sequences_per_row=1)
    with pytest.raises(ConfigError, match="dynamic"):
        DatagenConfig(packing=True, masking="dynamic", dupe_factor=1)
    assert "packing" not in DatagenConfig().to_dict()  # unpacked manifests are unchanged
    assert DatagenConfig(packing=True).to_dict()["max_sequences_per_row"] == 3
