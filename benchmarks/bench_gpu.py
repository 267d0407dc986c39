"""GPU figures on a lent accelerator machine (docs/gpu.md): OUR Keras trainer on the JAX backend
(`gpu_keras`: sequences/s and MFU of base and large at 128 and 512 tokens in float32 and bf16, SST-2
fine-tuning, its input keeping the GPU fed, bitwise determinism and resume), and Hugging Face's
`BertForPreTraining` on PyTorch beside it (the same figures, eager and compiled), fed by this package's
loader (`share_loader`).

The accelerator machines have JAX, PyTorch and CUDA but no TensorFlow and no network. So:
  python -m benchmarks.bench_gpu prepare --out .gpu    # here: vocab, datasets at 128 and 512, SST-2,
                                                       # and the wheels our trainer needs there
  python -m benchmarks.bench_gpu measure --data .gpu --out DIR   # there: one JSON line a figure
`measure` unpacks the wheels (Keras and what it needs; `gpu_wheels`) of the distributions missing there
into a temporary folder put first on the path, then runs each section in a process of its own.
``measure --smoke --device cpu`` runs every section with a tiny model on the CPU, to check the script first.

MFU = model FLOPs per second / the datasheet's dense peak of the precision (H100 SXM and H200 SXM alike:
989 TFLOP/s bfloat16, 67 TFLOP/s float32 without TF32; the device row names the card). Model FLOPs as
`bench_trainer` counts them: 3 x the forward's matmuls, the masked-LM head over the predicted positions
only (Hugging Face's head runs over every position; that extra work is not counted as useful).
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks import gpu_keras, gpu_wheels

PEAK_FLOPS = {"bf16": 989e12, "fp32": 67e12}  # H100 SXM and H200 SXM datasheets, dense
SIZES = {  # hidden, layers, heads, intermediate
    "base": (768, 12, 12, 3072),
    "large": (1024, 24, 16, 4096),
    "smoke": (64, 2, 2, 256),
}
BATCH = {128: 128, 512: 32}  # 16,384 tokens a step at either length
PREDICTIONS = {128: 20, 512: 80}
SEED = 12345


def emit(out: Path, record: dict[str, Any]) -> None:
    """One figure: printed and appended to out/gpu.jsonl at once, so a run cut short keeps what it measured."""
    line = json.dumps(record, sort_keys=True)
    print(line, flush=True)
    with open(out / "gpu.jsonl", "a") as f:
        f.write(line + "\n")


def prepare(out: Path, python: str = "3.12") -> None:
    """The vocab, datasets and wheels `measure` reads, from ../shared and the package index (run here, not
    on the accelerator). What is in ``out`` already is kept and reused: nothing there is replaced."""
    from benchmarks.bench_datagen import corpus_files, train_vocab
    from benchmarks.bench_tasks import TASKS

    out.mkdir(parents=True, exist_ok=True)
    wiki = corpus_files()[:4]
    vocab = out / "vocab.txt"
    if not vocab.exists():
        train_vocab(wiki, vocab)
    tool = [sys.executable, "-m", "bert_datagen.pipelines.cli"]
    for seq, dupe in ((128, 2), (512, 1)):
        if not (out / f"pt-{seq}" / "manifest.json").exists():
            inputs = [a for f in wiki for a in ("--input", str(f))]
            subprocess.run(tool + ["run", *inputs, "--input-format", "wikiextractor", "--vocab", str(vocab),
                                   "--output", str(out / f"pt-{seq}"), "--max-seq-length", str(seq),
                                   "--max-predictions-per-seq", str(PREDICTIONS[seq]), "--dupe-factor", str(dupe),
                                   "--quiet"], check=True)
    if not (out / "sst2" / "manifest.json").exists():
        with tempfile.TemporaryDirectory() as scratch:
            sst2 = Path(scratch) / "sst2-8k.tsv"  # the first 8,000 rows: enough steps, small enough to carry
            sst2.write_text("".join((TASKS / "sst2" / "train.tsv").read_text().splitlines(True)[:8001]))
            subprocess.run(tool + ["task", "--task", "glue/sst2", "--split", f"train={sst2}", "--vocab", str(vocab),
                                   "--output", str(out / "sst2"), "--max-seq-length", "128"], check=True)
    gpu_wheels.prepare(out, python)


def bert_config(size: str, vocab_size: int, labels: int = 2) -> Any:
    import transformers

    hidden, layers, heads, inner = SIZES[size]
    return transformers.BertConfig(vocab_size=vocab_size, hidden_size=hidden, num_hidden_layers=layers,
                                   num_attention_heads=heads, intermediate_size=inner, num_labels=labels)


def batches_of(data: Path, batch_size: int, count: int, device: str, start: int = 0) -> list[dict[str, Any]]:
    """``count`` global batches of the dataset's order from ``start``, as Hugging Face inputs on the device."""
    from bert_datagen.contract.loading.source import open_source
    from bert_datagen.contract.loading.torch_shares import share_loader

    loader = share_loader(open_source(str(data)), seed=SEED, batch_size=batch_size, start=start, stop=start + count)
    return [{k: v.to(device) for k, v in batch.items()} for batch in loader]


