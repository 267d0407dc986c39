"""The stderr filter of our commands (``filter_process_stderr``) in a real process: what child processes
write still gets through once they exit, and a helper that lives as long as the command (the
resource tracker Dask's local cluster starts) does not hold the command's exit up."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent.parent

SCRIPT = r"""
import multiprocessing.resource_tracker, subprocess, sys, time
from bert_datagen.cli.plumbing import filter_process_stderr
restore = filter_process_stderr()
if sys.argv[1] == "tracker":
    multiprocessing.resource_tracker.ensure_running()  # holds our stderr until this process ends
late = "import sys, time; time.sleep(0.4); sys.stderr.write('bert-datagen late line\\n'); sys.stderr.write('WARNING:x:noise\\n')"
child = subprocess.Popen([sys.executable, "-c", late])
if sys.argv[1] == "tracker":
    child.wait()  # what restore() waits for now is the tracker alone
sys.stderr.write("bert-datagen own line\n")
start = time.monotonic()
restore()
print(f"{time.monotonic() - start:.3f}")
"""


def run_script(mode: str) -> tuple[float, str]:
    result = subprocess.run([sys.executable, "-c", SCRIPT, mode], capture_output=True, text=True, timeout=60,
                            env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"})
    assert result.returncode == 0, result.stderr
    return float(result.stdout.strip()), result.stderr


def test_restore_waits_for_a_child_process_still_running_and_keeps_its_lines() -> None:
    seconds, stderr = run_script("plain")  # the child is still running (then a zombie) when restore() starts
    assert stderr == "bert-datagen own line\nbert-datagen late line\n"
    assert seconds > 0.2


def test_a_lifelong_helper_holding_stderr_does_not_hold_the_exit_up() -> None:
    # Before: restore() waited for end-of-file until its 2 s limit, at the end of every Dask run.
    seconds, stderr = run_script("tracker")
    assert stderr == "bert-datagen late line\nbert-datagen own line\n"  # the child ended first here
    assert seconds < 1.0
