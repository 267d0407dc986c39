"""Issue #43 points 1 and 3: a reader never hands out a record of another dataset, nor a record its
index misplaces.

A dataset replaced under a reader (the swap of `run --overwrite` and `task --overwrite`,
pipelines/beam/outputs.py) stops every reader with a LoadError before the first batch of the new
dataset, local and in a bucket; every batch handed out before is the old dataset's. An index whose
lines are shifted by one record (they still chain), or whose sha256 is not the manifest's, stops a
reader before any record of its shard, on any rank.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from bert_datagen.contract.loading.batches import NumpyBatches
from bert_datagen.contract.loading.mixture import MixedBatches
from bert_datagen.contract.loading.source import LoadError, open_source
from bert_datagen.contract.loading.split_records import SplitRecords
from bert_datagen.contract.loading.task_batches import TaskBatches
from tests.support.replacing import replace_dataset
from tests.support.synthetic import write_index, write_synthetic_dataset
from tests.support.task_fixtures import classification_dataset

B, BS, SEED = 8, 4, 3  # a window of pre-training data: 32 records, 4 batches
TASK_B = 2  # fine-tuning's windows: 50 batches, 100 records

REPLACED = r"manifest.json: the dataset was replaced while this loader read it"


def _pretraining(directory: str, seed: int) -> str:
    return write_synthetic_dataset(directory, seq_len=16, max_pred=3, vocab_size=40, train_shards=2,
                                   records_per_shard=64, eval_records=8, seed=seed)


def _task(directory: str, seed: int) -> str:
    """A task dataset with a record index beside each shard, as `bert-datagen task` writes them."""
    classification_dataset(directory, n_train=240, n_dev=8, seed=seed)
    root = Path(directory)
    manifest = _manifest(root)
    for split in manifest["splits"].values():
        for shard in split["shards"]:
            shard["index"] = write_index(directory, shard["path"], (root / shard["path"]).read_bytes(),
                                         shard["records"])
    _write_manifest(root, manifest)
    return directory


def _same(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> bool:
    return a.keys() == b.keys() and all(np.array_equal(np.asarray(a[k]), np.asarray(b[k])) for k in a)


# Each reader as an iterator of NumPy batches over a split, and how it is opened.
def _numpy(target: str) -> Iterator[dict]:
    return NumpyBatches(open_source(target), seed=SEED, batch_size=B, block_size=BS)


def _mixed(target: str) -> Iterator[dict]:
    src = open_source(target)
    return MixedBatches([src, open_source(target, "eval")], [0.5, 0.5], seed=SEED, batch_size=B, block_size=BS,
                        window=16)


def _task_batches(target: str) -> Iterator[dict]:
    return TaskBatches(open_source(target), seed=SEED, batch_size=TASK_B)


def _split_records(target: str) -> Iterator[dict]:
    records = SplitRecords(open_source(target))
    return (records[a:a + 20] for a in range(0, len(records), 20))


def _torch(target: str) -> Iterator[dict]:
    torch = pytest.importorskip("torch")
    from bert_datagen.contract.loading.torch_adapter import torch_batches

    batches = torch_batches(open_source(target), seed=SEED, batch_size=TASK_B)
    loader = torch.utils.data.DataLoader(batches, batch_size=None, num_workers=0)
    return ({k: v.numpy() for k, v in b.items()} for b in loader)


def _jax(target: str) -> Iterator[dict]:
    pytest.importorskip("jax")
    from bert_datagen.contract.loading.jax_hosts import JaxBatches

    batches = JaxBatches(open_source(target), seed=SEED, batch_size=B, block_size=BS, prefetch=1)
    return ({k: np.asarray(v) for k, v in b.items()} for b in batches)


READERS = {"numpy": (_numpy, _pretraining), "mixed": (_mixed, _pretraining), "task": (_task_batches, _task),
           "split_records": (_split_records, _pretraining), "torch": (_torch, _task), "jax": (_jax, _pretraining)}


def _read_across_a_replacement(open_reader, target: str, reference: str, replace) -> int:
    """Batches of a reader over ``target`` until it errors, its dataset replaced after the first
    batch: every batch must be the old dataset's (``reference``, an untouched copy) and the error
    the replacement's. Returns how many batches came before the error."""
    reader = open_reader(target)
    expected = open_reader(reference)
    got = [next(reader)]
    replace()
    with pytest.raises(LoadError, match=REPLACED):
        for _ in range(10_000):
            got.append(next(reader))
    for batch in got:
        assert _same(batch, next(expected)), "a batch of the new dataset came out"
    return len(got)


@pytest.mark.parametrize("kind", list(READERS))
def test_every_reader_stops_before_the_first_batch_of_a_replacing_dataset(kind, tmp_path) -> None:
    open_reader, make = READERS[kind]
    target = make(str(tmp_path / "ds"), 1)
    reference = shutil.copytree(target, tmp_path / "old")
    n = _read_across_a_replacement(open_reader, target, str(reference),
                                   lambda: replace_dataset(target, lambda d: make(d, 2)))
    assert n < 200  # it stopped at its next window, not at the end of the data


