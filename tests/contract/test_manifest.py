"""`Manifest` (bert_datagen.contract.manifest): one typed reader and writer of manifest.json, whose
bytes it keeps."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bert_datagen.contract.fs import LOCAL_FS
from bert_datagen.contract.manifest import IndexInfo, Manifest, ManifestError, manifest_identity
from tests.support.synthetic import write_synthetic_dataset


def _task_json() -> dict:
    spec = {"input_ids": ["int64", 16], "input_mask": ["int64", 16], "segment_ids": ["int64", 16],
            "label_ids": ["int64", 1]}
    shard = {"path": "dev/part-00000-of-00001.tfrecord", "records": 4, "bytes": 40, "sha256": "d"}
    split = {"shards": [shard],
             "mode": "predict", "labelled": False, "features": spec, "counts": {"examples": 4},
             "side": [{"path": "dev/examples.jsonl", "bytes": 9, "sha256": "e"}]}
    task = {"kind": "tsv", "type": "classification", "labels": ["a", "b"]}
    return Manifest.build(config={"random_seed": 3}, vocab={"path": "vocab.txt", "sha256": "v", "size": 10},
                          input_info={}, features=spec, splits={"dev": split}, totals={}, kind="task",
                          extra={"task": task}).to_dict()


def test_a_dataset_manifest_reads_typed_and_writes_back_the_same_bytes(tmp_path: Path) -> None:
    directory = write_synthetic_dataset(str(tmp_path / "d"), eval_records=8)
    raw = (tmp_path / "d" / "manifest.json").read_bytes()
    m = Manifest.load(directory, LOCAL_FS)
    assert m.kind == "pretraining" and m.split_names == ["train", "eval"] and m.shape == (32, 5)
    first = m.splits["train"].shards[0]
    assert (first.path, first.records) == ("train/part-00000-of-00002.tfrecord", 64)
    assert isinstance(first.index, IndexInfo) and first.index.path == first.path + ".index"
    assert m.splits["train"].records == 128 and m.split_records("eval") == 8 and m.split_records("dev") == 0
    assert m.features["input_ids"] == ("int64", 32) and m.vocab.size == 200 and m.vocab.do_lower_case is True
    assert m.to_bytes() == raw and m.fingerprint == manifest_identity(json.loads(raw))["fingerprint"]
    out = tmp_path / "copy"
    out.mkdir()
    m.write(str(out), LOCAL_FS)
    assert (out / "manifest.json").read_bytes() == raw


def test_fields_this_version_does_not_name_survive_a_round_trip(tmp_path: Path) -> None:
    data = json.loads(Path(write_synthetic_dataset(str(tmp_path / "d")), "manifest.json").read_text())
    data["later_field"] = {"b": 1, "a": [2.5, None]}
    data["splits"]["train"]["shards"][1]["note"] = "kept"
    m = Manifest.from_dict(data)
    assert m.to_dict() == data and m.to_bytes() == Manifest.from_dict(m.to_dict()).to_bytes()
    m.to_dict()["splits"].clear()  # a copy: the manifest itself cannot be edited through it
    assert m.to_dict() == data


def test_task_splits_are_typed_with_their_side_files() -> None:
    m = Manifest.from_dict(_task_json())
    dev = m.splits["dev"]
    assert m.kind == "task" and m.task is not None and m.task["labels"] == ["a", "b"]
    assert dev.mode == "predict" and dev.labelled is False and dev.counts == {"examples": 4}
    assert dev.features is not None and dev.features["label_ids"] == ("int64", 1)
    assert [(f.path, f.bytes, f.sha256) for f in dev.side] == [("dev/examples.jsonl", 9, "e")]
    assert dev.shards[0].index is None and m.splits["dev"].windows_per_example == {}


@pytest.mark.parametrize(("edit", "message"), [
    (lambda m: m["splits"]["dev"]["side"][0].pop("sha256"), "missing field splits.dev.side[0].sha256"),
    (lambda m: m["splits"]["dev"].__setitem__("side", {}), "field splits.dev.side must be a list"),
    (lambda m: m["splits"]["dev"]["features"].__setitem__("label_ids", ["int64"]),
     "field splits.dev.features.label_ids must be [dtype, length]"),
])
def test_a_malformed_task_split_is_refused_naming_the_field(edit, message: str) -> None:
    data = _task_json()
    edit(data)
    with pytest.raises(ManifestError, match=message.replace("[", r"\[").replace("]", r"\]")):
        Manifest.from_dict(data, "x/manifest.json")
