"""`inspect`, `stats`, `diff`, the manifest and the dataset card."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

sys.path.insert(0, str(Path(__file__).resolve().parent.parent.parent))  # benchmarks/ holds the fixture writer

from benchmarks.bench_verify import MASK, fixture_instances, fixture_vocab, make_dataset  # noqa: E402
from bert_datagen.contract.fs import LOCAL_FS  # noqa: E402
from bert_datagen.contract.manifest import ManifestError, build_manifest, load_manifest, write_manifest  # noqa: E402
from bert_datagen.datagen.tfrecord import frame_records  # noqa: E402
from bert_datagen.pipelines.tools.card import render_card  # noqa: E402
from bert_datagen.pipelines.tools.cli import diff_command, inspect_command, stats_command, verify_command  # noqa: E402
from tests.support.record_encoding import encode_batch  # noqa: E402

SEQ, PREDS = 64, 10
VOCAB = fixture_vocab()


@pytest.fixture(scope="module")
def datasets(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("sets")
    out = {}
    for name, seed in (("a", 12345), ("a2", 12345), ("b", 777)):
        out[name] = root / name
        make_dataset(str(out[name]), seed=seed, records=160, shards=2, eval_records=20,
                     max_seq_length=SEQ, max_predictions=PREDS)
    return out


def _run(cmd, args: list[str]):
    return CliRunner().invoke(cmd, [str(a) for a in args])


# ---------------------------------------------------------------- inspect


def _unmark(line: str) -> list[str]:
    """Tokens of an inspect A:/B: line with every masked position replaced by its label."""
    text = re.sub(r"\{(?:MASK|kept|random \S+):(\S+?)\}", r"\1", line)
    return text.split()


def test_inspect_text_round_trips_to_the_original_tokens(datasets) -> None:
    # Shard 1 of train starts at record 80 of the fixture; show records 80+5 .. 80+9.
    result = _run(inspect_command, [datasets["a"], "--split", "train", "--shard", 1, "--index", 5, "-n", 5])
    assert result.exit_code == 0, result.output
    batch, original = fixture_instances(12345, 85, 5, SEQ, PREDS, len(VOCAB))
    blocks = result.output.strip().split("\n\n")
    assert len(blocks) == 5
    for r, block in enumerate(blocks):
        head, a_line, b_line, masked_line = block.split("\n")
        length = int(batch.input_mask[r].sum())
        sep1 = int(np.nonzero(batch.segment_ids[r])[0][0]) - 1
        tokens = [VOCAB[i] for i in original[r, :length]]
        assert head.startswith(f"train/part-00001-of-00002.tfrecord record {5 + r}: {length} tokens")
        nsp = int(batch.next_sentence_labels[r])
        assert f"NSP label {nsp} = {'NotNext' if nsp else 'IsNext'}" in head
        assert _unmark(a_line[len("  A: "):]) == tokens[1:sep1]
        assert _unmark(b_line[len("  B: "):]) == tokens[sep1 + 1:length - 1]
        # Unmasked positions are shown verbatim; each masked one with its kind.
        k = int(batch.masked_lm_weights[r].sum())
        assert masked_line.count("->") == k
        for j in range(k):
            pos = int(batch.masked_lm_positions[r, j])
            shown = int(batch.input_ids[r, pos])
            kind = "[MASK]" if shown == MASK else ("kept" if shown == original[r, pos] else "random")
            assert f"{pos} {kind}" in masked_line


def test_inspect_json_marks_kinds_and_defaults_to_train(datasets) -> None:
    result = _run(inspect_command, [datasets["a"], "-n", 3, "--json"])
    assert result.exit_code == 0, result.output
    views = [json.loads(line) for line in result.output.splitlines()]
    batch, original = fixture_instances(12345, 0, 3, SEQ, PREDS, len(VOCAB))
    for r, v in enumerate(views):
        assert v["shard"] == "train/part-00000-of-00002.tfrecord" and v["index"] == r
        assert [t["token"] for t in v["tokens"]] == [VOCAB[i] for i in original[r, :v["length"]]]
        for m in v["masked"]:
            shown = VOCAB[batch.input_ids[r, m["position"]]]
            assert m["shown"] == shown and m["label"] == VOCAB[original[r, m["position"]]]
            assert m["kind"] == ("mask" if shown == "[MASK]" else "kept" if shown == m["label"] else "random")


def test_inspect_bad_arguments_are_clear(datasets) -> None:
    result = _run(inspect_command, [datasets["a"], "--split", "dev"])
    assert result.exit_code != 0 and "no shards in split 'dev'" in result.output
    result = _run(inspect_command, [datasets["a"], "--shard", 7])
    assert result.exit_code != 0 and "--shard 7 is out of range" in result.output
    result = _run(inspect_command, [datasets["a"], "--index", 5000])
    assert result.exit_code != 0 and "no record at index 5000" in result.output


# ---------------------------------------------------------------- stats


def test_stats_match_the_records(datasets) -> None:
    result = _run(stats_command, [datasets["a"], "--json", "--split", "train"])
    assert result.exit_code == 0, result.output
    st = json.loads(result.output)
    batch, original = fixture_instances(12345, 0, 160, SEQ, PREDS, len(VOCAB))
    length = batch.input_mask.sum(axis=1)
    assert st["records"] == 160 and st["shards"] == 2
    assert st["seq_length"]["mean"] == pytest.approx(length.mean(), abs=1e-3)
    assert st["seq_length"]["histogram"] == np.bincount(length, minlength=SEQ + 1).tolist()
    assert st["masked_count"]["mean"] == pytest.approx(batch.masked_lm_weights.sum(1).mean(), abs=1e-3)
    assert st["notnext_share"] == pytest.approx(batch.next_sentence_labels.mean(), abs=1e-6)
    assert st["padding_share"] == pytest.approx(1 - length.sum() / (160 * SEQ), abs=1e-6)
    sep1 = np.argmax(batch.segment_ids, axis=1) - 1
    assert st["a_length"]["mean"] == pytest.approx((sep1 - 1).mean(), abs=1e-3)
    assert st["b_length"]["mean"] == pytest.approx((length - sep1 - 2).mean(), abs=1e-3)
    assert st["unk_rate"] == 0.0
    text = [t for r in range(160) for t in original[r, 1:length[r] - 1].tolist() if t != 8]
    counts = np.bincount(text, minlength=len(VOCAB))
    top = st["top_tokens"][0]
    assert top["count"] == counts.max() and counts[top["id"]] == counts.max()
    assert sum(st["mask_kinds"].values()) == pytest.approx(1.0)


def test_stats_table_and_plot(datasets, tmp_path: Path) -> None:
    png = tmp_path / "h.png"
    result = _run(stats_command, [datasets["a"], "--plot", png, "--workers", 2])
    assert result.exit_code == 0, result.output
    for label in ("sequence length", "A length", "B length", "masked tokens", "NotNext share", "padding share",
                  "[UNK] rate", "most frequent tokens"):
        assert label in result.output
    assert "180 records in 3 shards" in result.output
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_stats_counts_unk(tmp_path: Path) -> None:
    d = tmp_path / "u"
    make_dataset(str(d), records=20, shards=1, max_seq_length=SEQ, max_predictions=PREDS)
    batch, _ = fixture_instances(12345, 0, 20, SEQ, PREDS, len(VOCAB))
    unk = VOCAB.index("[UNK]")
    batch.input_ids[0, 1] = unk
    batch.masked_lm_ids[0][batch.masked_lm_positions[0] == 1] = unk
    shard = d / "train" / "part-00000-of-00001.tfrecord"
    shard.write_bytes(frame_records(encode_batch(batch)))
    st = json.loads(_run(stats_command, [d, "--json"]).output)
    length = batch.input_mask.sum(1)
    assert st["unk_rate"] == pytest.approx(1 / int((length - 3).sum()), rel=1e-3)


# ---------------------------------------------------------------- diff


def test_diff_same_seed_is_identical(datasets) -> None:
    result = _run(diff_command, [datasets["a"], datasets["a2"]])
    assert result.exit_code == 0, result.output
    assert result.output.startswith("identical")


def test_diff_other_seed_names_fields_shards_and_first_record(datasets) -> None:
    result = _run(diff_command, [datasets["a"], datasets["b"]])
    assert result.exit_code == 1, result.output
    out = result.output
    assert "config.random_seed: 12345 -> 777" in out
    assert "train/part-00000-of-00002.tfrecord: sha256" in out
    assert "first differing record: split train, record 0 of the split" in out
    batch_a, orig_a = fixture_instances(12345, 0, 1, SEQ, PREDS, len(VOCAB))
    batch_b, orig_b = fixture_instances(777, 0, 1, SEQ, PREDS, len(VOCAB))
    row1 = next(line for line in out.splitlines() if re.match(r"\s+1\s+0", line))
    assert VOCAB[orig_a[0, 1]] in row1 or "{" in row1
    assert VOCAB[orig_b[0, 1]] in row1 or "{" in row1


def test_diff_finds_one_changed_record_across_shards(datasets, tmp_path: Path) -> None:
    d = tmp_path / "c"
    make_dataset(str(d), records=160, shards=2, eval_records=20, max_seq_length=SEQ, max_predictions=PREDS)
    batch, _ = fixture_instances(12345, 80, 80, SEQ, PREDS, len(VOCAB))
    batch.next_sentence_labels[13] = 1 - batch.next_sentence_labels[13]
    m = load_manifest(str(d), LOCAL_FS)
    data = frame_records(encode_batch(batch))
    (d / "train" / "part-00001-of-00002.tfrecord").write_bytes(data)
    import hashlib

    m["splits"]["train"]["shards"][1]["sha256"] = hashlib.sha256(data).hexdigest()
    write_manifest(str(d), m, LOCAL_FS)
    result = _run(diff_command, [datasets["a"], d])
    assert result.exit_code == 1
    assert "record 93 of the split" in result.output
    assert "A train/part-00001-of-00002.tfrecord record 13" in result.output
    assert "train/part-00000-of-00002.tfrecord" not in result.output.split("first differing")[0]


# ---------------------------------------------------------------- manifest and card


def _minimal(**over) -> dict:
    from bert_datagen.datagen.config import DatagenConfig
    from bert_datagen.datagen.record_layout import feature_spec

    kw = dict(config=DatagenConfig().to_dict(), vocab={"path": "vocab.txt", "sha256": "ab", "size": 10},
              input_info={"patterns": ["x"], "files": 1, "bytes": 3, "fingerprint": "f"},
              features=feature_spec(128, 20),
              splits={"train": {"shards": [{"path": "train/part-00000-of-00001.tfrecord", "records": 3,
                                            "bytes": 100, "sha256": "cc"}]}},
              totals={"instances": 3})
    kw.update(over)
    return build_manifest(**kw)


def test_manifest_round_trip_and_canonical_bytes(tmp_path: Path) -> None:
    m = _minimal()
    assert m["splits"]["train"]["records"] == 3 and m["splits"]["train"]["bytes"] == 100
    assert m["seed"] == 12345 and m["tool"]["name"] == "bert-datagen"
    path = write_manifest(str(tmp_path), m, LOCAL_FS)
    raw = Path(path).read_text()
    assert raw.endswith("}\n") and raw == json.dumps(m, sort_keys=True, indent=2, ensure_ascii=False) + "\n"
    assert load_manifest(str(tmp_path), LOCAL_FS) == json.loads(raw)
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".tmp-")]


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda m: m.__setitem__("schema", "other/thing"), "field schema is 'other/thing'"),
        (lambda m: m.__setitem__("schema_version", 2), "schema_version 2 is newer than this tool knows"),
        (lambda m: m.pop("totals"), "missing field totals"),
        (lambda m: m["vocab"].pop("sha256"), "missing field vocab.sha256"),
        (lambda m: m["features"].__setitem__("input_ids", ["int64"]), "field features.input_ids must be"),
        (lambda m: m["splits"]["train"]["shards"][0].__setitem__("records", -1),
         "splits.train.shards[0].records must be a non-negative integer"),
        (lambda m: m["splits"]["train"]["shards"][0].__setitem__("path", "../x"), "must be a relative"),
    ],
)
def test_load_manifest_rejects_with_file_and_field(tmp_path: Path, edit, message: str) -> None:
    m = _minimal()
    edit(m)
    (tmp_path / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(ManifestError) as e:
        load_manifest(str(tmp_path), LOCAL_FS)
    assert str(tmp_path / "manifest.json") in str(e.value) and message in str(e.value)


def test_load_manifest_missing_or_not_json(tmp_path: Path) -> None:
    with pytest.raises(ManifestError, match="no manifest"):
        load_manifest(str(tmp_path), LOCAL_FS)
    (tmp_path / "manifest.json").write_text("{not json")
    with pytest.raises(ManifestError, match="not valid JSON"):
        load_manifest(str(tmp_path), LOCAL_FS)


def test_card_lists_provenance_counts_checksums_and_commands(datasets) -> None:
    d = datasets["a"]
    card = (d / "README.md").read_text()
    m = load_manifest(str(d), LOCAL_FS)
    assert card == render_card(str(d), m)
    assert f"bert-datagen verify {d}" in card and f"bert-train pretrain --data {d}" in card
    assert m["vocab"]["sha256"] in card and "Seed: `12345`" in card
    for split in m["splits"].values():
        for s in split["shards"]:
            assert f"| `{s['path']}` | {s['records']} | {s['bytes']} | `{s['sha256']}` |" in card
    assert "| train | 2 | 160 |" in card and "| eval | 1 | 20 |" in card
    assert "| max_seq_length | `64` |" in card


def test_card_is_written_before_the_manifest(datasets) -> None:
    d = datasets["a"]
    assert (d / "README.md").stat().st_mtime_ns <= (d / "manifest.json").stat().st_mtime_ns


def test_verify_accepts_all_fixture_datasets(datasets) -> None:
    for d in datasets.values():
        assert _run(verify_command, [d]).exit_code == 0


def test_diff_ignores_how_and_where_but_not_what(datasets, tmp_path: Path) -> None:
    import shutil

    d = tmp_path / "moved"
    shutil.copytree(datasets["a"], d)
    m = load_manifest(str(d), LOCAL_FS)
    m["created_by"] = {"runner": "DataflowRunner"}
    m["tool"]["version"] = "9.9.9"
    m["input"]["patterns"] = ["gs://other/place/*.txt"]
    write_manifest(str(d), m, LOCAL_FS)
    result = _run(diff_command, [datasets["a"], d])
    assert result.exit_code == 0, result.output
    assert "(informational) tool.version: '0.1.0' -> '9.9.9'" in result.output
    m["input"]["fingerprint"] = "0" * 64
    write_manifest(str(d), m, LOCAL_FS)
    result = _run(diff_command, [datasets["a"], d])
    assert result.exit_code == 1 and "input.fingerprint" in result.output


def test_inspect_of_a_damaged_record_exits_non_zero(datasets, tmp_path: Path) -> None:
    import shutil

    d = tmp_path / "dmg"
    shutil.copytree(datasets["a"], d)
    shard = d / "train" / "part-00000-of-00002.tfrecord"
    data = bytearray(shard.read_bytes())
    data[100] ^= 0xFF
    shard.write_bytes(bytes(data))
    result = CliRunner().invoke(inspect_command, [str(d), "-n", "2"])
    assert result.exit_code == 1
    assert "record 0 at byte 0: payload CRC mismatch" in result.output
    assert "record 1: " in result.output  # the readable record is still shown


def test_inspect_words_joins_pieces(datasets) -> None:
    result = _run(inspect_command, [datasets["a"], "-n", 20, "--words"])
    assert result.exit_code == 0, result.output
    batch, original = fixture_instances(12345, 0, 20, SEQ, PREDS, len(VOCAB))
    joined_any = False
    for r, block in enumerate(result.output.strip().split("\n\n")):
        a_line = block.split("\n")[1][len("  A: "):]
        sep1 = int(np.nonzero(batch.segment_ids[r])[0][0]) - 1
        expected: list[str] = []
        for tok in (VOCAB[i] for i in original[r, 1:sep1]):
            if tok.startswith("##") and expected:
                expected[-1] += tok[2:]
                joined_any = True
            else:
                expected.append(tok)
        assert [w.replace("##", "") for w in _unmark(a_line)] == [w.replace("##", "") for w in expected]
    assert joined_any


def test_inspect_words_with_json_is_refused(datasets) -> None:
    result = _run(inspect_command, [datasets["a"], "--words", "--json"])
    assert result.exit_code == 2 and "--words does not apply here: --json shows" in result.output, result.output