def vocab_size(data: Path) -> int:
    with open(data / "vocab.txt", "rb") as f:
        return sum(1 for _ in f)


def training_step(model: Any, optimizer: Any, precision: str, device: str) -> Any:
    import torch

    def step(batch: dict[str, Any]) -> Any:
        with torch.autocast(device_type=device.split(":")[0], dtype=torch.bfloat16, enabled=precision == "bf16"):
            loss = model(**batch).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss

    return step


def timed(step: Any, batches: list[dict[str, Any]], warmup: int, device: str) -> tuple[float, float, float]:
    """(seconds of the first step, seconds a step after ``warmup``, last loss)."""
    start = time.perf_counter()
    step(batches[0])
    _sync(device)
    first = time.perf_counter() - start
    for batch in batches[1:warmup]:
        step(batch)
    _sync(device)
    start = time.perf_counter()
    for batch in batches[warmup:]:
        loss = step(batch)
    _sync(device)
    return first, (time.perf_counter() - start) / (len(batches) - warmup), float(loss.detach())


def pretrain_speed(args: argparse.Namespace, out: Path, compiled: bool) -> None:
    import torch
    import transformers

    from benchmarks.bench_trainer import training_flops_per_sequence

    torch.backends.cuda.matmul.allow_tf32 = False  # float32 means float32 here, not TF32
    torch.backends.cudnn.allow_tf32 = False
    sizes = ["smoke"] if args.smoke else ["base", "large"]
    precisions = ["bf16"] if compiled and not args.smoke else ["fp32", "bf16"]
    vocab = vocab_size(args.data)
    for seq in (128, 512):
        batch_size = 4 if args.smoke else BATCH[seq]
        batches = batches_of(args.data / f"pt-{seq}", batch_size, args.warmup + args.steps, args.device)
        for size in sizes:
            for precision in precisions:
                if time.monotonic() > args.deadline:
                    emit(out, {"section": "pretrain", "size": size, "seq": seq, "skipped": "time"})
                    continue
                torch.manual_seed(SEED)
                config = bert_config(size, vocab)
                model = transformers.BertForPreTraining(config).to(args.device).train()
                optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.01)
                forward = torch.compile(model) if compiled else model
                try:
                    first, per_step, loss = timed(training_step(forward, optimizer, precision, args.device), batches,
                                                  args.warmup, args.device)
                except RuntimeError as e:  # out of memory, a kernel missing: the next configuration still runs
                    emit(out, {"section": "pretrain", "size": size, "seq": seq, "precision": precision,
                               "compiled": compiled, "error": str(e)[:300]})
                    del model, optimizer, forward
                    _free()
                    continue
                seq_per_s = batch_size / per_step
                flops = training_flops_per_sequence(config, seq, PREDICTIONS[seq]) * seq_per_s
                emit(out, {"section": "pretrain", "size": size, "seq": seq, "batch": batch_size,
                           "precision": precision, "compiled": compiled, "seq_per_s": round(seq_per_s, 1),
                           "step_ms": round(per_step * 1e3, 2), "first_step_s": round(first, 2),
                           "model_tflops": round(flops / 1e12, 1), "mfu": round(flops / PEAK_FLOPS[precision], 4),
                           "loss": round(loss, 4), "max_memory_gb": _max_memory_gb()})
                del model, optimizer, forward
                _free()


