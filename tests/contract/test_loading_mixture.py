"""Weighted mixtures of datasets (`contract/loading/mixture.py`): one stream with the guarantees of
one dataset (pure, any world size, resumable), each record from its dataset's own order, the
weights exact per window, and datasets of another layout or vocab refused with one line."""

from __future__ import annotations

import re

import numpy as np
import pytest

from bert_datagen.contract.bounds import ArgumentError
from bert_datagen.contract.loading.batches import NumpyBatches
from bert_datagen.contract.loading.mixture import (
    MIXTURE_FEATURE,
    MixedBatches,
    MixtureError,
    apportion,
    mixture_fingerprint,
    parse_weights,
)
from bert_datagen.contract.loading.source import LoadError, open_source
from tests.support.synthetic import write_synthetic_dataset

B, BS, SEED, WINDOW = 8, 4, 9, 40


@pytest.fixture(scope="module")
def datasets(tmp_path_factory):
    def make(name: str, **kw) -> str:
        return write_synthetic_dataset(str(tmp_path_factory.mktemp(name)), eval_records=0, **kw)

    return {"a": make("a", train_shards=2, records_per_shard=30, seed=1),
            "b": make("b", train_shards=1, records_per_shard=45, seed=2),
            "long": make("long", train_shards=1, records_per_shard=20, seq_len=48, seed=3),
            "vocab": make("vocab", train_shards=1, records_per_shard=20, vocab_size=300, seed=4),
            "dynamic": make("dynamic", train_shards=1, records_per_shard=20, masking="dynamic", seed=5),
            "dynamic2": make("dynamic2", train_shards=2, records_per_shard=17, masking="dynamic", seed=6)}


def _mix(datasets, weights=(0.7, 0.3), **kw) -> MixedBatches:
    return MixedBatches([open_source(datasets["a"]), open_source(datasets["b"])], list(weights), seed=SEED,
                        batch_size=B, block_size=BS, window=WINDOW, **kw)


def test_apportion_and_weights() -> None:
    assert apportion([0.7, 0.3], 40) == (28, 12)
    assert apportion([1, 1, 1], 10) == (4, 3, 3)
    assert parse_weights("7,3", 2) == [7.0, 3.0]
    for bad in ("0.7", "a,b", "1,0", "1,nan"):
        with pytest.raises(MixtureError):
            parse_weights(bad, 2)
    with pytest.raises(MixtureError, match="no record in a mixture window"):
        apportion([1, 1e-9], 4096)


@pytest.mark.parametrize("given", [{"world_size": 2}, {"rank": 1}])
def test_a_world_size_without_a_rank_and_the_reverse_are_refused(datasets, given) -> None:
    """Issue #43 point 2: either alone read rank 0's share or the whole batch on every process."""
    missing = "world_size" if "rank" in given else "rank"
    with pytest.raises(ArgumentError, match=f"without {missing}") as raised:
        _mix(datasets, **given)
    assert raised.value.argument == missing


def test_weights_are_numbers_whose_shares_are_kept_even_when_their_sum_overflows(datasets) -> None:
    """Issue #43 point 8: [1e308, 1e308] ended in IndexError (their sum is inf); "0.7" and True were
    taken as weights by float()."""
    assert apportion([1e308, 1e308], 40) == (20, 20)
    assert apportion([1e308, 5e307], 30) == (20, 10)
    assert _mix(datasets, weights=(1e308, 1e308)).counts == (20, 20)
    for weights, bad in ((("0.7", "0.3"), "weights[0] must be a number, got '0.7' (str)"),
                         ((True, True), "weights[0] must be a number, got True (bool)"),
                         ((0.7, None), "weights[1] must be a number, got None (NoneType)")):
        with pytest.raises(TypeError, match=re.escape(bad)):
            _mix(datasets, weights=weights)


def test_a_datasets_train_and_eval_splits_mix_as_two_datasets(tmp_path) -> None:
    """Issue #43 point 8: they were refused as "the same dataset", though their records are disjoint;
    the same split twice still is the same records. A mixture of train splits keeps the fingerprint
    it had (runs recorded it), and one with another split is told apart from it."""
    path = write_synthetic_dataset(str(tmp_path / "both"), train_shards=1, records_per_shard=40, eval_records=32)
    train, held = open_source(path), open_source(path, "eval")
    mix = MixedBatches([train, held], [1, 1], seed=SEED, batch_size=B, block_size=BS, window=WINDOW)
    own = [NumpyBatches(s, seed=SEED, batch_size=B, block_size=BS) for s in (train, held)]
    batch = mix.batch_at(0)
    dataset, sub = mix.place(np.arange(B))
    for row, (d, p) in enumerate(zip(dataset.tolist(), sub.tolist(), strict=True)):
        assert np.array_equal(batch["input_ids"][row], own[d].read_positions(np.array([p]))["input_ids"][0])
    assert set(dataset.tolist()) == {0, 1}
    with pytest.raises(MixtureError, match="the same dataset and split as"):
        MixedBatches([train, open_source(path)], [1, 1], seed=SEED, batch_size=B, block_size=BS, window=WINDOW)
    assert mix.fingerprint != mixture_fingerprint([train.fingerprint, train.fingerprint], mix.counts, WINDOW)


