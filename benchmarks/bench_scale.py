"""`bert-datagen run` as the corpus grows: seconds per MB, peak RSS of the process tree, the ratio to
tokenizing once, DirectRunner against Dask.

Input (issue #32's shape): English Wikipedia in the original one-sentence-per-line format
(``--input-format sentences``), built from ../shared/corpora/enwiki_extract_2015: every article is
cut at its section headings into documents (a section is a document, as in corpora split by
section) and its paragraphs into sentences at ``. `` / ``? `` / ``! `` before a capital letter.
The ``1x`` input is the first ``--base-mb`` MB of those documents, all distinct; ``Nx`` is the 1x
documents followed by N-1 seeded variants of each (its sentences in another order, so every variant
is a new document with its own identity), written as ``--files`` files of equal size.

Runs, each a fresh ``bert-datagen run`` process: the default (in-memory DirectRunner, one worker),
and at ``--dask-scales`` the DirectRunner with 2 worker processes and the DaskRunner on a local
cluster of 2 workers (speedups against the one-worker run), and the bound on any 2-worker run: the
same documents dealt into two halves, run at once by two one-worker processes pinned to a core each
(``bound_speedup``; the one-worker run's tokenizer already uses the second core part of the time,
so on 2 cores this is under 2x). Peak RSS is the largest sum of RSS over
the process and all its children, sampled every 0.1 s; ``largest_process_rss_mb`` the largest one
process reached (a Dask worker's bound). The floor: tokenizing the same text
once with plain ``tokenizers`` on one thread (``bench_datagen``'s floor).

Issue #44's inputs, in the formats users have (``benchmarks.scale_corpora``), on the default runner:
``--wiki-scales`` copies of the Wikipedia extract as one WikiExtractor file (whole articles, a few
thousand tokens each) and ``--books`` Gutenberg book files (``--input-format text``, a book a
document, hundreds of KB each): peak RSS of the process tree, wall and CPU seconds, NotNext pools.

Run: ``python -m benchmarks.bench_scale [--scales 1,10,100] [--dask-scales 10] [--files 1]
[--wiki-scales 6,12,24] [--books 200]``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil

from benchmarks.bench_datagen import corpus_files, tokenize_floor, train_vocab, tree_sample
from benchmarks.scale_corpora import write_book_variants, write_wikiextractor_variants

REPO = Path(__file__).resolve().parent.parent
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z\"'(])")
RUN_TIMEOUT_S = 3 * 3600  # one run of the largest scale on 2 cores takes well under this
_HEADING = re.compile(r"^[^.]{1,80}\.$")


def wiki_documents(files: list[Path]) -> list[list[str]]:
    """The corpus's sections as documents, each a list of sentences."""
    docs: list[list[str]] = []
    current: list[str] = []
    for f in files:
        for line in f.read_text(encoding="utf-8").split("\n"):
            line = line.strip()
            if line.startswith("<doc") or line.startswith("</doc") or _HEADING.match(line):
                if len(current) > 1:
                    docs.append(current)
                current = []
                continue
            if line:
                current.extend(s for s in _SENTENCE_END.split(line) if s.strip())
    if len(current) > 1:
        docs.append(current)
    return docs


def base_documents(base_mb: float) -> list[list[str]]:
    """The 1x documents: the first ``base_mb`` MB of the corpus's sections."""
    out, size = [], 0
    for doc in wiki_documents(corpus_files()):
        out.append(doc)
        size += sum(len(s.encode()) + 1 for s in doc) + 1
        if size >= base_mb * 1e6:
            break
    return out