def finetune_speed(args: argparse.Namespace, out: Path) -> None:
    import torch
    import transformers

    size = "smoke" if args.smoke else "base"
    batch_size = 4 if args.smoke else 32
    batches = batches_of(args.data / "sst2", batch_size, args.warmup + args.steps * 2, args.device)
    for precision in ("fp32", "bf16"):
        torch.manual_seed(SEED)
        model = transformers.BertForSequenceClassification(bert_config(size, vocab_size(args.data))).to(args.device)
        optimizer = torch.optim.AdamW(model.train().parameters(), lr=2e-5, weight_decay=0.01)
        first, per_step, loss = timed(training_step(model, optimizer, precision, args.device), batches,
                                      args.warmup, args.device)
        emit(out, {"section": "finetune", "task": "sst2", "size": size, "seq": 128, "batch": batch_size,
                   "precision": precision, "steps_per_s": round(1 / per_step, 1),
                   "seq_per_s": round(batch_size / per_step, 1), "loss": round(loss, 4)})
        del model, optimizer
        _free()


def loader_speed(args: argparse.Namespace, out: Path) -> None:
    """Our loader alone (CPU): Hugging Face batches a second, with 0, 2 and 4 DataLoader workers."""
    from bert_datagen.contract.loading.source import open_source
    from bert_datagen.contract.loading.torch_shares import share_loader

    for seq in (128, 512):
        source = open_source(str(args.data / f"pt-{seq}"))
        batch_size = BATCH[seq]
        steps = sum(source.counts) // batch_size
        for workers in (0, 2, 4):
            loader = share_loader(source, seed=SEED, batch_size=batch_size, stop=steps, num_workers=workers,
                                  pin_memory=args.device.startswith("cuda"))
            start = time.perf_counter()
            count = sum(1 for _ in loader)
            seconds = time.perf_counter() - start
            emit(out, {"section": "loader", "seq": seq, "batch": batch_size, "workers": workers, "batches": count,
                       "seconds": round(seconds, 2), "seq_per_s": round(count * batch_size / seconds, 1)})


