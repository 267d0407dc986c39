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
# Pinned: packing is a pure function of each shard's records (any worker count, any input layout).
GOLDEN = {
    "nsp": {
        "eval/part-00000-of-00001.tfrecord": "9c80aa2193f8b66f9708b13178cc1b5c2e0f45343dd1a9fda08d176005d44404",
        "train/part-00000-of-00002.tfrecord": "202a62716ad5ec49cffb3d3b32034b20448bf4d636a5f186c435a1c4262ee8d0",
        "train/part-00001-of-00002.tfrecord": "7a29de782fab7352648650ff881b650cce92616d26e1c0b9d4010bfe220bb8c6",
    },
    "doc-sentences": {
        "eval/part-00000-of-00001.tfrecord": "e96d7edbc9454adf546fb2d8f25a96b58e1e2b91655c9e79c94f2cd09b05fb88",
        "train/part-00000-of-00002.tfrecord": "d3132a5e50a623c8379a5e87b44ab6389cf7ea81b6206b7df0dd3e185c81abef",
        "train/part-00001-of-00002.tfrecord": "0654526b318f09da936722b5a17cd0e232cbe6c0494e5008cd54a8651138c47b",
    },
}


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
    assert shard_digests(packed) == GOLDEN[name]
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


@pytest.mark.integration
def test_packed_bytes_do_not_depend_on_workers(corpus):
    from bert_datagen.pipelines.beam.runners import RunnerOptions

    root, vocab = corpus
    config = dataclasses.replace(GOLDEN_CONFIG, packing=True)
    out = root / "two-workers"
    generate_dataset(config, inputs=[str(root / "in" / "*.txt")], vocab_path=vocab, output_dir=str(out),
                     runner=RunnerOptions(beam_args=["--direct_num_workers=2"]))
    assert shard_digests(out) == GOLDEN["nsp"]