def write_scaled_input(docs: list[list[str]], scale: int, folder: Path, files: int = 1, seed: int = 0) -> list[Path]:
    """``scale`` copies of ``docs``: the first as they are, each further one with every document's
    sentences in a seeded order (a new document each), dealt into ``files`` files in turn."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = [folder / f"part-{i:03d}.txt" for i in range(files)]
    handles = [p.open("w", encoding="utf-8") for p in paths]
    try:
        n = 0
        for copy in range(scale):
            rng = random.Random(f"{seed}-{copy}")
            for doc in docs:
                sentences = list(doc)
                if copy:
                    rng.shuffle(sentences)
                handles[n % files].write("\n".join(sentences) + "\n\n")
                n += 1
    finally:
        for h in handles:
            h.close()
    return paths


def run_datagen(inputs: list[Path], vocab: Path, out: Path, extra: list[str], dupe_factor: int = 10,
                trace: list | None = None, cpus: set[int] | None = None, input_format: str = "sentences",
                env: dict[str, str] | None = None) -> dict:
    """One ``bert-datagen run`` process: wall seconds, peak RSS of its process tree, its manifest.
    ``trace`` (when given) gets (seconds, tree RSS bytes) every sample: the memory curve; ``cpus``
    (when given) pins the process and its threads to those cores; ``env`` (when given) is its
    environment (another checkout of the package on PYTHONPATH, for a before/after pair)."""
    cmd = [sys.executable, "-m", "bert_datagen.pipelines.cli", "run", *sum((["--input", str(p)] for p in inputs), []),
           "--vocab", str(vocab), "--output", str(out), "--input-format", input_format, "--max-seq-length", "128",
           "--max-predictions-per-seq", "20", "--dupe-factor", str(dupe_factor), "--overwrite", *extra]
    start = time.perf_counter()
    # stderr to a file: the run's progress lines would fill a pipe nobody reads while we sample.
    with tempfile.TemporaryFile("w+") as err_file:
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err_file, text=True, cwd=REPO,
                                start_new_session=True, env=env,
                                preexec_fn=None if cpus is None else lambda: os.sched_setaffinity(0, cpus))
        try:
            ps = psutil.Process(proc.pid)
            peak = 0
            cpu_seen: dict[int, float] = {}
            peaks: dict[int, int] = {}
            while proc.poll() is None:
                if time.perf_counter() - start > RUN_TIMEOUT_S:
                    raise RuntimeError(f"bert-datagen run did not finish within {RUN_TIMEOUT_S} s")
                rss = tree_sample(ps, cpu_seen, peaks)
                peak = max(peak, rss)
                if trace is not None:
                    trace.append((round(time.perf_counter() - start, 2), rss))
                time.sleep(0.1)
            wall = time.perf_counter() - start
        finally:
            if proc.poll() is None:  # the run and its workers (a Dask cluster) with it
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(30)
        err_file.seek(0)
        err = err_file.read()
    if proc.returncode != 0:
        raise RuntimeError(f"bert-datagen run failed ({proc.returncode}):\n{err[-4000:]}")
    manifest = json.loads((out / "manifest.json").read_text())
    return {"wall_s": wall, "cpu_s": sum(cpu_seen.values()), "peak_rss_mb": peak / 2**20,
            "largest_process_rss_mb": max(peaks.values(), default=0) / 2**20, "manifest": manifest, "stderr": err}


def run_halves_pinned(docs: list[list[str]], scale: int, vocab: Path, root: Path, dupe_factor: int,
                      env: dict[str, str] | None = None) -> dict:
    """The most two workers can win on this machine: the input's documents dealt into two halves, each
    run at once by its own one-worker process pinned to its own core (no coordination, no shuffle,
    nothing shared). Their slower wall time is the floor of any 2-worker run of the whole input.
    The halves are written once per scale (``root``); ``env``: as ``run_datagen``'s."""
    folder = root / f"in-{scale}-halves"
    halves = sorted(folder.glob("part-*.txt")) or write_scaled_input(docs, scale, folder, 2)
    cores = sorted(os.sched_getaffinity(0))[:2]
    results: list[dict] = [{}, {}]

    def one(i: int) -> None:
        results[i] = run_datagen([halves[i]], vocab, root / f"out-{scale}-half-{i}", ["--direct_num_workers=1"],
                                 dupe_factor, cpus={cores[i]}, env=env)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if not all(results):
        raise RuntimeError("a pinned half did not finish")
    return {"wall_s": round(max(r["wall_s"] for r in results), 1),
            "cpu_s": round(sum(r["cpu_s"] for r in results), 1),
            "instances": sum(r["manifest"]["totals"]["instances"] for r in results)}


