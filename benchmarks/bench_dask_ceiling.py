"""Dask's 2 local workers against the ceiling of any 2-worker run (issue #44 point 3).

``bench_scale``'s input (issue #32's enwiki sentences, one file), and per scale, interleaved and
repeated so that a shared machine's load falls on every kind alike: one DirectRunner worker
(``direct``), the DaskRunner on a local cluster of 2 workers (``dask-2``), the ceiling
(``halves-pinned``: the documents in two halves, each run at once by a one-worker process pinned to
a core: ``bench_scale.run_halves_pinned``) and, with ``--ref``, ``dask-2`` of the package at another
git ref (``dask-2-ref``: before and after in one sitting). Each run records the 1-minute load
average before and after it; every run of a scale must write the same shards.

The target: ``ceiling_over_dask`` = halves-pinned wall / dask-2 wall >= 0.9.

Run: ``python -m benchmarks.bench_dask_ceiling [--scales 10,100] [--repeats 2]
[--runs direct,dask-2,halves-pinned] [--ref REF] [--json PATH]``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks.bench_datagen import train_vocab
from benchmarks.bench_scale import base_documents, run_datagen, run_halves_pinned, write_scaled_input
from bert_datagen.contract.fs import LOCAL_FS

REPO = Path(__file__).resolve().parent.parent
RUNS = ("direct", "dask-2", "halves-pinned", "dask-2-ref")
DASK = ["--runner", "DaskRunner", "--dask-workers", "2"]


def ref_environment(ref: str, root: Path) -> dict[str, str]:
    """An environment whose ``bert_datagen`` is the package at git ``ref`` (unpacked under ``root``),
    checked, so that a run cannot measure the wrong code; Dask's workers inherit it."""
    root.mkdir(parents=True, exist_ok=True)
    archive = subprocess.run(["git", "archive", "--prefix=bert_datagen/", ref], cwd=REPO, check=True,
                             capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(root)], input=archive, check=True)
    # Compiled now, or the first run of that tree would compile every module it imports, in every process.
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(root)], check=True, capture_output=True)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")]))}
    where = subprocess.run([sys.executable, "-c", "import bert_datagen; print(list(bert_datagen.__path__)[0])"],
                           cwd=REPO, env=env, check=True, capture_output=True, text=True).stdout.strip()
    if Path(where).resolve() != (root / "bert_datagen").resolve():
        raise SystemExit(f"{Path(sys.argv[0]).stem}: the tree of {ref} is not the one imported ({where})")
    return env


def one_run(name: str, docs: list[list[str]], scale: int, inputs: list[Path], vocab: Path, root: Path,
            dupe_factor: int, ref_env: dict[str, str] | None) -> dict:
    load_before = os.getloadavg()[0]
    if name == "halves-pinned":
        r = run_halves_pinned(docs, scale, vocab, root, dupe_factor)
        row = {"wall_s": r["wall_s"], "cpu_s": r["cpu_s"], "instances": r["instances"]}
    else:
        extra = ["--direct_num_workers=1"] if name == "direct" else DASK
        r = run_datagen(inputs, vocab, root / f"out-{scale}-{name}", extra, dupe_factor,
                        env=ref_env if name == "dask-2-ref" else None)
        row = {"wall_s": round(r["wall_s"], 1), "cpu_s": round(r["cpu_s"], 1),
               "instances": r["manifest"]["totals"]["instances"],
               "shards": [s["sha256"] for s in r["manifest"]["splits"]["train"]["shards"]]}
    row.update(load_before=round(load_before, 2), load_after=round(os.getloadavg()[0], 2))
    return row


def measure(scales: list[int], runs: list[str], repeats: int, base_mb: float, dupe_factor: int, root: Path,
            ref_env: dict[str, str] | None) -> dict:
    docs = base_documents(base_mb)
    vocab, _ = train_vocab(write_scaled_input(docs, 1, root / "in-1", 1), root / "vocab.txt")
    results: dict = {"base_mb": base_mb, "dupe_factor": dupe_factor, "scales": {}}
    for scale in scales:
        inputs = write_scaled_input(docs, scale, root / f"in-{scale}", 1)
        rows: dict[str, list[dict]] = {name: [] for name in runs}
        for repeat in range(repeats):
            # Interleaved, and each repeat in the other order: a load that comes or goes mid-sitting
            # falls on every kind of run.
            for name in (runs if repeat % 2 == 0 else runs[::-1]):
                row = one_run(name, docs, scale, inputs, vocab, root, dupe_factor, ref_env)
                rows[name].append(row)
                shown = {k: v for k, v in row.items() if k != "shards"}
                print(f"{scale}x {name} #{repeat + 1}: {json.dumps(shown)}", flush=True)
        summary: dict = {"runs": rows}
        for name, got in rows.items():
            summary[f"{name}_median_wall_s"] = round(statistics.median(r["wall_s"] for r in got), 1)
        if "dask-2" in rows and "halves-pinned" in rows:
            # Run by run: each dask-2 run with the ceiling run next to it in the sitting.
            summary["ceiling_over_dask"] = [round(c["wall_s"] / d["wall_s"], 3)
                                            for c, d in zip(rows["halves-pinned"], rows["dask-2"], strict=True)]
        if "dask-2-ref" in rows and "halves-pinned" in rows:
            summary["ceiling_over_dask_ref"] = [round(c["wall_s"] / d["wall_s"], 3) for c, d in
                                                zip(rows["halves-pinned"], rows["dask-2-ref"], strict=True)]
        shards = {json.dumps(r["shards"]) for got in rows.values() for r in got if "shards" in r}
        summary["identical_shards"] = len(shards) <= 1
        summary["identical_instances"] = len({r["instances"] for got in rows.values() for r in got}) == 1
        for got in rows.values():
            for r in got:
                r.pop("shards", None)
        results["scales"][str(scale)] = summary
        print(f"{scale}x: {json.dumps({k: v for k, v in summary.items() if k != 'runs'})}", flush=True)
    return results


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--scales", default="10,100")
    parser.add_argument("--runs", default="direct,dask-2,halves-pinned",
                        help=f"kinds of run, in the order of the first repeat, from {', '.join(RUNS)}")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--ref", default=None, help="a git ref whose package dask-2-ref runs (needs that run kind)")
    parser.add_argument("--base-mb", type=float, default=4.36)
    parser.add_argument("--dupe-factor", type=int, default=10)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv if argv is not None else [])
    runs = [r for r in args.runs.split(",") if r]
    unknown = [r for r in runs if r not in RUNS]
    if unknown:
        parser.error(f"--runs: unknown kind {unknown[0]!r}, not one of {', '.join(RUNS)}")
    if ("dask-2-ref" in runs) != (args.ref is not None):
        parser.error("--ref and the run kind dask-2-ref go together")
    if args.repeats < 1:
        parser.error("--repeats must be at least 1")
    with tempfile.TemporaryDirectory(prefix="bench-dask-ceiling-") as tmp:
        ref_env = ref_environment(args.ref, Path(tmp) / "ref") if args.ref else None
        results = measure([int(s) for s in args.scales.split(",") if s], runs, args.repeats, args.base_mb,
                          args.dupe_factor, Path(tmp), ref_env)
    results["ref"] = args.ref
    results["cpu_cores"] = len(os.sched_getaffinity(0))
    if args.json:
        LOCAL_FS.write_atomic(str(args.json), (json.dumps(results, indent=1) + "\n").encode())
    return results


if __name__ == "__main__":
    main(sys.argv[1:])
