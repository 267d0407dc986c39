"""The PyTorch glue's refusals and positions (`torch_adapter.py`, `torch_shares.py`): a DataLoader
that would wrap every batch or lose the position is an error; a share loader with workers hands out
a rank's exact shares in step order and resumes from its state."""

from __future__ import annotations

import pytest

from bert_datagen.contract.bounds import ArgumentError
from bert_datagen.contract.loading.batches import NumpyBatches
from bert_datagen.contract.loading.source import open_source
from tests.support.synthetic import write_synthetic_dataset

torch = pytest.importorskip("torch")
from torch.utils.data import DataLoader  # noqa: E402

from bert_datagen.contract.loading.torch_adapter import TorchBatches, torch_batches  # noqa: E402
from bert_datagen.contract.loading.torch_shares import share_loader  # noqa: E402

B, BS, SEED = 8, 4, 7


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    d = str(tmp_path_factory.mktemp("glue"))
    return open_source(write_synthetic_dataset(d, train_shards=3, records_per_shard=50, eval_records=0))


def _same(got: dict, want: dict) -> None:
    assert sorted(got) == sorted(want)
    for k in want:
        assert (got[k].numpy() == want[k]).all(), k


@pytest.mark.parametrize("given", [{"world_size": 2}, {"rank": 1}, {"rank": 0}, {"world_size": 1}])
def test_a_world_size_without_a_rank_or_a_rank_without_one_is_refused(source, given) -> None:
    """Issue #43 point 2: a world size alone had every process read the whole global batch (the
    loaders then took (1, 0)), a rank alone the same; every torch entry point refuses either, naming
    the missing argument, and takes both or neither."""
    missing = "world_size" if "rank" in given else "rank"
    numpy = NumpyBatches(source, seed=SEED, batch_size=B, block_size=BS)
    makers = {"torch_batches": lambda: torch_batches(source, seed=SEED, batch_size=B, block_size=BS, **given),
              "TorchBatches": lambda: TorchBatches(source, seed=SEED, batch_size=B, block_size=BS, **given),
              "share_loader": lambda: share_loader(source, seed=SEED, batch_size=B, block_size=BS, **given),
              "share_loader(reader)": lambda: share_loader(numpy, **given)}
    for name, make in makers.items():
        with pytest.raises(ArgumentError, match=f"without {missing}: give both") as raised:
            make()
        assert raised.value.argument == missing, name
    # Both, or neither (one process when torch.distributed is not initialised): as before.
    share = next(iter(torch_batches(source, seed=SEED, batch_size=B, block_size=BS, world_size=2, rank=1)))
    assert share["input_ids"].shape[0] == B // 2
    whole = next(iter(share_loader(source, seed=SEED, batch_size=B, block_size=BS, hf=False)))
    _same(whole, numpy.batch_at(0))


@pytest.mark.parametrize("batch_size", [1, 4])
def test_dataloader_with_a_batch_size_is_refused(source, batch_size) -> None:
    ds = torch_batches(source, seed=SEED, batch_size=B, block_size=BS)
    with pytest.raises(TypeError, match="whole batch.*batch_size=None"):
        next(iter(DataLoader(ds, batch_size=batch_size)))
    assert next(iter(DataLoader(ds, batch_size=None)))["input_ids"].shape == (B, 32)


def test_plain_dataloader_with_workers_says_it_loses_the_position(source) -> None:
    ds = torch_batches(source, seed=SEED, batch_size=B, block_size=BS)
    with pytest.raises(RuntimeError, match="state_dict\\(\\) would lose the position"):
        next(iter(DataLoader(ds, batch_size=None, num_workers=1)))
    it = ds.loader(num_workers=1)
    _same(next(it), NumpyBatches(source, seed=SEED, batch_size=B, block_size=BS).batch_at(0))
    assert ds.state_dict()["step"] == 1


