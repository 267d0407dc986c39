"""TensorFlow reads what the pipeline writes, exactly as the original trainer parses it.

The only data-side test module that imports TensorFlow.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from bert_datagen.datagen.config import DatagenConfig
from bert_datagen.datagen.example_exact import decode_example
from bert_datagen.pipelines.pretraining.run import generate_dataset
from tests.support.pipeline_corpus import make_documents, manifest_of, write_text_files, write_vocab

tf = pytest.importorskip("tensorflow")

SEQ, PRED = 40, 6


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("tfformat")
    write_text_files(root / "in", make_documents(40, seed=8), n_files=2)
    vocab = write_vocab(root / "vocab.txt")
    config = DatagenConfig(max_seq_length=SEQ, max_predictions_per_seq=PRED, dupe_factor=2, num_shards=2,
                           eval_fraction=0.2, notnext_pool_size=10, whole_word_mask=True)
    out = root / "out"
    generate_dataset(config, inputs=[str(root / "in" / "*.txt")], vocab_path=str(vocab), output_dir=str(out))
    return out


def original_feature_spec() -> dict:
    # RECIPE.md section 4: the names, types and fixed lengths the original run_pretraining.py parses.
    return {
        "input_ids": tf.io.FixedLenFeature([SEQ], tf.int64),
        "input_mask": tf.io.FixedLenFeature([SEQ], tf.int64),
        "segment_ids": tf.io.FixedLenFeature([SEQ], tf.int64),
        "masked_lm_positions": tf.io.FixedLenFeature([PRED], tf.int64),
        "masked_lm_ids": tf.io.FixedLenFeature([PRED], tf.int64),
        "masked_lm_weights": tf.io.FixedLenFeature([PRED], tf.float32),
        "next_sentence_labels": tf.io.FixedLenFeature([1], tf.int64),
    }


def shard_paths(out: Path) -> list[str]:
    manifest = manifest_of(out)
    return [str(out / s["path"]) for split in manifest["splits"].values() for s in split["shards"]]


def test_tensorflow_parses_every_record_with_the_original_spec(dataset: Path) -> None:
    manifest = manifest_of(dataset)
    spec = original_feature_spec()
    parsed = 0
    for raw in tf.data.TFRecordDataset(shard_paths(dataset)):  # checks framing and CRCs
        features = tf.io.parse_single_example(raw, spec)
        mine = decode_example(raw.numpy())
        for name, tensor in features.items():
            np.testing.assert_array_equal(tensor.numpy(), mine[name], err_msg=name)
        n_real = int(features["input_mask"].numpy().sum())
        ids = features["input_ids"].numpy()
        assert (ids[n_real:] == 0).all() and n_real <= SEQ
        weights = features["masked_lm_weights"].numpy()
        n_pred = int(weights.sum())
        assert set(np.unique(weights)) <= {0.0, 1.0} and (weights[:n_pred] == 1).all()
        assert int(features["next_sentence_labels"].numpy()[0]) in (0, 1)
        parsed += 1
    assert parsed == manifest["totals"]["instances"] > 0


def test_bytes_equal_deterministic_protobuf_serialization(dataset: Path) -> None:
    int_names = ("input_ids", "input_mask", "segment_ids", "masked_lm_positions", "masked_lm_ids",
                 "next_sentence_labels")
    checked = 0
    for raw in tf.data.TFRecordDataset(shard_paths(dataset)):
        payload = raw.numpy()
        values = decode_example(payload)
        feature = {name: tf.train.Feature(int64_list=tf.train.Int64List(value=values[name].tolist()))
                   for name in int_names}
        feature["masked_lm_weights"] = tf.train.Feature(
            float_list=tf.train.FloatList(value=values["masked_lm_weights"].tolist()))
        example = tf.train.Example(features=tf.train.Features(feature=feature))
        assert example.SerializeToString(deterministic=True) == payload
        assert tf.train.Example.FromString(payload) == example
        checked += 1
    assert checked > 0
