"""`make pretrain`: the whole pipeline on the embedded default corpus, end to end, in minutes.

corpus (Python's own documentation, shipped with every CPython) -> WordPiece vocab -> datasets at 128
and 512 tokens -> phase 1 (tiny model, 128 tokens) -> phase 2 (512 tokens, initialised from phase 1)
-> eval. Everything is written under --out; rerunning resumes or reuses what is complete.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import sys
import time

from bert_datagen.cli.plumbing import EXIT_INTERRUPTED


def _bert_datagen(args: list[str]) -> None:
    """One `bert-datagen` command, run in this process: the CLI's validation, messages and exit codes."""
    from bert_datagen.pipelines.cli import main as datagen

    try:
        datagen.main(args, prog_name="bert-datagen", standalone_mode=False)
    except SystemExit as e:
        if e.code == EXIT_INTERRUPTED:  # it has removed its staging files and said "interrupted"
            raise
        if e.code:
            raise RuntimeError(f"bert-datagen {' '.join(args[:1])} failed (exit {e.code})") from None


def build_corpus(out: str) -> list[str]:
    from bert_datagen.datagen.embedded import write_embedded_corpus

    corpus = os.path.join(out, "corpus")
    marker = os.path.join(corpus, ".complete")  # an interrupted write leaves no marker
    if os.path.exists(marker):
        return sorted(glob.glob(os.path.join(corpus, "*.txt")))
    files = write_embedded_corpus(corpus)
    with open(marker, "w") as f:
        f.write("\n".join(os.path.basename(p) for p in files) + "\n")
    return files


def build_vocab(out: str, corpus: str, vocab_size: int) -> str:
    path = os.path.join(out, "vocab.txt")
    if not os.path.exists(path):
        _bert_datagen(["vocab", "--input", os.path.join(corpus, "*.txt"), "--output", path,
                       "--vocab-size", str(vocab_size), "--num-unused", "0"])
    return path


def build_dataset(out: str, corpus: str, vocab: str, seq: int, preds: int, dupe: int) -> str:
    path = os.path.join(out, f"data-{seq}")
    if not os.path.exists(os.path.join(path, "manifest.json")):
        _bert_datagen(["run", "--input", os.path.join(corpus, "*.txt"), "--vocab", vocab, "--output", path,
                       "--max-seq-length", str(seq), "--max-predictions-per-seq", str(preds),
                       "--dupe-factor", str(dupe), "--eval-fraction", "0.05", "--num-shards", "4",
                       "--overwrite", "--quiet"])
    return path


