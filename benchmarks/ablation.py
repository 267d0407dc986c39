"""`make ablation`: the pre-training variants side by side, in miniature, on one real corpus.

Rows (each trained with the same tiny model, batch, steps and learning rate, for several seeds):

* the masking table of the BERT paper (Table 8): six ``--mask-ratios`` rows ([MASK] / keep / random)
  80/10/10 (the original), 100/0/0, 80/0/20, 80/20/0, 0/20/80, 0/0/100;
* static (``--dupe-factor`` copies) vs dynamic masking (a new mask each epoch);
* NSP sentence pairs vs doc-sentences (packed sentences, no NSP);
* token vs word (whole-word) vs span masking.

Every model is evaluated on the SAME held-out data: the eval split of the original configuration
(NSP pairs, token masking, 80/10/10, static), held out by document identity, so every row predicts
the same masked positions of documents none of them trained on. Each pre-trained model is then
fine-tuned on SST-2 (GLUE, ../shared/tasks/sst2, built by `bert-datagen task` with the ablation's
vocab; the same examples, steps and learning rate for every row, the seed of its pre-training) and
scored on the full 872-sentence dev set. The two figures are held-out MLM accuracy and SST-2 dev accuracy, as mean
and spread (sample standard deviation) over seeds per row; the table marks a row whose difference
from the original is within two combined standard deviations ("within noise").

Output: a table on the terminal, ``ablation.json`` and ``ablation.png`` (matplotlib) under --out.
Datasets and runs are cached there, so an interrupted ablation resumes where it stopped.

Default size: four files of English Wikipedia (about 4 MB, 260 articles), a 4,000-token vocab, 128-token sequences,
a tiny model (2 layers, 128 wide), 600 steps of 16 sequences, then 400 fine-tuning steps of 32 SST-2
sentences (64 tokens), 3 seeds: under an hour on two CPU cores. docs/variants.md ("The ablation") says how to run it at full size.
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
from collections.abc import Callable
from dataclasses import dataclass, field

from bert_datagen.contract.fs import LOCAL_FS, replacing

CORPUS = os.path.join(os.path.dirname(__file__), "..", "..", "shared", "corpora", "enwiki_extract_2015")
SST2 = os.path.join(os.path.dirname(__file__), "..", "..", "shared", "tasks", "sst2")
METRICS = {"mlm": "held-out MLM accuracy", "sst2": "SST-2 dev accuracy"}


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
    sst2_dir: str | None = None  # None: no fine-tuning column
    sst2_steps: int = 400
    sst2_batch_size: int = 32
    sst2_seq: int = 64
    sst2_learning_rate: float = 1e-4


def _datagen(args: list[str]) -> None:
    from bert_datagen.pipelines.cli import main

    try:
        main(args, standalone_mode=False)
    except SystemExit as exc:
        if exc.code:
            raise RuntimeError(f"bert-datagen {args[0]} failed (exit {exc.code})") from exc


def select_rows(names: list[str]) -> tuple[Row, ...]:
    """The rows asked for (by name or data slug, any case), in table order, always with the original."""
    if not names:
        return ROWS
    wanted = {n.strip().lower() for n in names}
    known = {key for row in ROWS for key in (row.name.lower(), data_slug(row).lower())}
    unknown = sorted(wanted - known)
    if unknown:
        raise ValueError(f"--row {unknown[0]!r} is not a row; rows: " + "; ".join(r.name for r in ROWS))
    return tuple(row for row in ROWS if row is ORIGINAL or {row.name.lower(), data_slug(row).lower()} & wanted)


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


def cached(done: str, compute: Callable[[], dict]) -> dict:
    """The figures in `done` (written last, atomically, by an earlier call), or compute and write them:
    an interrupted ablation resumes at the first run without its figures."""
    if os.path.exists(done):
        with open(done) as f:
            return json.load(f)
    result = compute()
    LOCAL_FS.write_atomic(done, json.dumps(result, indent=1, sort_keys=True).encode())
    return result


def pretrain_run_dir(s: Settings, row: Row, seed: int) -> str:
    return os.path.join(s.out, "runs", f"{data_slug(row)}-seed{seed}")


def train_and_evaluate(s: Settings, row: Row, data: str, held_out: str, seed: int) -> dict:
    run = pretrain_run_dir(s, row, seed)
    return cached(os.path.join(run, "ablation_eval.json"), lambda: _train_and_evaluate(s, run, data, held_out, seed))


def _train_and_evaluate(s: Settings, run: str, data: str, held_out: str, seed: int) -> dict:
    from bert_datagen.trainer.pretrain.config import TrainConfig
    from bert_datagen.trainer.pretrain.evaluate import evaluate_run
    from bert_datagen.trainer.pretrain.train import pretrain

    started = time.perf_counter()
    pretrain(TrainConfig(data=data, out=run, model=s.model, batch_size=s.batch_size, steps=s.steps,
                         learning_rate=s.learning_rate, warmup_steps=max(s.steps // 10, 1), seed=seed,
                         checkpoint_every=s.steps, keep_checkpoints=1, log_every=max(s.steps // 4, 1),
                         eval_batches=1), log=lambda _: None)
    with open(os.path.join(held_out, "manifest.json")) as f:
        held_out_records = json.load(f)["splits"]["eval"]["records"]
    result = evaluate_run(run, held_out, batch_size=min(32, held_out_records), max_batches=s.eval_batches)
    result["train_seconds"] = time.perf_counter() - started
    return result


def build_sst2(s: Settings, vocab: str) -> str:
    """SST-2 train and dev as a task dataset with the ablation's vocab (one for every row)."""
    path = os.path.join(s.out, "data", f"sst2-{s.sst2_seq}")
    if not os.path.exists(os.path.join(path, "manifest.json")):
        _datagen(["task", "--task", "glue/sst2", "--split", f"train={os.path.join(s.sst2_dir, 'train.tsv')}",
                  "--split", f"dev={os.path.join(s.sst2_dir, 'dev.tsv')}", "--vocab", vocab, "--output", path,
                  "--max-seq-length", str(s.sst2_seq), "--quiet", "--overwrite"])
    return path


