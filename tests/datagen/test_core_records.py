"""Record encoding without TensorFlow: wire format, framing, CRCs, decoding."""

from __future__ import annotations

import io
import struct

import numpy as np
import pytest

from bert_datagen.datagen import example_exact, record_layout, records, tfrecord
from tests.support.record_encoding import encode_batch


def _batch(n: int = 4, seq: int = 16, preds: int = 3, seed: int = 0) -> records.InstanceBatch:
    g = np.random.default_rng(seed)  # test data only; not part of any dataset
    return records.InstanceBatch(
        input_ids=g.integers(0, 3_000_000, (n, seq)),
        input_mask=g.integers(0, 2, (n, seq)),
        segment_ids=g.integers(0, 2, (n, seq)),
        masked_lm_positions=g.integers(0, seq, (n, preds)),
        masked_lm_ids=g.integers(0, 30522, (n, preds)),
        masked_lm_weights=g.random((n, preds)).astype(np.float32),
        next_sentence_labels=g.integers(0, 2, n),
    )


def test_encode_decode_round_trip() -> None:
    batch = _batch()
    for i, payload in enumerate(encode_batch(batch)):
        decoded = example_exact.decode_example(payload)
        assert list(decoded) == list(record_layout.FEATURE_ORDER)
        for name, expected in batch.row(i).items():
            assert np.array_equal(decoded[name], expected.astype(decoded[name].dtype)), name


def test_varints_match_reference_encoder() -> None:
    values = np.array([[0, 1, 127, 128, 300, 16383, 16384, 2**21, 2**35, 2**63 - 1]], dtype=np.uint64)
    (slots, keep), counts = records._varint_slots(values)
    expected = b"".join(records.varint(int(v)) for v in values[0])
    assert slots[keep].tobytes() == expected and counts.tolist() == [len(expected)]


def test_known_bytes_of_a_minimal_record() -> None:
    batch = records.InstanceBatch(
        input_ids=np.array([[101, 102]]), input_mask=np.array([[1, 1]]), segment_ids=np.array([[0, 0]]),
        masked_lm_positions=np.array([[0]]), masked_lm_ids=np.array([[0]]),
        masked_lm_weights=np.array([[0.0]], dtype=np.float32), next_sentence_labels=np.array([1]),
    )
    payload = encode_batch(batch)[0]
    # Sorted keys, packed int64 lists: the first entry is input_ids = [101, 102].
    first = b"\x0a\x09input_ids\x12\x06\x1a\x04\x0a\x02\x65\x66"
    # Example.features (field 1, 2-byte length), then the first map entry (field 1).
    assert payload[0] == 0x0A and payload[3:3 + 2 + len(first)] == b"\x0a" + bytes([len(first)]) + first
    assert payload.count(b"next_sentence_labels") == 1


def test_framing_and_crc_checks() -> None:
    payloads = encode_batch(_batch())
    data = tfrecord.frame_records(payloads)
    assert list(tfrecord.iter_tfrecords(io.BytesIO(data), "x")) == payloads
    # Known value of the masked CRC32C of empty data (TFRecord spec arithmetic).
    assert tfrecord.masked_crc32c(b"") == 0xA282EAD8
    corrupted = bytearray(data)
    corrupted[20] ^= 0xFF
    with pytest.raises(tfrecord.RecordError, match="shard.tfrecord: record 0 .* payload CRC"):
        list(tfrecord.iter_tfrecords(io.BytesIO(bytes(corrupted)), "shard.tfrecord"))
    with pytest.raises(tfrecord.RecordError, match="truncated"):
        list(tfrecord.iter_tfrecords(io.BytesIO(data[:-3]), "shard.tfrecord"))
    length = struct.unpack("<Q", data[:8])[0]
    assert length == len(payloads[0])


@pytest.mark.parametrize("block", [13, 64, 1 << 20])
def test_record_offsets_walk_the_headers_in_blocks(block: int) -> None:
    # Blocks smaller than a record, than a header, and larger than the file: the same offsets.
    payloads = encode_batch(_batch(n=9))
    data = tfrecord.frame_records(payloads)
    offsets = tfrecord.record_offsets(io.BytesIO(data).read, 9, "s", block)
    assert offsets.tolist() == np.cumsum([0] + [16 + len(p) for p in payloads]).tolist()
    assert tfrecord.record_offsets(io.BytesIO(b"").read, 0, "s", block).tolist() == [0]
    broken = bytearray(data)
    broken[int(offsets[4]) + 2] ^= 0x01  # record 4's length field: its header CRC no longer matches
    with pytest.raises(tfrecord.RecordError, match=f"s: record 4 at byte {offsets[4]}: length CRC mismatch"):
        tfrecord.record_offsets(io.BytesIO(bytes(broken)).read, 9, "s", block)
    with pytest.raises(tfrecord.RecordError, match="s: truncated at record 9"):
        tfrecord.record_offsets(io.BytesIO(data).read, 10, "s", block)


def test_frames_are_checked_against_an_index() -> None:
    payloads = encode_batch(_batch(n=5))
    data = tfrecord.frame_records(payloads)
    offsets = tfrecord.record_offsets(io.BytesIO(data).read, 5, "s")
    heads, lengths = offsets[:-1], np.diff(offsets) - 16
    assert tfrecord.check_frames_at(data, heads, lengths) == []
    flipped = bytearray(data)
    flipped[int(offsets[2]) + 20] ^= 0xFF  # a payload byte of record 2
    header = bytearray(data)
    header[int(offsets[3]) + 9] ^= 0xFF  # record 3's stored header CRC
    assert tfrecord.check_frames_at(bytes(flipped), heads, lengths) == [(2, "payload CRC mismatch")]
    assert tfrecord.check_frames_at(bytes(header), heads, lengths) == [(3, "length CRC mismatch")]
    # A sound frame of another length than the index says: the file changed since it was indexed.
    other = tfrecord.frame_records([payloads[0] + b"\x00"])
    assert tfrecord.check_frames_at(other, heads[:1], lengths[:1]) == [(0, "length differs from the shard's index")]


def test_feature_spec_matches_recipe() -> None:
    spec = record_layout.feature_spec(128, 20)
    assert spec["input_ids"] == ("int64", 128) and spec["masked_lm_weights"] == ("float32", 20)
    assert spec["next_sentence_labels"] == ("int64", 1)
    assert set(spec) == set(record_layout.FEATURE_ORDER)
