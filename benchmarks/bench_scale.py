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
and with ``--dask`` the DaskRunner on a local cluster of 2 workers. Peak RSS is the largest sum of
RSS over the process and all its children, sampled every 0.1 s. The floor: tokenizing the same text
once with plain ``tokenizers`` on one thread (``bench_datagen``'s floor).

Run: ``python -m benchmarks.bench_scale [--scales 1,10,20] [--dask] [--files 1]``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

from benchmarks.bench_datagen import corpus_files, tokenize_floor, train_vocab, tree_sample

REPO = Path(__file__).resolve().parent.parent
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z\"'(])")
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
                trace: list | None = None) -> dict:
    """One ``bert-datagen run`` process: wall seconds, peak RSS of its process tree, its manifest.
    ``trace`` (when given) gets (seconds, tree RSS bytes) every sample: the memory curve."""
    cmd = [sys.executable, "-m", "bert_datagen.pipelines.cli", "run", *sum((["--input", str(p)] for p in inputs), []),
           "--vocab", str(vocab), "--output", str(out), "--input-format", "sentences", "--max-seq-length", "128",
           "--max-predictions-per-seq", "20", "--dupe-factor", str(dupe_factor), "--overwrite", *extra]
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO)
    ps = psutil.Process(proc.pid)
    peak = 0
    cpu_seen: dict[int, float] = {}
    while proc.poll() is None:
        rss = tree_sample(ps, cpu_seen)
        peak = max(peak, rss)
        if trace is not None:
            trace.append((round(time.perf_counter() - start, 2), rss))
        time.sleep(0.1)
    wall = time.perf_counter() - start
    _, err = proc.communicate()
    if proc.returncode != 0:
        raise RuntimeError(f"bert-datagen run failed ({proc.returncode}):\n{err[-4000:]}")
    manifest = json.loads((out / "manifest.json").read_text())
    return {"wall_s": wall, "cpu_s": sum(cpu_seen.values()), "peak_rss_mb": peak / 2**20, "manifest": manifest,
            "stderr": err}