def finetune_sst2(s: Settings, row: Row, sst2: str, seed: int) -> dict:
    """Fine-tune the row's pre-trained model for `sst2_steps` steps; its dev-set metrics."""
    from bert_datagen.trainer.finetune.train import FinetuneConfig, finetune

    run = os.path.join(s.out, "finetune", f"{data_slug(row)}-seed{seed}")

    def compute() -> dict:
        started = time.perf_counter()
        # epochs is only an upper bound: max_steps ends (and schedules) the run.
        result = finetune(FinetuneConfig(data=sst2, out=run, init_from=pretrain_run_dir(s, row, seed), epochs=1,
                                         max_steps=s.sst2_steps, batch_size=s.sst2_batch_size,
                                         learning_rate=s.sst2_learning_rate, seed=seed, log_every=10**6,
                                         keep_checkpoints=1), log=lambda _: None)
        return {**result["final"], "finetune_seconds": time.perf_counter() - started}

    return cached(os.path.join(run, "ablation_sst2.json"), compute)


def sst2_majority(s: Settings) -> float:
    """The dev accuracy of always answering SST-2's most frequent dev label: the floor a model that
    learned nothing sits at."""
    with open(os.path.join(s.sst2_dir, "dev.tsv"), encoding="utf-8") as f:
        labels = [line.rstrip("\n").rsplit("\t", 1)[-1] for line in f.readlines()[1:] if line.strip()]
    return max(labels.count(label) for label in set(labels)) / len(labels)


def spread(values: list[float]) -> dict:
    return {"mean": statistics.fmean(values), "sd": statistics.stdev(values) if len(values) > 1 else 0.0,
            "min": min(values), "max": max(values), "seeds": len(values), "values": values}


def summarise(results: dict[str, dict[str, list[float]]]) -> list[dict]:
    """One entry per row: per metric, mean / sd / min / max over seeds, the difference from the
    original and whether it is within two combined standard deviations."""
    base = {metric: spread(values) for metric, values in results[ORIGINAL.name].items()}
    table = []
    for row in ROWS:
        if row.name not in results:
            continue
        entry: dict = {"row": row.name, "group": row.group}
        for metric, values in results[row.name].items():
            stats = spread(values)
            delta = stats["mean"] - base[metric]["mean"]
            noise = 2.0 * math.sqrt(stats["sd"] ** 2 + base[metric]["sd"] ** 2)
            entry[metric] = {**stats, "delta_vs_original": delta,
                             "within_noise": row is not ORIGINAL and abs(delta) <= noise}
        table.append(entry)
    return table


