"""The same `bert-train` jobs on TensorFlow (with `--jit`) and on JAX: steady-state steps/s and the JAX/TF
ratio (issue #42 point 6; target JAX >= 1.0x).

Jobs: pre-training the tiny model and a 4-layer model of BERT base's width (hidden 768, 12 heads,
FFN 3072) at 128 tokens on synthetic records (30,522-token vocab, 20 predictions), and SST-2
fine-tuning from all-MiniLM-L6-v2 (`bench_finetune.build_sst2`: 64 tokens, batch 32). Each job runs
twice on each backend, A B B A (`trainer_runs`), each run timed over its steps after `warm` steps.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from benchmarks.trainer_runs import (
    TimedRun,
    compare_backends,
    log_every,
    summarise,
    timed_run,
    trainer_command,
)

BASE4 = {"hidden_size": 768, "num_hidden_layers": 4, "num_attention_heads": 12, "intermediate_size": 3072}
VOCAB, SEQ, PREDICTIONS = 30522, 128, 20


@dataclass(frozen=True)
class Job:
    """One `bert-train` command, run the same on either backend."""

    name: str
    args: tuple[str, ...]  # without --out, --backend, --jit
    batch_size: int
    warm: int
    timed: int
    notes: dict = field(default_factory=dict)


def pretrain_jobs(work: Path, quick: bool = False) -> list[Job]:
    from tests.support.synthetic import write_synthetic_dataset

    data = work / f"synthetic-{SEQ}"
    if not (data / "manifest.json").exists():
        write_synthetic_dataset(str(data), seq_len=SEQ, max_pred=PREDICTIONS, vocab_size=VOCAB, train_shards=4,
                                records_per_shard=256, eval_records=0)
    config = work / "base-width-4-layers.json"
    config.write_text(json.dumps({"vocab_size": VOCAB, **BASE4}))
    common = ("pretrain", "--data", str(data), "--steps", "100000", "--checkpoint-every", "100000")
    return [
        Job("pretrain tiny (L2 H128), batch 32x128", (*common, "--model", "tiny", "--batch-size", "32"), 32,
            warm=5, timed=10 if quick else 20),
        Job("pretrain base width (L4 H768 A12 F3072), batch 8x128",
            (*common, "--bert-config", str(config), "--batch-size", "8"), 8, warm=2, timed=4 if quick else 8),
    ]


def finetune_job(work: Path, quick: bool = False) -> Job | None:
    """SST-2 from all-MiniLM-L6-v2, or None where the task data or the encoder package is missing."""
    from benchmarks.bench_finetune import SHARED, build_sst2, minilm_dir

    if not (SHARED / "sst2" / "train.tsv").is_file():
        return None
    try:
        init = minilm_dir()
    except ImportError:
        return None
    data = build_sst2(str(work), 2000, 64)
    return Job("finetune SST-2 (all-MiniLM-L6-v2: L6 H384), batch 32x64",
               ("finetune", "--data", data, "--init-checkpoint", init, "--batch-size", "32", "--max-steps", "100000",
                "--eval-split", "none"), 32, warm=5, timed=10 if quick else 20)


def takes_backend_option(command: str) -> bool:
    """Whether `bert-train COMMAND` has `--backend` (fine-tuning gains it with the JAX port)."""
    out = subprocess.run(trainer_command(command, "--help"), capture_output=True, text=True, timeout=120)
    return "--backend" in out.stdout


def backend_run(job: Job, work: Path, backend: str, with_option: bool, counter: list[int]) -> TimedRun:
    """One run of `job` on `backend`: `--backend` where the command has it, else `KERAS_BACKEND` (the
    same choice by the CLI's rule); `--jit` on TensorFlow (JAX always compiles its step)."""
    counter[0] += 1
    args = [*job.args, "--out", str(work / f"run-{counter[0]}"), "--log-every", str(log_every(job.warm, job.timed))]
    if with_option:
        args += ["--backend", backend]
    if backend == "tensorflow":
        args.append("--jit")
    env = dict(os.environ, KERAS_BACKEND=backend)
    return timed_run(trainer_command(*args), warm=job.warm, timed=job.timed, backend=backend, env=env)


def run_jobs(jobs: list[Job], work: Path, rounds: int = 2,
             run: Callable[[Job, Path, str, bool, list[int]], TimedRun] = backend_run,
             has_option: Callable[[str], bool] = takes_backend_option) -> dict[str, dict]:
    """Each job on both backends, ABBA: per job, `summarise`'s figures."""
    options: dict[str, bool] = {}
    counter = [0]
    results = {}
    for job in jobs:
        command = job.args[0]
        if command not in options:
            options[command] = has_option(command)
        with_option = options[command]
        runs = compare_backends(lambda b, job=job, opt=with_option: run(job, work, b, opt, counter), rounds=rounds)
        results[job.name] = {"batch_size": job.batch_size, "warm_steps": job.warm, "timed_steps": job.timed,
                             "backend_option": options[command], **summarise(runs, job.batch_size)}
    return results


def print_rows(results: dict[str, dict]) -> None:
    print(f"{'job (same command on both backends; TF with --jit)':<62} {'TF steps/s':>10} {'JAX steps/s':>11} "
          f"{'TF seq/s':>9} {'JAX seq/s':>9} {'JAX/TF':>7}  pairs")
    for name, r in results.items():
        tf, jax = r["tensorflow"], r["jax"]
        ratio = r.get("jax_over_tensorflow")
        pairs = ", ".join(f"{p:.2f}" for p in r.get("pair_ratios", []))
        print(f"{name:<62} {_fmt(tf['steps_per_second'], 10, 2)} {_fmt(jax['steps_per_second'], 11, 2)} "
              f"{_fmt(tf['sequences_per_second'], 9, 1)} {_fmt(jax['sequences_per_second'], 9, 1)} "
              f"{_fmt(ratio, 7, 2)}  {pairs}")
        for backend in ("tensorflow", "jax"):
            for error in r[backend]["errors"]:
                print(f"    {backend}: {error}")


def _fmt(value: float | None, width: int, digits: int) -> str:
    return f"{value:>{width}.{digits}f}" if value is not None else f"{'-':>{width}}"


def main(work: Path, quick: bool = False) -> dict[str, dict]:
    jobs = pretrain_jobs(work, quick)
    finetune = finetune_job(work, quick)
    if finetune is not None:
        jobs.append(finetune)
    results = run_jobs(jobs, work)
    print_rows(results)
    print("steps/s: steady state (steps after the warm-up ones, compilation excluded) of `bert-train` runs, "
          "each backend run twice, A B B A; JAX/TF: the ratio of the totals (target >= 1.0); pairs: the "
          "ratio within each A B pair")
    return results
