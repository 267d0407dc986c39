"""NotNext pools bounded by tokens (issue #44 point 1): where ``pool_cuts`` cuts, and what it leaves alone."""

from __future__ import annotations

import numpy as np
import pytest

from bert_datagen.datagen.config import ConfigError, DatagenConfig
from bert_datagen.datagen.placement import num_pools_for, pool_cuts, pool_hashes, pool_of, pool_runs


def _pools(ids: np.ndarray, tokens: np.ndarray, config: DatagenConfig) -> tuple[list[np.ndarray], list[int]]:
    """Each pool's token counts (documents in hash order, as a spill file holds them) and the cuts."""
    num_pools = num_pools_for(ids.size, config)
    cuts = pool_cuts(ids, tokens, num_pools, config)
    order = np.argsort(pool_hashes(ids, config), kind="stable")
    runs = pool_runs(pool_hashes(ids, config)[order], num_pools, cuts)
    for pool, lo, hi in runs:  # the run of each document is its pool_of
        assert {pool_of(int(i), num_pools, config, cuts) for i in ids[order][lo:hi]} == {pool}
    assert sum(hi - lo for _, lo, hi in runs) == ids.size
    return [tokens[order][lo:hi] for _, lo, hi in runs], cuts


def _corpus(seed: int, docs: int, most_tokens: int) -> tuple[np.ndarray, np.ndarray]:
    g = np.random.default_rng(seed)
    ids = np.unique(g.integers(0, 2**63, docs, dtype=np.uint64))
    return ids, g.integers(1, most_tokens + 1, ids.size)


@pytest.mark.parametrize("seed", range(12))
def test_pools_hold_a_quarter_of_the_bound_to_the_bound_and_two_documents_at_least(seed: int) -> None:
    bound = 4_000 + 997 * seed
    ids, tokens = _corpus(seed, 300, bound // 4)  # no document over a quarter of the bound
    config = DatagenConfig(notnext_pool_tokens=bound, notnext_pool_size=[60, 120, 10_000][seed % 3],
                            random_seed=seed)
    pools, cuts = _pools(ids, tokens, config)
    assert cuts, "every pool is many times the bound: each must be cut"
    assert max(int(p.sum()) for p in pools) <= bound
    assert min(p.size for p in pools) >= 2
    assert min(int(p.sum()) for p in pools) >= bound // 4  # no pool of a few documents at the end of a run


def test_a_pool_within_the_bound_is_not_cut() -> None:
    """A corpus within the bound keeps the pools (and so the bytes) it had before the bound existed."""
    ids, tokens = _corpus(5, 400, 50)
    config = DatagenConfig(notnext_pool_size=100, notnext_pool_tokens=int(tokens.sum()))
    assert pool_cuts(ids, tokens, num_pools_for(ids.size, config), config) == []
    unbounded = DatagenConfig(notnext_pool_size=100, notnext_pool_tokens=None)
    hashes = np.sort(pool_hashes(ids, config))
    assert pool_runs(hashes, 4, []) == pool_runs(hashes, 4)
    assert pool_cuts(ids, tokens, 4, unbounded) == []


def test_only_the_pools_over_the_bound_are_cut() -> None:
    ids, tokens = _corpus(8, 400, 40)
    config = DatagenConfig(notnext_pool_size=100)
    hashes = pool_hashes(ids, config)
    first = np.array([pool_of(int(i), 4, config) == 0 for i in ids])
    tokens = np.where(first, tokens * 1_000, tokens)  # pool 0 far over the bound, the others within
    bound = int(tokens[~first].sum())  # more than any other pool holds
    config = DatagenConfig(notnext_pool_size=100, notnext_pool_tokens=bound)
    pools, cuts = _pools(ids, tokens, config)
    assert cuts and max(cuts) < hashes[~first].min()  # every cut inside pool 0's range of hashes
    others = pool_runs(np.sort(hashes[~first]), 4)
    assert sorted(p.size for p in pools)[-len(others):] == sorted(hi - lo for _, lo, hi in others)


def test_documents_big_against_the_bound_still_pair_with_another() -> None:
    """Documents over half the bound: a pool is two (or three) of them, never one alone."""
    ids, tokens = _corpus(3, 50, 3_000)
    tokens = tokens + 2_000
    config = DatagenConfig(notnext_pool_tokens=1_000)
    pools, _ = _pools(ids, tokens, config)
    assert len(pools) > 10 and all(2 <= p.size <= 3 for p in pools)


def test_the_same_documents_give_the_same_cuts_in_any_order() -> None:
    ids, tokens = _corpus(11, 300, 500)
    config = DatagenConfig(notnext_pool_tokens=5_000)
    back = np.arange(ids.size)[::-1]
    assert pool_cuts(ids, tokens, 1, config) == pool_cuts(ids[back], tokens[back], 1, config)


@pytest.mark.parametrize("value", [0, 999, 2**40 + 1, -5])
def test_the_bound_is_refused_outside_its_range(value: int) -> None:
    with pytest.raises(ConfigError, match=rf"--notnext-pool-tokens {value} must be in \[1,000, "):
        DatagenConfig(notnext_pool_tokens=value)


def test_a_manifest_of_an_earlier_version_had_no_bound() -> None:
    recorded = DatagenConfig().to_dict()
    del recorded["notnext_pool_tokens"]
    assert DatagenConfig.from_recorded(recorded).notnext_pool_tokens is None
    assert DatagenConfig.from_recorded(DatagenConfig(notnext_pool_tokens=5_000).to_dict()).notnext_pool_tokens == 5_000
