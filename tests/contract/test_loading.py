"""The loaders' one global order (docs/loading.md): the NumPy iterator and the PyTorch adapter give
bitwise the same global batches for any world size and DataLoader worker count, resume at any step
into any world size, read every record kind, and name a corrupt or missing shard."""

from __future__ import annotations

import hashlib
import json
import os
import re

import numpy as np
import pytest

from bert_datagen.contract.loading.batches import NumpyBatches
from bert_datagen.contract.loading.order import GlobalOrder, epoch_order
from bert_datagen.contract.loading.source import LoadError, open_source
from bert_datagen.datagen.dynamic import mask_records
from bert_datagen.datagen.record_layout import INSTANCE_KEY
from bert_datagen.datagen.records import frame_columns
from bert_datagen.datagen.tasks.features import task_feature_spec
from tests.support.synthetic import write_index, write_synthetic_dataset

B, BS, SEED = 8, 4, 11
# 3 shards of uneven length (the last blocks of each shard are short), several full windows
# (B * BS = 32 records) and a tail window per epoch.
COUNTS = (45, 38, 50)


@pytest.fixture(scope="module")
def static_ds(tmp_path_factory):
    d = str(tmp_path_factory.mktemp("static"))
    write_synthetic_dataset(d, train_shards=3, records_per_shard=50, eval_records=0)
    return _trim(d, COUNTS)


@pytest.fixture(scope="module")
def dynamic_ds(tmp_path_factory):
    d = str(tmp_path_factory.mktemp("dynamic"))
    return write_synthetic_dataset(d, train_shards=2, records_per_shard=39, eval_records=0, masking="dynamic")


def _trim(directory: str, counts: tuple[int, ...]) -> str:
    """Cut shard i to counts[i] records (rewriting the manifest), for uneven shards."""
    from bert_datagen.contract.fs import LOCAL_FS
    from bert_datagen.contract.manifest import load_manifest, write_manifest
    from bert_datagen.datagen.tfrecord import frame_records, iter_tfrecords

    manifest = load_manifest(directory, LOCAL_FS)
    shards = manifest["splits"]["train"]["shards"]
    for shard, n in zip(shards, counts, strict=True):
        path = os.path.join(directory, shard["path"])
        with open(path, "rb") as f:
            data = frame_records(list(iter_tfrecords(f))[:n])
        with open(path, "wb") as f:
            f.write(data)
        shard.update(records=n, bytes=len(data), sha256=hashlib.sha256(data).hexdigest(),
                     index=write_index(directory, shard["path"], data, n))
    manifest["splits"]["train"].update(records=sum(counts), bytes=sum(s["bytes"] for s in shards))
    write_manifest(directory, manifest, LOCAL_FS)
    return directory


def _numpy(ds, world=1, rank=0, **kw):
    return NumpyBatches(open_source(ds), seed=SEED, batch_size=B, block_size=BS, world_size=world, rank=rank, **kw)


def _union(shares):
    return {k: np.concatenate([s[k] for s in shares]) for k in shares[0]}


def _same(a, b, what):
    assert a.keys() == b.keys(), what
    for k in a:
        assert a[k].dtype == b[k].dtype and np.array_equal(a[k], b[k]), (what, k)


# ---------------------------------------------------------------- the order itself


def test_each_epoch_is_a_permutation_and_epochs_differ():
    total = sum(COUNTS)
    seen = []
    for epoch in (0, 1):
        shard, index = epoch_order(COUNTS, "fp", SEED, epoch, B, BS)
        pairs = set(zip(shard.tolist(), index.tolist(), strict=True))
        assert len(pairs) == total and all(0 <= i < COUNTS[s] for s, i in pairs)
        seen.append(list(zip(shard.tolist(), index.tolist(), strict=True)))
    assert seen[0] != seen[1]
    assert epoch_order(COUNTS, "other", SEED, 0, B, BS)[1].tolist() != [i for _, i in seen[0]]


# The order is a contract between frameworks and between versions: a change of it must be deliberate.
ORDER_GOLDEN = "ae92c35cbc648ba1a619d0bc8394433bb9796c6fa1e0078b2fd1ce305e9170a1"