def end_to_end(args: argparse.Namespace, out: Path) -> None:
    """BERT base at 128 tokens in bfloat16 (eager) fed by the loader as a user would run it, against the
    same steps on batches already on the GPU, in one process: does the loader keep the GPU busy?"""
    import torch
    import transformers

    from bert_datagen.contract.loading.source import open_source
    from bert_datagen.contract.loading.torch_shares import share_loader

    seq, size = 128, ("smoke" if args.smoke else "base")
    batch_size = 4 if args.smoke else BATCH[seq]
    source = open_source(str(args.data / f"pt-{seq}"))
    steps = min(sum(source.counts) // batch_size, args.warmup + 100)
    torch.manual_seed(SEED)
    model = transformers.BertForPreTraining(bert_config(size, vocab_size(args.data))).to(args.device).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.01)
    step = training_step(model, optimizer, "bf16", args.device)

    def rate(batches: Any) -> float:
        iterator = iter(batches)
        for _ in range(args.warmup):
            step(next(iterator))
        _sync(args.device)
        start, count = time.perf_counter(), 0
        for batch in iterator:
            step(batch)
            count += 1
        _sync(args.device)
        return count * batch_size / (time.perf_counter() - start)

    resident = batches_of(args.data / f"pt-{seq}", batch_size, steps, args.device)
    cuda = args.device.startswith("cuda")
    variants = [("resident", 0, False), ("loader", 0, False), ("loader", 0, cuda), ("loader", 2, cuda),
                ("loader", 4, cuda)]
    reference = None
    for kind, workers, pin in variants:
        if kind == "resident":
            seq_per_s = rate(resident)
            reference = seq_per_s
        else:
            loader = share_loader(source, seed=SEED, batch_size=batch_size, stop=steps, num_workers=workers,
                                  pin_memory=pin, device=args.device)
            seq_per_s = rate(loader)
        emit(out, {"section": "end_to_end", "size": size, "seq": seq, "batch": batch_size, "precision": "bf16",
                   "feed": kind, "workers": workers, "pin_memory": pin, "steps": steps - args.warmup,
                   "seq_per_s": round(seq_per_s, 1), "vs_resident": round(seq_per_s / reference, 3)})


def deterministic_cost(args: argparse.Namespace, out: Path) -> None:
    """Steps/s of BERT base at 128 tokens, bfloat16, eager, with torch's deterministic algorithms off and
    on, alternated over the same resident batches (ABAB), in one process."""
    import torch
    import transformers

    size = "smoke" if args.smoke else "base"
    batch_size = 4 if args.smoke else BATCH[128]
    batches = batches_of(args.data / "pt-128", batch_size, args.warmup + args.steps, args.device)
    torch.manual_seed(SEED)
    model = transformers.BertForPreTraining(bert_config(size, vocab_size(args.data))).to(args.device).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.01)
    step = training_step(model, optimizer, "bf16", args.device)
    times: dict[bool, list[float]] = {False: [], True: []}
    for deterministic in (False, True, False, True):
        torch.use_deterministic_algorithms(deterministic)
        times[deterministic].append(timed(step, batches, args.warmup, args.device)[1])
    off, on = (min(times[k]) for k in (False, True))
    emit(out, {"section": "deterministic_cost", "size": size, "seq": 128, "batch": batch_size,
               "step_ms_off": round(off * 1e3, 2), "step_ms_on": round(on * 1e3, 2), "speed_on_vs_off": round(off / on, 3)})


def determinism(args: argparse.Namespace, out: Path) -> None:
    """Dropout on, bfloat16 autocast: two runs from one seed, and a run resumed from a checkpoint
    taken half way (weights, AdamW state, RNG states, the loader's position) against the straight run."""
    import torch
    import transformers

    torch.use_deterministic_algorithms(args.deterministic)
    size = "smoke" if args.smoke else "base"
    batch_size, steps = (4 if args.smoke else 64), 8
    data = args.data / "pt-128"
    config = bert_config(size, vocab_size(args.data))

    def fresh() -> tuple[Any, Any]:
        torch.manual_seed(SEED)
        model = transformers.BertForPreTraining(config).to(args.device).train()
        return model, torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.01)

    def run(model: Any, optimizer: Any, start: int, stop: int) -> None:
        step = training_step(model, optimizer, "bf16", args.device)
        for batch in batches_of(data, batch_size, stop - start, args.device, start=start):
            step(batch)
        _sync(args.device)

    try:
        _determinism(args, out, fresh, run, size, batch_size, steps, config)
    except RuntimeError as e:  # e.g. a kernel without a deterministic implementation
        emit(out, {"section": "determinism", "deterministic_algorithms": args.deterministic, "error": str(e)[:300]})


