"""The tests marked `heavy` (pyproject.toml): long checks that the timed suite (`make test`, under
15 minutes on 2 cores) leaves out, each beside tests in the suite that hold the same promises. Run here so that `make bench` keeps them honest; fails when any of them fails.

    python -m benchmarks.bench_heavy_tests
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def main(argv: list[str] | None = None) -> dict:
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "pytest", "-n", "2", "-m", "heavy", "-q", "-p", "no:cacheprovider",
                           *(argv or [])], cwd=REPO, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    print(done.stdout[-3000:], flush=True)
    counts = {word: int(n) for n, word in re.findall(r"(\d+) (passed|failed|errors?|skipped)", done.stdout)}
    result = {"seconds": round(seconds, 1), **counts}
    if done.returncode != 0:
        raise RuntimeError(f"heavy tests failed (pytest exit {done.returncode}): {result}\n{done.stderr[-2000:]}")
    return result


if __name__ == "__main__":
    print(main(sys.argv[1:]))
