"""verify, inspect and stats on the new record kinds: data without NSP (doc-sentences,
full-sentences), dynamic masking (unmasked records with an instance_key) and span masking."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from bert_datagen.contract.dataset import open_dataset
from bert_datagen.datagen.example_codec import decode_batch
from bert_datagen.datagen.record_rules import check_batch
from bert_datagen.datagen.tfrecord import iter_tfrecords
from bert_datagen.pipelines.beam.fsio import BEAM_FS
from bert_datagen.pipelines.pretraining.run import generate_dataset
from bert_datagen.pipelines.tools.cli import inspect_command, stats_command, verify_command
from bert_datagen.pipelines.tools.verify import verify
from tests.support.pipeline_corpus import make_documents, write_sentence_files, write_vocab
from tests.support.pipeline_golden import CONFIG as GOLDEN_CONFIG

KINDS = {
    "span": dict(masking_unit="span"),
    "doc-sentences": dict(objective="doc-sentences"),
    "full-sentences": dict(objective="full-sentences"),
    "dynamic": dict(masking="dynamic", dupe_factor=1),
    "dynamic-full-sentences": dict(objective="full-sentences", masking="dynamic", dupe_factor=1, masking_unit="word"),
}


@pytest.fixture(scope="module")
def datasets(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("tool-variants")
    # few long documents in one pool: full-sentences records cross documents
    write_sentence_files(root / "in", make_documents(30, seed=42, max_sentences=8), n_files=2)
    vocab = str(write_vocab(root / "vocab.txt"))
    out = {}
    for name, kw in KINDS.items():
        out[name] = root / name
        generate_dataset(dataclasses.replace(GOLDEN_CONFIG, **kw), inputs=[str(root / "in" / "*.txt")],
                         vocab_path=vocab, output_dir=str(out[name]))
    return out


@pytest.mark.parametrize("name", list(KINDS))
def test_generated_variants_verify_clean(datasets, name):
    report = verify(open_dataset(str(datasets[name]), BEAM_FS), workers=1)
    assert report.problem_count == 0, report.problems
    assert report.records == json.loads((datasets[name] / "manifest.json").read_text())["totals"]["instances"]
    result = CliRunner().invoke(verify_command, [str(datasets[name])])
    assert result.exit_code == 0, result.output


def shard_batch(directory: Path):
    ds = open_dataset(str(directory), BEAM_FS)
    ref = ds.shards[0]
    payloads = list(iter_tfrecords(open(ref.path, "rb"), ref.path))
    batch, problems = decode_batch(payloads, list(range(len(payloads))), ds.shape)
    assert not problems and len(batch) == len(payloads) > 3
    return ds, batch


def messages(batch, shape) -> list[str]:
    return [m for _, m in check_batch(batch, shape)[0]]


def test_record_rules_catch_broken_packed_and_dynamic_records(datasets):
    ds, batch = shard_batch(datasets["doc-sentences"])
    f = batch.features
    f["segment_ids"][0, 1] = 1  # one segment only
    assert any("one segment" in m for m in messages(batch, ds.shape))
    f["segment_ids"][0, 1] = 0
    length = int(f["input_mask"][1].sum())
    f["input_ids"][1, length // 2] = ds.vocab.sep_id  # doc-sentences never holds a second [SEP]
    assert any("not [CLS] sentences [SEP]" in m for m in messages(batch, ds.shape))

    ds, batch = shard_batch(datasets["dynamic"])
    f = batch.features
    assert "masked_lm_weights" not in f and "instance_key" in f
    f["instance_key"][[1, 2]] = f["instance_key"][[2, 1]]  # out of key order
    assert any("instance_key" in m and "key order" in m for m in messages(batch, ds.shape))
    f["instance_key"][[1, 2]] = f["instance_key"][[2, 1]]
    f["input_ids"][3, 2] = ds.vocab.mask_id  # unmasked data holds no [MASK]
    assert any("special token" in m for m in messages(batch, ds.shape))


def test_full_sentences_records_hold_a_separator_between_documents(datasets):
    ds, batch = shard_batch(datasets["full-sentences"])
    f = batch.features
    lengths = f["input_mask"].sum(axis=1)
    inner = [(f["input_ids"][r, 1:lengths[r] - 1] == ds.vocab.sep_id).sum() for r in range(len(batch))]
    assert max(inner) >= 1 and not messages(batch, ds.shape)
    r = int(np.argmax(inner))
    at = 1 + int(np.argmax(f["input_ids"][r, 1:] == ds.vocab.sep_id))
    f["input_ids"][r, at + 1] = ds.vocab.sep_id  # two in a row
    assert any("not [CLS] sentences [SEP]" in m for m in messages(batch, ds.shape))


def test_stats_and_inspect_name_the_kind(datasets):
    st = json.loads(CliRunner().invoke(stats_command, [str(datasets["full-sentences"]), "--json"]).output)
    assert st["objective"] == "full-sentences" and st["notnext_share"] is None
    assert st["b_length"]["mean"] is None and st["masked_count"]["mean"] > 0
    text = CliRunner().invoke(stats_command, [str(datasets["dynamic"])]).output
    assert "masking dynamic" in text and "masked as" not in text and "NotNext share" in text
    out = CliRunner().invoke(inspect_command, [str(datasets["doc-sentences"]), "-n", "1"]).output
    assert "no NSP" in out and "  text: " in out and "  B: " not in out
    out = CliRunner().invoke(inspect_command, [str(datasets["dynamic-full-sentences"]), "-n", "1", "--json"]).output
    view = json.loads(out.splitlines()[0])
    assert view["next_sentence_label"] is None and view["masked"] == [] and view["instance_key"].startswith("0x")
    span = json.loads(CliRunner().invoke(stats_command, [str(datasets["span"]), "--json"]).output)
    assert span["masked_count"]["mean"] > 0 and abs(span["mask_kinds"]["mask"] - 0.8) < 0.15
