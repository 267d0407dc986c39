"""The figures docs/dataflow.md computes the paper's corpus on Dataflow from (issue #44 point 4 d).

One `bert-datagen run` per corpus of ../shared/corpora (English Wikipedia as WikiExtractor output,
Gutenberg books as text), with the defaults (the paper's recipe: 128 tokens, dupe factor 10), on
the DirectRunner with one worker, in a child process pinned to one core with a one-thread
tokenizer: what one Dataflow SDK worker process (one a vCPU) does. Per corpus:

- CPU seconds per MB of input (the process's user + system time) and wall seconds;
- words of input (whitespace-separated, markup lines left out) per MB, to scale to a corpus given
  in words;
- bytes each stage writes (spills, pools, fragments, shards, record indexes, small files), all kept
  in the output's staging prefix until the swap: the run's peak storage beside its input;
- the process's peak RSS (a worker's memory).

    .venv/bin/python -m benchmarks.dataflow_figures [--out FILE.json]

Takes under a minute here (40 s, vocab training included); the load averages before and after are in
the output: the machine may be shared.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CORPORA = REPO.parent / "shared" / "corpora"
INPUTS = {  # name -> (files, --input-format)
    # 4 KB: what a run costs whatever its input (Beam's start, two pipelines, the swap), taken off
    # the others' CPU seconds for their cost per MB.
    "fixed": (lambda: [CORPORA / "bert_sample_text" / "sample_text.txt"], "sentences"),
    "wikipedia": (lambda: sorted((CORPORA / "enwiki_extract_2015").glob("wiki_[0-9][0-9]")), "wikiextractor"),
    "books": (lambda: sorted((CORPORA / "gutenberg_en").glob("*.txt")), "text"),
}
STAGES = (  # a written file's stage, by where it lies in the staging prefix
    ("spills", re.compile(r"/work/read/")),
    ("pools", re.compile(r"/work/pools/")),
    ("fragments", re.compile(r"/work/parts/")),
    ("indexes", re.compile(r"/part-[^/]*\.tfrecord\.index")),
    ("shards", re.compile(r"/part-[^/]*\.tfrecord$")),
)
MARKUP = re.compile(r"^\s*</?doc[ >]")


def words_in(files: list[Path]) -> int:
    """Whitespace-separated words of the text, WikiExtractor's <doc> lines left out."""
    return sum(len(line.split()) for f in files for line in f.read_text(encoding="utf-8-sig").splitlines()
               if not MARKUP.match(line))


def measure_one(files: list[Path], input_format: str, vocab: Path, out: Path) -> dict:
    """In this (pinned, one-thread) process: one run on the DirectRunner with one worker."""
    from bert_datagen.datagen.config import DatagenConfig
    from bert_datagen.pipelines.beam import fsio
    from bert_datagen.pipelines.beam.runners import RunnerOptions
    from bert_datagen.pipelines.pretraining.run import generate_dataset

    written: dict[str, int] = {}
    files_written: dict[str, int] = {}
    original = fsio.write_atomic

    def counting_write(path: str, data: bytes) -> None:
        stage = next((name for name, pattern in STAGES if pattern.search(path)), "other")
        written[stage] = written.get(stage, 0) + len(data)
        files_written[stage] = files_written.get(stage, 0) + 1
        original(path, data)

    fsio.write_atomic = counting_write
    config = DatagenConfig(input_format=input_format)
    before = resource.getrusage(resource.RUSAGE_SELF)
    started = time.perf_counter()
    result = generate_dataset(config, inputs=[str(f) for f in files], vocab_path=str(vocab), output_dir=str(out),
                              runner=RunnerOptions(beam_args=("--direct_num_workers=1",)))
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_SELF)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    manifest = json.loads((out / "manifest.json").read_text())
    return {"wall_s": round(wall, 2), "cpu_s": round(cpu, 2), "cpu_s_by_step": result.cpu_seconds,
            "peak_rss_mb": round(after.ru_maxrss / 1024), "written_bytes": dict(sorted(written.items())),
            "written_files": dict(sorted(files_written.items())),
            "totals": {k: manifest["totals"].get(k) for k in ("documents", "tokens", "instances", "masked_tokens")},
            "config": {k: manifest["config"].get(k) for k in ("max_seq_length", "dupe_factor", "max_predictions_per_seq")},
            "shards": {split: len(info["shards"]) for split, info in manifest["splits"].items()}}


def child(name: str, vocab: str, out: str) -> None:
    files, input_format = INPUTS[name]
    files = files()
    row = measure_one(files, input_format, Path(vocab), Path(out))
    size = sum(f.stat().st_size for f in files)
    row.update({"input_bytes": size, "input_files": len(files), "input_format": input_format,
                "words": words_in(files)})
    print(json.dumps(row))


def run_child(name: str, vocab: Path, out: Path, core: int) -> dict:
    # One thread for the Rust tokenizer, as on a worker of several (pipelines/pretraining/run.py makes
    # the tokenizer single-threaded wherever a run has more than one worker), and one core.
    env = {**os.environ, "RAYON_NUM_THREADS": "1", "RAYON_RS_NUM_CPUS": "1", "TOKENIZERS_PARALLELISM": "false"}
    cmd = ["taskset", "-c", str(core), sys.executable, "-m", "benchmarks.dataflow_figures", "--child", name,
           str(vocab), str(out)]
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=REPO, timeout=1800)
    if done.returncode != 0:
        raise SystemExit(f"dataflow_figures: the {name} run failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def derived(row: dict, fixed_cpu_s: float) -> dict:
    mb = row["input_bytes"] / 1e6
    staged = sum(v for k, v in row["written_bytes"].items() if k not in ("shards", "indexes"))
    return {"input_mb": round(mb, 2), "cpu_s_per_mb": round(row["cpu_s"] / mb, 3),
            "marginal_cpu_s_per_mb": round((row["cpu_s"] - fixed_cpu_s) / mb, 3),
            "wall_s_per_mb": round(row["wall_s"] / mb, 3), "words_per_mb": round(row["words"] / mb),
            "staged_per_input_byte": round(staged / row["input_bytes"], 3),
            "shards_per_input_byte": round(row["written_bytes"].get("shards", 0) / row["input_bytes"], 3),
            "all_written_per_input_byte": round(sum(row["written_bytes"].values()) / row["input_bytes"], 3)}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, help="write the figures as JSON here too")
    parser.add_argument("--core", type=int, default=1, help="the core the runs are pinned to")
    parser.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        child(*args.child)
        return {}
    if not CORPORA.is_dir():
        raise SystemExit(f"dataflow_figures: {CORPORA} not found (the shared corpora)")
    from benchmarks.bench_datagen import train_vocab

    results: dict = {"load_before": os.getloadavg(), "cpus": os.cpu_count()}
    with tempfile.TemporaryDirectory(prefix="dataflow-figures-") as tmp:
        started = time.perf_counter()
        vocab, _ = train_vocab(INPUTS["wikipedia"][0](), Path(tmp) / "vocab.txt")
        results["vocab_s"] = round(time.perf_counter() - started, 1)
        for name in INPUTS:
            row = run_child(name, vocab, Path(tmp) / f"out-{name}", args.core)
            if name != "fixed":
                row["derived"] = derived(row, results["fixed"]["cpu_s"])
            results[name] = row
            print(f"{name}: {json.dumps(row)}", flush=True)
    results["load_after"] = os.getloadavg()
    if args.out:
        args.out.write_text(json.dumps(results, indent=1) + "\n")
    return results


if __name__ == "__main__":
    main()
