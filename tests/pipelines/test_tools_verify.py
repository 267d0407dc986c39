"""`bert-datagen verify`: a fresh dataset verifies; every kind of damage is found and named."""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

sys.path.insert(0, str(Path(__file__).resolve().parent.parent.parent))  # benchmarks/ holds the fixture writer

from benchmarks.bench_verify import CLS, MASK, SEP, fixture_instances, fixture_vocab, make_dataset  # noqa: E402
from bert_datagen.contract.dataset import open_dataset  # noqa: E402
from bert_datagen.datagen.example_codec import decode_batch  # noqa: E402
from bert_datagen.datagen.example_exact import _fields  # noqa: E402
from bert_datagen.datagen.tfrecord import frame_records  # noqa: E402
from bert_datagen.pipelines.beam.fsio import BEAM_FS  # noqa: E402
from bert_datagen.pipelines.tools.cli import verify_command  # noqa: E402
from bert_datagen.pipelines.tools.verify import verify  # noqa: E402
from tests.support.record_encoding import encode_batch  # noqa: E402

SEQ, PREDS = 64, 10
SHARD0 = "train/part-00000-of-00002.tfrecord"


@pytest.fixture(scope="module")
def pristine(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("pristine") / "ds"
    make_dataset(str(d), records=240, shards=2, eval_records=30, max_seq_length=SEQ, max_predictions=PREDS)
    return d


@pytest.fixture
def ds_dir(pristine: Path, tmp_path: Path) -> Path:
    """A fresh copy each test may damage."""
    out = tmp_path / "ds"
    for src in pristine.rglob("*"):
        if src.is_file():
            dst = out / src.relative_to(pristine)
            dst.parent.mkdir(parents=True, exist_ok=True)
            dst.write_bytes(src.read_bytes())
    return out


def _verify(d: Path, workers: int = 1):
    return verify(open_dataset(str(d), BEAM_FS), workers=workers)


def _problems(d: Path) -> str:
    report = _verify(d)
    assert not report.ok
    return "\n".join(report.problems)


def _manifest(d: Path) -> dict:
    return json.loads((d / "manifest.json").read_text())


def _save_manifest(d: Path, m: dict) -> None:
    (d / "manifest.json").write_text(json.dumps(m, indent=2, sort_keys=True) + "\n")


def test_fresh_dataset_verifies(pristine: Path) -> None:
    report = _verify(pristine)
    assert report.ok, report.problems
    assert report.records == 270
    assert [s.records for s in report.shards] == [120, 120, 30]


def test_cli_exit_codes_and_all_cores(ds_dir: Path) -> None:
    ok = CliRunner().invoke(verify_command, [str(ds_dir), "--workers", "2"])
    assert ok.exit_code == 0, ok.output
    assert ok.output.startswith("OK:") and "270 records" in ok.output
    (ds_dir / "train" / "part-99999-of-00002.tfrecord").write_bytes(b"")
    bad = CliRunner().invoke(verify_command, [str(ds_dir), "--workers", "2", "--json"])
    assert bad.exit_code == 1
    report = json.loads(bad.output)
    assert not report["ok"] and any("part-99999" in p for p in report["problems"])


def test_parallel_and_serial_reports_agree(ds_dir: Path) -> None:
    data = bytearray((ds_dir / SHARD0).read_bytes())
    data[500] ^= 0x01
    (ds_dir / SHARD0).write_bytes(bytes(data))
    assert _verify(ds_dir, workers=1).problems == _verify(ds_dir, workers=2).problems


def test_flipped_byte_is_found(ds_dir: Path) -> None:
    path = ds_dir / SHARD0
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x40
    path.write_bytes(bytes(data))
    text = _problems(ds_dir)
    assert f"{SHARD0}: record" in text and "CRC mismatch" in text
    assert f"{SHARD0}: sha256 is" in text


def test_flipped_byte_with_fixed_crc_is_found_by_the_record_checks(ds_dir: Path) -> None:
    """A change that keeps framing valid (CRCs recomputed) still fails: checksum and record index."""
    path = ds_dir / SHARD0
    batch, _ = fixture_instances(12345, 0, 120, SEQ, PREDS, len(fixture_vocab()))
    batch.next_sentence_labels[7] = 3
    path.write_bytes(frame_records(encode_batch(batch)))
    text = _problems(ds_dir)
    assert f"{SHARD0}: record 7: next_sentence_labels is 3" in text
    assert "sha256 is" in text


def test_truncated_shard_is_found(ds_dir: Path) -> None:
    path = ds_dir / SHARD0
    data = path.read_bytes()
    path.write_bytes(data[: len(data) - 100])
    text = _problems(ds_dir)
    assert "record 119" in text and "truncated" in text
    assert f"size is {len(data) - 100} bytes, manifest says {len(data)}" in text
    assert "holds 120 records, manifest says 120" not in text


def test_deleted_shard_is_found(ds_dir: Path) -> None:
    os.remove(ds_dir / SHARD0)
    assert f"{SHARD0}: shard is missing" in _problems(ds_dir)


def test_stray_shard_and_temp_file_are_found(ds_dir: Path) -> None:
    stray = ds_dir / "train" / "part-00002-of-00002.tfrecord"
    stray.write_bytes((ds_dir / SHARD0).read_bytes())
    (ds_dir / "eval" / ".tmp-0123-part-00000-of-00001.tfrecord").write_bytes(b"partial")
    text = _problems(ds_dir)
    assert "train/part-00002-of-00002.tfrecord: stray file not listed in the manifest" in text
    assert "leftover temp file of an interrupted write" in text


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda m: m["totals"].__setitem__("instances", 271), "totals.instances is 271 but the shards hold 270"),
        (lambda m: m["totals"].__setitem__("notnext_fraction", 0.9), "totals.notnext_fraction is 0.9"),
        (lambda m: m["totals"].__setitem__("masked_tokens", 1), "totals.masked_tokens is 1"),
        (lambda m: m["splits"]["train"].__setitem__("records", 1), "splits.train.records is 1 but its shards sum"),
        (lambda m: m["splits"]["train"]["shards"][0].__setitem__("records", 119),
         f"{SHARD0}: holds 120 records, manifest says 119"),
        (lambda m: m["splits"]["train"]["shards"][1].__setitem__("sha256", "0" * 64),
         "part-00001-of-00002.tfrecord: sha256 is"),
        (lambda m: m["config"].__setitem__("max_seq_length", 128), "disagree with features"),
        (lambda m: m["vocab"].__setitem__("sha256", "f" * 64), "vocab.txt: sha256 is"),
        (lambda m: m["vocab"].__setitem__("size", 30522), "manifest says vocab.size 30522"),
        (lambda m: m["splits"]["train"]["shards"].pop(), "part-00001-of-00002.tfrecord: stray file"),
    ],
)
def test_manifest_edits_are_found(ds_dir: Path, edit, message: str) -> None:
    m = _manifest(ds_dir)
    edit(m)
    _save_manifest(ds_dir, m)
    assert message in _problems(ds_dir)


