"""Record indexes (issue #30 points 3-5): `run` writes one per shard, listed with its sha256 in the
manifest, in the format of NVIDIA DALI and the `tfrecord` package; `verify` checks it against the
shard; the loaders read through it (only the bytes of their own records, no walk of the shards) and
still load datasets without one; the `tfrecord` package reads our shards with it; and a dataset
replaced under an open loader is an error at its next window, never a mix of two datasets."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from bert_datagen.contract.fs import DEFAULT_FS
from bert_datagen.contract.loading.batches import NumpyBatches
from bert_datagen.contract.loading.source import LoadError, open_source
from bert_datagen.pipelines.cli import main
from tests.support.pipeline_corpus import make_documents, manifest_of, write_text_files, write_vocab

B, BS = 8, 4  # a window: 32 records, 4 batches


def _cli(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, list(args))
    if result.exception and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result.exit_code, result.output


def _run(corpus: Path, out: Path, *extra: str) -> None:
    code, output = _cli("run", "--input", str(corpus / "in" / "*.txt"), "--vocab", str(corpus / "vocab.txt"),
                        "--output", str(out), "--dupe-factor", "2", "--max-seq-length", "32",
                        "--max-predictions-per-seq", "5", "--notnext-pool-size", "20", "--num-shards", "3",
                        "--quiet", *extra)
    assert code == 0, output


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("corpus")
    write_text_files(root / "in", make_documents(60, seed=3), n_files=3)
    write_vocab(root / "vocab.txt")
    return root


@pytest.fixture(scope="module")
def dataset(corpus, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("ds") / "out"
    _run(corpus, out)
    return out


def _frames(data: bytes) -> list[tuple[int, int]]:
    """(offset, frame length) of every record: the walk DALI's and the tfrecord package's
    tfrecord2idx make (written here independently of ours)."""
    out, pos = [], 0
    while pos < len(data):
        (n,) = struct.unpack_from("<Q", data, pos)
        out.append((pos, 16 + n))
        pos += 16 + n
    return out


def _shards(out: Path) -> list[dict]:
    return [s for split in manifest_of(out)["splits"].values() for s in split["shards"]]


def test_run_writes_an_index_per_shard_in_dali_format_listed_in_the_manifest(dataset) -> None:
    for shard in _shards(dataset):
        data = (dataset / shard["path"]).read_bytes()
        index = (dataset / shard["index"]["path"]).read_bytes()
        assert shard["index"]["path"] == shard["path"] + ".index"
        assert shard["index"]["bytes"] == len(index)
        assert shard["index"]["sha256"] == hashlib.sha256(index).hexdigest()
        lines = index.decode().splitlines(keepends=True)
        assert len({len(line) for line in lines}) == 1  # one width: line i at byte i * width
        assert [tuple(int(v) for v in line.split()) for line in lines] == _frames(data)
    code, output = _cli("verify", str(dataset))
    assert code == 0 and output.startswith("OK:"), output


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def _relist(out: Path, shard: int, index: bytes) -> None:
    """Replace shard ``shard``'s index and its manifest entry (so only a check of the shard sees it)."""
    manifest = manifest_of(out)
    entry = [s for split in manifest["splits"].values() for s in split["shards"]][shard]
    (out / entry["index"]["path"]).write_bytes(index)
    entry["index"].update(bytes=len(index), sha256=hashlib.sha256(index).hexdigest())
    (out / "manifest.json").write_text(json.dumps(manifest, sort_keys=True, indent=2) + "\n")


def test_verify_names_block_digests_that_do_not_describe_the_index(dataset, tmp_path) -> None:
    out = _copy(dataset, tmp_path / "ds")
    code, output = _cli("verify", str(out))
    assert code == 0, output
    blocks = _shards(out)[0]["index"]["blocks"]
    path = out / blocks["path"]
    digests = path.read_bytes()
    path.write_bytes(bytes([digests[0] ^ 1]) + digests[1:])
    code, output = _cli("verify", str(out))
    assert code == 1 and f"index block digests {blocks['path']}: size or sha256 differs from the manifest" in output
    manifest = manifest_of(out)
    for shard in (s for split in manifest["splits"].values() for s in split["shards"]):
        if shard["index"]["blocks"]["path"] == blocks["path"]:
            shard["index"]["blocks"]["sha256"] = hashlib.sha256(path.read_bytes()).hexdigest()
    (out / "manifest.json").write_text(json.dumps(manifest, sort_keys=True, indent=2) + "\n")
    code, output = _cli("verify", str(out))
    assert code == 1 and f"index block digests {blocks['path']}: do not match the index's blocks of 64 lines" in output
    path.unlink()
    code, output = _cli("verify", str(out))
    assert code == 1 and f"index block digests {blocks['path']} are missing" in output