def print_table(table: list[dict], s: Settings, floors: dict[str, float]) -> None:
    metrics = [m for m in METRICS if m in table[0]]
    print(f"\n{s.model} model, {s.steps} pre-training steps x {s.batch_size}"
          + (f", {s.sst2_steps} SST-2 steps x {s.sst2_batch_size}" if "sst2" in metrics else "")
          + f", {len(s.seeds)} seeds; the same held-out MLM eval split for every row; "
          "* = differs from the original by less than two combined standard deviations")
    header = f"{'group':<24}{'row':<26}"
    for metric in metrics:
        header += f"{metric + ' mean':>11}{'sd':>8}{'min':>8}{'max':>8}{'vs orig':>10}"
    print(header)
    for r in table:
        line = f"{r['group']:<24}{r['row']:<26}"
        for metric in metrics:
            m = r[metric]
            line += (f"{m['mean']:>11.4f}{m['sd']:>8.4f}{m['min']:>8.4f}{m['max']:>8.4f}"
                     f"{m['delta_vs_original']:>+9.4f}{'*' if m['within_noise'] else ' '}")
        print(line)
    for metric in metrics:
        noisy = sum(r[metric]["within_noise"] for r in table)
        print(f"{METRICS[metric]}: {noisy} of {len(table) - 1} rows differ from the original by less than two "
              "combined standard deviations: at this size their differences are not evidence either way.")
    if "sst2" in floors:
        stuck = sum(v <= floors["sst2"] + 1e-9 for r in table for v in r["sst2"]["values"]) if "sst2" in metrics else 0
        print(f"SST-2 majority class (dev): {floors['sst2']:.4f}; {stuck} of {len(table) * len(s.seeds)} "
              "fine-tuned models are at it (they predict one class)")


