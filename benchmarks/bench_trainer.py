"""Trainer throughput: sequences/s, model FLOP utilisation, input-pipeline overhead.

All ratios are taken in one run on this machine:
- MFU = model FLOPs per second of training / dense float32 matmul FLOP/s measured just before.
  Model FLOPs of a step = 3 x forward FLOPs (backward is about twice the forward), counting the
  matmuls only (projections, attention scores and context, FFN, pooler, MLM transform and the
  tied output matrix).
- Input overhead = step rate reading the TFRecords through the real tf.data pipeline / step rate on
  the same batches already in memory (target >= 0.97); "tiny-dynamic" reads unmasked records and
  masks every batch in the pipeline (dynamic masking, `bert_datagen.trainer.pretrain.dynamic_input`). Blocks of steps
  alternate real / cached (ABBA) so that other jobs on a shared machine load both alike; the
  figure is the median of the per-pair ratios, beside the ratio of the totals. Because wall time on
  a shared machine still moves with other jobs, the process CPU time per step is reported too:
  cached CPU / real CPU bounds the slowdown the input pipeline can cause on a saturated machine
  (its threads compete with the step for the same cores), whatever the other jobs do.
- Backends (`backend_speed`): the same `bert-train` pre-training jobs (tiny; 4 layers of base's width)
  and SST-2 fine-tuning on TensorFlow with `--jit` and on JAX, steady-state steps/s and the JAX/TF
  ratio, the runs alternated A B B A.
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time

MODELS = {
    # name: (size, vocab, seq, predictions, batch)  -- "small" is the naive-Keras reference point
    # of MEASUREMENTS.md (4 layers, 512 wide, 30k vocab, 20 predictions, 32 x 128).
    "small": ("small", 30522, 128, 20, 32),
    "tiny": ("tiny", 30522, 128, 20, 32),
    "tiny-dynamic": ("tiny", 30522, 128, 20, 32),
}


def matmul_flops_per_second(n: int = 1024, seconds: float = 3.0) -> float:
    import tensorflow as tf

    a = tf.random.normal((n, n), seed=1)
    b = tf.random.normal((n, n), seed=2)

    @tf.function
    def chain(a, b):
        x = a
        for _ in range(8):
            x = tf.matmul(x, b) * 1e-3
        return x

    chain(a, b).numpy()
    runs, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        chain(a, b).numpy()
        runs += 1
    return runs * 8 * 2 * n**3 / (time.perf_counter() - start)


def training_flops_per_sequence(bert, seq: int, predictions: int) -> float:
    h, f, v, layers = bert.hidden_size, bert.intermediate_size, bert.vocab_size, bert.num_hidden_layers
    per_layer = 2 * seq * (4 * h * h + 2 * h * f) + 2 * 2 * seq * seq * h
    heads = 2 * h * h + 2 * predictions * (h * h + h * v)  # pooler, MLM transform + output
    return 3.0 * (layers * per_layer + heads)


def _make_run(workdir: str, size: str, vocab: int, seq: int, preds: int, batch: int, masking: str = "static"):
    from bert_datagen.trainer.pretrain.config import TrainConfig
    from bert_datagen.trainer.pretrain.train import PretrainRun
    from tests.support.synthetic import write_synthetic_dataset

    data = os.path.join(workdir, f"data-{vocab}-{seq}-{masking}")
    if not os.path.exists(os.path.join(data, "manifest.json")):
        write_synthetic_dataset(data, seq_len=seq, max_pred=preds, vocab_size=vocab, train_shards=4,
                                records_per_shard=256, eval_records=0, masking=masking)
    cfg = TrainConfig(data=data, out=os.path.join(workdir, f"run-{size}-{masking}"), model=size, batch_size=batch,
                      steps=10**6, learning_rate=1e-4, warmup_steps=100)
    return PretrainRun(cfg, log=lambda _: None)


def train_step_of(run):
    """The run's optimizer step as (batch, lr, step) -> figures: `run.training.train_step` where the
    trainer has one step object for both backends, else its TensorFlow step functions."""
    training = getattr(run, "training", None)
    if training is not None:
        import numpy as np

        return lambda batch, lr, step: training.train_step(batch, np.float32(lr), step)
    import tensorflow as tf

    return lambda batch, lr, step: run.steps.train_step(batch, tf.constant(lr), tf.constant(step, tf.int64))


def _timed_steps(run, batches, step0: int) -> tuple[float, float]:
    """(wall, process CPU) seconds for len(batches) steps, or that many steps from the pipeline
    when batches is an int."""
    step = train_step_of(run)
    start, cpu = time.perf_counter(), time.process_time()
    # From the pipeline, each batch is fetched inside the timed loop, as the real loop does.
    source = (run.next_batch() for _ in range(batches)) if isinstance(batches, int) else batches
    for i, batch in enumerate(source):
        sums = step(batch, 1e-4, step0 + i)
        float(sums["mlm_ce"])  # the real loop reads the loss every step
    return time.perf_counter() - start, time.process_time() - cpu


def input_ratios(real: list[tuple[float, float]], cached: list[tuple[float, float]]) -> dict[str, float]:
    """Real-input over cached-input step rate from paired blocks of equal step counts: the median of
    the per-pair wall ratios, the ratio of total wall times, and the ratio of total CPU times."""
    pairs = [c[0] / r[0] for r, c in zip(real, cached, strict=True)]
    return {
        "input_ratio_median_of_pairs": statistics.median(pairs),
        "input_ratio_real_over_cached": sum(c[0] for c in cached) / sum(r[0] for r in real),
        "input_cpu_ratio_cached_over_real": sum(c[1] for c in cached) / sum(r[1] for r in real),
        "input_ratio_pairs": pairs,
    }


def bench_model(workdir: str, name: str, steps: int, rounds: int) -> dict:
    size, vocab, seq, preds, batch = MODELS[name]
    run = _make_run(workdir, size, vocab, seq, preds, batch, "dynamic" if name.endswith("dynamic") else "static")
    _timed_steps(run, 2, 0)  # trace + warm up
    cached = [run.next_batch() for _ in range(steps)]
    _timed_steps(run, cached[:1], 0)
    real_blocks: list[tuple[float, float]] = []
    cached_blocks: list[tuple[float, float]] = []
    matmul_rates = []
    # Rounds alternate matmul / real input / cached input, swapping the order of the two inputs
    # every round (ABBA), so that load from other processes on this shared machine hits every
    # figure alike.
    for r in range(rounds):
        matmul_rates.append(matmul_flops_per_second(seconds=1.0))
        first_real = r % 2 == 0
        for real_now in (first_real, not first_real):
            if real_now:
                real_blocks.append(_timed_steps(run, steps, 10 + r * steps))
            else:
                cached_blocks.append(_timed_steps(run, cached, 10 + r * steps))
    matmul_rates.append(matmul_flops_per_second(seconds=1.0))
    matmul_rate = sum(matmul_rates) / len(matmul_rates)
    n = steps * rounds
    cached_time = sum(b[0] for b in cached_blocks)
    seq_per_s = n * batch / cached_time
    flops = training_flops_per_sequence(run.bert, seq, preds) * seq_per_s
    return {
        "model": (f"{size} (L{run.bert.num_hidden_layers} H{run.bert.hidden_size}), vocab {vocab}, batch {batch}x{seq}, "
                  f"P {preds}{', dynamic masking' if name.endswith('dynamic') else ''}"),
        "seconds_per_step": cached_time / n,
        "cpu_seconds_per_step_cached": sum(b[1] for b in cached_blocks) / n,
        "cpu_seconds_per_step_real": sum(b[1] for b in real_blocks) / n,
        "sequences_per_second": seq_per_s,
        "model_gflops_per_second": flops / 1e9,
        "matmul_gflops_per_second": matmul_rate / 1e9,
        "mfu_vs_matmul": flops / matmul_rate,
        **input_ratios(real_blocks, cached_blocks),
    }


def masking_cost(batch: int = 32, seq: int = 128, repeats: int = 50) -> dict[str, float]:
    """Milliseconds to mask one batch with `bert_datagen.datagen.dynamic.mask_records` (the input pipeline's
    per-batch work under dynamic masking), per masking unit, on realistic word pieces."""
    import numpy as np

    from bert_datagen.datagen.config import DatagenConfig
    from bert_datagen.datagen.dynamic import mask_records
    from bert_datagen.datagen.rng import Stream

    class Vocab:  # a BERT-like layout: ids 0-4 special, every third piece a "##" continuation
        size, pad_id, cls_id, sep_id, mask_id = 30522, 0, 2, 3, 4
        is_continuation = np.arange(30522) % 3 == 0

    draws = Stream.for_purpose(1, "bench-masking").u64_array(batch * seq).reshape(batch, seq)
    ids = (5 + draws % np.uint64(30000)).astype(np.int32)
    ids[:, 0], ids[:, seq // 2], ids[:, -1] = 2, 3, 3
    mask = np.ones((batch, seq), np.int32)
    keys = np.arange(batch, dtype=np.int64)
    out = {}
    for unit in ("token", "word", "span"):
        config = DatagenConfig(max_seq_length=seq, max_predictions_per_seq=20, masking_unit=unit)
        start = time.perf_counter()
        for epoch in range(repeats):
            mask_records(ids, mask, keys, epoch, 1, config, Vocab)
        out[unit] = (time.perf_counter() - start) / repeats * 1e3
    return out


def main(quick: bool = False, only_backends: bool = False) -> dict:
    from pathlib import Path

    from benchmarks import backend_speed

    with tempfile.TemporaryDirectory() as workdir:
        backends = backend_speed.main(Path(workdir), quick)
    if only_backends:
        return {"backends": backends}
    results = _in_process(quick)
    results["backends"] = backends
    return results


def _in_process(quick: bool) -> dict:
    import tensorflow as tf

    # Each PretrainRun turns determinism on for its seed itself.
    results: dict = {"intra_op_threads": tf.config.threading.get_intra_op_parallelism_threads()}
    with tempfile.TemporaryDirectory() as workdir:
        results["tiny"] = bench_model(workdir, "tiny", steps=5 if quick else 8, rounds=2 if quick else 8)
        results["tiny-dynamic"] = bench_model(workdir, "tiny-dynamic", steps=5 if quick else 8,
                                              rounds=2 if quick else 8)
        results["small"] = bench_model(workdir, "small", steps=2, rounds=2 if quick else 6)
    print(f"{'model':<70} {'s/step':>7} {'seq/s':>7} {'GFLOP/s':>8} {'matmul':>7} {'MFU':>6} {'input':>6} "
          f"{'total':>6} {'CPU':>6}")
    for key in ("tiny", "tiny-dynamic", "small"):
        r = results[key]
        print(f"{r['model']:<70} {r['seconds_per_step']:>7.3f} {r['sequences_per_second']:>7.1f} "
              f"{r['model_gflops_per_second']:>8.1f} {r['matmul_gflops_per_second']:>7.1f} "
              f"{r['mfu_vs_matmul']:>6.1%} {r['input_ratio_median_of_pairs']:>6.3f} "
              f"{r['input_ratio_real_over_cached']:>6.3f} {r['input_cpu_ratio_cached_over_real']:>6.3f}")
    results["dynamic_mask_ms_per_batch"] = masking_cost()
    print("dynamic masking, ms per batch of 32 x 128 (host, in the pipeline's parallel map): "
          + ", ".join(f"{unit} {ms:.2f}" for unit, ms in results["dynamic_mask_ms_per_batch"].items()))
    print("GFLOP/s: model matmul FLOPs (3x forward) per second; matmul: dense float32 1024^2 matmul rate "
          "measured between the timed blocks; MFU = their ratio; input: step rate with TFRecord input / "
          "with the same batches in memory, median over ABBA pairs of blocks (target >= 0.97); total: the "
          "same from total times; CPU: process CPU per step cached / real (the bound on a saturated machine)")
    return results


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer steps and rounds")
    parser.add_argument("--backends-only", action="store_true", help="only the TensorFlow / JAX rows")
    options = parser.parse_args()
    main(options.quick, options.backends_only)