def test_a_mixture_of_train_splits_keeps_its_recorded_fingerprint(datasets) -> None:
    mix = _mix(datasets)
    assert mix.fingerprint == mixture_fingerprint([s.fingerprint for s in mix.sources], mix.counts, WINDOW)


def test_each_record_comes_from_its_datasets_own_order(datasets) -> None:
    mix = _mix(datasets)
    sources = mix.sources
    own = [NumpyBatches(s, seed=SEED, batch_size=B, block_size=BS) for s in sources]
    steps = 3 * WINDOW // B  # three mixture windows
    got = [mix.batch_at(s) for s in range(steps)]
    labels = np.concatenate([g[MIXTURE_FEATURE] for g in got])
    for w in range(3):  # the weights, exactly, in every window
        assert np.bincount(labels[w * WINDOW:(w + 1) * WINDOW], minlength=2).tolist() == [28, 12]
    dataset, sub = mix.place(np.arange(steps * B))
    for d in range(2):  # dataset d's records in its own order, none skipped, none twice
        assert sorted(sub[dataset == d].tolist()) == list(range(int((dataset == d).sum())))
    for step, batch in enumerate(got):
        for i in range(B):
            d, p = int(dataset[step * B + i]), int(sub[step * B + i])
            want = own[d].read_positions(np.array([p]))
            for k in want:
                assert (batch[k][i] == want[k][0]).all(), (step, i, k)


def test_a_dynamic_mixture_masks_each_record_as_its_own_datasets_reader_does(datasets) -> None:
    """Each record masked by its dataset's seed, instance key and the epoch of that dataset it is
    read in (past the first epoch of the smaller dataset), and asked-for positions read alone equal
    the stepped batches."""
    mix = MixedBatches([open_source(datasets["dynamic"]), open_source(datasets["dynamic2"])], [0.5, 0.5],
                       seed=SEED, batch_size=B, block_size=BS, window=WINDOW)
    own = [NumpyBatches(s, seed=SEED, batch_size=B, block_size=BS) for s in mix.sources]
    steps = 12  # 96 positions: about 48 of each dataset, two epochs and more of the 20-record one
    dataset, sub = mix.place(np.arange(steps * B))
    assert sub[dataset == 0].max() >= 2 * mix.sources[0].counts[0]
    for step in range(steps):
        batch = mix.batch_at(step)
        alone = mix.read_positions(np.arange(step * B, (step + 1) * B))
        for i in range(B):
            d, p = int(dataset[step * B + i]), int(sub[step * B + i])
            want = own[d].read_positions(np.array([p]))
            for k in want:
                assert (batch[k][i] == want[k][0]).all() and (alone[k][i] == want[k][0]).all(), (step, i, k)


def test_any_world_size_and_resume(datasets) -> None:
    whole = _mix(datasets)
    expect = [whole.batch_at(s) for s in range(12)]
    for world in (2, 4):
        shares = [_mix(datasets, world_size=world, rank=r) for r in range(world)]
        for step in range(12):
            joined = {k: np.concatenate([s.batch_at(step)[k] for s in shares]) for k in expect[0]}
            for k in expect[step]:
                assert (joined[k] == expect[step][k]).all(), (world, step, k)
    first = _mix(datasets)
    for _ in range(5):
        next(first)
    state = first.state_dict()
    resumed = _mix(datasets, world_size=2, rank=1)
    resumed.load_state_dict(state)
    assert (next(resumed)["input_ids"] == expect[5]["input_ids"][B // 2:]).all()
    other = _mix(datasets, weights=(0.5, 0.5))
    with pytest.raises(LoadError, match="another mixture"):
        other.load_state_dict(state)
    assert _mix(datasets, weights=(7, 3)).fingerprint == first.fingerprint  # the counts, not the spelling


def test_share_loader_reads_a_mixture(datasets) -> None:
    pytest.importorskip("torch")
    from bert_datagen.contract.loading.torch_shares import share_loader

    ref = _mix(datasets, world_size=2, rank=1)
    loader = share_loader(_mix(datasets), world_size=2, rank=1, hf=False, stop=6, num_workers=1)
    for step, batch in enumerate(loader):
        want = ref.batch_at(step)
        for k in want:
            assert (batch[k].numpy() == want[k]).all(), (step, k)
    assert loader.state_dict()["step"] == 6 and "mixture" in loader.state_dict()


@pytest.mark.parametrize("other, reason", [("long", "features differ"), ("vocab", "vocab differs"),
                                           ("dynamic", "features differ|masking|vocab differs"), ("a", "the same dataset")])
def test_incompatible_datasets_are_refused_in_one_line(datasets, other, reason) -> None:
    with pytest.raises(MixtureError, match=reason) as e:
        MixedBatches([open_source(datasets["a"]), open_source(datasets[other])], [1, 1], seed=SEED, batch_size=B)
    assert "\n" not in str(e.value) and datasets[other] in str(e.value)