def plot(table: list[dict], path: str, s: Settings, floors: dict[str, float]) -> str | None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no plot (pip install 'bert-datagen[plot]')")
        return None
    metrics = [m for m in METRICS if m in table[0]]
    fig, axes = plt.subplots(1, len(metrics), figsize=(7 + 4 * len(metrics), 5), squeeze=False, sharey=True)
    names = [r["row"] for r in table]
    for ax, metric in zip(axes[0], metrics, strict=True):
        ax.barh(range(len(table)), [r[metric]["mean"] for r in table], xerr=[r[metric]["sd"] for r in table],
                color=["tab:gray" if r["row"] == ORIGINAL.name else "tab:blue" for r in table], capsize=3)
        for i, r in enumerate(table):
            ax.plot(r[metric]["values"], [i] * len(r[metric]["values"]), "k.", markersize=4)
        if metric in floors:
            ax.axvline(floors[metric], color="tab:red", linestyle="--", linewidth=1, label="majority class")
            ax.legend(loc="lower right")
        ax.set_xlabel(f"{METRICS[metric]} (mean, sd and each seed)")
        lows = [min(r[metric]["values"]) for r in table]
        ax.set_xlim(max(0.0, min(lows) - 0.05) if metric == "sst2" else 0.0, None)
    axes[0][0].set_yticks(range(len(table)), names)
    axes[0][0].invert_yaxis()
    fig.suptitle(f"pre-training variants, {s.model} model, {s.steps} steps x {s.batch_size}"
                 + (f", SST-2 {s.sst2_steps} steps x {s.sst2_batch_size}" if "sst2" in metrics else "")
                 + f", {len(s.seeds)} seeds")
    fig.tight_layout()
    with replacing(path) as tmp:  # the temp name ends in .png too: matplotlib picks the format by it
        fig.savefig(tmp, dpi=120)
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
    parser.add_argument("--learning-rate", type=float, default=5e-4, help="pre-training peak learning rate")
    parser.add_argument("--sst2-learning-rate", type=float, default=1e-4, help="fine-tuning peak learning rate")
    parser.add_argument("--sst2-max-seq-length", type=int, default=64, help="SST-2 sequence length (8 to 512)")
    parser.add_argument("--sst2", default=SST2, help="a folder with SST-2's train.tsv and dev.tsv")
    parser.add_argument("--sst2-steps", type=int, default=400, help="fine-tuning steps per model (0: no SST-2 column)")
    parser.add_argument("--row", action="append", default=[], metavar="NAME",
                        help="only this row (repeatable; its name or data slug, e.g. 'dynamic masking' or "
                             "masking=dynamic); the original row is always run, as the baseline")
    parser.add_argument("--quick", action="store_true", help="a smoke run: two files, 30 steps, 2 seeds")
    args = parser.parse_args(argv)
    try:
        for name in ("files", "steps", "batch_size", "seeds", "vocab_size"):
            if getattr(args, name) <= 0:
                raise ValueError(f"--{name.replace('_', '-')} must be positive, got {getattr(args, name)}")
        for name in ("learning_rate", "sst2_learning_rate"):
            if not (math.isfinite(getattr(args, name)) and getattr(args, name) > 0):
                raise ValueError(f"--{name.replace('_', '-')} must be a positive number, got {getattr(args, name)}")
        if not 8 <= args.sst2_max_seq_length <= 512:
            raise ValueError(f"--sst2-max-seq-length must be in 8..512, got {args.sst2_max_seq_length}")
        if args.sst2_steps < 0:
            raise ValueError(f"--sst2-steps must be >= 0, got {args.sst2_steps}")
        rows = select_rows(args.row)
    except ValueError as exc:
        print(f"ablation: {exc}", file=sys.stderr)
        return 2
    files = sorted(glob.glob(os.path.join(args.corpus, "wiki_*")))
    if not files:
        print(f"ablation: no corpus at {os.path.abspath(args.corpus)} (../shared/corpora/enwiki_extract_2015); "
              "pass --corpus", file=sys.stderr)
        return 1
    sst2_dir = os.path.abspath(args.sst2) if args.sst2_steps > 0 else None
    if sst2_dir and not all(os.path.isfile(os.path.join(sst2_dir, f)) for f in ("train.tsv", "dev.tsv")):
        print(f"ablation: no SST-2 train.tsv and dev.tsv in {sst2_dir} (../shared/tasks/sst2); pass --sst2, "
              "or --sst2-steps 0 for no fine-tuning column", file=sys.stderr)
        return 1
    s = Settings(out=os.path.abspath(args.out), corpus_files=files[:2 if args.quick else args.files],
                 sst2_dir=sst2_dir, sst2_steps=20 if args.quick else args.sst2_steps,
                 learning_rate=args.learning_rate, sst2_learning_rate=args.sst2_learning_rate,
                 sst2_seq=args.sst2_max_seq_length,
                 vocab_size=args.vocab_size, model=args.model, steps=30 if args.quick else args.steps, batch_size=args.batch_size,
                 seeds=tuple(range(1, 1 + (2 if args.quick else args.seeds))), eval_batches=4 if args.quick else None)
    if args.quick:
        s = dataclasses.replace(s, dupe_factor=2, out=os.path.join(s.out, "quick"))
    os.makedirs(s.out, exist_ok=True)
    start = time.perf_counter()
    vocab = build_vocab(s)
    data = {row.name: build_dataset(s, vocab, row) for row in rows}
    print(f"[{time.perf_counter() - start:6.0f} s] {len(set(data.values()))} datasets under {s.out}/data", flush=True)
    held_out = data[ORIGINAL.name]
    sst2 = build_sst2(s, vocab) if s.sst2_dir else None
    results: dict[str, dict[str, list[float]]] = {}
    raw: dict[str, list[dict]] = {}
    for row in rows:
        for seed in s.seeds:
            r = train_and_evaluate(s, row, data[row.name], held_out, seed)
            values = results.setdefault(row.name, {})
            values.setdefault("mlm", []).append(float(r["mlm_accuracy"]))
            if sst2:
                r = {**r, "sst2": finetune_sst2(s, row, sst2, seed)}
                values.setdefault("sst2", []).append(float(r["sst2"]["accuracy"]))
            raw.setdefault(row.name, []).append(r)
        print(f"[{time.perf_counter() - start:6.0f} s] {row.name}: "
              + "; ".join(f"{m} " + " ".join(f"{v:.4f}" for v in vals) for m, vals in results[row.name].items()),
              flush=True)
    table = summarise(results)
    floors = {"sst2": sst2_majority(s)} if sst2 else {}
    print_table(table, s, floors)
    report = {"settings": {**dataclasses.asdict(s), "seeds": list(s.seeds)}, "held_out": held_out, "rows": table,
              "majority_class": floors, "runs": raw, "seconds": time.perf_counter() - start,
              # What the figures cost, even when this call found them all in the cache.
              "run_seconds": sum(r["train_seconds"] + r.get("sst2", {}).get("finetune_seconds", 0.0)
                                 for runs in raw.values() for r in runs)}
    path = os.path.join(s.out, "ablation.json")
    LOCAL_FS.write_atomic(path, json.dumps(report, indent=1, sort_keys=True).encode())
    png = plot(table, os.path.join(s.out, "ablation.png"), s, floors)
    print(f"\nwritten: {os.path.join(s.out, 'ablation.json')}" + (f", {png}" if png else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
