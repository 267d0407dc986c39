"""`--strategy multi-worker` with N worker processes on localhost (CPU) against one process with the
same global batch, dropout on (the default models' 0.1, and the classification head's own): the max
abs weight difference of the final checkpoints (model.npz), of the per-step losses and of the eval
metrics. Pre-training (by default with `--accumulation-steps 2` on `--masking dynamic` data) and
fine-tuning (a classification task), for each of `--workers` (default 2,4) and `--models` (default
tiny,mini), 20 steps.

    python -m benchmarks.bench_multiworker --workers 2,4 --models tiny,mini --work /tmp/mw

The timed tests do the same with 2 workers (tests/trainer/test_trainer_multiworker.py; with
accumulation on dynamic data, a killed worker and resumes on other cluster sizes:
tests/trainer/test_trainer_multiworker_faults.py).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np

from bert_datagen.trainer.model.config import BertConfig
from bert_datagen.trainer.runtime import checkpoint as ckpt_lib
from tests.support.cluster import bert_train, finish_all, free_ports, tf_config, train_scalars
from tests.support.synthetic import write_synthetic_dataset
from tests.support.task_fixtures import VOCAB, classification_dataset, write_pretrain_run


def eval_metrics(run: Path) -> dict[str, float]:
    """The final eval metrics of a pre-training (`eval`) or fine-tuning (`final`) run."""
    final = json.loads((run / "final_metrics.json").read_text())
    return final.get("eval") or final["final"]


def compare(work: Path, common: list[str], workers: int) -> dict:
    ports = free_ports(workers)
    start = time.perf_counter()
    procs = [bert_train([*common, "--out", str(work / "one"), "--strategy", "one-device"])]
    procs += [bert_train([*common, "--out", str(work / "many"), "--strategy", "multi-worker", "--cluster-timeout",
                          "300"], tf_config(ports, i)) for i in range(workers)]
    for rc, out, err in finish_all(procs, timeout=1200):
        if rc:
            raise SystemExit(f"a process failed (exit {rc}):\n{out[-2000:]}\n{err[-3000:]}")
    a = ckpt_lib.load_arrays(ckpt_lib.resolve_checkpoint(work / "one"), ckpt_lib.MODEL_FILE)
    b = ckpt_lib.load_arrays(ckpt_lib.resolve_checkpoint(work / "many"), ckpt_lib.MODEL_FILE)
    la, lb = train_scalars(work / "one", "loss"), train_scalars(work / "many", "loss")
    ea, eb = eval_metrics(work / "one"), eval_metrics(work / "many")
    if la.keys() != lb.keys() or ea.keys() != eb.keys():
        raise SystemExit(f"different steps or metrics: {sorted(la)} {sorted(lb)} {sorted(ea)} {sorted(eb)}")
    return {"workers": workers, "max_abs_weight_diff": max(float(np.abs(a[k] - b[k]).max()) for k in a),
            "max_abs_loss_diff": max(abs(la[s] - lb[s]) for s in la), "steps_compared": sorted(la),
            "max_abs_eval_metric_diff": max(abs(ea[k] - eb[k]) for k in ea), "eval_metrics": sorted(ea),
            "wall_seconds_all_processes": round(time.perf_counter() - start, 1)}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", default="2,4", help="cluster sizes, comma-separated")
    parser.add_argument("--models", default="tiny,mini", help="named model sizes (their default dropout)")
    parser.add_argument("--batch-size", type=int, default=16, help="the global batch")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--accumulation-steps", type=int, default=2)
    parser.add_argument("--masking", choices=("static", "dynamic"), default="dynamic", help="pre-training data")
    parser.add_argument("--work", help="a directory for the runs (default: a temporary one)")
    parser.add_argument("--tasks", default="pretrain,finetune")
    args = parser.parse_args(argv)
    if args.work is None:
        with tempfile.TemporaryDirectory(prefix="bench-mw-") as work:
            return run(args, Path(work))
    return run(args, Path(args.work))


def run(args: argparse.Namespace, work: Path) -> dict:
    batch = args.batch_size
    accumulation = ["--accumulation-steps", str(args.accumulation_steps)]
    results: dict = {}
    data = write_synthetic_dataset(str(work / "ds"), seq_len=32, max_pred=5, vocab_size=120, train_shards=2,
                                   records_per_shard=64, eval_records=2 * batch, masking=args.masking)
    task = classification_dataset(str(work / "task"), n_train=batch * 8, n_dev=2 * batch)
    for model in args.models.split(","):
        bert = BertConfig.from_name(model, 120)
        bert_file = work / f"bert_config_{model}.json"
        bert_file.write_text(json.dumps(bert.to_dict()))
        init = write_pretrain_run(str(work / f"init-{model}"), BertConfig.from_name(model, len(VOCAB)))
        for workers in (int(w) for w in args.workers.split(",")):
            name = f"{model}-{workers}-workers"
            if "pretrain" in args.tasks:
                results[f"pretrain-{name}"] = compare(work / f"pretrain-{name}", [
                    "pretrain", "--data", data, "--bert-config", str(bert_file), "--batch-size", str(batch),
                    "--steps", str(args.steps), "--learning-rate", "2e-3", "--warmup-steps", "1", "--seed", "3",
                    "--log-every", "1", "--eval-batches", "1", *accumulation], workers)
            if "finetune" in args.tasks:
                results[f"finetune-{name}"] = compare(work / f"finetune-{name}", [
                    "finetune", "--data", task, "--init-from", init, "--max-steps", str(args.steps),
                    "--batch-size", str(batch), "--learning-rate", "1e-3", "--log-every", "1", "--seed", "3",
                    *accumulation], workers)
            print(name, {k: v["max_abs_weight_diff"] for k, v in results.items() if name in k}, flush=True)
    results["settings"] = {"accumulation_steps": args.accumulation_steps, "pretraining_masking": args.masking,
                           "steps": args.steps, "batch_size": batch, "dropout": "the models' defaults (0.1)"}
    print(json.dumps(results, indent=2))
    return results


if __name__ == "__main__":
    main()
