"""A full disk during `bert-datagen run`, `task` or `vocab` is one `Error:` line naming the file being
written and the cause (issue 29, point 6), not Beam's wrapped "RuntimeError: OSError: [Errno 28] ...
[while running 'Step'] (unexpected ...)"; and the command leaves nothing behind on that disk."""

from __future__ import annotations

import errno
import os
import pathlib
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from bert_datagen.cli.plumbing import CommandGroup, wrapped_os_error
from bert_datagen.pipelines.cli import main
from tests.support.pipeline_corpus import make_documents, write_text_files, write_vocab

NO_SPACE = os.strerror(errno.ENOSPC)


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("inputs")
    write_text_files(root / "in", make_documents(300, seed=3), n_files=2)
    words = [w for doc in make_documents(40, seed=5) for s in doc for w in s.split()]
    rows = (" ".join(words[(i + j) % len(words)] for j in range(20)) + f"\t{'ab'[i % 2]}" for i in range(1500))
    (root / "train.tsv").write_text("text\tlabel\n" + "\n".join(rows) + "\n")
    return {"texts": root / "in", "tsv": root / "train.tsv", "vocab": write_vocab(root / "vocab.txt")}


def _commands(inputs: dict[str, Path], where: Path) -> dict[str, list[str]]:
    vocab = str(inputs["vocab"])
    return {
        "run": ["run", "--input", str(inputs["texts"] / "*.txt"), "--vocab", vocab, "--output", str(where / "ds"),
                "--max-seq-length", "64", "--dupe-factor", "5", "--quiet"],
        "task": ["task", "--task", "tsv", "--split", f"train={inputs['tsv']}", "--text-a", "text", "--label", "label",
                 "--vocab", vocab, "--output", str(where / "task"), "--quiet"],
        "vocab": ["vocab", "--input", str(inputs["texts"] / "*.txt"), "--output", str(where / "vocab.txt"),
                  "--vocab-size", "400"],
    }


def _one_line_naming(output: str, where: Path) -> None:
    lines = [line for line in output.splitlines() if line.strip()]
    assert len(lines) == 1, output
    assert lines[0].startswith(f"Error: {where}/") and lines[0].endswith(f": {NO_SPACE}"), output
    assert "unexpected" not in output and "RuntimeError" not in output and "Traceback" not in output, output


@pytest.mark.parametrize("command", ["run", "task"])
def test_a_real_full_disk_is_one_line_naming_the_file(inputs, full_disk, command):
    result = CliRunner().invoke(main, _commands(inputs, full_disk)[command])
    assert result.exit_code == 1, result.output
    _one_line_naming(result.output, full_disk)
    assert list(full_disk.iterdir()) == []  # its staging removed: the disk as it was


@pytest.mark.parametrize("command", ["run", "task", "vocab"])
def test_no_space_at_the_lowest_write_names_the_file(inputs, tmp_path, monkeypatch, command):
    """ENOSPC injected where every local write of the pipelines ends (`Path.write_bytes` of the temp
    file, as `f.write` raises it: no file name), inside Beam's workers: the same one line."""
    where = tmp_path / "out"
    original = pathlib.Path.write_bytes

    def full(self, data):
        if str(self).startswith(str(where)):
            raise OSError(errno.ENOSPC, NO_SPACE)
        return original(self, data)

    monkeypatch.setattr(pathlib.Path, "write_bytes", full)
    result = CliRunner().invoke(main, _commands(inputs, where)[command])
    assert result.exit_code == 1, result.output
    _one_line_naming(result.output, where)
    assert not [p for p in where.rglob("*") if p.is_file()]


def test_an_error_beam_carried_from_a_worker_process_as_text_is_unwrapped():
    """From a worker process only the text crosses (no chained exception): it is parsed."""
    text = (f"OSError: [Errno 28] {NO_SPACE}: '/data/ds/.bert-datagen-staging-1/train/part-00000.tfrecord' "
            "[while running 'WriteShards/WriteShard']")
    found = wrapped_os_error(RuntimeError(text))
    assert (found.errno, found.strerror, found.filename) == (
        errno.ENOSPC, NO_SPACE, "/data/ds/.bert-datagen-staging-1/train/part-00000.tfrecord")
    assert wrapped_os_error(RuntimeError("OSError: [Errno 28] no file [while running 'X']")).filename is None
    assert wrapped_os_error(ValueError("[Errno 28] not a Beam step")) is None

    @click.group(cls=CommandGroup)
    def group() -> None:
        pass

    @group.command("write")
    def write() -> None:
        raise RuntimeError(text)

    result = CliRunner().invoke(group, ["write"])
    assert result.exit_code == 1
    assert result.output == f"Error: /data/ds/.bert-datagen-staging-1/train/part-00000.tfrecord: {NO_SPACE}\n"