def measure(scales: list[int], dask_scales: list[int], files: int, base_mb: float, dupe_factor: int,
            root: Path) -> dict:
    docs = base_documents(base_mb)
    vocab, _ = train_vocab(write_scaled_input(docs, 1, root / "in-1", 1), root / "vocab.txt")
    results: dict = {"base_mb": base_mb, "dupe_factor": dupe_factor, "files": files, "scales": {}}
    for scale in sorted(set(scales) | set(dask_scales)):
        inputs = write_scaled_input(docs, scale, root / f"in-{scale}", files)
        mb = sum(p.stat().st_size for p in inputs) / 1e6
        floor = tokenize_floor(vocab, inputs, repeats=1)
        row: dict = {"input_mb": round(mb, 2), "floor_s": round(floor["seconds"], 2),
                     "floor_cpu_s": round(floor["cpu_seconds"], 2)}
        runs = {"direct": ["--direct_num_workers=1"]} if scale in scales else {}
        if scale in dask_scales:  # 2 workers each way, for what Dask itself costs
            runs["direct-2"] = ["--direct_num_workers=2"]
            runs["dask-2"] = ["--runner", "DaskRunner", "--dask-workers", "2"]
        for name, extra in runs.items():
            r = run_datagen(inputs, vocab, root / f"out-{scale}-{name}", extra, dupe_factor)
            row[name] = {"wall_s": round(r["wall_s"], 1), "cpu_s": round(r["cpu_s"], 1),
                         "s_per_mb": round(r["wall_s"] / mb, 3), "peak_rss_mb": round(r["peak_rss_mb"]),
                         "largest_process_rss_mb": round(r["largest_process_rss_mb"]),
                         "x_floor": round(r["wall_s"] / floor["seconds"], 2),
                         "cpu_x_floor": round(r["cpu_s"] / floor["cpu_seconds"], 2),
                         "documents": r["manifest"]["totals"]["documents"],
                         "instances": r["manifest"]["totals"]["instances"],
                         "shards": [s["sha256"] for s in r["manifest"]["splits"]["train"]["shards"]],
                         # A range read twice would count its sentences and duplicates twice.
                         "totals": r["manifest"]["totals"],
                         "reads": read_count(r["stderr"])}
            shown = {k: v for k, v in row[name].items() if k not in ("shards", "totals")}
            print(f"{scale}x {name}: {json.dumps(shown)}", flush=True)
        if "direct" in row and "dask-2" in row:
            if len(getattr(os, "sched_getaffinity", lambda _: ())(0)) >= 2:  # pinning: Linux
                row["halves-pinned"] = run_halves_pinned(docs, scale, vocab, root, dupe_factor)
                print(f"{scale}x halves-pinned: {json.dumps(row['halves-pinned'])}", flush=True)
                row["bound_speedup"] = round(row["direct"]["wall_s"] / row["halves-pinned"]["wall_s"], 2)
            for name in ("dask-2", "direct-2"):
                row[f"{name}_speedup"] = round(row["direct"]["wall_s"] / row[name]["wall_s"], 2)
            row["identical_shards"] = row["direct"]["shards"] == row["dask-2"]["shards"] == row["direct-2"]["shards"]
            row["identical_totals"] = row["direct"]["totals"] == row["dask-2"]["totals"] == row["direct-2"]["totals"]
        for name in runs:
            row[name].pop("shards")
            row[name].pop("totals")
        results["scales"][str(scale)] = row
    return results


def measure_formats(wiki_scales: list[int], books: list[int], vocab: Path, dupe_factor: int, root: Path) -> dict:
    """One default run (in-memory DirectRunner, one worker) per input of issue #44: peak RSS, time, pools."""
    # Each input written just before its run and removed after it: hundreds of MB each.
    inputs = [("wikiextractor", f"{scale}x", "wikiextractor",
               lambda scale=scale: [write_wikiextractor_variants(scale, root / f"wiki-{scale}" / "wiki.xml")])
              for scale in wiki_scales]
    inputs += [("books", str(count), "text", lambda count=count: write_book_variants(count, root / f"books-{count}"))
               for count in books]
    results: dict = {"wikiextractor": {}, "books": {}}
    for kind, name, input_format, write in inputs:
        paths = write()
        pattern = [paths[0]] if len(paths) == 1 else [paths[0].parent / "*.txt"]
        r = run_datagen(pattern, vocab, root / f"out-{kind}-{name}", ["--direct_num_workers=1"], dupe_factor,
                        input_format=input_format)
        totals = r["manifest"]["totals"]
        row = {"input_mb": round(sum(p.stat().st_size for p in paths) / 1e6, 1), "files": len(paths),
               "wall_s": round(r["wall_s"], 1), "cpu_s": round(r["cpu_s"], 1), "peak_rss_mb": round(r["peak_rss_mb"]),
               "largest_process_rss_mb": round(r["largest_process_rss_mb"]),
               **{k: totals.get(k) for k in ("documents", "duplicate_documents", "tokens", "instances",
                                             "notnext_pools", "notnext_same_document")}}
        results[kind][name] = row
        print(f"{kind} {name}: {json.dumps(row)}", flush=True)
        for path in paths:  # written by this function in its scratch root: only one input on disk at a time
            path.unlink()
    return results


