"""Datasets in buckets, against real servers on 127.0.0.1 (moto's S3 server, a GCS emulator): every
data command and the loaders on s3:// and gs:// paths, configured by the clients' own variables."""

from __future__ import annotations

import errno
import json
import sys

import numpy as np
import pytest
from click.testing import CliRunner

from bert_datagen.contract.buckets import BUCKETS
from bert_datagen.contract.loading.batches import NumpyBatches
from bert_datagen.contract.loading.source import open_source
from bert_datagen.pipelines.beam import outputs
from bert_datagen.pipelines.cli import main
from tests.support.pipeline_corpus import make_documents, write_text_files
from tests.support.servers import upload_tree

pytestmark = pytest.mark.timeout(240)

RUN = ["--dupe-factor", "2", "--max-seq-length", "32", "--max-predictions-per-seq", "5", "--quiet"]


def cli(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, list(args))
    return result.exit_code, result.output


@pytest.fixture
def corpus(tmp_path) -> str:
    write_text_files(tmp_path / "in", make_documents(30, seed=3), n_files=2)
    return str(tmp_path / "in" / "*.txt")


def objects(prefix: str) -> dict[str, bytes]:
    return {p[len(prefix) + 1:]: BUCKETS.read_bytes(p) for p in BUCKETS.list_prefix(prefix + "/")}


def test_a_dataset_written_to_a_bucket_has_the_bytes_of_a_local_one_and_every_tool_reads_it(
        bucket, corpus, tmp_path) -> None:
    upload_tree(tmp_path / "in", f"{bucket}/text")  # inputs, vocab and dataset all in the bucket
    vocab = f"{bucket}/vocab.txt"
    code, out = cli("vocab", "--input", f"{bucket}/text/*.txt", "--output", vocab, "--vocab-size", "300")
    assert code == 0, out
    remote, local = f"{bucket}/data/ds", str(tmp_path / "ds")
    for output, inputs in ((remote, f"{bucket}/text/*.txt"), (local, corpus)):
        code, out = cli("run", "--input", inputs, "--vocab", vocab, "--output", output, "--num-shards", "2",
                        "--eval-fraction", "0.2", *RUN)
        assert code == 0, out
    stored = objects(remote)
    assert sorted(stored) == sorted(str(p.relative_to(local)) for p in (tmp_path / "ds").rglob("*") if p.is_file())
    for name, data in stored.items():
        mine = (tmp_path / "ds" / name).read_bytes()
        if name == "manifest.json":  # the same but for the input patterns, which name the bucket
            data, mine = (json.loads(x) for x in (data, mine))
            assert data["input"].pop("patterns") == [f"{bucket}/text/*.txt"] and mine["input"].pop("patterns")
        if name != "README.md":  # the card shows the commands with the dataset's own path
            assert data == mine, name
    code, out = cli("verify", remote, "--workers", "1")
    assert code == 0 and out.startswith("OK"), out
    assert cli("inspect", remote, "-n", "1")[0] == 0
    code, out = cli("stats", remote)
    assert code == 0 and "[UNK] rate" in out, out
    code, out = cli("diff", remote, local)
    assert code == 0 and "identical" in out, out
    code, out = cli("batches", remote, "--batch-size", "4", "--seed", "1", "--step", "2")
    assert code == 0 and out == cli("batches", local, "--batch-size", "4", "--seed", "1", "--step", "2")[1].replace(
        local, remote), out
    # The loaders: the same batches from the bucket as from the local copy, NumPy and PyTorch.
    theirs = [NumpyBatches(open_source(p), seed=3, batch_size=4, world_size=2, rank=1) for p in (remote, local)]
    for _ in range(6):
        a, b = (next(t) for t in theirs)
        assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)
    torch = pytest.importorskip("torch")
    from bert_datagen.contract.loading.torch_adapter import torch_batches

    first = next(iter(torch_batches(open_source(remote), seed=3, batch_size=4, world_size=1, rank=0)))
    want = NumpyBatches(open_source(local), seed=3, batch_size=4).batch_at(0)
    assert all(torch.equal(first[k], torch.from_numpy(want[k])) for k in want)


def test_a_task_dataset_is_written_to_and_checked_in_a_bucket(bucket, corpus, tmp_path) -> None:
    vocab = tmp_path / "vocab.txt"
    assert cli("vocab", "--input", corpus, "--output", str(vocab), "--vocab-size", "300")[0] == 0
    docs = make_documents(12, seed=5)
    rows = "".join(f"{' '.join(d[0].split()[:12])}\t{i % 2}\n" for i, d in enumerate(docs))
    BUCKETS.write(f"{bucket}/glue/train.tsv", rows.encode())
    (tmp_path / "train.tsv").write_text(rows)
    outs = {}
    for name, (split, output) in {"remote": (f"{bucket}/glue/train.tsv", f"{bucket}/task"),
                                  "local": (str(tmp_path / "train.tsv"), str(tmp_path / "task"))}.items():
        code, out = cli("task", "--task", "tsv", "--text-a", "0", "--label", "1", "--no-header", "--split",
                        f"train={split}", "--vocab", str(vocab), "--output", output, "--quiet")
        assert code == 0, out
        outs[name] = output
    assert cli("verify", outs["remote"])[0] == 0
    shards = {k: v for k, v in objects(outs["remote"]).items() if k.endswith(".tfrecord")}
    assert shards and all(v == (tmp_path / "task" / k).read_bytes() for k, v in shards.items())
    code, out = cli("diff", outs["remote"], outs["local"])  # only where the input was read from differs
    assert "1 manifest field(s) differ" in out and "input.splits.train" in out, out