def test_order_is_pinned():
    h = hashlib.sha256()
    # Uneven shards and short blocks, several full windows and a tail, block size 1 (fine-tuning's).
    for counts, batch, block in (((1000, 37, 640, 1), 16, 8), ((5000, 5000, 123), 32, 64), ((300,), 4, 1),
                                 ((2048, 2048), 8, 64)):
        order = GlobalOrder(counts, f"fp-{batch}", 7, batch, block)
        for epoch in range(2):
            placed = order.place(np.arange(epoch * order.total, (epoch + 1) * order.total))
            for a in (placed.shard, placed.index, placed.virtual):
                h.update(np.ascontiguousarray(a, np.int64).tobytes())
        placed = order.place(np.array([order.total - 3, 5, order.total + 7, 2 * order.total - 1, 0]))
        h.update(placed.shard.tobytes())
        h.update(placed.index.tobytes())
    assert h.hexdigest() == ORDER_GOLDEN


def test_offsets_of_inverts_the_window_shuffle():
    for counts, batch, block in ((COUNTS, B, BS), ((1000, 37, 640, 1), 16, 8), ((300,), 4, 1)):
        order = GlobalOrder(counts, "fp", SEED, batch, block)
        for epoch in (0, 1):
            offsets = np.arange(order.total)
            placed = order.place(epoch * order.total + offsets)
            assert order.offsets_of(epoch, placed.virtual).tolist() == offsets.tolist()