def test_share_loader_with_workers_exact_shares_and_resume(source) -> None:
    ref = NumpyBatches(source, seed=SEED, batch_size=B, block_size=BS, world_size=2, rank=1)
    dl = share_loader(source, seed=SEED, batch_size=B, block_size=BS, world_size=2, rank=1, hf=False,
                      num_workers=2, stop=9)
    assert len(dl) == 9
    for step, batch in enumerate(dl):
        _same(batch, ref.batch_at(step))
        if step == 3:
            break  # the workers have read ahead; the position is what was handed out
    state = dl.state_dict()
    assert state["step"] == 4
    again = share_loader(source, seed=SEED, batch_size=B, block_size=BS, world_size=2, rank=1, hf=False, stop=9)
    again.load_state_dict(state)
    rest = list(again)
    assert len(rest) == 5
    for i, batch in enumerate(rest):
        _same(batch, ref.batch_at(4 + i))


def test_share_dataset_refuses_any_other_cut(source) -> None:
    dl = share_loader(source, seed=SEED, batch_size=B, block_size=BS, world_size=2, rank=1)
    with pytest.raises(TypeError, match="no length to sample from"):
        next(iter(DataLoader(dl.dataset, batch_size=4)))
    # accelerate's re-sharding without split_batches hands a rank whole batches, or another rank's share
    for wrong in ([0, 1, 2, 3], list(range(8)), [8, 9, 10, 11]):
        with pytest.raises(ValueError, match="not its share of a global batch"):
            next(iter(DataLoader(dl.dataset, batch_sampler=[wrong], collate_fn=lambda x: x)))
    with pytest.raises(TypeError, match="takes no shuffle"):
        share_loader(source, seed=SEED, batch_size=B, shuffle=True)


def test_trainer_resume_skips_by_position(source) -> None:
    """Trainer resumes through accelerate's skip_first_batches: on a share loader it skips index
    batches (positions), so the batches after the skip are the run's next ones."""
    accelerate = pytest.importorskip("accelerate")
    ref = NumpyBatches(source, seed=SEED, batch_size=B, block_size=BS, world_size=2, rank=0)
    dl = share_loader(source, seed=SEED, batch_size=B, block_size=BS, world_size=2, rank=0, hf=False, stop=6)
    skipped = accelerate.skip_first_batches(dl, 4)
    got = list(skipped)
    assert len(got) == 2
    for i, batch in enumerate(got):
        _same(batch, ref.batch_at(4 + i))


@pytest.mark.parametrize("workers", [0, 1])
def test_iterating_our_loaders_leaves_torchs_global_generator_alone(source, workers) -> None:
    """A DataLoader draws a base seed from torch's global generator at every iter() unless it has its
    own generator; ours have one, so dropout's random stream is the model's alone."""
    torch.manual_seed(3)
    before = torch.get_rng_state()
    list(share_loader(source, seed=SEED, batch_size=B, block_size=BS, stop=2, num_workers=workers))
    list(torch_batches(source, seed=SEED, batch_size=B, block_size=BS, stop=2).loader(num_workers=workers))
    assert torch.equal(torch.get_rng_state(), before)


def test_a_resumed_run_with_dropout_equals_the_run_that_never_stopped(source) -> None:
    """Weights, optimizer, torch's RNG state and the loader's position saved after 3 steps and loaded
    into new objects: steps 3-5 then give the same weights, bit for bit, as one run of 6 steps (dropout on).
    Before the loaders had their own generator, the resumed loader's iter() drew from the restored RNG."""

    def fresh() -> tuple:
        torch.manual_seed(11)
        model = torch.nn.Sequential(torch.nn.Embedding(1000, 16), torch.nn.Dropout(0.5), torch.nn.Linear(16, 1))
        return model, torch.optim.AdamW(model.parameters(), lr=1e-2)

    def train(model, optimizer, loader, steps: int) -> None:
        for _, batch in zip(range(steps), loader, strict=False):
            loss = model(batch["input_ids"] % 1000).float().pow(2).mean()
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()

    def loader():
        return share_loader(source, seed=SEED, batch_size=B, block_size=BS, hf=False, stop=6)

    model, optimizer = fresh()
    train(model, optimizer, loader(), 6)
    straight = [p.detach().clone() for p in model.parameters()]

    model, optimizer, first = *fresh(), loader()
    train(model, optimizer, first, 3)
    state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "rng": torch.get_rng_state(),
             "loader": first.state_dict()}
    model, optimizer, rest = *fresh(), loader()
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    torch.set_rng_state(state["rng"])
    rest.load_state_dict(state["loader"])
    train(model, optimizer, rest, 3)
    assert all(torch.equal(a, b) for a, b in zip(straight, model.parameters(), strict=True))
