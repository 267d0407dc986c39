"""TensorFlow parses task records with the split's feature spec, to the values the builders made.

The only task test module that imports TensorFlow. The bytes also equal TensorFlow's own
deterministic serialization of the same `tf.train.Example`.
"""

from __future__ import annotations

import numpy as np
import pytest

from bert_datagen.datagen.records import frame_columns
from bert_datagen.datagen.tasks.config import TaskConfig, split_is_training
from bert_datagen.datagen.tasks.features import task_feature_spec
from tests.support.record_encoding import encode_payloads
from tests.support.taskdata_fixtures import build_file, minilm_tokenizer, squad_slice, task_file

tf = pytest.importorskip("tensorflow")


def _tf_spec(spec: dict) -> dict:
    return {name: tf.io.FixedLenFeature([length], tf.float32 if dtype == "float32" else tf.int64)
            for name, (dtype, length) in spec.items()}


def _tf_example(row: dict) -> bytes:
    feature = {}
    for name, values in row.items():
        if values.dtype == np.float32:
            feature[name] = tf.train.Feature(float_list=tf.train.FloatList(value=values.tolist()))
        else:
            feature[name] = tf.train.Feature(int64_list=tf.train.Int64List(value=values.tolist()))
    return tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString(deterministic=True)


@pytest.mark.parametrize("kind, split, rel, L", [
    ("glue/sst2", "dev", "sst2/dev.tsv", 64),
    ("squad", "train", "squad11/dev-v1.1-part-b.json", 128),
    ("squad", "dev", "squad11/dev-v1.1-part-b.json", 384),
    ("conll", "dev", "wnut17/dev.conll", 32),
])
def test_tensorflow_parses_every_record(kind, split, rel, L, tmp_path):
    path = task_file(rel)
    path = squad_slice(path, 400) if kind == "squad" else path
    records, _ = build_file(TaskConfig(kind=kind, max_seq_length=L), split, path, minilm_tokenizer())
    n = min(len(records), 400)
    columns = {name: values[:n] for name, values in records.columns.items()}
    spec = task_feature_spec(TaskConfig(kind=kind).task_type, L, split_is_training(split))
    assert set(spec) == set(columns)
    blob, lengths = frame_columns(columns)
    path = tmp_path / "part.tfrecord"
    path.write_bytes(blob)
    assert sum(lengths) == len(blob)
    parsed = [tf.io.parse_single_example(raw, _tf_spec(spec)) for raw in tf.data.TFRecordDataset(str(path))]
    assert len(parsed) == n
    for name, (_, length) in spec.items():
        got = np.stack([p[name].numpy() for p in parsed])
        assert got.shape == (n, length)
        assert np.array_equal(got, columns[name].reshape(n, length)), name
    payloads = encode_payloads(columns)
    for i in range(0, n, 37):
        assert payloads[i] == _tf_example({k: v[i] for k, v in columns.items()})


def test_regression_label_is_one_float(tmp_path):
    header = "index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\tsentence2\tscore\n"
    path = tmp_path / "dev.tsv"
    path.write_text(header + "0\tm\tf\t2012\t1\tn\tn\tA plane.\tAn air plane.\t3.800\n")
    records, _ = build_file(TaskConfig(kind="glue/stsb"), "dev", path, minilm_tokenizer())
    spec = task_feature_spec("regression", 128, False)
    raw = encode_payloads(records.columns)[0]
    parsed = tf.io.parse_single_example(raw, _tf_spec(spec))
    assert parsed["label_ids"].dtype == tf.float32 and parsed["label_ids"].numpy().tolist() == [np.float32(3.8)]
    assert raw == _tf_example({k: v[0] for k, v in records.columns.items()})
