"""`bert-datagen run` on real Wikipedia text: speed, memory, and the ratio to a tokenize-once floor.

Corpus: ../shared/corpora/enwiki_extract_2015 (WikiExtractor format), max_seq_length 128,
dupe_factor 10. Each run is a separate `bert-datagen run` process; peak RSS is the largest sum of
RSS over that process and all its children (Beam's worker processes), sampled every 0.1 s.

The floor: tokenizing the same text once with plain `tokenizers` (BertNormalizer +
BertPreTokenizer + WordPiece on the same vocab) on one thread, in its own process.

Runs (each a fresh process, one after the other, in this order, so that the ratios are taken in
one sitting on the same machine state):

- ``1``: ``--direct_num_workers 1``, what ``bert-datagen run`` does by default: the in-memory
  DirectRunner; its one worker may spread tokenizing over the machine's idle cores.
- ``1-core``: the same with ``TOKENIZERS_PARALLELISM=false``: one worker on one core throughout,
  the strict reading of "one worker" against a one-thread floor.
- ``1-mp``: ``--direct_num_workers 1 --direct_running_mode multi_processing``: one worker process,
  the engine that ``2`` uses (a separate SDK worker process).
- ``2``: ``--direct_num_workers 2`` (multi_processing): two worker processes, one core each.

The two-worker ceiling: the ``1-core`` run's wall time outside its tasks (start-up, stage changes,
shutdown: ``wall outside tasks``) is serial, and its tasks' CPU seconds can at best be halved by two
workers. ``outside + task CPU / 2`` is therefore the shortest wall time any two-worker run could
have if running two workers cost nothing at all (no worker processes to start, no extra data
movement, each worker on a core of its own); the bench prints the speed-up that bound allows next
to the one measured. On a 2-core machine it lies below a 1.7x target (see
docs/pipeline.md).

The machine may be shared (wall times of one run here vary by 10-20%), so every run is repeated
``--repeats`` times, the rounds interleaved (1, 1-core, 1-mp, 2, 1, 1-core, ...), and the fastest
wall time of each is kept, as for the floor (its peak RSS is the largest seen).

Run: `python -m benchmarks.bench_datagen [--runs 1,1-core,1-mp,2] [--repeats 2] [--dupe-factor 10] [--profile]`.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parent.parent
CORPUS = REPO.parent / "shared" / "corpora" / "enwiki_extract_2015"


def corpus_files() -> list[Path]:
    files = sorted(CORPUS.glob("wiki_[0-9][0-9]"))
    if not files:
        raise SystemExit(f"bench_datagen: corpus not found at {CORPUS}")
    return files


def train_vocab(files: list[Path], out: Path, size: int = 30522) -> tuple[Path, str]:
    """A WordPiece vocab of the corpus, trained by the project's own (deterministic) trainer."""
    from bert_datagen.contract.fs import LOCAL_FS
    from bert_datagen.contract.vocab_io import write_vocab
    from bert_datagen.vocab.train import train_vocab as project_trainer

    texts = (line for f in files for line in f.read_text(encoding="utf-8").split("\n") if line.strip())
    write_vocab(project_trainer(texts, size, True), str(out), LOCAL_FS)
    return out, "bert_datagen.vocab.train"


FLOOR_SCRIPT = r"""
import json, sys, time
from tokenizers import Tokenizer, models, normalizers, pre_tokenizers
vocab_path, files = sys.argv[1], sys.argv[2:]
tokens = open(vocab_path, encoding="utf-8").read().split("\n")
vocab = {t: i for i, t in enumerate(t for t in tokens if t)}
tok = Tokenizer(models.WordPiece(vocab, unk_token="[UNK]", max_input_chars_per_word=200))
tok.normalizer = normalizers.BertNormalizer(lowercase=True)
tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
lines = []
for f in files:
    lines.extend(l for l in open(f, encoding="utf-8").read().split("\n") if l.strip())
start, cpu = time.perf_counter(), time.process_time()
n = 0
for i in range(0, len(lines), 1000):
    n += sum(len(e.ids) for e in tok.encode_batch(lines[i:i + 1000], add_special_tokens=False))
print(json.dumps({"seconds": time.perf_counter() - start, "cpu_seconds": time.process_time() - cpu, "tokens": n}))
"""


def tokenize_floor(vocab: Path, files: list[Path], repeats: int = 2) -> dict:
    """The fastest of ``repeats`` runs (the machine may be shared: the minimum is the floor)."""
    runs = [_tokenize_once(vocab, files) for _ in range(repeats)]
    return {"seconds": min(r["seconds"] for r in runs), "cpu_seconds": min(r["cpu_seconds"] for r in runs),
            "tokens": runs[0]["tokens"]}


