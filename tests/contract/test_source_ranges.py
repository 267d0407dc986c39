"""`Source.fetch` places the records of any list of ranges with array operations (fine-tuning's
order asks for thousands of one-record ranges): every mix of shards, lengths, repeats, empty ranges
and orders reads exactly the records asked for, through the record indexes or without them, and
spans that touch are read as one request."""

from __future__ import annotations

import numpy as np
import pytest

from bert_datagen.contract.fs import DEFAULT_FS
from bert_datagen.contract.loading.source import coalesce, open_source
from tests.support.synthetic import write_synthetic_dataset

COUNTS = 3 * [60]


class _CountingFS:
    def __init__(self) -> None:
        self.requests: dict[str, int] = {}

    def read_ranges(self, path: str, ranges: list[tuple[int, int]]) -> list[bytes]:
        self.requests[path] = self.requests.get(path, 0) + len(ranges)
        return DEFAULT_FS.read_ranges(path, ranges)

    def __getattr__(self, name: str):
        return getattr(DEFAULT_FS, name)


@pytest.fixture(scope="module", params=[True, False], ids=["indexed", "walked"])
def dataset(request, tmp_path_factory) -> str:
    return write_synthetic_dataset(str(tmp_path_factory.mktemp("ds")), train_shards=len(COUNTS),
                                   records_per_shard=COUNTS[0], eval_records=0, indexed=request.param)


def _whole(source) -> dict[str, np.ndarray]:
    parts = [source.read(i, 0, n) for i, n in enumerate(source.counts)]
    return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}


def test_any_ranges_read_exactly_their_records(dataset):
    source = open_source(dataset)
    whole = _whole(source)
    firsts = np.concatenate([[0], np.cumsum(COUNTS)])
    rng = np.random.default_rng(0)
    for trial in range(20):
        ranges = []
        for _ in range(int(rng.integers(1, 40))):
            shard = int(rng.integers(0, len(COUNTS)))
            start = int(rng.integers(0, COUNTS[shard]))
            size = int(rng.choice([0, 1, 1, 1, 3, 17]))
            ranges.append((shard, start, min(start + size, COUNTS[shard])))
        if trial % 4 == 0:
            ranges += ranges[:3]  # records asked for twice
        rows = np.concatenate([firsts[s] + np.arange(a, b) for s, a, b in ranges]).astype(np.int64)
        got = open_source(dataset).read_ranges(ranges)
        for name, values in whole.items():
            assert got[name].tobytes() == values[rows].tobytes(), (trial, name)


def test_single_record_ranges_that_touch_are_one_request(dataset):
    fs = _CountingFS()
    source = open_source(dataset, fs=fs)
    ranges = [(1, i, i + 1) for i in range(40, 10, -1)] + [(2, i, i + 1) for i in (5, 6, 7)]
    got = source.read_ranges(ranges)
    assert len(got["input_ids"]) == len(ranges)
    shards = {s: sum(n for p, n in fs.requests.items() if p.endswith(source.shards[s].path)) for s in (1, 2)}
    assert shards == {1: 1, 2: 1}, fs.requests


def test_coalesce_joins_touching_spans_and_near_ones_within_an_eighth():
    assert coalesce([], 100) == []
    assert coalesce([(30, 40), (0, 10), (10, 20), (20, 30)], 0) == [(0, 40)]
    assert coalesce(np.array([[0, 80], [82, 100], [300, 310]]), 100) == [(0, 100), (300, 310)]
    assert coalesce([(0, 10), (15, 25)], 100) == [(0, 10), (15, 25)]  # 5 bytes between > 20 / 8
    assert coalesce([(0, 5), (5, 10), (10, 15), (15, 20), (22, 30)], 100) == [(0, 30)]  # runs count whole


def test_runs_of_index_lines_are_checked_at_once_with_each_runs_own_message():
    from bert_datagen.datagen.tfrecord_index import RecordIndexError, check_runs

    frames = np.array([20, 30, 25, 40, 20, 33, 21, 50], np.int64)
    offsets = np.concatenate([[0], np.cumsum(frames)[:-1]])
    size = int(frames.sum())
    runs = [(0, 2), (3, 3), (7, 1)]  # (first line, lines): lines 0-1, 3-5 and the last

    def lines(off: np.ndarray, length: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        pick = np.concatenate([np.arange(a, a + n) for a, n in runs])
        return off[pick].copy(), length[pick].copy()

    firsts, sizes = np.array([a for a, _ in runs]), np.array([n for _, n in runs])
    check_runs(*lines(offsets, frames), firsts, sizes, len(frames), size)  # sound: no error
    o, n = lines(offsets, frames)
    o[[2, 4]] += 3  # lines 3 and 5 (the two runs' ends no longer meet) -> the first is named
    with pytest.raises(RecordIndexError, match="line 3 does not end where the next record starts"):
        check_runs(o, n, firsts, sizes, len(frames), size)
    o, n = lines(offsets, frames)
    n[-1] += 1  # the last run ends past the shard
    with pytest.raises(RecordIndexError, match=f"the records end at byte {size + 1}, the shard has {size}"):
        check_runs(o, n, firsts, sizes, len(frames), size)
    o, n = lines(offsets, frames)
    o[:2] += 5
    with pytest.raises(RecordIndexError, match="the first record starts at byte 5"):
        check_runs(o, n, firsts, sizes, len(frames), size)
    o, n = lines(offsets, frames)
    n[1] = 2  # line 1: shorter than a frame's header and CRCs
    with pytest.raises(RecordIndexError, match="line 1 does not end"):
        check_runs(o, n, firsts, sizes, len(frames), size)


def test_close_ranges_of_a_local_file_are_one_read_cut(tmp_path, monkeypatch):
    data = bytes(range(256)) * 1024
    path = tmp_path / "f"
    path.write_bytes(data)
    reads = []
    real_open = DEFAULT_FS.local.open_read

    def counting_open(p):
        f = real_open(p)
        read = f.read
        f.read = lambda n=-1: reads.append(n) or read(n)
        return f

    monkeypatch.setattr(DEFAULT_FS.local, "open_read", counting_open)
    ranges = [(0, 10), (10, 20), (30, 40), (200_000, 200_001), (200_001, 200_100)]
    assert DEFAULT_FS.read_ranges(str(path), ranges) == [data[b:e] for b, e in ranges]
    assert reads == [40, 100]  # 30 bytes apart: one read; ~200 KB apart: another
    with pytest.raises(OSError, match=r"bytes \[200000, 262145\) lie past the end"):
        DEFAULT_FS.read_ranges(str(path), [(200_000, 200_010), (262_140, 262_145)])