def test_a_failed_or_interrupted_overwrite_leaves_the_old_dataset_in_the_bucket(
        bucket, corpus, tmp_path, monkeypatch) -> None:
    vocab = tmp_path / "vocab.txt"
    assert cli("vocab", "--input", corpus, "--output", str(vocab), "--vocab-size", "300")[0] == 0
    out = f"{bucket}/ds"
    assert cli("run", "--input", corpus, "--vocab", str(vocab), "--output", out, "--num-shards", "3", *RUN)[0] == 0
    before = objects(out)
    # A run that fails part way (an input that is not text) changes nothing.
    (tmp_path / "in" / "zz-blob.txt").write_bytes(bytes(range(256)) * 64)
    code, output = cli("run", "--input", corpus, "--vocab", str(vocab), "--output", out, "--num-shards", "2",
                       "--overwrite", *RUN)
    assert code == 1 and "zz-blob.txt" in output
    assert objects(out) == before
    (tmp_path / "in" / "zz-blob.txt").unlink()
    # Interrupted in the middle of the swap: rolled back, the old dataset whole and readable.
    real_move, calls = outputs._move, {"n": 0}

    def dying_move(src: str, dst: str) -> None:
        calls["n"] += 1
        if calls["n"] == 4:
            raise KeyboardInterrupt
        real_move(src, dst)

    monkeypatch.setattr(outputs, "_move", dying_move)
    code, _ = cli("run", "--input", corpus, "--vocab", str(vocab), "--output", out, "--num-shards", "2",
                  "--overwrite", *RUN)
    monkeypatch.setattr(outputs, "_move", real_move)
    assert code == 130 and calls["n"] > 4
    assert objects(out) == before
    assert cli("verify", out, "--workers", "1")[0] == 0
    # A run into a new prefix that dies before its manifest: nothing there that reads as a dataset.
    fresh = f"{bucket}/fresh"
    calls["n"] = 0

    def dying_before_manifest(src: str, dst: str) -> None:
        if dst.endswith("manifest.json"):
            raise KeyboardInterrupt
        real_move(src, dst)

    monkeypatch.setattr(outputs, "_move", dying_before_manifest)
    code, _ = cli("run", "--input", corpus, "--vocab", str(vocab), "--output", fresh, *RUN)
    monkeypatch.setattr(outputs, "_move", real_move)
    assert code == 130
    code, output = cli("verify", fresh, "--workers", "1")
    assert code == 1 and "manifest" in output
    with pytest.raises(ValueError, match="manifest"):
        open_source(fresh)


def test_bucket_errors_are_one_line_naming_the_path_and_the_cause(bucket, monkeypatch) -> None:
    scheme = bucket.split("://")[0]
    missing = f"{scheme}://no-such-bucket-{bucket[-8:]}/ds"
    code, out = cli("verify", missing)
    assert code == 1 and out.count("\n") == 1 and missing in out and "does not exist" in out, out
    code, out = cli("verify", f"{bucket}/nothing-here")
    assert code == 1 and f"{bucket}/nothing-here" in out and "--max-seq-length" not in out, out
    # Without the client package: the extra to install.
    module = {"s3": "s3fs", "gs": "gcsfs"}[scheme]
    monkeypatch.setitem(sys.modules, module, None)
    monkeypatch.setitem(sys.modules, "gcsfs.core", None)
    monkeypatch.setenv("AWS_DEFAULT_REGION", "eu-west-1")  # a new configuration: a new client is made
    monkeypatch.setenv("GOOGLE_CLOUD_PROJECT", "p")
    with pytest.raises(OSError) as info:
        BUCKETS.read_bytes(f"{bucket}/x")
    assert info.value.errno == errno.ENOPKG and f"bert-datagen[{'s3' if scheme == 's3' else 'gcs'}]" in str(info.value)


def test_missing_credentials_and_a_denied_request_name_the_path(tmp_path, monkeypatch) -> None:
    from tests.support.servers import s3_server

    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_PROFILE", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    # A server that checks signatures (moto with IAM auth on): unknown keys are refused.
    monkeypatch.setenv("INITIAL_NO_AUTH_ACTION_COUNT", "0")
    with s3_server() as env:
        monkeypatch.setenv("AWS_ENDPOINT_URL", env["AWS_ENDPOINT_URL"])
        monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
        code, out = cli("verify", "s3://some-bucket/ds")
        assert code == 1 and "s3://some-bucket/ds" in out and "no credentials" in out, out
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAUNKNOWN")
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wrong")
        code, out = cli("verify", "s3://some-bucket/ds")
        assert code == 1 and "s3://some-bucket/ds" in out and "denied" in out, out


def test_beams_own_s3_options_are_refused_naming_the_setting_that_works(tmp_path) -> None:
    code, out = cli("run", "--input", str(tmp_path / "x.txt"), "--vocab", str(tmp_path / "v.txt"), "--output",
                    "s3://b/ds", "--s3_endpoint_url=http://127.0.0.1:9")
    assert code == 2 and "--s3_endpoint_url would be ignored" in out and "AWS_ENDPOINT_URL" in out, out
