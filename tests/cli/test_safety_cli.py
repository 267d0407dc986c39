"""Errors and interrupts as a user sees them in a terminal (real subprocesses, real stderr): one clean
`Error:` line and no traceback (unless --debug or BERT_DATAGEN_DEBUG=1), no Beam noise; SIGINT prints
"interrupted" and exits 130; SIGINT or SIGKILL at any point of `run --overwrite` leaves the old
dataset verifiable and exactly as it was, and a rerun succeeds and leaves none of our marks."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from bert_datagen.pipelines.beam.outputs import MARK
from bert_datagen.pipelines.cli import main
from tests.support.pipeline_corpus import make_documents, tree_snapshot, write_text_files, write_vocab

REPO = Path(__file__).resolve().parent.parent.parent


def environment(**extra: str) -> dict[str, str]:
    environ = {k: v for k, v in os.environ.items() if k != "BERT_DATAGEN_DEBUG"}
    return {**environ, "PYTHONPATH": str(REPO), **extra}


def datagen(*args: str, env: dict[str, str] | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "bert_datagen.pipelines.cli", *args], capture_output=True, text=True,
                          env=environment(**(env or {})), timeout=timeout)


def in_process(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, list(args))
    return result.exit_code, result.output


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("cli")
    write_text_files(root / "in", make_documents(300, seed=9), n_files=3)
    (root / "blob.txt").write_bytes(bytes(range(256)) * 64)
    return {"root": root, "vocab": write_vocab(root / "vocab.txt")}


def run_args(corpus, out: Path, *extra: str, inputs: str | None = None) -> list[str]:
    return ["run", "--input", inputs or str(corpus["root"] / "in" / "*.txt"), "--vocab", str(corpus["vocab"]),
            "--output", str(out), "--max-seq-length", "64", "--max-predictions-per-seq", "10", "--quiet", *extra]


def test_input_error_is_one_clean_line_without_beam_noise(corpus, tmp_path) -> None:
    result = datagen(*run_args(corpus, tmp_path / "o", inputs=str(corpus["root"] / "blob.txt")))
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 1 and len(lines) == 1, result.stderr
    assert lines[0].startswith(f"Error: {corpus['root'] / 'blob.txt'}: looks like a binary file")
    assert "Traceback" not in result.stderr and "apitools" not in result.stderr


@pytest.mark.integration
def test_debug_flag_and_environment_show_the_traceback(corpus, tmp_path) -> None:
    for env, extra in (({}, ["--debug"]), ({"BERT_DATAGEN_DEBUG": "1"}, [])):
        result = datagen(*run_args(corpus, tmp_path / "o", *extra, inputs=str(corpus["root"] / "blob.txt")), env=env)
        assert result.returncode == 1 and "Traceback" in result.stderr
        assert result.stderr.strip().splitlines()[-1].startswith("Error: ")


def test_data_commands_print_no_no_information_warnings(corpus, tmp_path) -> None:
    result = datagen("verify", str(tmp_path / "nothing"))
    assert result.returncode == 1 and result.stderr.startswith("Error: ") and "WARNING" not in result.stderr


def test_bert_train_uses_the_same_wrapper() -> None:
    from bert_datagen.cli.plumbing import CleanErrorsGroup
    from bert_datagen.trainer.cli import main

    assert isinstance(main, CleanErrorsGroup)


# ---------------------------------------------------------------- signals during run --overwrite


def _wait_for(out: Path, pattern: str, proc: subprocess.Popen, limit: float = 60.0) -> bool:
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        if any(out.glob(pattern)):
            return True
        if proc.poll() is not None:
            return False
        time.sleep(0.002)
    return False


POINTS = {  # where the signal lands, by what the run has written so far
    "early": f"{MARK}staging-*",
    "mid-run": f"{MARK}staging-*/work/parts/*",
    "writing shards": f"{MARK}staging-*/train/*part-*",
}


def _interrupted_run(corpus, out: Path, pattern: str, sig: int, *extra: str,
                     group: bool = True) -> tuple[bool, int, str]:
    """Start `run --overwrite`, send ``sig`` once ``pattern`` exists under ``out``: SIGINT to the whole
    process group, as Ctrl-C in a terminal does (Beam's worker processes get it too), or with
    ``group=False`` to the driver alone (`kill -INT PID`); SIGKILL to the driver alone."""
    proc = subprocess.Popen([sys.executable, "-m", "bert_datagen.pipelines.cli", *run_args(
        corpus, out, "--dupe-factor", "30", "--overwrite", "--num-shards", "3", *extra)], env=environment(),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    reached = _wait_for(out, pattern, proc)
    if reached:
        os.killpg(proc.pid, sig) if sig == signal.SIGINT and group else proc.send_signal(sig)
    try:
        _, stderr = proc.communicate(timeout=120)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # orphaned workers, if any
    return reached, proc.returncode, stderr


def _check_interrupted(out: Path, before: dict[str, str], sig: int, rc: int, stderr: str, point: str) -> None:
    if sig == signal.SIGINT:
        assert rc == 130 and stderr.strip().splitlines()[-1] == "interrupted", (point, stderr[-2000:])
        assert "Traceback" not in stderr, point
        assert tree_snapshot(out) == before, point  # staging and temp files removed too
    else:
        assert rc == -signal.SIGKILL, point
        assert {k: v for k, v in tree_snapshot(out).items() if MARK not in k} == before, point
    code, report = in_process("verify", str(out))
    assert code == 0 and report.startswith("OK"), (point, report)


def _rerun_leaves_no_marks(corpus, out: Path) -> None:
    code, output = in_process(*run_args(corpus, out, "--dupe-factor", "2", "--overwrite", "--num-shards", "2"))
    assert code == 0, output
    assert not [p for p in tree_snapshot(out) if MARK in p or ".tmp-" in p]
    assert in_process("verify", str(out))[0] == 0


@pytest.mark.integration
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGKILL], ids=["SIGINT", "SIGKILL"])
def test_signal_during_overwrite_keeps_the_old_dataset(corpus, tmp_path, sig: int) -> None:
    out = tmp_path / "ds"
    assert in_process(*run_args(corpus, out, "--dupe-factor", "1"))[0] == 0
    before = tree_snapshot(out)
    for point, pattern in POINTS.items():
        reached, rc, stderr = _interrupted_run(corpus, out, pattern, sig)
        assert reached, f"the run ended before reaching {point!r} (rc {rc}): {stderr[-500:]}"
        _check_interrupted(out, before, sig, rc, stderr, point)
    _rerun_leaves_no_marks(corpus, out)


@pytest.mark.integration
def test_ctrl_c_with_worker_processes(corpus, tmp_path) -> None:
    """Two worker processes (Beam's multi-process DirectRunner): Ctrl-C reaches them too; their
    tracebacks and log lines are not shown, the old dataset stays."""
    out = tmp_path / "ds"
    assert in_process(*run_args(corpus, out, "--dupe-factor", "1"))[0] == 0
    before = tree_snapshot(out)
    for group in (True, False):  # Ctrl-C; `kill -INT` of the driver alone (it passes it on)
        reached, rc, stderr = _interrupted_run(corpus, out, POINTS["mid-run"], signal.SIGINT,
                                               "--direct_num_workers=2", group=group)
        assert reached, stderr[-500:]
        _check_interrupted(out, before, signal.SIGINT, rc, stderr, f"mid-run, 2 workers, group {group}")
        assert "WARNING" not in stderr and "INFO" not in stderr


# Imported first by every Python process given this directory on PYTHONPATH: of Beam's two worker
# processes (they have a WORKER_ID) worker_0 starts 6 s late; the one input file goes to worker_1.
LATE_WORKER = """
import os, time
if os.environ.get("WORKER_ID") == "worker_0":
    time.sleep(6)
"""


@pytest.mark.integration
def test_input_error_with_worker_processes_is_one_clean_line(corpus, tmp_path) -> None:
    """The error comes from one worker before the other has connected to the runner: the run still
    ends (Beam alone waits forever for the late worker; a loaded CI machine hit it about 1 run in
    30, and this test hangs without `stop_workers_that_connect_late`)."""
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "sitecustomize.py").write_text(LATE_WORKER)
    env = {"PYTHONPATH": f"{REPO}{os.pathsep}{tmp_path / 'site'}"}
    result = datagen(*run_args(corpus, tmp_path / "o", "--direct_num_workers=2",
                               inputs=str(corpus["root"] / "blob.txt")), env=env, timeout=60)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 1 and len(lines) == 1 and lines[0].startswith("Error: "), result.stderr
    assert not (tmp_path / "o").exists()


def test_child_log_filter_drops_records_and_their_tracebacks() -> None:
    from bert_datagen.cli.plumbing import ChildLogFilter

    lines = [b"WARNING:root:apitools not found\n", b"ERROR:apache_beam.runners.common:boom\n",
             b"Traceback (most recent call last):\n", b'  File "x.py", line 1\n', b"RuntimeError: boom\n",
             b"\n", b"bert-datagen [pid 1, 0s]: 3 files\n", b"Exception in thread run_worker:\n",
             b"Traceback (most recent call last):\n", b"RuntimeError: exited -2\n", b"interrupted\n",
             b"Traceback (most recent call last):\n", b"KeyboardInterrupt\n",
             b"Error: in.txt: cannot read\n", b"plain line of ours\n"]
    records = ChildLogFilter()
    assert [line for line in lines if records.keep(line)] == [
        b"bert-datagen [pid 1, 0s]: 3 files\n", b"interrupted\n", b"Error: in.txt: cannot read\n",
        b"plain line of ours\n"]


def test_an_in_process_interrupt_leaves_sigint_as_it_was():
    """Only a process about to end may ignore SIGINT: the disposition is inherited by every process
    it starts, which would then never stop on Ctrl-C (a leak between tests found this)."""
    import signal

    import click
    from click.testing import CliRunner

    from bert_datagen.cli.plumbing import CommandGroup

    @click.group(cls=CommandGroup)
    def group() -> None:
        pass

    @group.command()
    def stop() -> None:
        raise KeyboardInterrupt

    before = signal.getsignal(signal.SIGINT)
    result = CliRunner().invoke(group, ["stop"])
    assert result.exit_code == 130 and "interrupted" in result.output
    assert signal.getsignal(signal.SIGINT) is before
