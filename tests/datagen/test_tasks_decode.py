"""example_codec's batch decoder, driven by a task split's feature spec, equals the exact one-record decoder
and hands it every odd record."""

from __future__ import annotations

import numpy as np

from bert_datagen.datagen.example_codec import decode_batch, decode_exact
from bert_datagen.datagen.records import varint
from bert_datagen.datagen.tasks.config import TaskConfig
from bert_datagen.datagen.tasks.features import task_feature_spec
from tests.support.record_encoding import encode_payloads
from tests.support.taskdata_fixtures import build_file, minilm_tokenizer, task_file


def _entries(payload: bytes) -> bytes:
    """The map entries of a serialized Example (its Features message body)."""
    assert payload[0] == 0x0A
    pos, length, shift = 1, 0, 0
    while True:
        b = payload[pos]
        length |= (b & 0x7F) << shift
        pos += 1
        if b < 0x80:
            return payload[pos:pos + length]
        shift += 7


def _example(entries: bytes) -> bytes:
    return b"\x0a" + varint(len(entries)) + entries


def test_real_records_decode_as_written():
    for kind, split, rel, L in (("squad", "train", "squad11/dev-v1.1-part-b.json", 128),
                                ("conll", "dev", "wnut17/dev.conll", 32), ("glue/rte", "dev", "rte/dev.tsv", 64)):
        records, _ = build_file(TaskConfig(kind=kind, max_seq_length=L), split, task_file(rel), minilm_tokenizer())
        spec = task_feature_spec(TaskConfig(kind=kind).task_type, L, split == "train")
        payloads = encode_payloads(records.columns)
        batch, problems = decode_batch(payloads, list(range(len(payloads))), spec)
        columns = batch.features
        assert problems == [] and batch.index.tolist() == list(range(len(payloads)))
        for name, values in records.columns.items():
            assert np.array_equal(columns[name], values.reshape(len(values), -1)), (kind, name)
        for i in range(0, len(payloads), 97):
            exact = decode_exact(payloads[i], spec)
            assert all(np.array_equal(exact[k], columns[k][i]) for k in spec)


def test_odd_records_go_through_the_exact_decoder():
    L = 6
    spec = task_feature_spec("regression", L, False)
    good = {"input_ids": np.array([[7, 5, 300, 8, 0, 0]]), "input_mask": np.array([[1, 1, 1, 1, 0, 0]]),
            "segment_ids": np.zeros((1, L), np.int64), "label_ids": np.array([[2.5]], np.float32),
            "is_real_example": np.ones((1, 1), np.int64)}
    [canonical] = encode_payloads(good)
    # The same features with the map entries in reverse order: valid, not the canonical layout.
    singles = [_entries(encode_payloads({name: good[name]})[0]) for name in sorted(good)]
    reordered = _example(b"".join(reversed(singles)))
    missing = encode_payloads({k: v for k, v in good.items() if k != "label_ids"})[0]
    extra = encode_payloads({**good, "other": np.zeros((1, 1), np.int64)})[0]
    short = encode_payloads({**good, "input_mask": np.ones((1, L - 1), np.int64)})[0]
    as_int = encode_payloads({**good, "label_ids": np.array([[2]])})[0]
    payloads = [canonical, reordered, missing, extra, short, as_int, canonical[:-3]]
    batch, problems = decode_batch(payloads, list(range(len(payloads))), spec)
    columns = batch.features
    assert batch.index.tolist() == [0, 1]
    assert len(columns["input_ids"]) == 2 and np.array_equal(columns["input_ids"][1], good["input_ids"][0])
    assert columns["label_ids"][:, 0].tolist() == [2.5, 2.5]
    messages = dict(problems)
    assert set(messages) == {2, 3, 4, 5, 6}
    assert "feature label_ids is missing" in messages[2]
    assert "unexpected feature(s) other" in messages[3]
    assert "feature input_mask has 5 values, expected 6" in messages[4]
    assert "feature label_ids is int64, expected float32" in messages[5]
    assert "does not parse" in messages[6]


def test_names_one_byte_cannot_tell_apart_still_decode_exactly():
    # "ab", "ac", "bb": no single position separates all three, so one guess is wrong for some key and
    # those records must come out of the exact decoder with the right values.
    spec = {"ab": ("int64", 2), "ac": ("float32", 1), "bb": ("int64", 1)}
    rows = [{"ab": np.array([[i, 300 + i]]), "ac": np.array([[i / 2]], np.float32), "bb": np.array([[-i]])}
            for i in range(5)]
    payloads = [encode_payloads(r)[0] for r in rows]
    batch, problems = decode_batch(payloads, list(range(10, 15)), spec)
    assert problems == [] and batch.index.tolist() == list(range(10, 15))
    assert batch.features["ab"].tolist() == [[i, 300 + i] for i in range(5)]
    assert batch.features["ac"][:, 0].tolist() == [i / 2 for i in range(5)]
    assert batch.features["bb"][:, 0].tolist() == [-i for i in range(5)]


def test_one_shared_order_and_mixed_orders_decode_alike():
    # A writer may order the map entries its own way: a batch in one shared order (not the spec's)
    # takes the in-step walk, a batch mixing orders the general one; both give the exact values.
    L = 4
    spec = task_feature_spec("classification", L, False)
    rows = [{"input_ids": np.array([[2, 300 + i, 70000 * i, 3]]), "input_mask": np.array([[1, 1, 1, 0]]),
             "segment_ids": np.array([[0, 0, 1, 1]]), "label_ids": np.array([[i % 3]]),
             "is_real_example": np.ones((1, 1), np.int64)} for i in range(6)]

    def reordered(row: dict, names: list[str]) -> bytes:
        return _example(b"".join(_entries(encode_payloads({k: row[k]})[0]) for k in names))

    backwards = sorted(spec, reverse=True)
    shared = [reordered(r, backwards) for r in rows]
    mixed = [reordered(r, backwards if i % 2 else sorted(spec)) for i, r in enumerate(rows)]
    for payloads in (shared, mixed):
        batch, problems = decode_batch(payloads, list(range(6)), spec)
        assert problems == [] and batch.index.tolist() == list(range(6))
        for name in spec:
            assert batch.features[name].tolist() == [r[name][0].tolist() for r in rows], name


def test_entries_of_one_size_with_other_keys_are_told_apart():
    # Two features of the same size: a record that swaps them has its entries at the same places
    # with the same sizes, so only the key bytes tell them apart.
    spec = {"ab": ("int64", 2), "ac": ("int64", 2)}
    rows = [{"ab": np.array([[i, 1]]), "ac": np.array([[i, 2]])} for i in range(4)]

    def ordered(row: dict, names: list[str]) -> bytes:
        return _example(b"".join(_entries(encode_payloads({k: row[k]})[0]) for k in names))

    payloads = [ordered(r, ["ab", "ac"] if i != 2 else ["ac", "ab"]) for i, r in enumerate(rows)]
    batch, problems = decode_batch(payloads, list(range(4)), spec)
    assert problems == []
    assert batch.features["ab"].tolist() == [[i, 1] for i in range(4)]
    assert batch.features["ac"].tolist() == [[i, 2] for i in range(4)]