def test_verify_names_an_index_that_does_not_describe_its_shard(dataset, tmp_path) -> None:
    out = _copy(dataset, tmp_path / "ds")
    shard = _shards(out)[0]
    index = (out / shard["index"]["path"]).read_bytes()
    last = index[-2] - ord("0")
    _relist(out, 0, index[:-2] + str((last + 1) % 10).encode() + b"\n")  # the last length, wrong
    code, output = _cli("verify", str(out))
    assert code == 1 and f"index {shard['index']['path']}: does not describe the shard's records" in output
    (out / shard["index"]["path"]).write_bytes(index)  # listed size and sha256 no longer match
    code, output = _cli("verify", str(out))
    assert code == 1 and f"index {shard['index']['path']}: size or sha256 differs from the manifest" in output
    (out / shard["index"]["path"]).unlink()
    code, output = _cli("verify", str(out))
    assert code == 1 and f"index {shard['index']['path']} is missing" in output


class CountingFS:
    """The loaders' filesystem, counting what is read: whole-file opens (a walk of a shard's headers)
    and ranged reads (requests and bytes per file)."""

    def __init__(self) -> None:
        self.opened: list[str] = []
        self.ranges: dict[str, list[tuple[int, int]]] = {}

    def open_read(self, path: str):
        self.opened.append(path)
        return DEFAULT_FS.open_read(path)

    def read_ranges(self, path: str, ranges: list[tuple[int, int]]) -> list[bytes]:
        self.ranges.setdefault(path, []).extend(ranges)
        return DEFAULT_FS.read_ranges(path, ranges)

    def __getattr__(self, name: str):
        return getattr(DEFAULT_FS, name)

    def bytes_of(self, suffix: str) -> int:
        return sum(e - b for path, spans in self.ranges.items() if path.endswith(suffix) for b, e in spans)


def _epoch(source, world: int, rank: int, **kw) -> list[dict[str, np.ndarray]]:
    it = NumpyBatches(source, seed=3, batch_size=B, block_size=BS, world_size=world, rank=rank, **kw)
    steps = sum(source.counts) // B
    return [next(it) for _ in range(steps)]


def _without_indexes(src: Path, dst: Path) -> Path:
    """The dataset as written before indexes: none on disk, none in the manifest."""
    out = _copy(src, dst)
    manifest = manifest_of(out)
    for split in manifest["splits"].values():
        for shard in split["shards"]:
            (out / shard.pop("index")["path"]).unlink()
    (out / "manifest.json").write_text(json.dumps(manifest, sort_keys=True, indent=2) + "\n")
    return out


def test_loaders_fetch_only_their_records_through_the_index(dataset, tmp_path) -> None:
    total = sum(s["bytes"] for s in manifest_of(dataset)["splits"]["train"]["shards"])
    fs = CountingFS()
    source = open_source(str(dataset), fs=fs)
    rank0 = _epoch(source, 2, 0, prefetch=False)
    assert not [p for p in fs.opened if p.endswith(".tfrecord")]  # no walk of any shard's headers
    fetched = fs.bytes_of(".tfrecord")
    # Its half of the full windows, and of the epoch's tail only what its batches need.
    assert fetched <= 0.6 * total, (fetched, total)
    # Blocks of index lines, each read once: at most the whole index (blocks of 64 lines against
    # chunks of 4 records: a rank of 2 needs nearly every block).
    assert 0 < fs.bytes_of(".index") <= sum(s["index"]["bytes"] for s in manifest_of(dataset)["splits"]["train"]["shards"])
    # The same batches as from the same dataset without indexes (walked, then read alike).
    old = open_source(str(_without_indexes(dataset, tmp_path / "old")))
    for a, b in zip(rank0, _epoch(old, 2, 0), strict=True):
        assert all(np.array_equal(a[k], b[k]) for k in a)


def test_reading_ahead_gives_the_same_batches(dataset) -> None:
    ahead = _epoch(open_source(str(dataset)), 1, 0, prefetch=True)  # (local shards: only when asked for)
    plain = _epoch(open_source(str(dataset)), 1, 0, prefetch=False)
    for a, b in zip(ahead, plain, strict=True):
        assert all(np.array_equal(a[k], b[k]) for k in a)


def test_reading_ahead_is_for_remote_shards_unless_asked(dataset) -> None:
    from bert_datagen.contract.loading.source import files_source

    local = open_source(str(dataset))
    assert not NumpyBatches(local, seed=3, batch_size=B).prefetch
    assert NumpyBatches(local, seed=3, batch_size=B, prefetch=True).prefetch
    remote = files_source("s3://bucket/ds", ["s3://bucket/ds/a.tfrecord", "s3://bucket/ds/b.tfrecord"],
                          [40, 40], local.fingerprint, local.spec, local.kind)
    assert NumpyBatches(remote, seed=3, batch_size=B).prefetch
    assert not NumpyBatches(remote, seed=3, batch_size=B, prefetch=False).prefetch