def _tokenize_once(vocab: Path, files: list[Path]) -> dict:
    env = {**os.environ, "RAYON_RS_NUM_CPUS": "1", "RAYON_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    done = subprocess.run([sys.executable, "-c", FLOOR_SCRIPT, str(vocab), *map(str, files)],
                          capture_output=True, text=True, env=env, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def tree_sample(proc: psutil.Process, cpu_seen: dict[int, float], peaks: dict[int, int] | None = None) -> int:
    """RSS summed over the process tree now; records each process's latest CPU seconds (and, given
    ``peaks``, each process's largest RSS so far)."""
    total = 0
    try:
        procs = [proc, *proc.children(recursive=True)]
    except psutil.NoSuchProcess:
        return 0
    for p in procs:
        try:
            with p.oneshot():
                rss = p.memory_info().rss
                total += rss
                if peaks is not None:
                    peaks[p.pid] = max(peaks.get(p.pid, 0), rss)
                times = p.cpu_times()
                cpu_seen[p.pid] = times.user + times.system
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass
    return total


# name -> (extra bert-datagen arguments, extra environment)
RUNS: dict[str, tuple[list[str], dict[str, str]]] = {
    "1": (["--direct_num_workers=1"], {}),
    "1-core": (["--direct_num_workers=1"], {"TOKENIZERS_PARALLELISM": "false"}),
    "1-mp": (["--direct_num_workers=1", "--direct_running_mode=multi_processing"], {}),
    "2": (["--direct_num_workers=2"], {}),
}


WORKERS = {"1": 1, "1-core": 1, "1-mp": 1, "2": 2}


def run_datagen(vocab: Path, out: Path, run: str, dupe_factor: int, profile: Path | None = None) -> dict:
    cmd = [sys.executable]
    if profile is not None:
        cmd += ["-m", "cProfile", "-o", str(profile)]
    cmd += ["-m", "bert_datagen.pipelines.cli", "run", "--input", str(CORPUS / "wiki_[0-9][0-9]"), "--vocab", str(vocab),
            "--output", str(out), "--input-format", "wikiextractor", "--max-seq-length", "128",
            "--max-predictions-per-seq", "20", "--dupe-factor", str(dupe_factor), "--overwrite"]
    extra_args, extra_env = RUNS[run]
    if profile is None:  # the profiled run stays in one process (in-memory DirectRunner) so cProfile sees it
        cmd += extra_args
    env = {k: v for k, v in os.environ.items() if k != "TOKENIZERS_PARALLELISM"} | extra_env
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO, env=env)
    ps = psutil.Process(proc.pid)
    peak = 0
    cpu_seen: dict[int, float] = {}
    while proc.poll() is None:
        peak = max(peak, tree_sample(ps, cpu_seen))
        time.sleep(0.1)
    wall = time.perf_counter() - start
    _, err = proc.communicate()
    # CPU of every process as last sampled (up to 0.1 s before it ended), summed over the tree.
    cpu = sum(cpu_seen.values())
    if proc.returncode != 0:
        raise RuntimeError(f"bert-datagen run failed ({proc.returncode}):\n{err[-4000:]}")
    manifest = json.loads((out / "manifest.json").read_text())
    return {"wall_s": wall, "cpu_s": cpu, "peak_rss_mb": peak / 2**20, "manifest": manifest,
            "task_cpu_s": task_cpu_seconds(err)}


