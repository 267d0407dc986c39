"""Every dataset kind the CLIs write in one reader (docs/loading.md, issue #31 points 1, 5, 6): the
manifest's own features (packed rows included), fine-tuning's order for task splits, the PyTorch
adapter and its DataLoader workers bitwise equal to the NumPy readers, `bert-datagen batches` naming
exactly the records a step reads, map-style access and epochs of a chosen size."""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner

from bert_datagen.contract.bounds import ArgumentError
from bert_datagen.contract.loading.batches import NumpyBatches
from bert_datagen.contract.loading.kinds import Epochs, batches_for
from bert_datagen.contract.loading.source import LoadError, open_source
from bert_datagen.contract.loading.split_records import SplitRecords
from bert_datagen.contract.loading.task_batches import GROUP_WINDOW, TaskBatches, bucket_lengths
from bert_datagen.contract.manifest import load_manifest
from bert_datagen.pipelines.cli import main
from tests.support.loader_kinds import KINDS, PRETRAINING_KINDS, TASK_KINDS, build_kind

B, SEED = 4, 3


@pytest.fixture(scope="module")
def kinds(tmp_path_factory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("kinds")
    return {kind: build_kind(root, kind) for kind in KINDS}


def _whole(source) -> dict[str, np.ndarray]:
    """The split's records in shard order, decoded as the readers decode them."""
    parts = [source.read_ranges([(i, 0, n)], model_inputs=True) for i, n in enumerate(source.counts)]
    return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}


def _split_index(source, placed) -> np.ndarray:
    return np.concatenate([[0], np.cumsum(source.counts)])[placed.shard] + placed.index


def _same(a: dict, b: dict) -> None:
    assert list(a) == list(b)
    for k in a:
        x, y = np.asarray(a[k]), np.asarray(b[k])
        assert x.dtype == y.dtype and x.shape == y.shape and x.tobytes() == y.tobytes(), k


@pytest.mark.parametrize("kind", PRETRAINING_KINDS)
def test_pretraining_kinds_read_the_manifests_features(kinds, kind):
    source = open_source(kinds[kind])
    manifest = load_manifest(kinds[kind], source.fs)
    assert source.spec == {k: (v[0], v[1]) for k, v in manifest["features"].items()}
    reader = batches_for(source, seed=SEED, batch_size=B, block_size=2)
    assert isinstance(reader, NumpyBatches)
    whole = _whole(source)
    for step in (0, 5, 60):  # 60: a later epoch
        batch = reader.batch_at(step)
        rows = _split_index(source, reader.order.batch(step))
        for name, values in batch.items():
            if kind == "dynamic" and name.startswith(("input_ids", "masked_lm")):
                continue  # masked per epoch: tests/contract/test_loading.py checks the masks
            assert values.tobytes() == whole[name][rows].tobytes(), name
    if kind == "packed":
        assert {"sequence_ids", "position_ids", "cls_positions"} <= set(batch)
        assert batch["masked_lm_positions"].shape[1] == source.spec["masked_lm_positions"][1]