@pytest.mark.parametrize("digests", [True, False], ids=["block-digests", "written-before-digests"])
def test_a_corrupt_index_is_a_load_error_naming_it(dataset, tmp_path, digests) -> None:
    out = _copy(dataset, tmp_path / "ds")
    if not digests:
        manifest = manifest_of(out)
        for shard in (s for split in manifest["splits"].values() for s in split["shards"]):
            (out / shard["index"].pop("blocks")["path"]).unlink()
        (out / "manifest.json").write_text(json.dumps(manifest, sort_keys=True, indent=2) + "\n")
    shard = _shards(out)[0]
    path = out / shard["index"]["path"]
    index = bytearray(path.read_bytes())
    width = index.index(b"\n") + 1
    index[width + 1] = ord("9") if index[width + 1] != ord("9") else ord("8")  # line 1's offset
    path.write_bytes(bytes(index))
    why = "lines 0-63 do not match their block digest" if digests else "line 0 does not end where the next record"
    with pytest.raises(LoadError, match=rf"corrupt index: {path}: {why}"):
        _epoch(open_source(str(out)), 1, 0)


_TFRECORD_CHILD = """
import json, sys
from tfrecord.reader import tfrecord_loader
shards, parts = json.loads(sys.argv[1]), 3
print(json.dumps([[r["input_ids"].tolist() for k in range(parts)
                   for r in tfrecord_loader(path, index, {"input_ids": "int"}, shard=(k, parts))]
                  for path, index in shards]))
"""


def test_the_tfrecord_package_reads_our_shards_with_our_index(dataset) -> None:
    # In a child process: the package registers its own copy of TensorFlow's Example protos, which
    # protobuf refuses beside TensorFlow's in one process. Its `shard=` splits a file only through
    # an index: it reads the lines we wrote, and makes none of its own.
    if importlib.util.find_spec("tfrecord") is None:  # (not imported here: see above)
        pytest.skip("the tfrecord package is not installed (pip install -e '.[dev]')")
    shards = manifest_of(dataset)["splits"]["train"]["shards"]
    done = subprocess.run([sys.executable, "-c", _TFRECORD_CHILD,
                           json.dumps([(str(dataset / s["path"]), str(dataset / s["index"]["path"])) for s in shards])],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    source = open_source(str(dataset))
    for i, theirs in enumerate(json.loads(done.stdout)):
        assert np.array_equal(np.asarray(theirs, np.int64), source.read(i, 0, source.counts[i])["input_ids"])


def test_a_dataset_replaced_under_a_loader_is_an_error_at_its_next_window(corpus, tmp_path) -> None:
    out = tmp_path / "ds"
    _run(corpus, out, "--random-seed", "1")
    old = _copy(out, tmp_path / "old")
    it = NumpyBatches(open_source(str(out)), seed=3, batch_size=B, block_size=BS)
    expected = NumpyBatches(open_source(str(old)), seed=3, batch_size=B, block_size=BS, prefetch=False)
    got = [next(it)]  # the first window is read, the second one read ahead
    _run(corpus, out, "--random-seed", "2", "--overwrite")  # the same shape, other records
    assert manifest_of(out)["splits"]["train"]["records"] >= 2 * B * BS
    got += [next(it) for _ in range(BS - 1)]  # the rest of the window, read before the run
    with pytest.raises(LoadError, match=r"manifest.json: the dataset was replaced while this loader read it"):
        next(it)
    for batch in got:  # every batch it gave is of the dataset it opened
        want = next(expected)
        assert all(np.array_equal(batch[k], want[k]) for k in batch)


def test_inspect_reads_records_through_the_index(dataset, tmp_path) -> None:
    from bert_datagen.contract.dataset import open_dataset
    from bert_datagen.pipelines.beam.fsio import BEAM_FS
    from bert_datagen.pipelines.tools.shards import _indexed_payloads, read_records

    ds = open_dataset(str(dataset), BEAM_FS)
    old = open_dataset(str(_without_indexes(dataset, tmp_path / "old")), BEAM_FS)
    ref, old_ref = ds.shards[1], old.shards[1]
    assert _indexed_payloads(ref, 5, 3) is not None and _indexed_payloads(old_ref, 5, 3) is None
    (a, pa), (b, pb) = read_records(ref, ds.shape, 5, 3), read_records(old_ref, old.shape, 5, 3)
    assert not pa and not pb and len(a) == 3
    assert all(np.array_equal(a.features[k], b.features[k]) for k in a.features)
