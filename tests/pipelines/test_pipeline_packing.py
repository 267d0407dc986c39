"""Packed pre-training data (--packing) end to end: golden shard checksums, and unpacking a packed
dataset gives back the unpacked run's records byte for byte, in order (docs/packing.md)."""

from __future__ import annotations

import dataclasses
import io
import json

import numpy as np
import pytest
from click.testing import CliRunner

from bert_datagen.contract.dataset import open_dataset
from bert_datagen.datagen.example_codec import decode_batch
from bert_datagen.datagen.framed import EncodedRecords
from bert_datagen.datagen.packed import pack, pack_records, unpack
from bert_datagen.datagen.packed_rules import check_packed_batch
from bert_datagen.datagen.record_layout import feature_spec
from bert_datagen.datagen.records import frame_columns
from bert_datagen.datagen.tfrecord import iter_tfrecords
from bert_datagen.pipelines.beam.fsio import BEAM_FS
from bert_datagen.pipelines.beam.runners import RunnerOptions
from bert_datagen.pipelines.cli import main
from bert_datagen.pipelines.pretraining.run import generate_dataset
from tests.support.pipeline_corpus import (
    make_documents,
    manifest_of,
    shard_digests,
    write_sentence_files,
    write_vocab,
)
from tests.support.pipeline_golden import CONFIG as GOLDEN_CONFIG
from tests.support.record_encoding import encode_batch

VARIANTS = {
    "nsp": dict(),
    "doc-sentences": dict(objective="doc-sentences", masking_unit="word"),
}
# Pinned: packing is a pure function of each shard's records (any worker count, any input layout).
GOLDEN = {
    "nsp": {
        "eval/part-00000-of-00001.tfrecord": "ad66cdc66ec00b63728408d9c46e78580a50da8fccbb7198100fd3440be9991a",
        "train/part-00000-of-00002.tfrecord": "08d52e823f2c7155e5d124dfff9ce89c41c6508b473b9d31024cf77ef765bca2",
        "train/part-00001-of-00002.tfrecord": "ffc7099214d94b5a6ad8e8c4c3cc56b1b50effd82485db1d32181eb7bcac8d7c",
    },
    "doc-sentences": {
        "eval/part-00000-of-00001.tfrecord": "1685d027af0853d7afed7f89e340735f601009d9adcf35e51af227833df27cb2",
        "train/part-00000-of-00002.tfrecord": "81d9a3b97233bb8cb0b41563b0f28b674be43b993c2da60531bada7e6c36c9e4",
        "train/part-00001-of-00002.tfrecord": "af9f4876de514447c8e35d5318c3ec08920d15f7f6d03410ab6d947672f6fe4f",
    },
}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("packing")
    write_sentence_files(root / "in", make_documents(30, seed=42, max_sentences=8), n_files=2)
    return root, str(write_vocab(root / "vocab.txt"))


def _records(path) -> list[bytes]:
    return list(iter_tfrecords(io.BytesIO(path.read_bytes()), str(path)))


@pytest.fixture(scope="module")
def built(corpus):
    """(plain, packed) dataset directories per variant, with the same options."""
    root, vocab = corpus
    out = {}
    for name, options in VARIANTS.items():
        config = dataclasses.replace(GOLDEN_CONFIG, **options)
        out[name] = (root / f"{name}-plain", root / f"{name}-packed")
        for cfg, path in ((config, out[name][0]), (dataclasses.replace(config, packing=True), out[name][1])):
            generate_dataset(cfg, inputs=[str(root / "in" / "*.txt")], vocab_path=vocab, output_dir=str(path))
    return out


@pytest.mark.parametrize("name", list(VARIANTS))
def test_packed_dataset_unpacks_to_the_unpacked_run(built, name):
    config = dataclasses.replace(GOLDEN_CONFIG, **VARIANTS[name])
    plain, packed = built[name]
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


def _packed_batch(packed):
    manifest = manifest_of(packed)
    shard = packed / manifest["splits"]["train"]["shards"][0]["path"]
    payloads = _records(shard)
    shape = open_dataset(str(packed), BEAM_FS).shape
    batch, _ = decode_batch(payloads, list(range(len(payloads))), shape)
    return batch, shape