def test_edited_vocab_is_found(ds_dir: Path) -> None:
    vocab = ds_dir / "vocab.txt"
    vocab.write_text(vocab.read_text().replace("kalo\n", "kallo\n", 1))
    assert "vocab.txt: sha256 is" in _problems(ds_dir)


def test_manifest_errors_name_file_and_field(ds_dir: Path) -> None:
    m = _manifest(ds_dir)
    del m["splits"]["train"]["shards"][0]["sha256"]
    _save_manifest(ds_dir, m)
    result = CliRunner().invoke(verify_command, [str(ds_dir)])
    assert result.exit_code != 0
    assert "manifest.json" in result.output and "splits.train.shards[0].sha256" in result.output
    os.remove(ds_dir / "manifest.json")
    result = CliRunner().invoke(verify_command, [str(ds_dir)])
    assert result.exit_code != 0 and "no manifest" in result.output


# ---------------------------------------------------------------- record invariants


def _rewrite(d: Path, batch) -> None:
    """Replace shard 0 with these records and fix the manifest, so only the records are wrong."""
    data = frame_records(encode_batch(batch))
    (d / SHARD0).write_bytes(data)
    m = _manifest(d)
    entry = m["splits"]["train"]["shards"][0]
    entry.update(bytes=len(data), sha256=hashlib.sha256(data).hexdigest(), records=len(batch))
    m["splits"]["train"]["bytes"] = sum(s["bytes"] for s in m["splits"]["train"]["shards"])
    _save_manifest(d, m)


def _first_masked(b, r: int) -> int:
    return int(b.masked_lm_positions[r, 0])


def _length(b, r: int) -> int:
    return int(b.input_mask[r].sum())


def _sep1(b, r: int) -> int:
    return int(np.nonzero(b.segment_ids[r])[0][0]) - 1