def task_cpu_seconds(stderr: str) -> dict[str, float]:
    """The summary table's "CPU seconds in tasks" line: {read: s, build: s, write: s}."""
    for line in stderr.splitlines():
        if "CPU seconds in tasks" in line:
            pairs = line.split("CPU seconds in tasks", 1)[1].split(",")
            return {k: float(v.replace(",", "")) for k, v in (p.split() for p in pairs)}
    return {}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", default="1,1-core,1-mp,2", help=f"runs, of {', '.join(RUNS)}")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--dupe-factor", type=int, default=10)
    parser.add_argument("--profile", action="store_true", help="also profile an in-memory run (cProfile)")
    args = parser.parse_args(argv if argv is not None else [])
    files = corpus_files()
    input_mb = sum(f.stat().st_size for f in files) / 1e6
    results: dict = {"input_mb": round(input_mb, 3), "dupe_factor": args.dupe_factor, "runs": {}}
    with tempfile.TemporaryDirectory(prefix="bench-datagen-") as tmp:
        tmp_path = Path(tmp)
        t0 = time.perf_counter()
        vocab, results["vocab_trainer"] = train_vocab(files, tmp_path / "vocab.txt")
        results["vocab_train_s"] = round(time.perf_counter() - t0, 2)
        floor = tokenize_floor(vocab, files)
        results["floor_s"] = round(floor["seconds"], 3)
        results["floor_cpu_s"] = round(floor["cpu_seconds"], 3)
        results["floor_tokens"] = floor["tokens"]
        best: dict[str, dict] = {}
        for _ in range(args.repeats):
            for name in args.runs.split(","):
                run = run_datagen(vocab, tmp_path / f"out-{name}", name, args.dupe_factor)
                seen = best.get(name)
                if seen is not None:
                    run["peak_rss_mb"] = max(run["peak_rss_mb"], seen["peak_rss_mb"])
                    if seen["wall_s"] <= run["wall_s"]:
                        seen["peak_rss_mb"] = run["peak_rss_mb"]
                        continue
                best[name] = run
        for name, run in best.items():
            totals = run["manifest"]["totals"]
            results["runs"][name] = {
                "wall_s": round(run["wall_s"], 2),
                "documents": totals["documents"],
                "tokens": totals["tokens"],
                "instances": totals["instances"],
                "mb_per_s": round(input_mb / run["wall_s"], 3),
                "instances_per_s": round(totals["instances"] / run["wall_s"], 1),
                "peak_rss_mb": round(run["peak_rss_mb"], 1),
                "ratio_to_floor": round(run["wall_s"] / floor["seconds"], 2),
                "cpu_s": round(run["cpu_s"], 1),
                "cpu_ratio_to_floor": round(run["cpu_s"] / floor["cpu_seconds"], 2),
                "task_cpu_s": run["task_cpu_s"],
                # Wall time the tasks' own CPU time does not explain, with the work split evenly over
                # the workers: the runner's start-up, stage changes, shuffles and shutdown.
                "outside_tasks_s": round(run["wall_s"] - sum(run["task_cpu_s"].values()) / WORKERS[name], 2),
                "shards_sha256": [s["sha256"] for s in run["manifest"]["splits"]["train"]["shards"]],
            }
        if args.profile:
            prof = tmp_path / "datagen.prof"
            run_datagen(vocab, tmp_path / "outprof", "1", args.dupe_factor, profile=prof)
            import pstats

            stats = pstats.Stats(str(prof))
            stats.sort_stats("cumulative").print_stats(25)
    runs = results["runs"]
    results["cpu_cores"] = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    if "2" in runs:
        for base in ("1", "1-core", "1-mp"):
            if base in runs:
                results[f"speedup_2_vs_{base}"] = round(runs[base]["wall_s"] / runs["2"]["wall_s"], 2)
    if "1-core" in runs:
        results.update(two_worker_ceiling(runs))
    digests = {tuple(r["shards_sha256"]) for r in runs.values()}
    results["identical_shards_all_runs"] = len(digests) == 1
    for run in runs.values():
        run.pop("shards_sha256")
    print_table(results)
    return results


def two_worker_ceiling(runs: dict) -> dict:
    """The best two-worker wall time the ``1-core`` run allows (its serial part plus half its task
    CPU), and the speed-up over each one-worker run that it would give."""
    one = runs["1-core"]
    bound = one["outside_tasks_s"] + sum(one["task_cpu_s"].values()) / 2
    out = {"two_worker_bound_s": round(bound, 2)}
    for base in ("1", "1-core", "1-mp"):
        if base in runs:
            out[f"ceiling_2_vs_{base}"] = round(runs[base]["wall_s"] / bound, 2)
    return out


def print_table(results: dict) -> None:
    print(f"input {results['input_mb']:.2f} MB, dupe_factor {results['dupe_factor']}, "
          f"floor (tokenizers, 1 thread, tokenize once) {results['floor_s']:.2f} s "
          f"for {results['floor_tokens']:,} tokens")
    print("(x floor: wall time / floor wall time; cpu x floor: CPU seconds of all processes / floor CPU seconds,"
          " which a busy shared machine distorts less)")
    header = ("run", "documents", "tokens", "instances", "wall s", "MB/s", "inst/s", "peak RSS MB", "x floor",
              "cpu s", "cpu x floor", "task cpu s (read/build/write)", "wall outside tasks s")
    print(" | ".join(header))
    for name, r in results["runs"].items():
        print(" | ".join(str(x) for x in (name, r["documents"], r["tokens"], r["instances"], r["wall_s"],
                                         r["mb_per_s"], r["instances_per_s"], r["peak_rss_mb"], r["ratio_to_floor"],
                                         r["cpu_s"], r["cpu_ratio_to_floor"],
                                         "/".join(f"{r['task_cpu_s'].get(k, 0.0):.1f}" for k in ("read", "build", "write")),
                                         r["outside_tasks_s"])))
    for key, value in results.items():
        if key.startswith("speedup_2_vs_"):
            base = key.removeprefix("speedup_2_vs_")
            ceiling = results.get(f"ceiling_2_vs_{base}")
            allowed = f" (ceiling {ceiling}x, were two workers free)" if ceiling else ""
            print(f"2 workers vs {base}: {value}x faster{allowed}")
    if "two_worker_bound_s" in results:
        print(f"two-worker bound on this {results['cpu_cores']}-core machine: {results['two_worker_bound_s']} s "
              "(1-core run's wall outside tasks + half its task CPU)")
    print(f"identical shards in every run: {results['identical_shards_all_runs']}")


if __name__ == "__main__":
    main(sys.argv[1:])
