"""Length-grouped fine-tuning batches, each rank reading its share (issue #43 point 7): a window is
sorted by every record's length, which a rank takes from the shards' lengths files (written by
`task`, listed in the manifest), so it reads only the records of its share of each batch (before,
every rank read the whole window: N times its share). The batches are bitwise those of the whole
window read (a dataset written before lengths files), for 1 and 4 ranks; lengths that disagree with
the records, or with the manifest, stop the reader, and `verify` names them."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from bert_datagen.contract.loading.source import LoadError, open_source
from bert_datagen.contract.loading.task_batches import TaskBatches
from bert_datagen.datagen.tasks.config import TaskConfig
from bert_datagen.datagen.tfrecord_index import parse_lines
from bert_datagen.pipelines.cli import main
from bert_datagen.pipelines.tasks.run import generate_task_dataset
from tests.support.pipeline_corpus import write_vocab
from tests.support.taskdata_corpus import write_pair_tsv

B, SEED = 32, 4


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("grouped")
    config = TaskConfig(kind="tsv", text_a="sentence1", text_b="sentence2", label="label", num_shards=3,
                        max_seq_length=64)
    generate_task_dataset(config, splits=[f"train={write_pair_tsv(root / 'pairs.tsv', 1800, 5)}"],
                          vocab_path=str(write_vocab(root / "vocab.txt")), output_dir=str(root / "ds"))
    return root / "ds"


def _manifest(directory: Path) -> dict:
    return json.loads((directory / "manifest.json").read_text())


def _write_manifest(directory: Path, manifest: dict) -> None:
    (directory / "manifest.json").write_text(json.dumps(manifest, sort_keys=True, indent=2) + "\n")


def _without_lengths(src: Path, dst: Path) -> Path:
    """The dataset as written before lengths files."""
    shutil.copytree(src, dst)
    manifest = _manifest(dst)
    for shard in manifest["splits"]["train"]["shards"]:
        (dst / shard.pop("lengths")["path"]).unlink()
    _write_manifest(dst, manifest)
    return dst


class Counting:
    """The loaders' filesystem, counting the bytes of each file's ranged reads."""

    def __init__(self) -> None:
        from bert_datagen.contract.fs import DEFAULT_FS

        self.fs, self.read = DEFAULT_FS, {}

    def read_ranges(self, path: str, ranges: list[tuple[int, int]]) -> list[bytes]:
        self.read[path] = self.read.get(path, 0) + sum(e - b for b, e in ranges)
        return self.fs.read_ranges(path, ranges)

    def __getattr__(self, name: str):
        return getattr(self.fs, name)


def _epoch(directory: Path, world: int, rank: int, fs=None) -> tuple[TaskBatches, list[dict]]:
    kw = {"fs": fs} if fs is not None else {}
    reader = TaskBatches(open_source(str(directory), **kw), seed=SEED, batch_size=B, world_size=world, rank=rank,
                         group_by_length=True)
    return reader, [reader.batch_at(step) for step in range(reader.per_epoch)]


def test_grouped_shares_are_the_whole_windows_batches(dataset, tmp_path) -> None:
    old = _without_lengths(dataset, tmp_path / "old")
    for world in (1, 4):
        for rank in range(world):
            _, new = _epoch(dataset, world, rank)
            _, before = _epoch(old, world, rank)
            for step, (a, b) in enumerate(zip(new, before, strict=True)):
                assert sorted(a) == sorted(b) and all(a[k].dtype == b[k].dtype and a[k].tobytes() == b[k].tobytes()
                                                      for k in a), (world, rank, step)


@pytest.mark.parametrize("world", [1, 4, 16])
def test_each_rank_reads_only_its_records_of_each_grouped_batch(dataset, world) -> None:
    manifest = _manifest(dataset)
    frames = {}
    for shard in manifest["splits"]["train"]["shards"]:
        index = (dataset / shard["index"]["path"]).read_bytes()
        offsets, lengths = parse_lines(index, len(index) // shard["records"])
        frames[shard["path"]] = lengths
    names = [s["path"] for s in manifest["splits"]["train"]["shards"]]
    worst = 0.0
    for rank in range(world):
        fs = Counting()
        reader = TaskBatches(open_source(str(dataset), fs=fs), seed=SEED, batch_size=B, world_size=world, rank=rank,
                             group_by_length=True)
        positions = []
        for step in range(reader.per_epoch):  # (a step's positions are known once its window is read)
            reader.batch_at(step)
            positions.append(reader.positions_at(step))
        placed = reader.order.place(np.concatenate(positions))
        handed = sum(int(frames[names[s]][i]) for s, i in zip(placed.shard.tolist(), placed.index.tolist(),
                                                              strict=True))
        fetched = sum(n for path, n in fs.read.items() if path.endswith(".tfrecord"))
        worst = max(worst, fetched / handed)
    # The records a rank is handed, read once each (neighbours joined: a few bytes between).
    assert worst <= 1.1, f"world {world}: a rank fetched {worst:.3f}x the bytes of the records it was handed"


def test_lengths_that_disagree_stop_the_reader_and_verify_names_them(dataset, tmp_path) -> None:
    out = Path(shutil.copytree(dataset, tmp_path / "ds"))
    manifest = _manifest(out)
    entry = manifest["splits"]["train"]["shards"][1]["lengths"]
    path = out / entry["path"]
    lengths = np.frombuffer(path.read_bytes(), "<u2").copy()
    lengths[:] = lengths[::-1]  # other records' lengths: the sort, and so the batches, would change
    path.write_bytes(lengths.tobytes())
    with pytest.raises(LoadError, match=rf"corrupt lengths: .*{entry['path']}: its size or sha256 differs"):
        _epoch(out, 2, 1)
    result = CliRunner().invoke(main, ["verify", str(out)])
    assert result.exit_code == 1 and f"{entry['path']}: its size or sha256 differs" in result.output, result.output
    entry["sha256"] = hashlib.sha256(path.read_bytes()).hexdigest()  # listed as it is: only the records tell
    _write_manifest(out, manifest)
    with pytest.raises(LoadError, match=r"part-00001-of-00003.tfrecord: a record holds another number of tokens"):
        _epoch(out, 2, 1)
    result = CliRunner().invoke(main, ["verify", str(out)])
    assert result.exit_code == 1 and f"lengths {entry['path']} say" in result.output, result.output