@pytest.mark.parametrize("kind", TASK_KINDS)
@pytest.mark.parametrize("grouped", [False, True])
@pytest.mark.parametrize("piece", [4096, 5])
def test_task_kinds_read_in_finetunings_order(kinds, kind, grouped, piece, monkeypatch):
    # Pieces of 5 records: a window's records are many decoded pieces, and batches gather across them.
    from bert_datagen.contract.loading import source as source_module

    monkeypatch.setattr(source_module, "_DECODE_RECORDS", piece)
    source = open_source(kinds[kind])
    reader = batches_for(source, seed=SEED, batch_size=B, group_by_length=grouped)
    assert isinstance(reader, TaskBatches)
    total, per_epoch = sum(source.counts), sum(source.counts) // B
    assert reader.per_epoch == per_epoch
    whole = _whole(source)
    seq = source.spec["input_ids"][1]
    for epoch in (0, 1):
        seen = []
        for b in range(per_epoch):  # an epoch: whole batches, no record twice
            step = epoch * per_epoch + b
            batch = reader.batch_at(step)
            positions = reader.positions_at(step)
            assert (positions // total == epoch).all()
            rows = _split_index(source, reader.order.place(positions))
            seen.extend(rows.tolist())
            width = batch["input_ids"].shape[1]
            assert width == seq or (grouped and width in bucket_lengths(seq))
            for name, values in batch.items():
                want = whole[name][rows]
                want = want[:, :width] if want.ndim == 2 and want.shape[1] == seq else want
                assert values.tobytes() == want.tobytes(), (step, name)
        assert len(seen) == len(set(seen)) == per_epoch * B
    # Ranks: the union of the shares is the global batch, for either mode.
    shares = [batches_for(source, seed=SEED, batch_size=B, world_size=2, rank=r, group_by_length=grouped)
              for r in range(2)]
    for step in (0, GROUP_WINDOW + 1 if per_epoch > GROUP_WINDOW + 1 else 3, per_epoch + 2):
        parts = [s.batch_at(step) for s in shares]
        _same({k: np.concatenate([p[k] for p in parts]) for k in parts[0]}, reader.batch_at(step))


def test_readers_refuse_the_other_kinds_options(kinds):
    with pytest.raises(ArgumentError, match="group_by_length"):
        batches_for(open_source(kinds["static"]), seed=1, batch_size=B, group_by_length=True)
    with pytest.raises(ArgumentError, match="block_size"):
        batches_for(open_source(kinds["classification"]), seed=1, batch_size=B, block_size=64)
    reader = batches_for(open_source(kinds["classification"]), seed=1, batch_size=B)
    state = reader.state_dict()
    other = batches_for(open_source(kinds["classification"]), seed=1, batch_size=B, group_by_length=True)
    with pytest.raises(LoadError, match="group_by_length"):
        other.load_state_dict(state)
    reader.step = 17
    again = batches_for(open_source(kinds["classification"]), seed=1, batch_size=B, world_size=2, rank=1)
    again.load_state_dict(reader.state_dict())
    assert again.step == 17


@pytest.mark.parametrize("given", [{"world_size": 2}, {"rank": 1}, {"world_size": 1}, {"rank": 0}])
def test_readers_refuse_a_world_size_without_a_rank_and_the_reverse(kinds, given):
    """Issue #43 point 2: one without the other read rank 0's share, or the whole batch, on every
    process; each reader names the missing argument."""
    missing = "world_size" if "rank" in given else "rank"
    static, task = open_source(kinds["static"]), open_source(kinds["classification"])
    for make in (lambda: NumpyBatches(static, seed=SEED, batch_size=B, **given),
                 lambda: TaskBatches(task, seed=SEED, batch_size=B, **given),
                 lambda: batches_for(static, seed=SEED, batch_size=B, **given),
                 lambda: batches_for(task, seed=SEED, batch_size=B, **given)):
        with pytest.raises(ArgumentError, match=f"without {missing}") as raised:
            make()
        assert raised.value.argument == missing
    assert TaskBatches(task, seed=SEED, batch_size=B).world_size == 1  # neither: one process


# ---------------------------------------------------------------- map-style access, epochs


@pytest.mark.parametrize("kind", KINDS)
def test_len_and_record_i_of_every_kind(kinds, kind):
    source = open_source(kinds[kind])
    records, whole = SplitRecords(source), _whole(source)
    n = len(records)
    assert n == sum(source.counts)
    for i in (0, source.counts[0] - 1, source.counts[0], n - 1, -1, -n):
        _same(records[i], {k: v[i] for k, v in whole.items()})
    picks = [7, 3, 3, n - 2, 0, -1]
    _same(records[picks], {k: v[picks] for k, v in whole.items()})
    _same(records[2:n:3], {k: v[2:n:3] for k, v in whole.items()})
    assert len(records[5:5]["input_ids"]) == 0
    for bad in (n, -n - 1):
        with pytest.raises(IndexError, match=f"{n} records"):
            records[bad]
    with pytest.raises(IndexError):
        records[[0, n]]


@pytest.mark.parametrize("kind", ["static", "classification"])
def test_epochs_of_a_chosen_size_are_slices_of_the_stream(kinds, kind):
    source = open_source(kinds[kind])
    reference = batches_for(source, seed=SEED, batch_size=B)
    total = sum(source.counts)
    for size in (3 * B, (total // B + 5) * B):  # fewer and more samples than the split holds
        epochs = Epochs(batches_for(open_source(kinds[kind]), seed=SEED, batch_size=B), size)
        assert len(epochs) == size // B
        first, second = list(epochs), list(epochs)
        assert len(first) == len(second) == size // B and epochs.epoch == 2
        for step, batch in enumerate(first + second):
            _same(batch, reference.batch_at(step))
        epochs.set_epoch(1)
        _same(next(iter(epochs)), second[0])
        state = epochs.state_dict()
        resumed = Epochs(batches_for(open_source(kinds[kind]), seed=SEED, batch_size=B, world_size=2, rank=1), size)
        resumed.load_state_dict(state)
        assert len(list(resumed)) == size // B - 1
    with pytest.raises(ArgumentError, match="multiple of the global batch size"):
        Epochs(reference, B + 1)


# ---------------------------------------------------------------- bert-datagen batches


def _cli_rows(path: str, step: int, *extra) -> dict:
    result = CliRunner().invoke(main, ["batches", path, "--seed", SEED, "--batch-size", B, "--step", step, "--json",
                                       *[str(e) for e in extra]])
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


@pytest.mark.parametrize("kind", KINDS)
def test_batches_cli_names_exactly_what_the_trainers_read(kinds, kind):
    source = open_source(kinds[kind])
    whole = _whole(source)
    modes = [(), ("--group-by-length",)] if kind in TASK_KINDS else [()]
    for extra in modes:
        reader = batches_for(source, seed=SEED, batch_size=B, world_size=2, rank=1, group_by_length=bool(extra))
        step = sum(source.counts) // B + 2  # in the second epoch
        out = _cli_rows(kinds[kind], step, "--world-size", 2, "--rank", 1, *extra)
        batch = reader.batch_at(step)
        shard = np.array([r["shard_number"] for r in out["records"]])
        index = np.array([r["index"] for r in out["records"]])
        rows = np.concatenate([[0], np.cumsum(source.counts)])[shard] + index
        assert [r["epoch"] for r in out["records"]] == [1] * (B // 2)
        for name, values in batch.items():
            if kind == "dynamic" and name.startswith(("input_ids", "masked_lm")):
                continue
            want = whole[name][rows]
            if kind in TASK_KINDS:  # cut to the batch's padded length, which the command names
                width = out["records"][0]["length"]
                assert width == batch["input_ids"].shape[1]
                want = want[:, :width] if want.ndim == 2 and want.shape[1] == whole["input_ids"].shape[1] else want
            assert values.tobytes() == want.tobytes(), name
        if kind == "packed":
            for record, keys, seqs in zip(out["records"], batch["instance_key"], batch["sequence_ids"], strict=True):
                assert record["instance_keys"] == keys[:seqs.max()].view(np.uint64).tolist()
        if kind == "dynamic":
            assert [r["instance_key"] for r in out["records"]] == batch["instance_key"][:, 0].view(np.uint64).tolist()


def test_batches_cli_refuses_the_other_kinds_options(kinds):
    for path, option in ((kinds["static"], ["--group-by-length"]), (kinds["span"], ["--block-size", "8"])):
        result = CliRunner().invoke(main, ["batches", path, "--seed", 1, "--batch-size", B, "--step", 0, *option])
        assert result.exit_code == 2 and f"{option[0]} does not apply here" in result.output


# ---------------------------------------------------------------- PyTorch


def _numpy(batch: dict) -> dict[str, np.ndarray]:
    return {k: v.numpy() for k, v in batch.items()}


@pytest.mark.parametrize("kind", KINDS)
def test_torch_adapter_and_its_workers_give_the_readers_batches(kinds, kind):
    pytest.importorskip("torch")
    from bert_datagen.contract.loading.torch_adapter import torch_batches

    grouped = kind in ("span", "tagging")  # length-grouped batches differ in width: they cross flat
    source = open_source(kinds[kind])
    steps = sum(source.counts) // B + 7  # into the second epoch
    reader = batches_for(source, seed=SEED, batch_size=B, world_size=2, rank=1, group_by_length=grouped,
                         block_size=None if kind in TASK_KINDS else 2)
    want = [reader.batch_at(s) for s in range(steps)]
    kw = dict(seed=SEED, batch_size=B, world_size=2, rank=1, group_by_length=grouped, stop=steps,
              block_size=None if kind in TASK_KINDS else 2)
    for workers in (0, 2):
        ds = torch_batches(open_source(kinds[kind]), **kw)
        got = []
        for batch in ds.loader(num_workers=workers):
            got.append(_numpy(batch))
            if len(got) == 5:
                assert ds.state_dict()["step"] == 5  # counted as consumed
        assert len(got) == steps
        for s, (a, b) in enumerate(zip(got, want, strict=True)):
            _same(a, b) if list(a) == list(b) else pytest.fail(f"step {s}: features {list(a)} != {list(b)}")


def test_torch_epochs_and_len(kinds):
    pytest.importorskip("torch")
    from bert_datagen.contract.loading.torch_adapter import torch_batches

    source = open_source(kinds["classification"])
    reference = batches_for(source, seed=SEED, batch_size=B)
    ds = torch_batches(source, seed=SEED, batch_size=B, epoch_size=5 * B)
    assert len(ds) == 5
    first = [_numpy(b) for b in ds]
    second = [_numpy(b) for b in ds.loader(num_workers=2)]
    assert len(first) == len(second) == 5 and ds.state_dict()["step"] == 10
    for step, batch in enumerate(first + second):
        _same(batch, reference.batch_at(step))
    with pytest.raises(TypeError, match="epoch_size"):
        len(torch_batches(source, seed=SEED, batch_size=B))


def test_narrowed_hand_off_is_exact():
    pytest.importorskip("torch")
    from bert_datagen.contract.loading.torch_workers import _narrowed

    cases = [np.array([0, 1, 0], np.float32), np.array([-0.0, 1.0], np.float32), np.array([0.5, 1], np.float32),
             np.array([-3, 200], np.int32), np.array([0, 65535], np.int32), np.array([0, 70000], np.int32),
             np.array([-(2**40), 5], np.int64), np.array([2**63 - 1], np.int64), np.zeros(0, np.int32)]
    for values in cases:
        narrow = _narrowed(values)
        back = narrow.astype(values.dtype)
        assert back.tobytes() == values.tobytes(), values
    assert _narrowed(cases[0]).dtype == np.uint8 and _narrowed(cases[1]).dtype == np.float32
    assert _narrowed(cases[4]).dtype == np.uint16 and _narrowed(cases[5]).dtype == np.int32
