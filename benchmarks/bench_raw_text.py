"""Raw text near the tokenizer (issue #44 point 2): one worker's `bert-datagen run` on WikiExtractor
text, where the pipeline splits sentences, against tokenizing the same input once.

Input: ``--copies`` copies of ../shared/corpora/enwiki_extract_2015 as one WikiExtractor file
(``benchmarks/scale_corpora.py``: copy 0 as it is, each further copy with every article's paragraphs in
a seeded order), ``--input-format wikiextractor``, max_seq_length 128, 20 predictions, ``--dupe-factor``
10, otherwise the defaults (in-memory DirectRunner, one worker). The vocab: the project's trainer on
the extract (``bench_datagen``'s). The floor: ``bench_datagen``'s, tokenizing every non-blank line of
the same file once with plain `tokenizers` on one thread in its own process (the same definition as
issue #32's 1.84x for pre-split sentences).

With ``--before REF`` the same rounds also run the package as it was at git ``REF`` (exported to a
temporary folder and put first on PYTHONPATH), so before and after are measured in one sitting:
each round runs the floor, then before, then after, and reports the load average around each run
(the machine may be shared). Every run must write the same shards.

Run: `python -m benchmarks.bench_raw_text [--copies 6] [--rounds 3] [--before REF] [--json PATH]`.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile
from pathlib import Path

from benchmarks.bench_dask_ceiling import ref_environment
from benchmarks.bench_datagen import corpus_files, task_cpu_seconds, tokenize_floor, train_vocab
from benchmarks.bench_scale import run_datagen
from benchmarks.scale_corpora import write_wikiextractor_variants


def one_run(name: str, path: Path, vocab: Path, out: Path, dupe_factor: int, floor_s: float, floor_cpu_s: float,
            env: dict[str, str] | None) -> dict:
    load_before = os.getloadavg()[0]
    r = run_datagen([path], vocab, out, ["--direct_num_workers=1"], dupe_factor, input_format="wikiextractor",
                    env=env)
    totals = r["manifest"]["totals"]
    row = {"wall_s": round(r["wall_s"], 1), "cpu_s": round(r["cpu_s"], 1),
           "x_floor": round(r["wall_s"] / floor_s, 2), "cpu_x_floor": round(r["cpu_s"] / floor_cpu_s, 2),
           "task_cpu_s": task_cpu_seconds(r["stderr"]), "read_done_s": read_done(r["stderr"]),
           "peak_rss_mb": round(r["peak_rss_mb"]),
           "load_before": round(load_before, 2), "load_after": round(os.getloadavg()[0], 2),
           "documents": totals["documents"], "instances": totals["instances"],
           "shards": [s["sha256"] for s in r["manifest"]["splits"]["train"]["shards"]]}
    shown = {k: v for k, v in row.items() if k != "shards"}
    print(f"  {name}: {json.dumps(shown)}", flush=True)
    return row


def read_done(stderr: str) -> int | None:
    """When the read stage ended, in whole seconds from the start: its last progress line (each read
    task reports as it ends), so ``wall_s`` minus it is the build and write stages and the end."""
    seconds = [int(m.group(1)) for m in re.finditer(r"^bert-datagen \[pid \d+, (\d+)s\]: [\d,]+ files, ", stderr, re.M)]
    return max(seconds, default=None)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--copies", type=int, default=6, help="copies of the Wikipedia extract in the input")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--dupe-factor", type=int, default=10)
    parser.add_argument("--before", default=None, help="git ref of the package to compare with, in the same rounds")
    parser.add_argument("--json", type=Path, default=None, help="write the figures (JSON)")
    args = parser.parse_args(argv if argv is not None else [])
    with tempfile.TemporaryDirectory(prefix="bench-raw-text-") as tmp:
        root = Path(tmp)
        vocab, _ = train_vocab(corpus_files(), root / "vocab.txt")
        path = write_wikiextractor_variants(args.copies, root / "input" / "wiki.xml")
        versions: dict[str, dict[str, str] | None] = {}
        if args.before:
            versions[f"before ({args.before})"] = ref_environment(args.before, root / "before")
        versions["now"] = None
        results: dict = {"copies": args.copies, "input_mb": round(path.stat().st_size / 1e6, 1),
                         "dupe_factor": args.dupe_factor, "cpu_cores": len(os.sched_getaffinity(0)), "rounds": []}
        for k in range(args.rounds):
            floor = tokenize_floor(vocab, [path], repeats=1)
            row: dict = {"floor_s": round(floor["seconds"], 2), "floor_cpu_s": round(floor["cpu_seconds"], 2),
                         "load_before_floor": round(os.getloadavg()[0], 2)}
            print(f"round {k + 1}: floor {row['floor_s']} s ({row['floor_cpu_s']} CPU s)", flush=True)
            for name, env in versions.items():
                row[name] = one_run(name, path, vocab, root / "out", args.dupe_factor, floor["seconds"],
                                    floor["cpu_seconds"], env)
            results["rounds"].append(row)
        shards = {tuple(r[name]["shards"]) for r in results["rounds"] for name in versions}
        results["identical_shards"] = len(shards) == 1
        for r in results["rounds"]:
            for name in versions:
                r[name].pop("shards")
    print(f"identical shards in every run: {results['identical_shards']}")
    if args.json:
        from bert_datagen.contract.fs import LOCAL_FS

        LOCAL_FS.write_atomic(str(args.json), (json.dumps(results, indent=1) + "\n").encode())
    return results


if __name__ == "__main__":
    main(sys.argv[1:])
