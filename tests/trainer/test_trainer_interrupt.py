"""`bert-train pretrain` interrupted (SIGINT) and killed (SIGKILL) at several points, as a process:
during start-up, mid-training, during a checkpoint write. Every rerun resumes, and the run ends with
bitwise the weights of an uninterrupted run. The timed suite runs the hardest point (SIGKILL in the
middle of a checkpoint write); the sweep of all four is `heavy` (`make test-heavy`, `make bench`),
and `tests/trainer/test_trainer_safety.py` holds SIGINT mid-run in process."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("tensorflow")

from bert_datagen.trainer.runtime import checkpoint as ckpt_lib  # noqa: E402
from tests.support.synthetic import write_synthetic_dataset  # noqa: E402

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parent.parent.parent
STEPS = 14


def command(data: str, out: Path) -> list[str]:
    return [sys.executable, "-m", "bert_datagen.trainer.cli", "pretrain", "--data", data, "--out", str(out),
            "--steps", str(STEPS), "--batch-size", "8", "--warmup-steps", "2", "--learning-rate", "1e-3",
            "--checkpoint-every", "1", "--keep-checkpoints", "3", "--log-every", "1", "--eval-batches", "1",
            "--seed", "7"]


class Trainer:
    """One `python -m bert_datagen.trainer.cli pretrain` process whose stdout is collected as it comes."""

    def __init__(self, data: str, out: Path):
        env = dict(os.environ, PYTHONPATH=str(REPO), PYTHONUNBUFFERED="1")
        self.proc = subprocess.Popen(command(data, out), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True, env=env, cwd=out.parent)
        self.lines: list[str] = []
        self.errors: list[str] = []
        self._readers = [threading.Thread(target=self._read, args=(stream, into), daemon=True)
                         for stream, into in ((self.proc.stdout, self.lines), (self.proc.stderr, self.errors))]
        for reader in self._readers:
            reader.start()

    @staticmethod
    def _read(stream, into: list[str]) -> None:
        for line in stream:
            into.append(line)

    def wait_for(self, prefix: str, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while not any(line.startswith(prefix) for line in self.lines):
            assert self.proc.poll() is None, f"ended before {prefix!r}: {''.join(self.lines)}"
            assert time.monotonic() < deadline, f"no {prefix!r} in {timeout} s"
            time.sleep(0.01)

    def finish(self, timeout: float = 120) -> int:
        self.proc.wait(timeout=timeout)
        for reader in self._readers:
            reader.join(timeout=10)
        return self.proc.returncode

    @property
    def stderr(self) -> str:
        return "".join(self.errors)

    def stdout(self) -> str:
        return "".join(self.lines)


def interrupted_exit(code: int, stderr: str) -> bool:
    """The CLI's answer to SIGINT: "interrupted", exit 130, no traceback."""
    return code == 130 and "interrupted" in stderr and "Traceback" not in stderr


def steps_of(run: Path) -> list[int]:
    return [step for step, _ in ckpt_lib.list_checkpoints(run)]


def weights(run: Path) -> dict[str, np.ndarray]:
    ckpt = ckpt_lib.resolve_checkpoint(run)
    return {**ckpt_lib.load_arrays(ckpt, ckpt_lib.MODEL_FILE), **ckpt_lib.load_arrays(ckpt, ckpt_lib.OPTIMIZER_FILE)}


def small_dataset(tmp_path: Path) -> str:
    return write_synthetic_dataset(str(tmp_path / "ds"), seq_len=16, max_pred=3, vocab_size=40,
                                   train_shards=2, records_per_shard=24, eval_records=8)


def kill_during_a_checkpoint_write(data: str, run: Path) -> None:
    """Start the run and SIGKILL it while a checkpoint is being written (every step saves one),
    once it has a complete one to resume from."""
    t = Trainer(data, run)
    t.wait_for("resumed from" if steps_of(run) else "step       3/")
    caught = False
    while t.proc.poll() is None:
        if any(entry.name.startswith(ckpt_lib.TMP_PREFIX) for entry in os.scandir(run)):
            t.proc.kill()
            caught = True
            break
    t.finish()
    assert caught, "the run ended before a checkpoint write was seen"
    assert steps_of(run)[-1] < STEPS


def resume_to_the_end_bitwise(data: str, run: Path, reference: Path) -> None:
    """The rerun resumes to the end: bitwise the uninterrupted run, and nothing of ours left over."""
    t = Trainer(data, run)
    assert t.finish() == 0, t.stderr
    assert any(line.startswith("resumed from") for line in t.lines)
    ref, got = weights(reference), weights(run)
    assert ref.keys() == got.keys()
    for name in ref:
        assert ref[name].tobytes() == got[name].tobytes(), f"{name} differs"
    assert not [p.name for p in run.iterdir() if p.name.startswith(".tmp-")]


def test_sigkill_during_a_checkpoint_write_then_resume_bitwise(tmp_path):
    data = small_dataset(tmp_path)
    reference = Trainer(data, tmp_path / "reference")
    assert reference.finish() == 0, reference.stderr
    run = tmp_path / "run"
    kill_during_a_checkpoint_write(data, run)
    resume_to_the_end_bitwise(data, run, tmp_path / "reference")


@pytest.mark.heavy
def test_sigint_and_sigkill_at_several_points_then_resume_bitwise(tmp_path):
    data = small_dataset(tmp_path)
    reference = Trainer(data, tmp_path / "reference")
    assert reference.finish() == 0, reference.stderr
    run = tmp_path / "run"

    # 1. SIGINT during start-up (TensorFlow still importing): nothing written that looks complete.
    t = Trainer(data, run)
    time.sleep(1.0)
    t.proc.send_signal(signal.SIGINT)
    assert interrupted_exit(t.finish(), t.stderr), t.stderr
    assert steps_of(run) == []

    # 2. SIGINT mid-training: the step finishes, a checkpoint of it is saved, exit.
    t = Trainer(data, run)
    t.wait_for("step       3/")
    t.proc.send_signal(signal.SIGINT)
    code = t.finish()
    assert interrupted_exit(code, t.stderr), t.stderr
    last = steps_of(run)[-1]
    assert 3 <= last < STEPS
    assert f"interrupted at step {last} (checkpoint {run / f'ckpt-{last:08d}'})" in t.stdout()

    # 3. SIGKILL mid-training: the last complete checkpoint is what remains.
    t = Trainer(data, run)
    t.wait_for(f"step {last + 3:>7}/")
    t.proc.kill()
    t.finish()
    last = steps_of(run)[-1]
    assert last < STEPS

    # 4. SIGKILL during a checkpoint write (every step saves one: wait until a temp dir appears).
    kill_during_a_checkpoint_write(data, run)

    # 5. The rerun resumes to the end: bitwise the uninterrupted run, and nothing of ours left over.
    resume_to_the_end_bitwise(data, run, tmp_path / "reference")
