"""Pre-training's reading of --data (trainer/pretrain/dataset_info.py's DatasetInfo) holds the dataset the
contract opened and reads what its manifest says from it (issue #45: not a third copy of the
manifest's facts beside Manifest and Dataset)."""

from __future__ import annotations

import dataclasses

import pytest

pytest.importorskip("tensorflow")

from bert_datagen.contract.dataset import Dataset  # noqa: E402
from bert_datagen.trainer.pretrain.data import open_pretraining_data  # noqa: E402
from bert_datagen.trainer.pretrain.dataset_info import DatasetInfo  # noqa: E402
from tests.support.synthetic import write_synthetic_dataset  # noqa: E402

READ_FROM_THE_MANIFEST = ("manifest", "vocab_size", "eval_records", "objective", "masking", "word_segmented",
                          "train_refs", "eval_refs", "eval_counts")


def test_what_the_manifest_says_is_read_from_the_dataset(tmp_path) -> None:
    assert not {f.name for f in dataclasses.fields(DatasetInfo)} & set(READ_FROM_THE_MANIFEST)
    directory = write_synthetic_dataset(str(tmp_path / "d"), train_shards=2, records_per_shard=8, eval_records=4,
                                        masking="dynamic")
    info = open_pretraining_data(directory)
    assert isinstance(info.dataset, Dataset) and info.manifest is info.dataset.manifest
    manifest = info.manifest
    assert info.vocab_size == manifest.vocab.size
    assert (info.objective, info.masking, info.word_segmented) == ("nsp", "dynamic", False)
    assert info.train_records == manifest.split_records("train") == 16
    assert info.eval_records == manifest.split_records("eval") == 4
    assert [r.path for r in info.train_refs] == info.train_files
    assert [r.path for r in info.eval_refs] == info.eval_files and info.eval_counts == [4]


def test_tfrecord_globs_have_no_dataset_and_the_originals_defaults(tmp_path) -> None:
    directory = write_synthetic_dataset(str(tmp_path / "d"), train_shards=1, records_per_shard=8, eval_records=4)
    info = open_pretraining_data(f"{directory}/train/*.tfrecord", 32, 5)
    assert info.dataset is None and info.manifest is None
    assert (info.vocab_size, info.eval_records, info.train_refs, info.eval_refs, info.eval_counts) == (None,) * 5
    assert (info.objective, info.masking, info.word_segmented) == ("nsp", "static", False)
