"""`make finetune`: fine-tune the model `make pretrain` trained on a task built from the same
embedded corpus, end to end, with nothing from outside the repository.

The task: which part of Python's documentation does a paragraph come from, a pydoc help topic
("topic") or a standard-library docstring ("docstring")? Paragraphs of both sources are ordered by a
seeded hash (datagen/rng.py), balanced, cut into train and dev TSV files (`sentence<TAB>label`),
turned into a task dataset by `bert-datagen task` with the pre-training vocab; then `bert-train
finetune` runs from the pre-training run and `bert-train predict` writes the dev predictions.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

LABELS = ("topic", "docstring")


def paragraphs_by_source(seed: int, per_class: int) -> dict[str, list[str]]:
    from bert_datagen.datagen.embedded import stdlib_documents, topic_documents
    from bert_datagen.datagen.rng import derive_key

    sources = {"topic": topic_documents(), "docstring": stdlib_documents()}
    out = {}
    for label, documents in sources.items():
        unique = sorted({" ".join(p.split()) for doc in documents for p in doc if len(p.split()) >= 8})
        unique.sort(key=lambda text: derive_key(seed, "finetune-demo", text))
        out[label] = unique[:per_class]
    return out


def write_tsvs(out: str, seed: int, per_class: int, dev_fraction: float = 0.2) -> tuple[str, str]:
    from bert_datagen.contract.fs import LOCAL_FS
    from bert_datagen.datagen.rng import derive_key

    train, dev = os.path.join(out, "train.tsv"), os.path.join(out, "dev.tsv")
    if os.path.exists(train) and os.path.exists(dev):
        return train, dev
    os.makedirs(out, exist_ok=True)
    rows = {"train": [], "dev": []}
    for label, texts in paragraphs_by_source(seed, per_class).items():
        cut = int(len(texts) * (1 - dev_fraction))
        rows["train"] += [(t, label) for t in texts[:cut]]
        rows["dev"] += [(t, label) for t in texts[cut:]]
    for name, path in (("train", train), ("dev", dev)):
        ordered = sorted(rows[name], key=lambda r: derive_key(seed, "finetune-demo-order", r[0]))
        text = "sentence\tlabel\n" + "".join(f"{t.replace(chr(9), ' ')}\t{label}\n" for t, label in ordered)
        LOCAL_FS.write_atomic(path, text.encode("utf-8"))
    return train, dev


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pretrain", default="runs/pretrain", help="The output directory of `make pretrain`.")
    parser.add_argument("--out", default="runs/finetune")
    parser.add_argument("--per-class", type=int, default=1200)
    parser.add_argument("--max-seq-length", type=int, default=64)
    parser.add_argument("--epochs", type=float, default=3)
    parser.add_argument("--learning-rate", type=float, default=1e-4)
    parser.add_argument("--seed", type=int, default=12345)
    args = parser.parse_args(argv)
    start = time.perf_counter()

    def stage(message: str) -> None:
        print(f"[{time.perf_counter() - start:6.1f} s] {message}", flush=True)

    pretrain_run = os.path.join(args.pretrain, "phase1")
    vocab = os.path.join(args.pretrain, "vocab.txt")
    if not os.path.isdir(pretrain_run) or not os.path.exists(vocab):
        print(f"{args.pretrain}: no pre-training run here; run `make pretrain` first", file=sys.stderr)
        return 1
    out = os.path.abspath(args.out)
    train_tsv, dev_tsv = write_tsvs(os.path.join(out, "tsv"), args.seed, args.per_class)
    stage(f"task: topic vs docstring paragraphs -> {train_tsv}, {dev_tsv}")
    data = os.path.join(out, "data")
    if not os.path.exists(os.path.join(data, "manifest.json")):
        from examples.pretrain_demo import _bert_datagen

        _bert_datagen(["task", "--task", "tsv", "--text-a", "sentence", "--label", "label", "--labels",
                       ",".join(LABELS), "--split", f"train={train_tsv}", "--split", f"dev={dev_tsv}",
                       "--vocab", vocab, "--output", data, "--max-seq-length", str(args.max_seq_length),
                       "--overwrite"])
    stage(f"task dataset (bert-datagen task): {data}")

    from bert_datagen.trainer.finetune.cli import predict_run
    from bert_datagen.trainer.finetune.train import FinetuneConfig, finetune

    run = os.path.join(out, "run")
    stage(f"fine-tuning {pretrain_run} -> {run}")
    finetune(FinetuneConfig(data=data, out=run, init_from=pretrain_run, epochs=args.epochs,
                            learning_rate=args.learning_rate, seed=args.seed, log_every=50))
    predictions = os.path.join(out, "predictions")
    # The demo's own directory: a rerun replaces what the last one predicted (and only that).
    for path in predict_run(run, data, "dev", predictions, overwrite=True)["files"]:
        stage(f"wrote {path}")
    final = json.load(open(os.path.join(run, "final_metrics.json")))
    with open(dev_tsv, encoding="utf-8") as f:
        labels = [line.rstrip("\n").split("\t")[1] for line in f.readlines()[1:]]
    majority = max(labels.count(label) for label in LABELS) / len(labels)
    print(f"\ndev accuracy {final['final']['accuracy']:.4f} (majority class {majority:.4f}); best epoch "
          f"{final['best_epoch']['epoch']:g}; {len(labels)} dev paragraphs")
    print(f"written under {out}: tsv/, data/ (task dataset), run/ (checkpoints, final_metrics.json, "
          f"tensorboard/), predictions/predictions.tsv")
    stage("done")
    return 0


if __name__ == "__main__":
    from bert_datagen.trainer.quiet import run_quietly

    sys.exit(run_quietly(main))
