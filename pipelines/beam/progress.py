"""Progress lines on stderr for local runs (one line per interval per worker process)."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from typing import TextIO

# Every DoFn of a worker process has its own Progress, set up when the runner first needs it; timed
# from their own setup, a later stage's lines would start again at 0s. One start per process (this
# module is imported once, before any DoFn is set up) keeps the elapsed times of its lines rising.
PROCESS_START = time.monotonic()
# CPU seconds each kind of task took, summed over workers: where the time goes, and how well the
# work spread (the summary table shows them; the manifest does not: they differ run to run).
BUSY_PREFIX = "cpu_seconds/"


class Progress:
    """Counts what a worker process has done and prints a line at most every ``interval`` seconds.

    Each worker process reports its own counts (Beam gives no cheap live channel back to the
    driver), so with several workers the lines are tagged with the process id.
    """

    def __init__(self, interval: float = 2.0, stream: TextIO | None = None, start: float | None = None,
                 clock: Callable[[], float] | None = None) -> None:
        self.interval = interval
        self.stream = stream
        self.counts: dict[str, int] = {}
        self.clock = clock or time.monotonic
        self.start = PROCESS_START if start is None else start
        self.began = self.clock()  # this stage's rate is over its own time, not the process's
        self.last = float("-inf")
        self.shown: dict[str, int] = {}  # the counts of the last line printed

    def add(self, force: bool = False, **counts: int) -> None:
        for name, n in counts.items():
            self.counts[name] = self.counts.get(name, 0) + int(n)
        now = self.clock()
        if force or now - self.last >= self.interval:
            self.last = now
            self.emit(now)

    def finish(self) -> None:
        """The worker's final counts, unless its last line already said them."""
        if self.counts and self.counts != self.shown:
            self.emit()

    def emit(self, now: float | None = None) -> None:
        now = self.clock() if now is None else now
        elapsed, busy = now - self.start, max(now - self.began, 1e-9)
        parts = [f"{v:,} {k.replace('_', ' ')}" for k, v in self.counts.items()]
        rate = ""
        if "instances" in self.counts:
            rate = f" ({self.counts['instances'] / busy:,.0f} instances/s)"
        elif "documents" in self.counts:
            rate = f" ({self.counts['documents'] / busy:,.0f} documents/s)"
        stream = self.stream or sys.stderr
        stream.write(f"bert-datagen [pid {os.getpid()}, {elapsed:.0f}s]: {', '.join(parts)}{rate}\n")
        stream.flush()
        self.shown = dict(self.counts)
