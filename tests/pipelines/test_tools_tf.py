"""Records written by TensorFlow itself (as the original tool does) pass verify, inspect and stats.

TensorFlow serializes tf.train.Example without deterministic map order, so the feature entries can
come in any order: the tools must not depend on it. This is the only tools test that imports TF.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

sys.path.insert(0, str(Path(__file__).resolve().parent.parent.parent))  # benchmarks/ holds the fixture writer

from benchmarks.bench_verify import fixture_instances, fixture_vocab  # noqa: E402
from bert_datagen.pipelines.tools.cli import inspect_command, stats_command, verify_command  # noqa: E402

tf = pytest.importorskip("tensorflow")

SEQ, PREDS = 40, 6
VOCAB = fixture_vocab()


def _example(batch, r: int) -> bytes:
    """The original tool's create_int_feature / create_float_feature, record by record."""
    def ints(v):
        return tf.train.Feature(int64_list=tf.train.Int64List(value=[int(x) for x in np.atleast_1d(v)]))

    features = {
        "input_ids": ints(batch.input_ids[r]),
        "input_mask": ints(batch.input_mask[r]),
        "segment_ids": ints(batch.segment_ids[r]),
        "masked_lm_positions": ints(batch.masked_lm_positions[r]),
        "masked_lm_ids": ints(batch.masked_lm_ids[r]),
        "masked_lm_weights": tf.train.Feature(
            float_list=tf.train.FloatList(value=[float(x) for x in batch.masked_lm_weights[r]])),
        "next_sentence_labels": ints(batch.next_sentence_labels[r]),
    }
    return tf.train.Example(features=tf.train.Features(feature=features)).SerializeToString()


@pytest.fixture(scope="module")
def tf_written(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("tfdata")
    for i in range(2):
        batch, _ = fixture_instances(21, 30 * i, 30, SEQ, PREDS, len(VOCAB))
        with tf.io.TFRecordWriter(str(root / f"tf_examples.tfrecord-{i:05d}")) as w:
            for r in range(30):
                w.write(_example(batch, r))
    (root / "vocab.txt").write_text("\n".join(VOCAB) + "\n")
    return root


def _opts(root: Path) -> list[str]:
    return ["--max-seq-length", str(SEQ), "--max-predictions-per-seq", str(PREDS), "--vocab", str(root / "vocab.txt")]


def test_tf_written_records_verify(tf_written: Path) -> None:
    result = CliRunner().invoke(verify_command, [str(tf_written / "tf_examples.tfrecord-*"), *_opts(tf_written)])
    assert result.exit_code == 0, result.output
    assert "60 records" in result.output


def test_tf_written_records_inspect_and_stats(tf_written: Path) -> None:
    result = CliRunner().invoke(inspect_command, [str(tf_written / "tf_examples.tfrecord-*"), "--shard", "1",
                                                  "--index", "4", "-n", "1", "--json", *_opts(tf_written)])
    assert result.exit_code == 0, result.output
    view = json.loads(result.output)
    batch, original = fixture_instances(21, 34, 1, SEQ, PREDS, len(VOCAB))
    assert [t["token"] for t in view["tokens"]] == [VOCAB[i] for i in original[0, :view["length"]]]
    assert view["next_sentence_label"] == int(batch.next_sentence_labels[0])
    result = CliRunner().invoke(stats_command, [str(tf_written / "tf_examples.tfrecord-*"), "--json",
                                                *_opts(tf_written)])
    st = json.loads(result.output)
    all_batch, _ = fixture_instances(21, 0, 60, SEQ, PREDS, len(VOCAB))
    assert st["records"] == 60 and st["unreadable_records"] == 0
    assert st["notnext_share"] == pytest.approx(all_batch.next_sentence_labels.mean())


def test_tf_written_damage_is_found(tf_written: Path, tmp_path: Path) -> None:
    src = tf_written / "tf_examples.tfrecord-00000"
    dst = tmp_path / "tf_examples.tfrecord-00000"
    data = bytearray(src.read_bytes())
    data[-30] ^= 0x02
    dst.write_bytes(bytes(data))
    result = CliRunner().invoke(verify_command, [str(dst), *_opts(tf_written)])
    assert result.exit_code == 1
    assert "record 29" in result.output and "payload CRC mismatch" in result.output
