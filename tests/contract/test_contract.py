"""contract/: kind-aware manifest validation, the local filesystem seam, one dataset discovery."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from bert_datagen.contract.dataset import DatasetError, open_dataset
from bert_datagen.contract.fs import LOCAL_FS
from bert_datagen.contract.manifest import (
    ManifestError,
    build_manifest,
    load_manifest,
    manifest_kind,
    write_manifest,
)
from bert_datagen.datagen.record_layout import feature_spec


def _manifest(**over) -> dict:
    kw = dict(config={"random_seed": 1}, vocab={"path": "vocab.txt", "sha256": "ab", "size": 10},
              input_info={"patterns": ["x"]}, features=feature_spec(16, 3),
              splits={"train": {"shards": [{"path": "train/part-00000-of-00001.tfrecord", "records": 3,
                                            "bytes": 100, "sha256": "cc"}]}},
              totals={"instances": 3})
    kw.update(over)
    return build_manifest(**kw)


def test_pretraining_manifest_has_no_kind_field() -> None:
    m = _manifest()
    assert "kind" not in m and manifest_kind(m) == "pretraining"


def test_task_manifest_needs_its_task_field_but_not_the_mlm_features() -> None:
    features = {"input_ids": ("int64", 16), "input_mask": ("int64", 16), "segment_ids": ("int64", 16),
                "label_ids": ("int64", 1)}
    with pytest.raises(ManifestError, match="missing field task"):
        _manifest(features=features, kind="task")
    m = _manifest(features=features, kind="task", extra={"task": {"kind": "tsv", "type": "classification"}})
    assert manifest_kind(m) == "task" and m["task"]["type"] == "classification"


def test_unknown_kind_is_refused_naming_the_field() -> None:
    with pytest.raises(ManifestError, match="field kind is 'images'"):
        _manifest(kind="images")


def test_local_fs_round_trip_and_gzip(tmp_path: Path) -> None:
    m = _manifest()
    write_manifest(str(tmp_path), m, LOCAL_FS)
    assert load_manifest(str(tmp_path), LOCAL_FS) == json.loads((tmp_path / "manifest.json").read_text())
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".tmp-")]
    (tmp_path / "x.gz").write_bytes(gzip.compress(b"hello"))
    assert LOCAL_FS.read_bytes(str(tmp_path / "x.gz")) == b"hello"
    assert LOCAL_FS.glob(str(tmp_path / "*.gz")) == [str(tmp_path / "x.gz")]


def test_open_dataset_without_vocab_lists_shards_in_split_order(tmp_path: Path) -> None:
    m = _manifest(splits={
        "eval": {"shards": [{"path": "eval/part-00000-of-00001.tfrecord", "records": 1, "bytes": 1, "sha256": "e"}]},
        "train": {"shards": [{"path": "train/part-00000-of-00001.tfrecord", "records": 3, "bytes": 1,
                              "sha256": "t"}]}})
    write_manifest(str(tmp_path), m, LOCAL_FS)
    ds = open_dataset(str(tmp_path), LOCAL_FS, need_vocab=False)
    assert ds.splits == ["train", "eval"] and ds.vocab is None and (ds.max_seq_length, ds.max_predictions) == (16, 3)
    assert ds.split_shards("eval")[0].path == str(tmp_path / "eval" / "part-00000-of-00001.tfrecord")
    with pytest.raises(DatasetError, match="vocab file not found"):
        open_dataset(str(tmp_path), LOCAL_FS)
