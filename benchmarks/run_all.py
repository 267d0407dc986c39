"""Run every benchmark and write their figures to .bench/results.json.

Each benchmark module has a `main()` that prints its own table and returns a
dict of figures; ratios inside a module are taken in the same run.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import time
import traceback
from pathlib import Path

BENCHMARKS = ("bench_vocab", "bench_zh", "bench_datagen", "bench_verify", "bench_tasks", "bench_trainer", "bench_finetune",
              "bench_order", "bench_loader_speed", "bench_loader_kinds", "bench_input_overhead", "bench_padding",
              "bench_multiworker", "bench_scale", "bench_raw_text",
              "bench_learning", "bench_buckets", "bench_heavy_tests")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("names", nargs="*", default=list(BENCHMARKS), help="benchmarks to run")
    parser.add_argument("--out", default=".bench/results.json")
    args = parser.parse_args(argv)
    results: dict[str, object] = {}
    failed = []
    for name in args.names:
        print(f"\n=== {name} ===", flush=True)
        start = time.perf_counter()
        try:
            module = importlib.import_module(f"benchmarks.{name}")
            results[name] = module.main()
        except Exception:  # report and go on: one broken benchmark must not hide the others
            traceback.print_exc()
            failed.append(name)
            results[name] = {"error": traceback.format_exc(limit=3)}
        print(f"--- {name}: {time.perf_counter() - start:.1f} s", flush=True)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2, sort_keys=True, default=str) + "\n")
    print(f"\nfigures written to {out}")
    if failed:
        print(f"failed benchmarks: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
