"""`make torch-pretrain`: Hugging Face `BertForPreTraining` (PyTorch, CPU) trained on a dataset of ours
through the package's PyTorch glue (`share_loader`, Hugging Face inputs; docs/loading.md), from the
Keras trainer's initial weights.

corpus (../shared/corpora/enwiki_extract_2015, else Python's documentation) -> WordPiece vocab ->
dataset (128 tokens) -> our Keras model built with the run's seed, exported with our Hugging Face
exporter -> BertForPreTraining. The first batch's loss of both models (no dropout) must agree to 1e-4;
then a few hundred AdamW steps through a DataLoader with workers, the loss printed as it falls.
"""

from __future__ import annotations

import argparse
import glob
import os
import sys
import time
from typing import Any

import numpy as np

from examples.pretrain_demo import _bert_datagen, build_corpus, build_vocab

ENWIKI = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "shared", "corpora",
                      "enwiki_extract_2015")
TOLERANCE = 1e-4


def keras_model(vocab_size: int, seed: int, model: str = "tiny") -> Any:
    """Our Keras model as `bert-train pretrain --model MODEL --seed SEED` builds it before step 0."""
    from bert_datagen.trainer.model.bert import build_model
    from bert_datagen.trainer.model.config import BertConfig

    return build_model(BertConfig.from_name(model, vocab_size), seed=seed)


def keras_loss(model: Any, batch: dict[str, np.ndarray]) -> float:
    """The Keras trainer's loss of a batch (its objective: MLM averaged over masked_lm_weights + mean
    NSP), without dropout."""
    import tensorflow as tf

    from bert_datagen.trainer.pretrain.objective import batch_sums, losses_from_sums

    inputs = {k: tf.constant(v) for k, v in batch.items()}
    return losses_from_sums(batch_sums(model(inputs, training=False), inputs))["loss"]


def export_to_hf(model: Any, out: str) -> Any:
    """`BertForPreTraining` holding the Keras model's weights, through our exporter (a model directory)."""
    import transformers

    from bert_datagen.trainer.interop.export import export_hf
    from bert_datagen.trainer.model.weights import model_tf1_arrays

    directory = export_hf(out, model_tf1_arrays(model), model.config.to_dict(), None, overwrite=True)
    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    return transformers.BertForPreTraining.from_pretrained(str(directory), local_files_only=True)


def hf_loss(model: Any, batch: dict[str, np.ndarray]) -> float:
    """BertForPreTraining's loss of a batch of ours (the package's mapping to its inputs)."""
    import torch

    from bert_datagen.contract.loading.hf import hf_inputs

    model.eval()
    with torch.no_grad():
        return float(model(**{k: torch.from_numpy(v) for k, v in hf_inputs(batch).items()}).loss)


