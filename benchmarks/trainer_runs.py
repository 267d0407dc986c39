"""`bert-train` runs timed from outside, by when their step lines arrive; both backends compared ABBA.

A run is timed as a user runs it (its own process, start-up, data checks, compilation and the real
input), but only in its steady state: the clock starts when the line of step `warm` arrives and stops
at the line of step `warm + timed`, and the run is then killed, so that neither compilation nor the
final checkpoint and eval are counted. Keras picks its backend once per process, so each backend's
run is a process of its own anyway; on a shared machine the runs alternate A B B A, so that load from
other jobs falls on both backends alike.
"""

from __future__ import annotations

import math
import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

STEP_LINE = re.compile(r"^step\s+(\d+)/\d+")
LOSS = re.compile(r"\bloss (\S+)")
BACKENDS = ("tensorflow", "jax")


@dataclass(frozen=True)
class TimedRun:
    """One run's steady state: `steps` steps in `seconds`, after `start_seconds` of start-up,
    compilation and warm-up steps; `error` the run's last line where it ended before the timed steps."""

    backend: str
    steps: int = 0
    seconds: float = 0.0
    start_seconds: float = 0.0
    loss: float | None = None
    error: str | None = None

    @property
    def steps_per_second(self) -> float | None:
        return self.steps / self.seconds if self.steps and self.seconds > 0 else None


def trainer_command(*args: str) -> list[str]:
    """`bert-train ARGS` with this interpreter (no console script needed where the package only lies on
    the path, as on the accelerator machines)."""
    return [sys.executable, "-m", "bert_datagen.trainer.cli", *args]


def log_every(warm: int, timed: int) -> int:
    """The largest logging interval whose lines include steps `warm` and `warm + timed`."""
    if warm <= 0 or timed <= 0:
        raise ValueError(f"warm and timed steps must be positive, got {warm} and {timed}")
    return math.gcd(warm, timed)


def timed_run(command: Sequence[str], *, warm: int, timed: int, backend: str = "",
              env: dict[str, str] | None = None, timeout: float = 600.0) -> TimedRun:
    """Run `command` (a `bert-train` run logging every `log_every(warm, timed)` steps, with more steps
    than warm + timed) until its line of step warm + timed, then kill it. Never raises for the run's
    own failure: that comes back as `error`."""
    environ = dict(os.environ if env is None else env, PYTHONUNBUFFERED="1")
    start = time.perf_counter()
    proc = subprocess.Popen(list(command), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=environ)
    # The pipe is read in this thread, so a run that hangs is stopped by a timer instead.
    timer = threading.Timer(timeout, proc.kill)
    timer.start()
    seen: dict[int, float] = {}
    last_line, loss, done = "", None, False
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            now = time.perf_counter()
            text = line.strip()
            match = STEP_LINE.match(text)
            if match:
                step = int(match.group(1))
                seen[step] = now
                found = LOSS.search(text)
                loss = _number(found.group(1)) if found else loss
                if step >= warm + timed:
                    done = True
                    break
            elif text:
                last_line = text
    finally:
        timer.cancel()
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=60)
        if proc.stdout is not None:
            proc.stdout.close()
    if not done:
        if time.perf_counter() - start >= timeout:
            return TimedRun(backend, error=f"timed out after {timeout:.0f} s")
        return TimedRun(backend, error=last_line or f"exit code {proc.returncode} before step {warm + timed}")
    first = min((s for s in seen if s >= warm), default=None)
    end = max(seen)
    if first is None or first == end:
        return TimedRun(backend, error=f"no step line between step {warm} and step {end}: log every "
                                       f"{log_every(warm, timed)} steps")
    return TimedRun(backend, steps=end - first, seconds=seen[end] - seen[first], start_seconds=seen[first] - start,
                    loss=loss)


def _number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


def compare_backends(job: Callable[[str], TimedRun], rounds: int = 2,
                     backends: Sequence[str] = BACKENDS) -> dict[str, list[TimedRun]]:
    """`job(backend)` `rounds` times each, in the order A B, B A, A B, ...: each backend's runs."""
    runs: dict[str, list[TimedRun]] = {b: [] for b in backends}
    for r in range(rounds):
        for backend in (backends if r % 2 == 0 else tuple(reversed(backends))):
            runs[backend].append(job(backend))
    return runs


def summarise(runs: dict[str, list[TimedRun]], batch_size: int) -> dict:
    """Per backend, steps/s and sequences/s over all its timed steps (total steps / total time), each
    run's steps/s, its start-up seconds and errors; `jax_over_tensorflow`: the ratio of the two rates,
    and `pair_ratios`: the same per round (the two runs next to each other in time)."""
    out: dict = {}
    for backend, timed in runs.items():
        good = [t for t in timed if t.error is None]
        seconds = sum(t.seconds for t in good)
        rate = sum(t.steps for t in good) / seconds if good and seconds > 0 else None
        out[backend] = {"steps_per_second": rate, "sequences_per_second": rate * batch_size if rate else None,
                        "runs_steps_per_second": [t.steps_per_second for t in timed],
                        "start_seconds": [round(t.start_seconds, 1) for t in good],
                        "last_loss": [t.loss for t in good],
                        "errors": sorted({t.error for t in timed if t.error})}
    if set(BACKENDS) <= set(runs):
        tf, jax = out["tensorflow"]["steps_per_second"], out["jax"]["steps_per_second"]
        out["jax_over_tensorflow"] = jax / tf if tf and jax else None
        out["pair_ratios"] = [j.steps_per_second / t.steps_per_second
                              for t, j in zip(runs["tensorflow"], runs["jax"], strict=False)
                              if t.steps_per_second and j.steps_per_second]
    return out
