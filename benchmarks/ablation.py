"""`make ablation`: the pre-training variants side by side, in miniature, on one real corpus.

Rows (each trained with the same tiny model, batch, steps and learning rate, for several seeds):

* the masking table of the BERT paper (Table 8): six ``--mask-ratios`` rows ([MASK] / keep / random)
  80/10/10 (the original), 100/0/0, 80/0/20, 80/20/0, 0/20/80, 0/0/100;
* static (``--dupe-factor`` copies) vs dynamic masking (a new mask each epoch);
* NSP sentence pairs vs doc-sentences (packed sentences, no NSP);
* token vs word (whole-word) vs span masking.

Every model is evaluated on the SAME held-out data: the eval split of the original configuration
(NSP pairs, token masking, 80/10/10, static), held out by document identity, so every row predicts
the same masked positions of documents none of them trained on. The figure is held-out MLM
accuracy, as mean and spread (sample standard deviation) over seeds per row; the table marks a row
whose difference from the original is within two combined standard deviations ("within noise").

Output: a table on the terminal, ``ablation.json`` and ``ablation.png`` (matplotlib) under --out.
Datasets and runs are cached there, so an interrupted ablation resumes where it stopped.

Default size: four files of English Wikipedia (about 4 MB, 260 articles), a 4,000-token vocab, 128-token sequences,
a tiny model (2 layers, 128 wide), 600 steps of 16 sequences, 3 seeds: about 40 minutes on two CPU
cores. docs/variants.md ("The ablation") says how to run it at full size.
"""

from __future__ import annotations

import argparse
import dataclasses
import glob
import json
import math
import os
import statistics
import sys
import time
from dataclasses import dataclass, field

CORPUS = os.path.join(os.path.dirname(__file__), "..", "..", "shared", "corpora", "enwiki_extract_2015")


@dataclass(frozen=True)
class Row:
    name: str
    group: str
    data: dict = field(default_factory=dict)  # bert-datagen run options that differ from the original


ORIGINAL = Row("80/10/10 (original)", "mask ratios")
ROWS = (
    ORIGINAL,
    Row("100/0/0", "mask ratios", {"mask_ratios": "1,0,0"}),
    Row("80/0/20", "mask ratios", {"mask_ratios": "0.8,0,0.2"}),
    Row("80/20/0", "mask ratios", {"mask_ratios": "0.8,0.2,0"}),
    Row("0/20/80", "mask ratios", {"mask_ratios": "0,0.2,0.8"}),
    Row("0/0/100", "mask ratios", {"mask_ratios": "0,0,1"}),
    Row("dynamic masking", "static vs dynamic", {"masking": "dynamic"}),
    Row("doc-sentences (no NSP)", "NSP vs doc-sentences", {"objective": "doc-sentences"}),
    Row("whole-word masking", "token vs word vs span", {"masking_unit": "word"}),
    Row("span masking", "token vs word vs span", {"masking_unit": "span"}),
)


@dataclass
class Settings:
    out: str
    corpus_files: list[str]
    vocab_size: int = 4000
    seq: int = 128
    preds: int = 20
    dupe_factor: int = 5
    steps: int = 600
    batch_size: int = 16
    learning_rate: float = 5e-4
    model: str = "tiny"
    seeds: tuple[int, ...] = (1, 2, 3)
    eval_batches: int | None = None  # None: the whole held-out split


def _datagen(args: list[str]) -> None:
    from pipelines.cli import main

    try:
        main(args, standalone_mode=False)
    except SystemExit as exc:
        if exc.code:
            raise RuntimeError(f"bert-datagen {args[0]} failed (exit {exc.code})") from exc


def build_vocab(s: Settings) -> str:
    path = os.path.join(s.out, "vocab.txt")
    if not os.path.exists(path):
        _datagen(["vocab", *sum((["--input", f] for f in s.corpus_files), []), "--input-format", "wikiextractor",
                  "--output", path, "--vocab-size", str(s.vocab_size), "--num-unused", "0"])
    return path


