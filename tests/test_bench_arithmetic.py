"""The arithmetic the trainer benchmark reports its input-overhead figures with."""

import pytest

from benchmarks.bench_trainer import input_ratios


def test_input_ratios_pair_blocks_and_keep_the_cpu_bound_apart():
    # (wall, cpu) per block; pair 2 ran while another job slowed the machine down.
    real = [(1.0, 2.0), (3.0, 2.1), (1.1, 2.0)]
    cached = [(1.0, 1.9), (1.5, 1.9), (1.0, 1.9)]
    r = input_ratios(real, cached)
    assert r["input_ratio_pairs"] == pytest.approx([1.0, 0.5, 1.0 / 1.1])
    assert r["input_ratio_median_of_pairs"] == pytest.approx(1.0 / 1.1)
    assert r["input_ratio_real_over_cached"] == pytest.approx(3.5 / 5.1)
    assert r["input_cpu_ratio_cached_over_real"] == pytest.approx(5.7 / 6.1)


def test_input_ratios_need_pairs():
    with pytest.raises(ValueError):
        input_ratios([(1.0, 1.0)], [])