def _mask_position(b, r: int, pos: int) -> None:
    """Mask ``pos`` the way a buggy generator would (label = the token there), keeping order."""
    k = int(b.masked_lm_weights[r].sum())
    old = [int(p) for p in b.masked_lm_positions[r, :k] if p != pos][: k - 1]
    new = sorted(old + [pos])
    labels = [int(b.masked_lm_ids[r, old.index(p)]) if p in old else int(b.input_ids[r, p]) for p in new]
    b.input_ids[r, pos] = MASK
    b.masked_lm_positions[r, :k] = new
    b.masked_lm_ids[r, :k] = labels


def _drop_last_mask(b, r: int) -> None:
    """Unmask the last masked position cleanly (token restored): a record with one prediction too few."""
    k = int(b.masked_lm_weights[r].sum())
    pos = int(b.masked_lm_positions[r, k - 1])
    b.input_ids[r, pos] = b.masked_lm_ids[r, k - 1]
    b.masked_lm_positions[r, k - 1] = b.masked_lm_ids[r, k - 1] = 0
    b.masked_lm_weights[r, k - 1] = 0


MUTATIONS = {
    "id over vocab": (lambda b, r: b.input_ids[r].__setitem__(1, 10_000), "is not below the vocab size"),
    "mask not prefix": (lambda b, r: b.input_mask[r].__setitem__(SEQ - 1, 1), "input_mask is not 1s then 0s"),
    "padding id": (lambda b, r: b.input_ids[r].__setitem__(SEQ - 1, 5) if _length(b, r) < SEQ else None,
                   "padding position"),
    "no cls": (lambda b, r: b.input_ids[r].__setitem__(0, 20), "not [CLS] A [SEP] B [SEP]"),
    "extra sep": (lambda b, r: b.input_ids[r].__setitem__(_length(b, r) - 2, SEP)
                  if _length(b, r) - 2 not in b.masked_lm_positions[r] else None, "3 [SEP]"),
    "segment": (lambda b, r: b.segment_ids[r].__setitem__(1, 1), "segment_ids wrong at position 1"),
    "masked on sep": (lambda b, r: _mask_position(b, r, _sep1(b, r)), "is on [SEP]"),
    "masked on cls": (lambda b, r: b.masked_lm_positions[r].__setitem__(0, 0), "not strictly inside"),
    "unsorted": (lambda b, r: b.masked_lm_positions[r].__setitem__(slice(0, 2), b.masked_lm_positions[r, 1::-1].copy()),
                 "not strictly increasing"),
    "weights": (lambda b, r: b.masked_lm_weights[r].__setitem__(0, 0.5), "masked_lm_weights are not 1s then 0s"),
    "tail": (lambda b, r: b.masked_lm_positions[r].__setitem__(PREDS - 1, 3), "has weight 0 but is not 0"),
    "nsp": (lambda b, r: b.next_sentence_labels.__setitem__(r, 2), "next_sentence_labels is 2"),
    "masked count": (lambda b, r: _drop_last_mask(b, r), "the recipe gives"),
    "mask in text": (lambda b, r: b.input_ids[r].__setitem__(
        next(i for i in range(1, _length(b, r)) if i not in b.masked_lm_positions[r]
             and b.input_ids[r, i] not in (SEP, CLS)), MASK), f"special token id {MASK} inside the text"),
}


@pytest.mark.parametrize("name", sorted(MUTATIONS))
def test_broken_record_invariant_is_found(ds_dir: Path, name: str) -> None:
    mutate, message = MUTATIONS[name]
    batch, _ = fixture_instances(12345, 0, 120, SEQ, PREDS, len(fixture_vocab()))
    # Pick a record where the mutation applies (long enough, several masked positions, some padding).
    r = next(i for i in range(120) if 12 <= _length(batch, i) < SEQ - 1 and batch.masked_lm_weights[i, 2] == 1
             and batch.masked_lm_weights[i, -1] == 0 and _sep1(batch, i) > 2)
    mutate(batch, r)
    _rewrite(ds_dir, batch)
    text = _problems(ds_dir)
    assert f"{SHARD0}: record {r}: " in text
    assert message in text, text


def test_unparseable_and_misshapen_records_are_named(ds_dir: Path) -> None:
    good, _ = fixture_instances(12345, 0, 4, SEQ, PREDS, len(fixture_vocab()))
    short, _ = fixture_instances(12345, 0, 1, 32, PREDS, len(fixture_vocab()))
    payloads = encode_batch(good)
    payloads[1] = b"\x0a\xff\xff"  # a length-delimited field running past the end
    payloads[2] = encode_batch(short)[0]
    data = frame_records(payloads)
    (ds_dir / SHARD0).write_bytes(data)
    text = _problems(ds_dir)
    assert f"{SHARD0}: record 1: does not parse" in text
    assert f"{SHARD0}: record 2: feature input_ids has 32 values, expected {SEQ}" in text
    assert "record 0:" not in text and "record 3:" not in text