@pytest.mark.parametrize("bucket", ["s3"], indirect=True)
@pytest.mark.parametrize("kind", ["numpy", "task"])
def test_readers_stop_on_a_dataset_replaced_in_a_bucket(kind, bucket, tmp_path) -> None:
    from tests.support.servers import upload_tree

    open_reader, make = READERS[kind]
    local = make(str(tmp_path / "old"), 1)
    remote = f"{bucket}/ds"
    upload_tree(Path(local), remote)
    _read_across_a_replacement(open_reader, remote, local,
                               lambda: replace_dataset(remote, lambda d: make(d, 2)))


# ---------------------------------------------------------------- point 3: tampered indexes

def _manifest(directory: Path) -> dict:
    return json.loads((directory / "manifest.json").read_text())


def _write_manifest(directory: Path, manifest: dict) -> None:
    (directory / "manifest.json").write_text(json.dumps(manifest, sort_keys=True, indent=2) + "\n")


def _shift_index(directory: Path, shard: int, split: str = "train", record_sha: bool = True) -> None:
    """Shard ``shard``'s index lines shifted by one record: line i names record i + 1, the last line
    a frame after the shard's end. Every line still ends where the next one starts. With
    ``record_sha`` the manifest records the new index's sha256, so only the lines themselves tell."""
    manifest = _manifest(directory)
    entry = manifest["splits"][split]["shards"][shard]["index"]
    path = directory / entry["path"]
    data = path.read_bytes()
    width = data.index(b"\n") + 1
    lines = [data[i:i + width] for i in range(0, len(data), width)]
    offset_digits = lines[-1].index(b" ")
    last_offset, last_length = (int(x) for x in lines[-1].split())
    after = f"{last_offset + last_length:0{offset_digits}d} {last_length:0{width - offset_digits - 2}d}\n".encode()
    shifted = b"".join(lines[1:]) + after
    assert len(shifted) == len(data)
    path.write_bytes(shifted)
    if record_sha:
        entry["sha256"] = hashlib.sha256(shifted).hexdigest()
        _write_manifest(directory, manifest)


@pytest.fixture
def pretraining(tmp_path) -> Path:
    return Path(_pretraining(str(tmp_path / "ds"), 1))


@pytest.mark.parametrize("record_sha", [True, False], ids=["sha-recorded", "sha-stale"])
@pytest.mark.parametrize("world", [1, 2])
def test_an_index_shifted_by_one_record_gives_no_batch_on_any_rank(pretraining, tmp_path, world, record_sha) -> None:
    good = shutil.copytree(pretraining, tmp_path / "good")
    _shift_index(pretraining, 1, record_sha=record_sha)
    for rank in range(world):
        reader = NumpyBatches(open_source(str(pretraining)), seed=SEED, batch_size=B, block_size=BS,
                              world_size=world, rank=rank)
        expected = NumpyBatches(open_source(str(good)), seed=SEED, batch_size=B, block_size=BS,
                                world_size=world, rank=rank)
        with pytest.raises(LoadError, match=r"corrupt index: .*part-00001-of-00002.tfrecord.index"):
            for _ in range(2 * 128 // B):  # two epochs: every record read at least once
                assert _same(next(reader), next(expected)), f"rank {rank}: a wrong batch"


def test_an_index_shifted_by_one_record_gives_no_task_batch_and_no_record(tmp_path) -> None:
    target = Path(_task(str(tmp_path / "task"), 1))
    _shift_index(target, 0)
    with pytest.raises(LoadError, match=r"corrupt index: .*\.index"):
        next(TaskBatches(open_source(str(target)), seed=SEED, batch_size=TASK_B))
    with pytest.raises(LoadError, match=r"corrupt index: .*\.index"):
        SplitRecords(open_source(str(target)))[len(SplitRecords(open_source(str(target)))) - 1]


def test_block_digests_of_another_sha256_than_the_manifests_are_refused_before_any_record(pretraining) -> None:
    manifest = _manifest(pretraining)
    blocks = manifest["splits"]["train"]["shards"][1]["index"]["blocks"]
    path = pretraining / blocks["path"]
    digests = bytearray(path.read_bytes())
    digests[0] ^= 1
    path.write_bytes(bytes(digests))
    with pytest.raises(LoadError, match=rf"corrupt index: .*{blocks['path']}: its size or sha256 differs from the "
                                        "manifest's"):
        list(NumpyBatches(open_source(str(pretraining)), seed=SEED, batch_size=B, block_size=BS, stop=128 // B))
    (pretraining / blocks["path"]).unlink()
    with pytest.raises(LoadError, match=r"index block digests listed in the manifest are missing"):
        list(NumpyBatches(open_source(str(pretraining)), seed=SEED, batch_size=B, block_size=BS, stop=128 // B))


def test_an_index_of_another_sha256_than_the_manifests_is_refused_before_its_records(pretraining) -> None:
    """A dataset written before block digests: its index is checked whole against the manifest."""
    manifest = _manifest(pretraining)
    entry = manifest["splits"]["train"]["shards"][0]["index"]
    entry["sha256"] = hashlib.sha256(b"another index").hexdigest()
    del entry["blocks"]
    _write_manifest(pretraining, manifest)
    with pytest.raises(LoadError, match=rf"corrupt index: .*{entry['path']}: its sha256 is .*, the manifest "
                                        r"says [0-9a-f]+"):
        next(NumpyBatches(open_source(str(pretraining)), seed=SEED, batch_size=B, block_size=BS))
    with pytest.raises(LoadError, match=r"its sha256 is"):
        SplitRecords(open_source(str(pretraining)))[0]