def data_slug(row: Row) -> str:
    return "original" if not row.data else "-".join(f"{k}={v}".replace(",", "_") for k, v in sorted(row.data.items()))


def build_dataset(s: Settings, vocab: str, row: Row) -> str:
    path = os.path.join(s.out, "data", data_slug(row))
    if os.path.exists(os.path.join(path, "manifest.json")):
        return path
    options = {"mask_ratios": "0.8,0.1,0.1", "masking": "static", "objective": "nsp", "masking_unit": "token",
               **row.data}
    args = ["run", *sum((["--input", f] for f in s.corpus_files), []), "--input-format", "wikiextractor",
            "--vocab", vocab, "--output", path, "--max-seq-length", str(s.seq),
            "--max-predictions-per-seq", str(s.preds), "--eval-fraction", "0.1", "--num-shards", "4",
            "--notnext-pool-size", "200", "--quiet", "--overwrite"]
    for key, value in options.items():
        args += [f"--{key.replace('_', '-')}", str(value)]
    if options["masking"] == "static":
        args += ["--dupe-factor", str(s.dupe_factor)]
    _datagen(args)
    return path


def train_and_evaluate(s: Settings, row: Row, data: str, held_out: str, seed: int) -> dict:
    from trainer.config import TrainConfig
    from trainer.train import evaluate_run, pretrain

    run = os.path.join(s.out, "runs", f"{data_slug(row)}-seed{seed}")
    done = os.path.join(run, "ablation_eval.json")
    if os.path.exists(done):
        with open(done) as f:
            return json.load(f)
    started = time.perf_counter()
    pretrain(TrainConfig(data=data, out=run, model=s.model, batch_size=s.batch_size, steps=s.steps,
                         learning_rate=s.learning_rate, warmup_steps=max(s.steps // 10, 1), seed=seed,
                         checkpoint_every=s.steps, keep_checkpoints=1, log_every=max(s.steps // 4, 1),
                         eval_batches=1, shuffle_buffer=5000), log=lambda _: None)
    result = evaluate_run(run, held_out, batch_size=32, max_batches=s.eval_batches)
    result["train_seconds"] = time.perf_counter() - started
    with open(done + ".tmp", "w") as f:
        json.dump(result, f, indent=1, sort_keys=True)
    os.replace(done + ".tmp", done)
    return result


def summarise(results: dict[str, list[float]]) -> list[dict]:
    base = results[ORIGINAL.name]
    base_mean = statistics.fmean(base)
    base_sd = statistics.stdev(base) if len(base) > 1 else 0.0
    table = []
    for row in ROWS:
        values = results.get(row.name)
        if not values:
            continue
        mean = statistics.fmean(values)
        sd = statistics.stdev(values) if len(values) > 1 else 0.0
        delta = mean - base_mean
        noise = 2.0 * math.sqrt(sd**2 + base_sd**2)
        table.append({"row": row.name, "group": row.group, "mean": mean, "sd": sd, "min": min(values),
                      "max": max(values), "seeds": len(values), "delta_vs_original": delta,
                      "within_noise": row is not ORIGINAL and abs(delta) <= noise, "values": values})
    return table


def print_table(table: list[dict], s: Settings) -> None:
    print(f"\nheld-out MLM accuracy (same eval split for every row), {s.model} model, {s.steps} steps x "
          f"{s.batch_size}, {len(s.seeds)} seeds")
    print(f"{'group':<24}{'row':<26}{'mean':>8}{'sd':>8}{'min':>8}{'max':>8}{'vs orig':>9}  note")
    for r in table:
        note = "within noise" if r["within_noise"] else ""
        print(f"{r['group']:<24}{r['row']:<26}{r['mean']:>8.4f}{r['sd']:>8.4f}{r['min']:>8.4f}{r['max']:>8.4f}"
              f"{r['delta_vs_original']:>+9.4f}  {note}")
    noisy = sum(r["within_noise"] for r in table)
    print(f"{noisy} of {len(table) - 1} rows differ from the original by less than two combined standard "
          "deviations: at this size their differences are not evidence either way.")


def plot(table: list[dict], path: str, s: Settings) -> str | None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no plot (pip install 'bert-datagen[plot]')")
        return None
    fig, ax = plt.subplots(figsize=(10, 5))
    names = [r["row"] for r in table]
    ax.barh(range(len(table)), [r["mean"] for r in table], xerr=[r["sd"] for r in table], color=[
        "tab:gray" if r["row"] == ORIGINAL.name else "tab:blue" for r in table], capsize=3)
    for i, r in enumerate(table):
        ax.plot(r["values"], [i] * len(r["values"]), "k.", markersize=4)
    ax.set_yticks(range(len(table)), names)
    ax.invert_yaxis()
    ax.set_xlabel("held-out MLM accuracy (mean, sd and each seed)")
    ax.set_title(f"pre-training variants, {s.model} model, {s.steps} steps x {s.batch_size}, {len(s.seeds)} seeds")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=".bench/ablation")
    parser.add_argument("--corpus", default=CORPUS, help="a folder of WikiExtractor files (wiki_*)")
    parser.add_argument("--files", type=int, default=4, help="how many of its files to use")
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--vocab-size", type=int, default=4000)
    parser.add_argument("--model", default="tiny", help="model size (tiny, mini, small, medium, base, large)")
    parser.add_argument("--quick", action="store_true", help="a smoke run: two files, 30 steps, 2 seeds")
    args = parser.parse_args(argv)
    files = sorted(glob.glob(os.path.join(args.corpus, "wiki_*")))
    if not files:
        print(f"ablation: no corpus at {os.path.abspath(args.corpus)} (../shared/corpora/enwiki_extract_2015); "
              "pass --corpus", file=sys.stderr)
        return 1
    s = Settings(out=os.path.abspath(args.out), corpus_files=files[:2 if args.quick else args.files],
                 vocab_size=args.vocab_size, model=args.model, steps=30 if args.quick else args.steps, batch_size=args.batch_size,
                 seeds=tuple(range(1, 1 + (2 if args.quick else args.seeds))), eval_batches=4 if args.quick else None)
    if args.quick:
        s = dataclasses.replace(s, dupe_factor=2, out=os.path.join(s.out, "quick"))
    os.makedirs(s.out, exist_ok=True)
    start = time.perf_counter()
    vocab = build_vocab(s)
    data = {row.name: build_dataset(s, vocab, row) for row in ROWS}
    print(f"[{time.perf_counter() - start:6.0f} s] {len(set(data.values()))} datasets under {s.out}/data", flush=True)
    held_out = data[ORIGINAL.name]
    results: dict[str, list[float]] = {}
    raw: dict[str, list[dict]] = {}
    for row in ROWS:
        for seed in s.seeds:
            r = train_and_evaluate(s, row, data[row.name], held_out, seed)
            results.setdefault(row.name, []).append(float(r["mlm_accuracy"]))
            raw.setdefault(row.name, []).append(r)
        print(f"[{time.perf_counter() - start:6.0f} s] {row.name}: "
              + " ".join(f"{v:.4f}" for v in results[row.name]), flush=True)
    table = summarise(results)
    print_table(table, s)
    report = {"settings": {**dataclasses.asdict(s), "seeds": list(s.seeds)}, "held_out": held_out, "rows": table,
              "runs": raw, "seconds": time.perf_counter() - start}
    with open(os.path.join(s.out, "ablation.json"), "w") as f:
        json.dump(report, f, indent=1, sort_keys=True)
    png = plot(table, os.path.join(s.out, "ablation.png"), s)
    print(f"\nwritten: {os.path.join(s.out, 'ablation.json')}" + (f", {png}" if png else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