def test_rank_shares_of_a_full_window_come_from_disjoint_chunks():
    order = GlobalOrder(COUNTS, "fp", SEED, B, BS)
    for world in (2, 4):
        chunks = [set() for _ in range(world)]
        for step in range(BS):  # the first window: BS batches
            for rank in range(world):
                chunks[rank] |= set(order.batch(step, world, rank).chunk(BS).tolist())
        assert all(len(c) == B // world for c in chunks)
        assert len(set().union(*chunks)) == B


def test_ranks_read_disjoint_records_in_a_full_window(static_ds):
    read = []
    for rank in range(4):
        it = _numpy(static_ds, 4, rank, prefetch=False)  # (with it: the next window's share too)
        got: set[tuple[int, int]] = set()
        real = it.source.fetch

        def counting(ranges, *args, real=real, got=got, **kwargs):
            for shard, start, stop in ranges:
                got.update((shard, i) for i in range(start, stop))
            return real(ranges, *args, **kwargs)

        it.source.fetch = counting
        for _ in range(BS):  # the first window
            next(it)
        read.append(got)
        assert len(got) == B * BS // 4  # its share of the window, nothing more
    assert not any(read[a] & read[b] for a in range(4) for b in range(a + 1, 4))


# ---------------------------------------------------------------- NumPy vs PyTorch, any world, any workers


STEPS = 7  # crosses a window and (at 133 records, 16.6 batches per epoch) nothing more: cheap


@pytest.fixture(scope="module")
def reference(static_ds):
    it = _numpy(static_ds)
    return [next(it) for _ in range(STEPS)]


@pytest.mark.parametrize("piece", [4096, 5])
def test_batches_hold_the_records_the_order_places(static_ds, monkeypatch, piece):
    # Against an independent reader: every frame read in order, decoded one record at a time. With
    # pieces of 5 records a window's store is many pieces and batches straddle them; of those only
    # the last few stay decoded, so steps asked for again decode theirs anew.
    from bert_datagen.contract.loading import batches as batches_module
    from bert_datagen.contract.loading import source as source_module
    from bert_datagen.datagen.example_exact import decode_exact
    from bert_datagen.datagen.tfrecord import iter_tfrecords

    monkeypatch.setattr(source_module, "_DECODE_RECORDS", piece)
    monkeypatch.setattr(batches_module, "_STORE_ROWS", piece)
    src = open_source(static_ds)
    records = []
    for ref in src.shards:
        with open(ref.path, "rb") as f:
            records.append([decode_exact(p, src.spec) for p in iter_tfrecords(f, ref.path)])
    order = GlobalOrder(src.counts, src.fingerprint, SEED, B, BS)
    for world in (1, 4):
        its = [_numpy(static_ds, world, r) for r in range(world)]
        for step in [*range(40), 33, 32, 30]:  # past two epochs: full windows, tails, a batch across epochs
            got = _union([it.batch_at(step) for it in its])
            placed = order.batch(step)
            for name, (dtype, _) in src.spec.items():
                want = np.stack([records[s][i][name] for s, i in zip(placed.shard, placed.index, strict=True)])
                cast = np.int32 if dtype == "int64" and name != INSTANCE_KEY else want.dtype
                assert got[name].dtype == cast and np.array_equal(got[name], want.astype(cast)), (world, step, name)


@pytest.mark.parametrize("world", [1, 2, 4])
def test_numpy_shares_union_to_the_global_batch(static_ds, reference, world):
    shares = [_numpy(static_ds, world, r) for r in range(world)]
    for step in range(STEPS):
        _same(_union([s.batch_at(step) for s in shares]), reference[step], (world, step))


@pytest.mark.filterwarnings("ignore:This DataLoader will create")  # 3 workers on a 2-core machine
@pytest.mark.parametrize("workers", [0, 1, 3])
def test_torch_adapter_equals_numpy_any_world_and_workers(static_ds, reference, workers):
    pytest.importorskip("torch")
    from bert_datagen.contract.loading.torch_adapter import torch_batches

    for world in (1, 2, 4):
        got = []
        for rank in range(world):
            ds = torch_batches(open_source(static_ds), seed=SEED, batch_size=B, block_size=BS,
                               world_size=world, rank=rank, stop=STEPS)
            got.append([{k: v.numpy() for k, v in b.items()} for b in ds.loader(num_workers=workers)])
            assert ds.state_dict()["step"] == STEPS
        for step in range(STEPS):
            _same(_union([g[step] for g in got]), reference[step], (world, workers, step))


def test_resume_at_any_step_into_another_world_size(static_ds):
    pytest.importorskip("torch")
    from bert_datagen.contract.loading.torch_adapter import torch_batches

    # 2 ranks run 9 steps (past an epoch boundary at step 16.6 later), then 4 ranks go on.
    run = [_numpy(static_ds, 2, r) for r in range(2)]
    for it in run:
        for _ in range(9):
            next(it)
    state = run[0].state_dict()
    assert state["step"] == 9
    ref = _numpy(static_ds, start=9)
    expect = [next(ref) for _ in range(9)]  # steps 9..17: crosses into epoch 1
    resumed = []
    for rank in range(4):
        it = _numpy(static_ds, 4, rank)
        it.load_state_dict(json.loads(json.dumps(state)))
        resumed.append([next(it) for _ in range(9)])
    for j in range(9):
        _same(_union([r[j] for r in resumed]), expect[j], j)
    ds = torch_batches(open_source(static_ds), seed=SEED, batch_size=B, block_size=BS, world_size=1, rank=0,
                       stop=12)
    ds.load_state_dict(state)
    got = [{k: v.numpy() for k, v in b.items()} for b in ds.loader(num_workers=1)]
    for j, batch in enumerate(got):
        _same(batch, expect[j], ("torch", j))


@pytest.mark.parametrize("prefetch", ["no", 1, 0.0])
def test_prefetch_is_true_false_or_none(static_ds, prefetch):
    """Issue #43 point 8: prefetch="no" read ahead (bool("no") is True) without a word."""
    with pytest.raises(TypeError, match=re.escape(f"prefetch must be True, False or None, got {prefetch!r}")):
        NumpyBatches(open_source(static_ds), seed=SEED, batch_size=B, block_size=BS, prefetch=prefetch)
    for fine in (True, False, None, np.bool_(True)):
        NumpyBatches(open_source(static_ds), seed=SEED, batch_size=B, block_size=BS, prefetch=fine)


def test_state_of_another_order_is_refused(static_ds):
    state = _numpy(static_ds).state_dict()
    other = NumpyBatches(open_source(static_ds), seed=SEED + 1, batch_size=B, block_size=BS)
    with pytest.raises(LoadError, match="seed"):
        other.load_state_dict(state)
    with pytest.raises(LoadError, match="not a multiple of the world size 3"):
        NumpyBatches(open_source(static_ds), seed=SEED, batch_size=B, world_size=3, rank=0)
    with pytest.raises(LoadError, match="fewer than one batch"):
        NumpyBatches(open_source(static_ds), seed=SEED, batch_size=1000)


# ---------------------------------------------------------------- record kinds


def test_dynamic_masking_is_the_trainers_function_of_seed_identity_epoch(dynamic_ds):
    src = open_source(dynamic_ds)
    it = NumpyBatches(src, seed=SEED, batch_size=B, block_size=BS, start=9)  # 78 records: step 9 straddles epochs 0 and 1
    batch = next(it)
    placed = it.order.batch(9)
    assert set(placed.epoch.tolist()) == {0, 1}
    rows = [src.read(s, i, i + 1) for s, i in zip(placed.shard.tolist(), placed.index.tolist(), strict=True)]
    raw = {k: np.concatenate([r[k] for r in rows]) for k in rows[0]}
    masked = mask_records(raw["input_ids"], raw["input_mask"], raw[INSTANCE_KEY][:, 0], placed.epoch, SEED,
                          src.mask_config, src.vocab)
    assert np.array_equal(batch["input_ids"], masked.input_ids)
    assert np.array_equal(batch["masked_lm_positions"], masked.masked_lm_positions)
    assert np.array_equal(batch["masked_lm_weights"], masked.masked_lm_weights)
    assert np.array_equal(batch[INSTANCE_KEY], raw[INSTANCE_KEY])


def _task_dataset(directory: str, task_type: str, n: int = 20, seq: int = 12) -> str:
    from bert_datagen.contract.fs import LOCAL_FS

    rng = np.random.default_rng(0)
    spec = task_feature_spec(task_type, seq, training=True)
    columns = {k: (rng.random((n, c)).astype(np.float32) if d == "float32" else rng.integers(0, 50, (n, c)))
               for k, (d, c) in spec.items()}
    os.makedirs(os.path.join(directory, "train"))
    data, _ = frame_columns(columns)
    rel = "train/part-00000-of-00001.tfrecord"
    with open(os.path.join(directory, rel), "wb") as f:
        f.write(data)
    vocab = b"".join(b"t%d\n" % i for i in range(50))
    with open(os.path.join(directory, "vocab.txt"), "wb") as f:
        f.write(vocab)
    shard = {"path": rel, "records": n, "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    features = {k: [d, c] for k, (d, c) in spec.items()}
    manifest = {
        "schema": "bert-datagen/manifest", "schema_version": 1, "kind": "task", "tool": {"name": "test"},
        "config": {}, "seed": 0, "vocab": {"path": "vocab.txt", "sha256": hashlib.sha256(vocab).hexdigest(),
                                           "size": 50},
        "input": {}, "task": {"type": task_type}, "features": features,
        "splits": {"train": {"shards": [shard], "records": n, "bytes": len(data), "features": features}},
        "totals": {"records": n},
    }
    LOCAL_FS.write_atomic(os.path.join(directory, "manifest.json"), json.dumps(manifest).encode())
    return columns


@pytest.mark.parametrize("task_type", ["classification", "regression", "span", "tagging"])
def test_task_records_every_feature(tmp_path, task_type):
    from bert_datagen.contract.loading.split_records import SplitRecords

    columns = _task_dataset(str(tmp_path), task_type)
    records = SplitRecords(open_source(str(tmp_path)))
    batch = records[list(range(len(records)))]
    assert batch.keys() == columns.keys()
    for k, v in columns.items():
        assert np.array_equal(batch[k], v), k
    # Pre-training's order is not what fine-tuning reads: the pre-training iterator refuses task data.
    with pytest.raises(LoadError, match="a task dataset; read it in fine-tuning's order"):
        NumpyBatches(open_source(str(tmp_path)), seed=SEED, batch_size=4, block_size=2)


# ---------------------------------------------------------------- broken shards


def _copy(src: str, dst) -> str:
    import shutil

    shutil.copytree(src, dst)
    return str(dst)


def test_corrupt_record_is_one_error_naming_shard_and_record(static_ds, tmp_path):
    d = _copy(static_ds, tmp_path / "ds")
    path = os.path.join(d, "train", "part-00001-of-00003.tfrecord")
    data = bytearray(open(path, "rb").read())
    data[200] ^= 0xFF  # inside record 0's payload (records are a few hundred bytes)
    open(path, "wb").write(bytes(data))
    it = _numpy(d)
    with pytest.raises(LoadError, match=r"part-00001-of-00003\.tfrecord: corrupt shard: record 0 .*CRC"):
        for _ in range(2 * STEPS * 3):
            next(it)


def test_missing_shard_is_named(static_ds, tmp_path):
    d = _copy(static_ds, tmp_path / "ds")
    os.remove(os.path.join(d, "train", "part-00002-of-00003.tfrecord"))
    with pytest.raises(LoadError, match=r"part-00002-of-00003\.tfrecord: shard listed in the manifest is missing"):
        for _ in range(2 * STEPS * 3):
            next(_numpy(d))