def read_count(stderr: str) -> int:
    """Files read, from the progress lines: each process's last count of files (a lower bound where a
    process reports per task, as Dask's workers do: compare ``identical_totals`` instead)."""
    last: dict[str, int] = {}
    for line in stderr.splitlines():
        m = re.match(r"bert-datagen \[pid (\d+), [^\]]*\]: ([\d,]+) files", line)
        if m:
            last[m.group(1)] = int(m.group(2).replace(",", ""))
    return sum(last.values())


def plot(results: dict, path: Path, before_rss: dict[str, dict[float, float]] | None = None) -> None:
    """Time and peak RSS against input size; ``before_rss``: other curves of peak RSS (label -> MB -> MB)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = sorted((r["input_mb"], r["direct"]) for r in results["scales"].values() if "direct" in r)
    mb = [m for m, _ in rows]
    fig, (left, right) = plt.subplots(1, 2, figsize=(11.5, 3.8))
    # CPU seconds first: on a shared machine they move far less than wall times.
    left.plot(mb, [r["cpu_s"] for _, r in rows], "s-", color="C0", label="sentences: run, CPU s (all processes)")
    floors = sorted((r["input_mb"], r["floor_cpu_s"]) for r in results["scales"].values())
    left.plot([m for m, _ in floors], [f for _, f in floors], "^:", color="C1", label="sentences: tokenize once, CPU s")
    left.plot(mb, [r["wall_s"] for _, r in rows], "o--", color="C0", alpha=0.4, label="sentences: run, wall s")
    right.plot(mb, [r["peak_rss_mb"] for _, r in rows], "o-", color="C0", label="sentences")
    # Issue #44's inputs: whole articles and books, the same colour in both panels.
    for kind, marker, colour in (("wikiextractor", "D-", "C2"), ("books", "v-", "C3")):
        runs = sorted((r["input_mb"], r) for r in results.get(kind, {}).values())
        if runs:
            left.plot([m for m, _ in runs], [r["cpu_s"] for _, r in runs], marker, color=colour,
                      label=f"{kind}: run, CPU s")
            right.plot([m for m, _ in runs], [r["peak_rss_mb"] for _, r in runs], marker, color=colour, label=kind)
    right.axhline(1024, color="grey", lw=0.8, ls=":", label="1 GiB")
    for label, before in (before_rss or {}).items():
        right.plot(sorted(before), [before[m] for m in sorted(before)], "x:", label=label)
    left.set_xlabel("input MB")
    left.set_ylabel("seconds")
    left.legend(fontsize=7)
    right.set_xlabel("input MB")
    right.set_ylabel("peak RSS of the process tree, MB")
    right.set_ylim(bottom=0)
    right.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))  # beside: no point hidden
    fig.suptitle(f"bert-datagen run, one worker, dupe_factor {results.get('dupe_factor', 10)}: enwiki sentences "
                 "(issue #32), whole articles (WikiExtractor) and Gutenberg books (issue #44)", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--scales", default="1,10,100", help="scales run on the default runner")
    parser.add_argument("--dask-scales", default="10", help="scales also run on Dask, 2 local workers ('' for none)")
    parser.add_argument("--files", type=int, default=1, help="input files each scale is written as")
    parser.add_argument("--base-mb", type=float, default=4.36, help="size of the 1x input")
    parser.add_argument("--dupe-factor", type=int, default=10)
    parser.add_argument("--wiki-scales", default="6,12,24",
                        help="copies of the Wikipedia extract as one WikiExtractor file ('' for none)")
    parser.add_argument("--books", default="200", help="Gutenberg book files made from the shared books ('' for none)")
    parser.add_argument("--plot", type=Path, default=None, help="write the time and memory curve (PNG)")
    parser.add_argument("--json", type=Path, default=None, help="write the figures (JSON)")
    args = parser.parse_args(argv if argv is not None else [])
    with tempfile.TemporaryDirectory(prefix="bench-scale-") as tmp:
        results = measure(_ints(args.scales), _ints(args.dask_scales), args.files, args.base_mb, args.dupe_factor,
                          Path(tmp))
        results.update(measure_formats(_ints(args.wiki_scales), _ints(args.books), Path(tmp) / "vocab.txt",
                                       args.dupe_factor, Path(tmp)))
    results["cpu_cores"] = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    if args.json:
        args.json.write_text(json.dumps(results, indent=1) + "\n")
    if args.plot:
        plot(results, args.plot)
    print(json.dumps(results, indent=1))
    return results


if __name__ == "__main__":
    main(sys.argv[1:])