def test_problem_list_is_bounded_but_counted(ds_dir: Path) -> None:
    batch, _ = fixture_instances(12345, 0, 120, SEQ, PREDS, len(fixture_vocab()))
    batch.next_sentence_labels[:] = 5
    _rewrite(ds_dir, batch)
    report = _verify(ds_dir)
    assert report.problem_count >= 120
    assert any("and 100 more problems" in p for p in report.problems), report.problems[-3:]


# ---------------------------------------------------------------- the vectorized parser


def _entries(payload: bytes) -> list[bytes]:
    (_, _, features), = list(_fields(payload))
    return [e for _, _, e in _fields(features)]


def _ld(field: int, body: bytes) -> bytes:
    n, out = len(body), bytearray([(field << 3) | 2])
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out) + body


def test_parser_accepts_any_map_order_and_matches_the_exact_decoder() -> None:
    from bert_datagen.datagen.example_exact import decode_example

    batch, _ = fixture_instances(99, 0, 50, SEQ, PREDS, len(fixture_vocab()))
    payloads = encode_batch(batch)
    # Protobuf writers without deterministic serialization emit map entries in any order.
    shuffled = [_ld(1, b"".join(_ld(1, e) for e in reversed(_entries(p)))) if i % 2 else p
                for i, p in enumerate(payloads)]
    assert shuffled[1] != payloads[1]
    from bert_datagen.datagen.record_rules import RecordShape

    shape = RecordShape(SEQ, PREDS, len(fixture_vocab()), CLS, SEP, MASK, 0, 6)
    decoded, problems = decode_batch(shuffled, list(range(50)), shape)
    assert problems == [] and len(decoded) == 50
    for i in range(50):
        exact = decode_example(shuffled[i])
        for name, values in exact.items():
            np.testing.assert_array_equal(decoded.features[name][i], values)


def test_checksums_only_skips_record_checks_but_not_hashes(ds_dir: Path) -> None:
    batch, _ = fixture_instances(12345, 0, 120, SEQ, PREDS, len(fixture_vocab()))
    batch.next_sentence_labels[3] = 4
    _rewrite(ds_dir, batch)
    quick = CliRunner().invoke(verify_command, [str(ds_dir), "--checksums-only"])
    assert quick.exit_code == 0 and "records not parsed" in quick.output
    full = CliRunner().invoke(verify_command, [str(ds_dir)])
    assert full.exit_code == 1 and "record 3: next_sentence_labels is 4" in full.output
    (ds_dir / SHARD0).write_bytes((ds_dir / SHARD0).read_bytes()[:-1])
    quick = CliRunner().invoke(verify_command, [str(ds_dir), "--checksums-only"])
    assert quick.exit_code == 1 and "truncated" in quick.output


# ---------------------------------------------------------------- framing


def _frames(data: bytes, chunk: int):
    import tempfile

    from bert_datagen.datagen.tfrecord import ShardStream

    with tempfile.NamedTemporaryFile(suffix=".tfrecord", delete=False) as f:
        f.write(data)
    stream = ShardStream(f.name, "s.tfrecord", chunk_bytes=chunk)
    got = [(i, p) for raw in stream.raw_batches() for i, p in zip(raw.indices, raw.payloads(), strict=True)]
    os.remove(f.name)
    return stream, got


@pytest.mark.parametrize("chunk", [7, 100, 1 << 20])
def test_framing_across_chunk_boundaries_matches_the_reference_reader(chunk: int) -> None:
    import io

    from bert_datagen.datagen.tfrecord import iter_tfrecords

    payloads = [bytes([i % 251]) * (i * 37 % 300) for i in range(60)]  # includes empty payloads
    data = frame_records(payloads)
    stream, got = _frames(data, chunk)
    assert [p for _, p in got] == list(iter_tfrecords(io.BytesIO(data))) == payloads
    assert [i for i, _ in got] == list(range(60))
    assert stream.records == 60 and stream.bytes == len(data) and not stream.problems
    assert stream.hexdigest() == hashlib.sha256(data).hexdigest()


