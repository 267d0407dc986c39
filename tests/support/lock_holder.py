"""A second process holding an output lock, for the lock tests."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent.parent
HOLD = """
import os, subprocess, sys
from bert_datagen.cli.lock import lock_output
held = lock_output(sys.argv[1])
children = []
if len(sys.argv) > 2:  # children that outlive us: an exec'd one (close_fds off) and a plain fork
    children.append(subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], close_fds=False).pid)
    pid = os.fork()
    if pid == 0:
        import time
        time.sleep(60)
        os._exit(0)
    children.append(pid)
print("held", *children, flush=True)
sys.stdin.read()
held.release()  # a command that ends normally removes its lock file
"""


class Holder:
    """A process holding the lock of ``output`` until it is told to stop or killed."""

    def __init__(self, output: Path | str, with_children: bool = False) -> None:
        args = [sys.executable, "-c", HOLD, str(output)] + (["children"] if with_children else [])
        self.proc = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                     env={**os.environ, "PYTHONPATH": str(REPO)})
        line = self.proc.stdout.readline().split()
        assert line and line[0] == "held", "the holder did not take the lock"
        self.children = [int(p) for p in line[1:]]

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait(timeout=10)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.close()
            self.proc.wait(timeout=10)
        for pid in self.children:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
