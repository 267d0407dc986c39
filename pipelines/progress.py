"""Progress lines on stderr for local runs (one line per interval per worker process)."""

from __future__ import annotations

import os
import sys
import time
from typing import TextIO


class Progress:
    """Counts what a worker process has done and prints a line at most every ``interval`` seconds.

    Each worker process reports its own counts (Beam gives no cheap live channel back to the
    driver), so with several workers the lines are tagged with the process id.
    """

    def __init__(self, interval: float = 2.0, stream: TextIO | None = None) -> None:
        self.interval = interval
        self.stream = stream
        self.counts: dict[str, int] = {}
        self.start = time.monotonic()
        self.last = 0.0

    def add(self, force: bool = False, **counts: int) -> None:
        for name, n in counts.items():
            self.counts[name] = self.counts.get(name, 0) + int(n)
        now = time.monotonic()
        if force or now - self.last >= self.interval:
            self.last = now
            self.emit(now)

    def emit(self, now: float | None = None) -> None:
        elapsed = max((now or time.monotonic()) - self.start, 1e-9)
        parts = [f"{v:,} {k.replace('_', ' ')}" for k, v in self.counts.items()]
        rate = ""
        if "instances" in self.counts:
            rate = f" ({self.counts['instances'] / elapsed:,.0f} instances/s)"
        elif "documents" in self.counts:
            rate = f" ({self.counts['documents'] / elapsed:,.0f} documents/s)"
        stream = self.stream or sys.stderr
        stream.write(f"bert-datagen [pid {os.getpid()}, {elapsed:.0f}s]: {', '.join(parts)}{rate}\n")
        stream.flush()