@pytest.mark.parametrize("chunk", [50, 1 << 20])
def test_corrupt_length_header_stops_framing_and_names_the_record(chunk: int) -> None:
    payloads = [b"x" * 40] * 10
    data = bytearray(frame_records(payloads))
    data[56 * 6 + 1] ^= 0x01  # length field of record 6
    stream, got = _frames(bytes(data), chunk)
    assert [i for i, _ in got] == [0, 1, 2, 3, 4, 5]
    assert stream.problems == [(6, "record 6 at byte 336: corrupt length header (CRC mismatch); the rest of "
                                   "the shard cannot be framed")]
    assert stream.bytes == len(data)  # still hashed to the end


def test_huge_corrupt_length_does_not_wait_for_the_data() -> None:
    data = bytearray(frame_records([b"y" * 30] * 3))
    data[46 + 7] = 0x7F  # record 1's length becomes ~2**62
    stream, got = _frames(bytes(data), 16)
    assert [i for i, _ in got] == [0]
    assert stream.problems and "record 1 at byte 46: corrupt length header" in stream.problems[0][1]


def test_vectorized_crc32c_matches_google_crc32c() -> None:
    import google_crc32c

    from bert_datagen.datagen.tfrecord import crc32c_rows

    rows = np.random.default_rng(0).integers(0, 256, size=(500, 8), dtype=np.uint8)
    expected = [google_crc32c.value(bytes(r)) for r in rows]
    assert crc32c_rows(rows).tolist() == expected


def test_spawned_workers_give_the_same_report(ds_dir: Path, monkeypatch) -> None:
    """Remote datasets use 'spawn' pools: tasks and results must survive pickling into fresh processes."""
    import bert_datagen.pipelines.tools.shards as shards

    data = bytearray((ds_dir / SHARD0).read_bytes())
    data[700] ^= 0x04
    (ds_dir / SHARD0).write_bytes(bytes(data))
    forked = _verify(ds_dir, workers=2)
    monkeypatch.setattr(shards, "pool_start_method", lambda tasks: "spawn")
    spawned = _verify(ds_dir, workers=2)
    assert spawned.problems == forked.problems and spawned.problem_count == forked.problem_count > 0


def test_unusual_but_valid_encodings_take_the_exact_path() -> None:
    """Value-before-key map entries and unpacked int lists are valid protobuf: same values, no problem."""
    from bert_datagen.datagen.example_exact import decode_example
    from bert_datagen.datagen.record_rules import RecordShape

    batch, _ = fixture_instances(7, 0, 6, SEQ, PREDS, len(fixture_vocab()))
    payloads = encode_batch(batch)
    rewritten = []
    for i, p in enumerate(payloads):
        entries = []
        for e in _entries(p):
            (_, _, key), (_, _, value) = list(_fields(e))
            if key == b"next_sentence_labels" and i % 2:
                label = int(batch.next_sentence_labels[i])
                value = _ld(3, bytes([0x08, label]))  # int64_list with its one value unpacked
            entries.append(_ld(2, value) + _ld(1, key) if i % 3 == 0 else _ld(1, key) + _ld(2, value))
        rewritten.append(_ld(1, b"".join(_ld(1, e) for e in entries)))
    assert rewritten != payloads
    shape = RecordShape(SEQ, PREDS, len(fixture_vocab()), CLS, SEP, MASK, 0, 6)
    decoded, problems = decode_batch(rewritten, list(range(6)), shape)
    assert problems == [] and len(decoded) == 6
    for i in range(6):
        for name, values in decode_example(rewritten[i]).items():
            np.testing.assert_array_equal(decoded.features[name][i], values)
        assert decoded.features["next_sentence_labels"][i, 0] == batch.next_sentence_labels[i]


def test_verify_in_a_terminal_ends_quietly_and_never_hangs(tmp_path: Path) -> None:
    """The CLI's SIGINT/SIGTERM handlers were inherited by the forked pool workers: the pool's
    terminate() at the end then printed "Process ForkPoolWorker-N:" (4 runs in 6), or left a worker
    stuck on a lock and the command waiting forever. Real processes, as a user starts them; several
    at once, many workers each, so that a bad ending shows."""
    import subprocess

    ds = tmp_path / "ds"
    make_dataset(str(ds), records=64, shards=8, max_seq_length=SEQ, max_predictions=PREDS)
    env = {k: v for k, v in os.environ.items() if k != "BERT_DATAGEN_DEBUG"}
    procs = [subprocess.Popen([sys.executable, "-m", "bert_datagen.pipelines.cli", "verify", str(ds), "--workers", "8"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
             for _ in range(3)]
    try:
        ended = [p.communicate(timeout=30) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(timeout=30)
    for p, (out, err) in zip(procs, ended, strict=True):
        assert p.returncode == 0 and out.startswith("OK:"), (out, err)
        assert err == "", err