def _determinism(args: argparse.Namespace, out: Path, fresh: Any, run: Any, size: str, batch_size: int, steps: int,
                 config: Any) -> None:
    import torch

    digests = []
    for _ in range(2):
        model, optimizer = fresh()
        run(model, optimizer, 0, steps)
        digests.append(_digest(model))
    model, optimizer = fresh()
    run(model, optimizer, 0, steps // 2)
    saved = io.BytesIO()
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "cpu_rng": torch.get_rng_state(),
                "device_rng": _device_rng(args.device)}, saved)
    del model, optimizer
    saved.seek(0)
    state = torch.load(saved, weights_only=False)
    model, optimizer = fresh()
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    torch.set_rng_state(state["cpu_rng"])
    _set_device_rng(args.device, state["device_rng"])
    run(model, optimizer, steps // 2, steps)
    emit(out, {"section": "determinism", "size": size, "seq": 128, "batch": batch_size, "steps": steps,
               "dropout": config.hidden_dropout_prob, "deterministic_algorithms": args.deterministic,
               "two_runs_equal": digests[0] == digests[1], "resumed_equals_straight": _digest(model) == digests[0],
               "digest": digests[0][:16]})


def _digest(model: Any) -> str:
    h = hashlib.sha256()
    for name, value in sorted(model.state_dict().items()):
        h.update(name.encode())
        h.update(value.detach().float().cpu().numpy().tobytes())
    return h.hexdigest()


def _device_rng(device: str) -> Any:
    import torch

    return torch.cuda.get_rng_state() if device.startswith("cuda") else None


def _set_device_rng(device: str, state: Any) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.set_rng_state(state)


def _sync(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _max_memory_gb() -> float | None:
    import torch

    if not torch.cuda.is_available():
        return None
    peak = torch.cuda.max_memory_allocated() / 2**30
    torch.cuda.reset_peak_memory_stats()
    return round(peak, 1)


def _free() -> None:
    import gc

    import torch

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


SECTIONS = {
    **gpu_keras.SECTIONS,
    "determinism": determinism,
    "pretrain-eager": lambda a, o: pretrain_speed(a, o, compiled=False),
    "finetune": finetune_speed,
    "loader": loader_speed,
    "end-to-end": end_to_end,
    "deterministic-cost": deterministic_cost,
    "pretrain-compiled": lambda a, o: pretrain_speed(a, o, compiled=True),
}


def measure(args: argparse.Namespace) -> int:
    """Each section in a process of its own (a CUDA error poisons its process; the deterministic
    sections need cuBLAS's workspace setting before CUDA starts), in order of value, within --budget-s."""
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "gpu.jsonl").write_text("")  # this run's figures only, not appended to an earlier run's
    deadline = time.monotonic() + args.budget_s
    # Ours first: the Hugging Face rows were measured before (docs/gpu.md).
    plan = args.sections or [("keras-pretrain", ["--rows", "targets"]), ("keras-determinism", []),
                             ("keras-finetune", []), ("keras-feed", []), ("keras-pretrain", ["--rows", "others"]),
                             ("determinism", ["--deterministic"]), ("determinism", []), ("pretrain-eager", []),
                             ("finetune", []), ("loader", []), ("end-to-end", []), ("deterministic-cost", []),
                             ("pretrain-compiled", [])]
    with tempfile.TemporaryDirectory(prefix="bench-gpu-site-") as site:
        try:
            unpacked = gpu_wheels.install(args.data / "wheels", Path(site), every_fitting=args.smoke)
        except gpu_wheels.WheelError as exc:
            print(f"bench_gpu measure: {exc}", file=sys.stderr)
            return 1
        print(f"# unpacked onto the path: {', '.join(unpacked) or 'nothing (all installed)'}", flush=True)
        paths = [site, str(Path(__file__).resolve().parents[1]), os.environ.get("PYTHONPATH", "")]
        env = dict(os.environ, CUBLAS_WORKSPACE_CONFIG=":4096:8", PYTHONPATH=os.pathsep.join(filter(None, paths)))
        failed = _run_plan(args, plan, deadline, env)
    rows = [json.loads(line) for line in (args.out / "gpu.jsonl").read_text().splitlines() if line.strip()]
    for line in gpu_keras.mfu_summary(rows):
        print(f"# {line}", flush=True)
    return 1 if failed else 0


def _run_plan(args: argparse.Namespace, plan: list[tuple[str, list[str]]], deadline: float, env: dict) -> int:
    failed = 0
    for name, extra in plan:
        left = deadline - time.monotonic()
        if left < 20:
            emit(args.out, {"section": name, "skipped": "time"})
            continue
        command = [sys.executable, "-m", "benchmarks.bench_gpu", "section", name, "--data", str(args.data),
                   "--out", str(args.out), "--device", args.device, "--steps", str(args.steps),
                   "--warmup", str(args.warmup), "--deadline-in", str(left - 10), *extra]
        if args.smoke:
            command.append("--smoke")
        start = time.monotonic()
        try:
            rc = subprocess.run(command, env=env, timeout=left).returncode
        except subprocess.TimeoutExpired:
            rc = "timeout"
        print(f"# {name} {' '.join(extra)}: rc {rc}, {time.monotonic() - start:.1f} s", flush=True)
        failed += rc != 0
    return failed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    prep = commands.add_parser("prepare")
    prep.add_argument("--out", type=Path, default=Path(".gpu"))
    prep.add_argument("--python-version", default="3.12", help="the accelerator machine's Python, for its wheels")
    for name in ("measure", "section"):
        sub = commands.add_parser(name)
        if name == "section":
            sub.add_argument("name", choices=sorted(SECTIONS))
            sub.add_argument("--deadline-in", type=float, default=1e9)
            sub.add_argument("--deterministic", action="store_true")
            sub.add_argument("--rows", choices=sorted(gpu_keras.ROWS), default="targets",
                             help="keras-pretrain: the rows with a target, or the others")
        sub.add_argument("--data", type=Path, default=Path(".gpu"))
        sub.add_argument("--out", type=Path, required=True)
        sub.add_argument("--device", default="cuda")
        sub.add_argument("--steps", type=int, default=10)
        sub.add_argument("--warmup", type=int, default=3)
        sub.add_argument("--budget-s", type=float, default=480)
        sub.add_argument("--smoke", action="store_true")
        if name == "measure":
            sub.add_argument("--only", dest="sections", type=lambda v: [(n, []) for n in v.split(",")], default=None,
                             help="comma-separated sections to run, in this order (default: all)")
    args = parser.parse_args(argv)
    if args.command != "prepare":
        if not (args.device == "cpu" or args.device.split(":")[0] == "cuda"):
            parser.error(f"--device: cpu or cuda[:N], got {args.device!r}")
        unknown = [n for n, _ in args.sections or [] if n not in SECTIONS] if args.command == "measure" else []
        if unknown:
            parser.error(f"--only: no section {', '.join(map(repr, unknown))} (sections: {', '.join(sorted(SECTIONS))})")
        if not (args.data / "vocab.txt").is_file():
            print(f"bench_gpu: --data {args.data}: not a prepared folder (no vocab.txt): run "
                  "`python -m benchmarks.bench_gpu prepare --out DIR` first", file=sys.stderr)
            return 1
    if args.command == "prepare":
        prepare(args.out, args.python_version)
        return 0
    if args.command == "measure":
        return measure(args)
    args.out.mkdir(parents=True, exist_ok=True)
    args.deadline = time.monotonic() + args.deadline_in
    if not args.device.startswith("cuda"):
        os.environ["JAX_PLATFORMS"] = "cpu"  # before JAX starts: the sections' own JAX, and their runs'
    if args.device.startswith("cuda"):
        import torch

        emit(args.out, {"section": "device", "name": torch.cuda.get_device_name(), "torch": torch.__version__})
    SECTIONS[args.name](args, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
