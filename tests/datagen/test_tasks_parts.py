"""A split built in parts (as workers build it) equals the split built whole; the train order is seeded."""

from __future__ import annotations

import numpy as np
import pytest

from bert_datagen.datagen.tasks import build
from bert_datagen.datagen.tasks.config import TaskConfig
from tests.support.taskdata_fixtures import minilm_tokenizer, task_file


def _equal(a, b) -> None:
    assert a.columns.keys() == b.columns.keys()
    for name in a.columns:
        assert np.array_equal(a.columns[name], b.columns[name]), name
        assert a.columns[name].dtype == b.columns[name].dtype
    assert a.counts == b.counts
    assert a.example_lines == b.example_lines and a.window_lines == b.window_lines
    assert a.histogram == b.histogram


@pytest.mark.parametrize("kind, split, rel, L, size", [
    ("squad", "dev", "squad11/dev-v1.1-part-b.json", 128, 97),
    ("squad", "train", "squad11/dev-v1.1-part-b.json", 128, 250),
    ("conll", "dev", "wnut17/dev.conll", 16, 77),
    ("glue/rte", "dev", "rte/dev.tsv", 64, 50),
])
def test_parts_equal_the_whole(kind, split, rel, L, size):
    path = task_file(rel)
    config = TaskConfig(kind=kind, max_seq_length=L)
    tok = minilm_tokenizer()
    si = build.read_split(config, split, [(str(path), path.read_bytes())])
    labels = build.split_labels(config, si)
    order = build.train_order(len(si.examples), 7) if split == "train" else None
    whole = build.split_records(config, si, labels, tok, order)
    parts = build.split_records(config, si, labels, tok, order, part_size=size)
    _equal(whole, parts)
    if kind == "squad":
        assert whole.columns["unique_ids"][:, 0].tolist() == list(range(1000000000, 1000000000 + len(whole)))
        assert whole.counts["max_windows_per_example"] > 1


def test_train_order_is_a_seeded_permutation():
    a = build.train_order(1000, 12345)
    assert sorted(a.tolist()) == list(range(1000))
    assert np.array_equal(a, build.train_order(1000, 12345))
    assert not np.array_equal(a, build.train_order(1000, 12346))
    assert not np.array_equal(a, np.arange(1000))
    # The first examples keep their relative order when more are appended (keys per position).
    b = build.train_order(1500, 12345)
    assert [i for i in b.tolist() if i < 1000] == a.tolist()


def test_empty_split_has_one_empty_part(tmp_path):
    path = tmp_path / "e.tsv"
    path.write_text("sentence\tlabel\n")
    config = TaskConfig(kind="glue/sst2")
    si = build.read_split(config, "dev", [(str(path), path.read_bytes())])
    records = build.split_records(config, si, ["0", "1"], minilm_tokenizer())
    assert len(records) == 0 and records.columns["input_ids"].shape == (0, 128)
    assert records.counts["examples"] == 0
