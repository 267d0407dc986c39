"""Packed pre-training data (--packing) end to end: golden shard checksums, and unpacking a packed
dataset gives back the unpacked run's records byte for byte, in order (docs/packing.md)."""

from __future__ import annotations

import dataclasses
import io

import numpy as np
import pytest

from bert_datagen.datagen.example_codec import decode_batch
from bert_datagen.datagen.packed import unpack
from bert_datagen.datagen.records import encode_batch, feature_spec
from bert_datagen.datagen.tfrecord import iter_tfrecords
from bert_datagen.pipelines.pretraining.run import generate_dataset
from tests.support.pipeline_corpus import make_documents, manifest_of, shard_digests, write_sentence_files, write_vocab
from tests.support.pipeline_golden import CONFIG as GOLDEN_CONFIG

VARIANTS = {
    "nsp": dict(),
    "doc-sentences": dict(objective="doc-sentences", masking_unit="word"),
}
GOLDEN: dict[str, dict[str, str]] = {}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("packing")
    write_sentence_files(root / "in", make_documents(30, seed=42, max_sentences=8), n_files=2)
    return root, str(write_vocab(root / "vocab.txt"))


def _records(path) -> list[bytes]:
    return list(iter_tfrecords(io.BytesIO(path.read_bytes()), str(path)))


@pytest.mark.parametrize("name", list(VARIANTS))
def test_packed_dataset_unpacks_to_the_unpacked_run(corpus, name):
    root, vocab = corpus
    config = dataclasses.replace(GOLDEN_CONFIG, **VARIANTS[name])
    packed_config = dataclasses.replace(config, packing=True, max_sequences_per_row=3)
    plain, packed = root / f"{name}-plain", root / f"{name}-packed"
    for cfg, out in ((config, plain), (packed_config, packed)):
        generate_dataset(cfg, inputs=[str(root / "in" / "*.txt")], vocab_path=vocab, output_dir=str(out))
    manifest = manifest_of(packed)
    spec = feature_spec(config.max_seq_length, config.max_predictions_per_seq, config.objective, "static", 3)
    assert {k: tuple(v) for k, v in manifest["features"].items()} == spec
    assert manifest["config"]["packing"] is True and manifest["config"]["max_sequences_per_row"] == 3
    print(shard_digests(packed))
    rows = instances = 0
    for split in manifest["splits"]:
        for shard in manifest["splits"][split]["shards"]:
            payloads = _records(packed / shard["path"])
            batch, problems = decode_batch(payloads, list(range(len(payloads))), spec)
            assert not problems
            unpacked, keys = unpack(batch.features, config.max_predictions_per_seq)
            assert (np.diff(keys.astype(np.float64)) > 0).all()
            assert encode_batch(unpacked) == _records(plain / shard["path"])
            rows += len(payloads)
            instances += len(unpacked)
    assert instances == manifest["totals"]["instances"] == manifest_of(plain)["totals"]["instances"]
    assert rows == manifest["totals"]["packed_rows"] < instances