def train(model: Any, batches: Any, steps: int, lr: float, log_every: int,
          log: Any = print) -> list[float]:
    """AdamW with linear warm-up over a tenth of the steps; the mean loss of each `log_every` steps.
    ``batches`` yield Hugging Face inputs (`share_loader`)."""
    import torch

    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
    warmup = max(steps // 10, 1)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min((s + 1) / warmup, 1.0))
    means, window = [], []
    for step, batch in enumerate(batches):
        if step == steps:
            break
        loss = model(**batch).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        schedule.step()
        window.append(loss.item())
        if len(window) == log_every or step + 1 == steps:
            means.append(float(np.mean(window)))
            log(f"step {step + 1:5d}  loss {means[-1]:.4f}")
            window = []
    return means


def build_dataset(out: str, inputs: list[str], input_format: str, vocab: str) -> str:
    path = os.path.join(out, "data-128")
    if not os.path.exists(os.path.join(path, "manifest.json")):
        args = ["run", "--vocab", vocab, "--output", path, "--input-format", input_format,
                "--max-seq-length", "128", "--max-predictions-per-seq", "20", "--dupe-factor", "2",
                "--num-shards", "4", "--overwrite", "--quiet"]
        for pattern in inputs:
            args += ["--input", pattern]
        _bert_datagen(args)
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="runs/torch-pretrain")
    parser.add_argument("--enwiki-files", type=int, default=2,
                        help="WikiExtractor files of ../shared/corpora/enwiki_extract_2015 to use")
    parser.add_argument("--vocab-size", type=int, default=4000)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--lr", type=float, default=5e-4)
    parser.add_argument("--workers", type=int, default=2, help="DataLoader worker processes")
    parser.add_argument("--seed", type=int, default=12345)
    args = parser.parse_args(argv)
    start = time.perf_counter()
    out = os.path.abspath(args.out)
    os.makedirs(out, exist_ok=True)

    def stage(message: str) -> None:
        print(f"[{time.perf_counter() - start:6.1f} s] {message}", flush=True)

    wiki = sorted(glob.glob(os.path.join(ENWIKI, "wiki_*")))[:args.enwiki_files]
    if wiki:
        inputs, input_format = wiki, "wikiextractor"
        stage(f"corpus: {len(wiki)} files of {os.path.abspath(ENWIKI)}")
    else:
        inputs, input_format = build_corpus(out), "text"
        stage(f"corpus: {ENWIKI} is absent; Python's documentation instead ({len(inputs)} files)")
    if input_format == "text":
        vocab = build_vocab(out, os.path.dirname(inputs[0]), args.vocab_size)
    else:
        vocab = _wiki_vocab(out, inputs, args.vocab_size)
    data = build_dataset(out, inputs, input_format, vocab)
    stage(f"dataset: {data}")

    import torch

    from bert_datagen.contract.loading.batches import NumpyBatches
    from bert_datagen.contract.loading.source import open_source
    from bert_datagen.contract.loading.torch_shares import share_loader

    torch.manual_seed(args.seed)  # BertForPreTraining's dropout in training
    source = open_source(data)
    first = NumpyBatches(source, seed=args.seed, batch_size=args.batch_size).batch_at(0)

    keras = keras_model(_vocab_size(vocab), args.seed)
    ours = keras_loss(keras, first)
    hf = export_to_hf(keras, os.path.join(out, "hf-init"))
    theirs = hf_loss(hf, first)
    stage(f"first batch, no dropout: Keras loss {ours:.6f}, BertForPreTraining loss {theirs:.6f} "
          f"(|difference| {abs(ours - theirs):.2e})")
    if not abs(ours - theirs) <= TOLERANCE:
        print(f"torch-pretrain: the losses differ by more than {TOLERANCE}", file=sys.stderr)
        return 1

    stage(f"training BertForPreTraining: {args.steps} steps of {args.batch_size}, {args.workers} DataLoader workers")
    # spawn, not fork: this process has TensorFlow's threads running, which a forked worker must not inherit.
    context = "spawn" if args.workers else None
    # The rank's shares (one process here; under torchrun each rank its own), as Hugging Face inputs.
    batches = share_loader(source, seed=args.seed, batch_size=args.batch_size, stop=args.steps,
                           num_workers=args.workers, multiprocessing_context=context)
    means = train(hf, batches, args.steps, args.lr, log_every=25, log=stage)
    stage(f"loss {means[0]:.4f} (first 25 steps) -> {means[-1]:.4f} (last)")
    if not means[-1] < means[0]:
        print("torch-pretrain: the loss did not fall", file=sys.stderr)
        return 1
    return 0


def _wiki_vocab(out: str, inputs: list[str], vocab_size: int) -> str:
    path = os.path.join(out, "vocab.txt")
    if not os.path.exists(path):
        args = ["vocab", "--output", path, "--vocab-size", str(vocab_size), "--num-unused", "0",
                "--input-format", "wikiextractor"]
        for pattern in inputs:
            args += ["--input", pattern]
        _bert_datagen(args)
    return path


def _vocab_size(vocab: str) -> int:
    with open(vocab, "rb") as f:
        return sum(1 for _ in f)


if __name__ == "__main__":
    from bert_datagen.trainer.quiet import run_quietly

    sys.exit(run_quietly(main))