def test_packed_row_rules_catch_a_broken_row(built):
    batch, shape = _packed_batch(built["nsp"][1])
    problems, total, instances = check_packed_batch(batch, shape)
    assert (problems, total) == ([], 0) and len(instances) >= len(batch)
    row = int(np.argmax(batch.features["sequence_ids"].max(axis=1)))  # a row of several sequences
    assert batch.features["sequence_ids"][row].max() >= 2
    for name, change in (("position_ids", lambda f: f["position_ids"][row].__setitem__(-1, 7)),
                         ("cls_positions", lambda f: f["cls_positions"][row].__setitem__(1, 3)),
                         ("next_sentence_weights", lambda f: f["next_sentence_weights"][row].__setitem__(2, 1.0)),
                         ("input_ids", lambda f: f["input_ids"][row].__setitem__(
                             int(f["cls_positions"][row, 1]), 5))):  # the second sequence loses its [CLS]
        broken = type(batch)(batch.index, {k: v.copy() for k, v in batch.features.items()})
        if name == "next_sentence_weights" and batch.features["sequence_ids"][row].max() == 3:
            continue
        change(broken.features)
        problems, total, _ = check_packed_batch(broken, shape)
        assert total >= 1 and problems[0][0] == row, name


def test_tools_show_packed_rows(built):
    plain, packed = built["nsp"]
    runner = CliRunner()
    result = runner.invoke(main, ["verify", str(packed)])
    assert result.exit_code == 0, result.output
    result = runner.invoke(main, ["stats", str(packed), "--json"])
    assert result.exit_code == 0, result.output
    st = json.loads(result.output)
    plain_st = json.loads(runner.invoke(main, ["stats", str(plain), "--json"]).output)
    assert st["records"] == plain_st["records"] and st["packing"]["rows"] < st["records"]
    assert st["packing"]["unpacked_padding_share"] == plain_st["padding_share"] > st["packing"]["padding_share"]
    assert st["seq_length"] == plain_st["seq_length"] and st["mask_kinds"] == plain_st["mask_kinds"]
    batch, _ = _packed_batch(packed)
    row = int(np.argmax(batch.features["sequence_ids"].max(axis=1)))
    result = runner.invoke(main, ["inspect", str(packed), "--index", str(row), "-n", "1"])
    assert result.exit_code == 0 and "sequence 2 at position" in result.output, result.output
    result = runner.invoke(main, ["diff", str(packed), str(packed)])
    assert result.exit_code == 0 and result.output.startswith("identical"), result.output


@pytest.mark.integration
def test_packed_bytes_do_not_depend_on_workers(corpus):
    root, vocab = corpus
    config = dataclasses.replace(GOLDEN_CONFIG, packing=True)
    out = root / "two-workers"
    generate_dataset(config, inputs=[str(root / "in" / "*.txt")], vocab_path=vocab, output_dir=str(out),
                     runner=RunnerOptions(beam_args=["--direct_num_workers=2"]))
    assert shard_digests(out) == GOLDEN["nsp"]


def test_cli_packing_options(corpus):
    root, vocab = corpus
    base = ["run", "--input", str(root / "in" / "*.txt"), "--input-format", "sentences", "--vocab", vocab,
            "--max-seq-length", "32", "--max-predictions-per-seq", "5", "--dupe-factor", "1", "--quiet"]
    result = CliRunner().invoke(main, [*base, "--output", str(root / "cli"), "--packing",
                                       "--max-sequences-per-row", "2"])
    assert result.exit_code == 0, result.output
    config = manifest_of(root / "cli")["config"]
    assert (config["packing"], config["max_sequences_per_row"], config["packing_group_size"]) == (True, 2, 8192)
    for extra, message in ((["--max-sequences-per-row", "2"], "--packing"),
                           (["--packing", "--max-sequences-per-row", "1"], "--max-sequences-per-row"),
                           (["--packing", "--max-sequences-per-row", "11"], "--max-sequences-per-row"),
                           (["--packing", "--masking", "dynamic"], "dynamic")):
        result = CliRunner().invoke(main, [*base, "--output", str(root / "cli-bad"), *extra])
        assert result.exit_code == 2 and message in result.output, (extra, result.output)
        assert not (root / "cli-bad" / "manifest.json").exists()


def test_packing_group_by_group_equals_packing_the_shard_at_once(built):
    """pack_records packs one group at a time; with small groups that must equal one pack() call."""
    packed = built["nsp"][1]
    config = dataclasses.replace(GOLDEN_CONFIG, packing=True, packing_group_size=7)
    batch, shape = _packed_batch(packed)
    instances, keys = unpack(batch.features, config.max_predictions_per_seq)
    blob, lengths = frame_columns(instances.columns())
    records = EncodedRecords(keys, lengths, blob)
    chunked = pack_records(records, config, "shard")
    columns, row_keys = pack({n: getattr(instances, n) for n in instances.feature_names}, keys, config)
    assert chunked.blob == frame_columns(columns)[0] and (chunked.keys == row_keys).all()
    assert len(chunked) > len(batch)  # groups of 7 pack worse than groups of 8192
