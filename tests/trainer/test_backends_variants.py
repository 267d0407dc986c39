"""The variants and the safety of a run on both Keras backends (issue #42 point 8), dropout on: LAMB,
packed rows, dynamic masking (words as the masking unit, no NSP) end alike on TensorFlow and JAX; a
dynamic-masking JAX run resumed mid-epoch is bitwise the straight one; on JAX a diverging run stops
on its non-finite loss naming the last good checkpoint, and SIGINT stops it between steps with a
checkpoint of the step it finished, from which the rerun ends bitwise as the run never stopped.

Each backend runs in a process of its own (`tests/support/backend_runs.py`).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("jax")
pytest.importorskip("tensorflow")

from tests.support.packed_rows import write_packed_dataset  # noqa: E402
from tests.support.pipeline_corpus import write_dynamic_dataset  # noqa: E402
from tests.support.synthetic import write_synthetic_dataset  # noqa: E402
from tests.trainer.test_backends import REPO, on_backend, weights, worst_difference  # noqa: E402

STEPS = 8
# float16 computes with a 1e-3 epsilon, and each backend's float16 kernels round differently: where a
# gradient is near zero Adam's step can take another sign, a step of the learning rate's size
# (2e-3) against weights of about 4e-2 (the initialiser's 2 stddev). Measured: 1.5e-2 after 8 steps.
FLOAT16_BOUND = 3e-2


def spec(data: str, out: Path, backend: str, **kw) -> dict:
    return {"data": data, "out": str(out), "model": "tiny", "batch_size": 8, "steps": STEPS, "learning_rate": 2e-3,
            "warmup_steps": 2, "seed": 3, "checkpoint_every": 4, "keep_checkpoints": 5, "log_every": 4,
            "eval_batches": 1, "backend": backend, **kw}


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict:
    tmp = tmp_path_factory.mktemp("variants")
    synthetic = write_synthetic_dataset(str(tmp / "syn"), seq_len=32, max_pred=5, vocab_size=120, train_shards=2,
                                        records_per_shard=48, eval_records=16)
    packed = write_packed_dataset(str(tmp / "packed"), row_length=64, max_sequences=4, seq_len=32, max_pred=5,
                                  vocab_size=120, instances=160)
    dynamic = write_dynamic_dataset(tmp / "dynamic", 120, "word")
    r = {}
    kinds = {"lamb": (synthetic, {"optimizer": "lamb"}), "packed": (packed, {}), "dynamic": (dynamic, {}),
             "float16": (synthetic, {"precision": "mixed_float16"})}
    for backend in ("tensorflow", "jax"):
        runs_of = []
        for kind, (data, extra) in kinds.items():
            r[backend, kind] = tmp / f"{backend}-{kind}"
            runs_of.append(spec(data, r[backend, kind], backend, **extra))
        if backend == "jax":
            r["resumed"] = tmp / "jax-dynamic-resumed"
            runs_of += [spec(dynamic, r["resumed"], "jax", stop_at=4), spec(dynamic, r["resumed"], "jax")]
            # float16 from a scale that overflows at once: its first steps are skipped, halving it.
            r["float16-resumed"] = tmp / "jax-float16-resumed"
            runs_of += [spec(synthetic, r["float16-resumed"], "jax", precision="mixed_float16", stop_at=4),
                        spec(synthetic, r["float16-resumed"], "jax", precision="mixed_float16")]
        if backend == "tensorflow":
            r["float16-to-jax"] = tmp / "float16-to-jax"
            runs_of.append(spec(synthetic, tmp / "float16-tf-half", backend, precision="mixed_float16", stop_at=4))
        if backend == "jax":
            runs_of.append(spec(synthetic, r["float16-to-jax"], "jax", precision="mixed_float16",
                                copy_from=str(tmp / "float16-tf-half")))
        on_backend(backend, {"runs": runs_of}, tmp)
    r["synthetic"] = synthetic
    return r


@pytest.mark.parametrize("kind", ["lamb", "packed", "dynamic", "float16"])
def test_each_variant_ends_alike_on_both_backends(runs, kind):
    worst = worst_difference(weights(runs["tensorflow", kind], STEPS), weights(runs["jax", kind], STEPS))
    print(f"{kind}: weights within {worst:.2e}")
    assert worst <= (FLOAT16_BOUND if kind == "float16" else 1e-3)


def test_float16_keeps_the_same_loss_scale_on_both_backends_and_moves_between_them(runs):
    def state(run: Path) -> tuple[float, int]:
        with np.load(run / f"ckpt-{STEPS:08d}" / "optimizer.npz") as opt:
            return float(opt["loss_scale"]), int(opt["loss_scale_good_steps"])

    tf_state, jax_state = state(runs["tensorflow", "float16"]), state(runs["jax", "float16"])
    print("loss scale (scale, good steps):", tf_state, jax_state)
    assert tf_state == jax_state
    for name in ("model.npz", "optimizer.npz"):  # a float16 JAX run resumes bitwise
        with np.load(runs["jax", "float16"] / f"ckpt-{STEPS:08d}" / name) as a, \
                np.load(runs["float16-resumed"] / f"ckpt-{STEPS:08d}" / name) as b:
            assert all(np.array_equal(a[k], b[k]) for k in a.files), name
    assert state(runs["float16-to-jax"]) == tf_state  # started on TensorFlow, resumed on JAX
    worst = worst_difference(weights(runs["float16-to-jax"], STEPS), weights(runs["tensorflow", "float16"], STEPS))
    print(f"float16 TF -> JAX within {worst:.2e}")
    assert worst <= FLOAT16_BOUND


def test_a_dynamic_masking_jax_run_resumed_mid_epoch_ends_bitwise(runs):
    for name in ("model.npz", "optimizer.npz"):
        with np.load(runs["jax", "dynamic"] / f"ckpt-{STEPS:08d}" / name) as a, \
                np.load(runs["resumed"] / f"ckpt-{STEPS:08d}" / name) as b:
            assert sorted(a.files) == sorted(b.files)
            assert all(np.array_equal(a[k], b[k]) for k in a.files), name


def _train(data: str, out: Path, *extra: str) -> subprocess.Popen:
    args = [sys.executable, "-m", "tests.support.without_tensorflow", "pretrain", "--data", data, "--out", str(out),
            "--model", "tiny", "--batch-size", "8", "--warmup-steps", "1", "--seed", "7", "--log-every", "1",
            "--eval-batches", "1", "--backend", "jax", *extra]
    env = {**{k: v for k, v in os.environ.items() if k != "KERAS_BACKEND"}, "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen(args, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_on_jax_a_diverging_run_stops_on_its_non_finite_loss(runs, tmp_path):
    done = _train(runs["synthetic"], tmp_path / "run", "--steps", "6", "--checkpoint-every", "1",
                  "--learning-rate", "1e30")
    out, err = done.communicate(timeout=300)
    assert done.returncode == 1, out + err
    lines = [line for line in err.splitlines() if line.startswith("Error:")]
    assert len(lines) == 1 and "loss is nan" in lines[0] and "stopped (last good checkpoint:" in lines[0], err[-2000:]
    assert "Traceback" not in err


def test_on_jax_sigint_stops_between_steps_and_the_rerun_ends_bitwise(runs, tmp_path):
    data = runs["synthetic"]
    args = ("--steps", "10", "--checkpoint-every", "100", "--learning-rate", "1e-3")
    straight = _train(data, tmp_path / "straight", *args)
    assert straight.wait(timeout=300) == 0
    run = _train(data, tmp_path / "stopped", *args)
    lines: list[str] = []
    deadline = time.monotonic() + 300
    for line in run.stdout:  # the step lines as they come
        lines.append(line)
        if line.startswith("step") and "/10" in line:
            run.send_signal(signal.SIGINT)
            break
        assert time.monotonic() < deadline
    out, err = run.communicate(timeout=300)
    assert run.returncode == 130, "".join(lines) + out + err
    assert "interrupted at step" in out and "rerun the same command to resume" in out
    saved = sorted(p.name for p in (tmp_path / "stopped").glob("ckpt-*"))
    assert saved and saved[-1] != "ckpt-00000010"  # a checkpoint of the step it finished, not of the end
    again = _train(data, tmp_path / "stopped", *args)
    out, err = again.communicate(timeout=300)
    assert again.returncode == 0, err[-2000:]
    assert "resumed from" in out
    a, b = weights(tmp_path / "straight", 10), weights(tmp_path / "stopped", 10)
    assert all(np.array_equal(a[k], b[k]) for k in a)