def baselines(data: str) -> dict[str, float]:
    """Accuracy of constant guesses on the eval split: the most frequent masked token of the train
    split, and the majority NSP class."""
    import collections

    import numpy as np

    from bert_datagen.trainer.pretrain.data import eval_batches, open_pretraining_data

    info = open_pretraining_data(data)
    counts: collections.Counter[int] = collections.Counter()
    for batch in eval_batches(info, 64, files=info.train_files):
        counts.update(batch["masked_lm_ids"][batch["masked_lm_weights"] > 0].tolist())
    top = counts.most_common(1)[0][0]
    hits = total = 0.0
    labels = []
    for batch in eval_batches(info, 1):
        w = batch["masked_lm_weights"]
        hits += float((w * (batch["masked_lm_ids"] == top)).sum())
        total += float(w.sum())
        labels.append(int(batch["next_sentence_labels"].ravel()[0]))
    notnext = float(np.mean(labels))
    return {"mlm_baseline": hits / total, "nsp_baseline": max(notnext, 1 - notnext)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="runs/pretrain")
    parser.add_argument("--vocab-size", type=int, default=4000)
    parser.add_argument("--phase1-steps", type=int, default=2000)
    parser.add_argument("--phase2-steps", type=int, default=100)
    # Small batches and many updates: a from-scratch MLM first sits on a plateau (guessing tokens
    # by frequency) that it leaves after some hundreds of updates; this is the fastest way out on a CPU.
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--seed", type=int, default=12345)
    args = parser.parse_args(argv)
    start = time.perf_counter()
    out = os.path.abspath(args.out)
    os.makedirs(out, exist_ok=True)

    def stage(message: str) -> None:
        print(f"[{time.perf_counter() - start:6.1f} s] {message}", flush=True)

    stage("writing the embedded corpus (Python's documentation)")
    files = build_corpus(out)
    corpus = os.path.dirname(files[0])
    stage(f"corpus: {len(files)} files, {sum(os.path.getsize(f) for f in files) / 1e6:.1f} MB in {corpus}")
    vocab = build_vocab(out, corpus, args.vocab_size)
    stage(f"vocab: {vocab}")
    data128 = build_dataset(out, corpus, vocab, 128, 20, dupe=3)
    stage(f"dataset (128 tokens): {data128}")
    data512 = build_dataset(out, corpus, vocab, 512, 80, dupe=1)
    stage(f"dataset (512 tokens): {data512}")

    from bert_datagen.trainer.pretrain.config import TrainConfig
    from bert_datagen.trainer.pretrain.evaluate import evaluate_run
    from bert_datagen.trainer.pretrain.train import pretrain

    phase1 = os.path.join(out, "phase1")
    stage(f"phase 1: tiny model, 128 tokens, {args.phase1_steps} steps of {args.batch_size} -> {phase1}")
    # 5e-4, not 1e-3: at 1e-3 a tiny model's [CLS] pathway collapses and NSP stays at the prior.
    pretrain(TrainConfig(data=data128, out=phase1, model="tiny", batch_size=args.batch_size,
                         steps=args.phase1_steps, learning_rate=5e-4, warmup_steps=args.phase1_steps // 10,
                         seed=args.seed, checkpoint_every=max(args.phase1_steps // 4, 1), log_every=250,
                         eval_batches=20))
    phase2 = os.path.join(out, "phase2")
    stage(f"phase 2: 512 tokens from phase 1, {args.phase2_steps} steps of 4 -> {phase2}")
    pretrain(TrainConfig(data=data512, out=phase2, model="tiny", batch_size=4, steps=args.phase2_steps,
                         learning_rate=5e-4, warmup_steps=args.phase2_steps // 10, seed=args.seed,
                         checkpoint_every=args.phase2_steps, log_every=25, eval_batches=20,
                         init_from=phase1))

    results = {"phase1 on 128-token eval": evaluate_run(phase1, data128, batch_size=16),
               "phase2 on 512-token eval": evaluate_run(phase2, data512, batch_size=4)}
    results["phase1 on 128-token eval"].update(baselines(data128))
    results["phase2 on 512-token eval"].update(baselines(data512))
    print()
    for name, r in results.items():
        print(f"{name:<26} MLM accuracy {r['mlm_accuracy']:.4f} (loss {r['mlm_loss']:.3f}; most frequent token "
              f"{r['mlm_baseline']:.4f})   NSP accuracy {r['nsp_accuracy']:.4f} (loss {r['nsp_loss']:.3f}; "
              f"majority class {r['nsp_baseline']:.4f})   {int(r['examples'])} sequences")
    summary = {name: {k: v for k, v in r.items()} for name, r in results.items()}
    with open(os.path.join(out, "demo_results.json"), "w") as f:
        json.dump(summary, f, indent=2, sort_keys=True)
    print(f"\nwritten under {out}:")
    print(f"  corpus        {corpus}\n  vocab         {vocab}\n  datasets      {data128}, {data512}")
    print(f"  runs          {phase1}, {phase2} (checkpoints ckpt-*/, TensorBoard logs tensorboard/)")
    print(f"  results       {os.path.join(out, 'demo_results.json')}")
    stage("done")
    return 0


if __name__ == "__main__":
    from bert_datagen.trainer.quiet import run_quietly

    sys.exit(run_quietly(main))
