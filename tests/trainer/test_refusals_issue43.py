"""Issue #43 point 8, the trainer's parts: `bert-train export --out` inside a dataset is refused
before any work, as predict, vocab and pretrain refuse it; and the workers of one multi-worker run
agree on a `--data` spelled relative on one and absolute (or through a symlink) on another, while
two datasets still make them stop with one line."""

from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace

import pytest
from click.testing import CliRunner

from bert_datagen.trainer.cli import main
from bert_datagen.trainer.errors import TrainConfigError
from bert_datagen.trainer.runtime import cluster
from tests.support.synthetic import write_synthetic_dataset


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> Path:
    return Path(write_synthetic_dataset(str(tmp_path_factory.mktemp("data") / "ds"), train_shards=1,
                                        records_per_shard=8, eval_records=0))


def _files(directory: Path) -> dict[str, bytes]:
    return {str(p.relative_to(directory)): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("where", ["export", "", "train/export"])
def test_export_out_in_a_dataset_is_refused_before_any_work(dataset, tmp_path, where):
    before = _files(dataset)
    out = dataset / where if where else dataset
    # The run does not exist: an export that looked at it first would say so instead.
    res = CliRunner().invoke(main, ["export", "--run", str(tmp_path / "no-run"), "--format", "tf1", "--out", str(out)])
    assert res.exit_code == 1, res.output
    lines = res.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: --out "), res.output
    assert "the bert-datagen dataset" in lines[0] and str(dataset) in lines[0], lines[0]
    assert _files(dataset) == before and not (dataset / "export").exists()


def test_export_out_beside_a_dataset_is_not_refused_for_it(dataset, tmp_path):
    res = CliRunner().invoke(main, ["export", "--run", str(tmp_path / "no-run"), "--format", "tf1",
                                    "--out", str(tmp_path / "export")])
    assert res.exit_code == 1 and "the bert-datagen dataset" not in res.output, res.output


def _record(data: str, out: Path, **more: object) -> dict[str, object]:
    strategy = SimpleNamespace(num_replicas_in_sync=1)  # outside a cluster: one worker's own record
    return cluster.start_record({"data": data, "out": str(out), "batch_size": 8, **more}, str(out), "fp",
                                {"hidden_size": 32}, strategy)


def test_workers_agree_on_one_dataset_however_its_path_is_spelled(dataset, tmp_path, monkeypatch):
    link = tmp_path / "linked"
    link.symlink_to(dataset, target_is_directory=True)
    out = tmp_path / "run"
    records = []
    for cwd, data in ((dataset.parent, dataset.name), (tmp_path, str(dataset)), (Path("/"), f"{link}/"),
                      (dataset, ".")):
        monkeypatch.chdir(cwd)
        records.append(_record(data, out, mix=[os.path.relpath(dataset, cwd)]))
    cluster.check_same_records(records)  # no TrainConfigError
    assert {r["--data"] for r in records} == {os.path.realpath(dataset)}


def test_workers_on_two_datasets_still_stop_naming_data(dataset, tmp_path, monkeypatch):
    other = Path(write_synthetic_dataset(str(tmp_path / "ds"), train_shards=1, records_per_shard=8,
                                         eval_records=0))
    monkeypatch.chdir(tmp_path)
    # The same relative spelling, two working directories: two datasets.
    records = [_record("ds", tmp_path / "run")]
    monkeypatch.chdir(dataset.parent)
    records.append(_record("ds", tmp_path / "run"))
    assert os.path.realpath(other) != os.path.realpath(dataset)
    with pytest.raises(TrainConfigError, match=r"the workers disagree on --data: worker 0 has .*worker 1 has "):
        cluster.check_same_records(records)
    # Buckets: a trailing slash is the same prefix, another prefix is not.
    same = [_record("s3://b/c128/", tmp_path / "run"), _record("s3://b/c128", tmp_path / "run")]
    cluster.check_same_records(same)
    with pytest.raises(TrainConfigError, match="--data"):
        cluster.check_same_records([_record("s3://b/c128", tmp_path / "run"), _record("s3://b/c129", tmp_path / "run")])
