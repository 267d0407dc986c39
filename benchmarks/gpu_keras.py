"""`bench_gpu`'s sections for OUR Keras trainer on the JAX backend (issue #42 point 7).

- `keras-pretrain`: `bert-train pretrain --backend jax`, base and large at 128 and 512 tokens, float32
  and bf16 (`--precision mixed_bfloat16`): sequences/s of its steady state (`trainer_runs`: steps after
  the warm-up ones, compilation excluded) and MFU, beside the targets of issue #42 (base at 128 bf16 >=
  40%, large at 512 >= 45%). float32 runs with JAX's float32 matmuls (`JAX_DEFAULT_MATMUL_PRECISION=
  highest`, no TF32), as the PyTorch rows turn TF32 off: what the 67 TFLOP/s peak is for.
- `keras-finetune`: `bert-train finetune --backend jax` on the prepared SST-2, base, batch 32, from a
  Hugging Face checkpoint of random weights (`--init-checkpoint`).
- `keras-feed`: does the trainer's input keep the GPU fed? The loader alone (`NumpyBatches.batch_at`,
  what each step reads) and, in one process, the run's own steps fed by its input against the same
  steps on batches already on the device, alternated.
- `keras-determinism`: two `bert-train` runs from one seed (dropout on, bf16), and a run resumed
  from its step-4 checkpoint, against the straight run: sha256 of the step-8 weights. On a GPU, when
  the default build differs, again with `XLA_FLAGS=--xla_gpu_deterministic_ops=true`.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np

from benchmarks.trainer_runs import log_every, timed_run, trainer_command

PRECISION = {"fp32": "float32", "bf16": "mixed_bfloat16"}
TARGET_MFU = {("base", 128, "bf16"): 0.40, ("large", 512, "bf16"): 0.45}
ROWS = {"targets": [("base", 128, "bf16"), ("large", 512, "bf16")],
        "others": [("base", 128, "fp32"), ("base", 512, "bf16"), ("base", 512, "fp32"), ("large", 128, "bf16"),
                   ("large", 128, "fp32"), ("large", 512, "fp32")]}
SMOKE_ROWS = {"targets": [("base", 128, "bf16"), ("large", 512, "bf16")],
              "others": [("base", 128, "fp32"), ("large", 512, "fp32")]}
DETERMINISTIC_XLA = "--xla_gpu_deterministic_ops=true"


def _bench_gpu() -> Any:
    from benchmarks import bench_gpu  # the driver: its sizes, batches, peaks and emit

    return bench_gpu


def trainer_env(args: argparse.Namespace, precision: str, xla_flags: str | None = None) -> dict[str, str]:
    env = dict(os.environ, KERAS_BACKEND="jax")
    if not args.device.startswith("cuda"):
        env["JAX_PLATFORMS"] = "cpu"
    if precision == "fp32":
        env["JAX_DEFAULT_MATMUL_PRECISION"] = "highest"
    if xla_flags:
        env["XLA_FLAGS"] = " ".join(filter(None, [env.get("XLA_FLAGS"), xla_flags]))
    return env


def model_config(work: Path, size: str, vocab: int) -> tuple[Path, SimpleNamespace]:
    """An original bert_config.json of `size` (bench_gpu.SIZES) in `work`, and its figures."""
    hidden, layers, heads, inner = _bench_gpu().SIZES[size]
    fields = {"vocab_size": vocab, "hidden_size": hidden, "num_hidden_layers": layers,
              "num_attention_heads": heads, "intermediate_size": inner}
    path = work / f"bert_config-{size}.json"
    path.write_text(json.dumps(fields))
    return path, SimpleNamespace(**fields)


def warm_and_timed(args: argparse.Namespace) -> tuple[int, int]:
    """Steps before the clock starts (the first compiles) and steps timed."""
    return args.warmup + 2, 2 * args.steps


def _left(args: argparse.Namespace) -> float:
    return args.deadline - time.monotonic()


def keras_pretrain(args: argparse.Namespace, out: Path) -> None:
    from benchmarks.bench_trainer import training_flops_per_sequence

    gpu = _bench_gpu()
    vocab = gpu.vocab_size(args.data)
    warm, timed = warm_and_timed(args)
    for stands_for, seq, precision in (SMOKE_ROWS if args.smoke else ROWS)[args.rows]:
        size = "smoke" if args.smoke else stands_for
        row = {"section": "keras-pretrain", "backend": "jax", "size": size, "seq": seq, "precision": precision}
        if _left(args) < 30:
            gpu.emit(out, {**row, "skipped": "time"})
            continue
        batch = 4 if args.smoke else gpu.BATCH[seq]
        with tempfile.TemporaryDirectory(prefix="keras-pretrain-") as work:
            config, bert = model_config(Path(work), size, vocab)
            command = trainer_command("pretrain", "--backend", "jax", "--data", str(args.data / f"pt-{seq}"),
                                      "--out", str(Path(work) / "run"), "--bert-config", str(config),
                                      "--batch-size", str(batch), "--steps", "100000", "--checkpoint-every", "100000",
                                      "--log-every", str(log_every(warm, timed)), "--precision", PRECISION[precision])
            run = timed_run(command, warm=warm, timed=timed, backend="jax", env=trainer_env(args, precision),
                            timeout=max(_left(args) - 5, 10))
        row.update(batch=batch, warm_steps=warm, timed_steps=run.steps)
        if run.error:
            gpu.emit(out, {**row, "error": run.error[:300]})
            continue
        seq_per_s = batch * run.steps_per_second
        flops = training_flops_per_sequence(bert, seq, gpu.PREDICTIONS[seq]) * seq_per_s
        mfu = flops / gpu.PEAK_FLOPS[precision]
        target = TARGET_MFU.get((stands_for, seq, precision))
        row.update(seq_per_s=round(seq_per_s, 1), step_ms=round(1e3 / run.steps_per_second, 2),
                   start_s=round(run.start_seconds, 1), model_tflops=round(flops / 1e12, 2), mfu=round(mfu, 4),
                   loss=run.loss)
        if target is not None:
            row.update(target_mfu=target, stands_for=stands_for, meets_target=mfu >= target)
        gpu.emit(out, row)


def hf_init(work: Path, size: str, data: Path) -> Path:
    """A Hugging Face BertForPreTraining directory of random weights (seeded) with the data's vocab: a
    fine-tuning start that needs no pre-training run."""
    import torch
    import transformers

    gpu = _bench_gpu()
    torch.manual_seed(gpu.SEED)
    path = work / "hf-init"
    transformers.BertForPreTraining(gpu.bert_config(size, gpu.vocab_size(data))).save_pretrained(path)
    shutil.copyfile(data / "vocab.txt", path / "vocab.txt")
    return path


def takes_backend_option(command: str) -> bool:
    done = subprocess.run(trainer_command(command, "--help"), capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, KERAS_BACKEND="jax"))
    return "--backend" in done.stdout


def keras_finetune(args: argparse.Namespace, out: Path) -> None:
    gpu = _bench_gpu()
    size = "smoke" if args.smoke else "base"
    batch = 4 if args.smoke else 32
    warm, timed = warm_and_timed(args)
    backend = ["--backend", "jax"] if takes_backend_option("finetune") else []  # else KERAS_BACKEND says it
    with tempfile.TemporaryDirectory(prefix="keras-finetune-") as work:
        init = hf_init(Path(work), size, args.data)
        for precision in ("fp32", "bf16"):
            row = {"section": "keras-finetune", "backend": "jax", "task": "sst2", "size": size, "seq": 128,
                   "batch": batch, "precision": precision}
            if _left(args) < 30:
                gpu.emit(out, {**row, "skipped": "time"})
                continue
            command = trainer_command("finetune", *backend, "--data", str(args.data / "sst2"),
                                      "--out", str(Path(work) / f"run-{precision}"), "--init-checkpoint", str(init),
                                      "--batch-size", str(batch), "--max-steps", "100000", "--eval-split", "none",
                                      "--log-every", str(log_every(warm, timed)), "--precision", PRECISION[precision])
            run = timed_run(command, warm=warm, timed=timed, backend="jax", env=trainer_env(args, precision),
                            timeout=max(_left(args) - 5, 10))
            if run.error:
                gpu.emit(out, {**row, "error": run.error[:300]})
                continue
            gpu.emit(out, {**row, "steps_per_s": round(run.steps_per_second, 2),
                           "seq_per_s": round(batch * run.steps_per_second, 1), "start_s": round(run.start_seconds, 1),
                           "loss": run.loss})


def keras_feed(args: argparse.Namespace, out: Path) -> None:
    """The loader alone, then the trainer's steps fed by its input against resident batches (ABAB)."""
    from bert_datagen.contract.loading.batches import NumpyBatches
    from bert_datagen.contract.loading.source import open_source

    gpu = _bench_gpu()
    seq, size = 128, ("smoke" if args.smoke else "base")
    batch = 4 if args.smoke else gpu.BATCH[seq]
    loader = NumpyBatches(open_source(str(args.data / f"pt-{seq}")), seed=gpu.SEED, batch_size=batch)
    count = min(200, sum(loader.source.counts) // batch)
    start = time.perf_counter()
    for i in range(count):
        loader.batch_at(i)
    seconds = time.perf_counter() - start
    gpu.emit(out, {"section": "keras-feed", "feed": "loader alone (host)", "seq": seq, "batch": batch, "batches": count,
                   "seq_per_s": round(count * batch / seconds, 1)})
    try:
        fed, resident, blocks = _fed_against_resident(args, size, seq, batch)
    except (AttributeError, TypeError, ImportError) as exc:  # the trainer's objects changed shape
        gpu.emit(out, {"section": "keras-feed", "feed": "trainer", "error": f"{type(exc).__name__}: {exc}"[:300]})
        return
    gpu.emit(out, {"section": "keras-feed", "size": size, "seq": seq, "batch": batch, "precision": "bf16",
                   "steps_per_block": blocks, "seq_per_s_fed": round(fed, 1), "seq_per_s_resident": round(resident, 1),
                   "fed_vs_resident": round(fed / resident, 3)})


def _fed_against_resident(args: argparse.Namespace, size: str, seq: int, batch: int) -> tuple[float, float, int]:
    os.environ.update(trainer_env(args, "bf16"))  # this process is the JAX one: before Keras is imported
    import jax

    from bert_datagen.trainer.pretrain.config import TrainConfig
    from bert_datagen.trainer.pretrain.train import PretrainRun

    with tempfile.TemporaryDirectory(prefix="keras-feed-") as work:
        _, bert = model_config(Path(work), size, _bench_gpu().vocab_size(args.data))
        cfg = TrainConfig(data=str(args.data / f"pt-{seq}"), out=str(Path(work) / "run"), model=None,
                          bert_config=vars(bert), batch_size=batch, steps=10**6, backend="jax",
                          precision=PRECISION["bf16"])
        run = PretrainRun(cfg, log=lambda _: None)
        run.restore_or_initialise()
        # One step object for both backends (`training`), or the JAX one beside TensorFlow's (`jax`).
        training = getattr(run, "training", None) or run.jax
        lr, blocks = np.float32(1e-4), max(args.steps, 5)
        try:
            step = 0
            for _ in range(args.warmup):
                training.train_step(run.next_batch(), lr, step)
                step += 1
            on_device = [jax.device_put(run.next_batch()) for _ in range(blocks)]
            jax.block_until_ready(on_device)
            times: dict[str, float] = {"fed": 0.0, "resident": 0.0}
            for kind in ("fed", "resident", "resident", "fed"):
                begin = time.perf_counter()
                for b in range(blocks):
                    training.train_step(run.next_batch() if kind == "fed" else on_device[b], lr, step)
                    step += 1
                times[kind] += time.perf_counter() - begin
        finally:
            if run.input is not None:
                run.input.close()
    return 2 * blocks * batch / times["fed"], 2 * blocks * batch / times["resident"], blocks


def weights_digest(checkpoint: Path) -> str:
    """sha256 over a checkpoint's weights, in name order (names and bytes)."""
    h = hashlib.sha256()
    with np.load(checkpoint / "model.npz") as arrays:
        for name in sorted(arrays.files):
            h.update(name.encode())
            h.update(np.ascontiguousarray(arrays[name]).tobytes())
    return h.hexdigest()


def keras_determinism(args: argparse.Namespace, out: Path) -> None:
    variants = [None]
    for flags in variants:
        equal = _determinism(args, out, flags)
        if equal is False and flags is None and args.device.startswith("cuda"):
            variants.append(DETERMINISTIC_XLA)


def _determinism(args: argparse.Namespace, out: Path, flags: str | None) -> bool | None:
    gpu = _bench_gpu()
    size, batch, steps = ("smoke" if args.smoke else "base"), (4 if args.smoke else 64), 8
    row = {"section": "keras-determinism", "backend": "jax", "size": size, "seq": 128, "batch": batch,
           "steps": steps, "precision": "bf16", "dropout": 0.1, "xla_flags": flags or "(default)"}
    env = trainer_env(args, "bf16", flags)
    with tempfile.TemporaryDirectory(prefix="keras-determinism-") as work:
        config, _ = model_config(Path(work), size, gpu.vocab_size(args.data))

        def run(name: str, says: str = "") -> str | None:
            command = trainer_command("pretrain", "--backend", "jax", "--data", str(args.data / "pt-128"),
                                      "--out", str(Path(work) / name), "--bert-config", str(config),
                                      "--batch-size", str(batch), "--steps", str(steps), "--checkpoint-every",
                                      str(steps // 2), "--keep-checkpoints", "2", "--log-every", str(steps // 2),
                                      "--precision", PRECISION["bf16"])
            left = _left(args)
            if left < 20:
                return "out of time"
            try:
                done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=left)
            except subprocess.TimeoutExpired:
                return "out of time"
            lines = [line for line in (done.stdout + done.stderr).splitlines() if line.strip()]
            if done.returncode != 0:
                return lines[-1] if lines else f"exit code {done.returncode}"
            return None if says in done.stdout else f"{name}: the run did not say {says!r}"

        errors = [e for e in (run("a"), run("b")) if e]
        if not errors:
            resumed = Path(work) / "c"
            resumed.mkdir()
            for item in (Path(work) / "a").iterdir():  # the run as it stood at its first checkpoint
                if item.name in (f"ckpt-{steps:08d}", "final_metrics.json", "tensorboard") or item.name.startswith(".bert"):
                    continue
                (shutil.copytree if item.is_dir() else shutil.copyfile)(item, resumed / item.name)
            errors += [e for e in (run("c", f"(step {steps // 2})"),) if e]  # "resumed from ... (step 4)"
        if errors:
            gpu.emit(out, {**row, "error": errors[0][:300]})
            return None
        digests = [weights_digest(Path(work) / name / f"ckpt-{steps:08d}") for name in "abc"]
    row.update(two_runs_equal=digests[0] == digests[1], resumed_equals_straight=digests[2] == digests[0],
               digest=digests[0][:16])
    gpu.emit(out, row)
    return digests[0] == digests[1]


SECTIONS = {"keras-pretrain": keras_pretrain, "keras-finetune": keras_finetune, "keras-feed": keras_feed,
            "keras-determinism": keras_determinism}


def mfu_summary(rows: list[dict]) -> list[str]:
    """One line per row that has a target: its MFU beside the target."""
    lines = []
    for r in rows:
        if r.get("section") == "keras-pretrain" and "target_mfu" in r:
            verdict = "met" if r["meets_target"] else "not met"
            lines.append(f"{r['stands_for']} ({r['size']}) at {r['seq']} tokens, {r['precision']}: MFU {r['mfu']:.1%}, "
                         f"target >= {r['target_mfu']:.0%}: {verdict}")
    return lines
