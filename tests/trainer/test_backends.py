"""The trainer on both Keras backends (issue #42): one model and numerics, the same run on either,
bitwise resume on JAX, a run that moves between them, N devices equal one, and the `--backend` switch.

Each backend runs in a process of its own (Keras fixes its backend at import), through
`tests/support/backend_runs.py`. Dropout is on (the tiny model's default 0.1) in every run.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("jax")
pytest.importorskip("tensorflow")

from tests.support.synthetic import write_synthetic_dataset  # noqa: E402
from tests.support.without_tensorflow import MARK  # noqa: E402

REPO = Path(__file__).resolve().parent.parent.parent
# The attention key bias has no effect on any output (softmax is invariant to a constant added to all
# of a query's scores), so its true gradient is 0 and Adam turns each backend's rounding noise into
# updates of the learning rate's size: the one weight the backends' runs do not share.
NO_EFFECT = "/attention/self/key/bias"


def on_backend(backend: str, spec: dict, tmp: Path, env: dict | None = None) -> str:
    path = tmp / f"spec-{backend}-{len(list(tmp.glob('spec-*')))}.json"
    path.write_text(json.dumps(spec))
    environ = {**os.environ, "KERAS_BACKEND": backend, **(env or {})}
    done = subprocess.run([sys.executable, "-m", "tests.support.backend_runs", str(path)], cwd=REPO,
                          env=environ, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"TENSORFLOW_LOADED {backend == 'tensorflow'}" in done.stdout.splitlines()[-1]
    return done.stdout


def weights(run: Path, step: int) -> dict[str, np.ndarray]:
    with np.load(run / f"ckpt-{step:08d}" / "model.npz") as data:
        return {k: data[k] for k in data.files}


def worst_difference(a: dict, b: dict, skip: str | None = NO_EFFECT) -> float:
    """Largest |a - b| over every array, relative to that array's largest value."""
    assert sorted(a) == sorted(b)
    return max(float(np.max(np.abs(a[k] - b[k])) / max(np.max(np.abs(b[k])), 1e-12))
               for k in a if not (skip and skip in k))


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> str:
    return write_synthetic_dataset(str(tmp_path_factory.mktemp("data") / "ds"), seq_len=32, max_pred=5,
                                   vocab_size=120, train_shards=2, records_per_shard=48, eval_records=16)


def run_spec(data: str, out: Path, **kw) -> dict:
    return {"data": data, "out": str(out), "model": "tiny", "batch_size": 8, "steps": 12, "learning_rate": 2e-3,
            "warmup_steps": 2, "seed": 3, "checkpoint_every": 3, "keep_checkpoints": 5, "log_every": 6,
            "eval_batches": 2, **kw}


@pytest.fixture(scope="module")
def runs(data, tmp_path_factory) -> dict[str, Path]:
    """The same 12-step run on TensorFlow and on JAX; JAX stopped at 6 and resumed; TensorFlow stopped at
    6 and resumed on JAX; and each backend's logits, loss and gradients on one batch."""
    tmp = tmp_path_factory.mktemp("runs")
    r = {name: tmp / name for name in ("tf", "jax", "jax_resumed", "tf_half", "tf_then_jax")}
    on_backend("tensorflow", {"outputs": str(tmp / "tf.npz"), "runs": [
        run_spec(data, r["tf"], backend="tensorflow"),
        run_spec(data, r["tf_half"], backend="tensorflow", stop_at=6)]}, tmp)
    on_backend("jax", {"outputs": str(tmp / "jax.npz"), "runs": [
        run_spec(data, r["jax"], backend="jax"),
        run_spec(data, r["jax_resumed"], backend="jax", stop_at=6),
        run_spec(data, r["jax_resumed"], backend="jax"),
        run_spec(data, r["tf_then_jax"], backend="jax", copy_from=str(r["tf_half"]))]}, tmp)
    r["tf_outputs"], r["jax_outputs"] = tmp / "tf.npz", tmp / "jax.npz"
    return r


def test_one_batch_gives_the_same_logits_losses_and_gradients_on_both_backends(runs):
    with np.load(runs["tf_outputs"]) as tf_out, np.load(runs["jax_outputs"]) as jax_out:
        for name in ("mlm_logits", "nsp_logits", "loss", "mlm_loss"):
            scale = max(float(np.max(np.abs(tf_out[name]))), 1.0)
            assert np.max(np.abs(tf_out[name] - jax_out[name])) / scale <= 1e-5, name
        grads = [k for k in tf_out.files if k.startswith("grad/")]
        assert len(grads) == 46  # every weight of the tiny pre-training model
        for name in grads:
            if NO_EFFECT in name:  # a true gradient of 0: rounding noise on both (and tiny)
                assert np.max(np.abs(jax_out[name])) < 1e-5 and np.max(np.abs(tf_out[name])) < 1e-5
                continue
            ref = tf_out[name]
            assert np.max(np.abs(ref - jax_out[name])) / np.max(np.abs(ref)) <= 1e-4, name


def test_the_same_run_with_dropout_ends_alike_on_both_backends(runs):
    tf_metrics = json.loads((runs["tf"] / "final_metrics.json").read_text())
    jax_metrics = json.loads((runs["jax"] / "final_metrics.json").read_text())
    for part in ("train", "eval"):
        for name in ("loss", "mlm_loss", "nsp_loss"):
            assert abs(tf_metrics[part][name] - jax_metrics[part][name]) <= 1e-3, (part, name)
        for name in ("mlm_accuracy", "nsp_accuracy"):
            assert abs(tf_metrics[part][name] - jax_metrics[part][name]) <= 0.005, (part, name)
    assert worst_difference(weights(runs["jax"], 12), weights(runs["tf"], 12)) <= 1e-3
    # Not the same by accident: the key biases, which only rounding moves, do differ.
    a, b = weights(runs["jax"], 12), weights(runs["tf"], 12)
    assert any(not np.array_equal(a[k], b[k]) for k in a if NO_EFFECT in k)


def test_a_jax_run_resumed_ends_bitwise_as_the_run_that_never_stopped(runs):
    straight, resumed = weights(runs["jax"], 12), weights(runs["jax_resumed"], 12)
    assert all(np.array_equal(straight[k], resumed[k]) for k in straight)
    for name in ("optimizer.npz",):
        with np.load(runs["jax"] / "ckpt-00000012" / name) as a, np.load(runs["jax_resumed"] / "ckpt-00000012" / name) as b:
            assert all(np.array_equal(a[k], b[k]) for k in a.files)


def test_a_run_started_on_tensorflow_resumes_on_jax(runs):
    moved = weights(runs["tf_then_jax"], 12)
    assert worst_difference(moved, weights(runs["tf"], 12)) <= 1e-4
    state = json.loads((runs["tf_then_jax"] / "ckpt-00000012" / "state.json").read_text())
    assert state["backend"] == "jax" and state["step"] == 12
    first = json.loads((runs["tf_then_jax"] / "ckpt-00000006" / "state.json").read_text())
    assert first["backend"] == "tensorflow"


def test_two_devices_of_one_process_equal_one_with_accumulation(data, tmp_path):
    one, two = tmp_path / "one", tmp_path / "two"
    spec = {"data": data, "model": "tiny", "batch_size": 8, "accumulation_steps": 2, "steps": 6,
            "learning_rate": 2e-3, "warmup_steps": 2, "seed": 3, "checkpoint_every": 6, "log_every": 6,
            "eval_batches": 1, "backend": "jax"}
    flags = {"XLA_FLAGS": "--xla_force_host_platform_device_count=2"}
    on_backend("jax", {"runs": [{**spec, "out": str(one), "strategy": "one-device"}]}, tmp_path, flags)
    log = on_backend("jax", {"runs": [{**spec, "out": str(two)}]}, tmp_path, flags)
    assert "2 replica(s)" in log
    assert worst_difference(weights(two, 6), weights(one, 6)) <= 1e-5


def bert_train(*args: str, env: dict | None = None, without_tensorflow: bool = False) -> subprocess.CompletedProcess:
    """`bert-train ARGS`; `without_tensorflow`: as an install without TensorFlow runs it, checked to
    have loaded no TensorFlow module (`tests/support/without_tensorflow.py`)."""
    environ = {k: v for k, v in os.environ.items() if k != "KERAS_BACKEND"}
    entry = "tests.support.without_tensorflow" if without_tensorflow else "bert_datagen.trainer.cli"
    done = subprocess.run([sys.executable, "-m", entry, *args], cwd=REPO, env={**environ, **(env or {})},
                          capture_output=True, text=True, timeout=300)
    if without_tensorflow:
        assert done.stderr.rstrip().endswith(f"{MARK} none"), done.stderr[-2000:]
    return done


def test_the_backend_is_chosen_once_recorded_and_named(data, tmp_path):
    out = tmp_path / "run"
    args = ["pretrain", "--data", data, "--out", str(out), "--steps", "2", "--batch-size", "8",
            "--checkpoint-every", "2", "--log-every", "2", "--warmup-steps", "1"]
    refused = bert_train(*args, "--backend", "jax", env={"KERAS_BACKEND": "tensorflow"})
    assert refused.returncode == 2 and not out.exists()
    assert "--backend jax contradicts KERAS_BACKEND=tensorflow" in refused.stderr
    assert "Traceback" not in refused.stderr
    # Keras's own variable, honoured; on an install without TensorFlow, which none of it imports.
    done = bert_train(*args, env={"KERAS_BACKEND": "jax"}, without_tensorflow=True)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.splitlines()[0].endswith("Keras on jax")
    assert json.loads((out / "train_config.json").read_text())["backend"] == "jax"
    assert json.loads((out / "ckpt-00000002" / "state.json").read_text())["backend"] == "jax"
    unknown = bert_train(*args, "--backend", "torch")
    assert unknown.returncode == 2 and "--backend" in unknown.stderr
    # There, the TensorFlow backend is refused in one line naming the extra that brings it.
    missing = bert_train(*args, "--backend", "tensorflow", without_tensorflow=True)
    assert missing.returncode == 2 and "Traceback" not in missing.stderr
    assert "the tensorflow backend needs tensorflow, which is not installed: pip install 'bert-datagen[train]'" \
        in missing.stderr
    scored = bert_train("eval", "--run", str(out), "--data", data, "--batch-size", "8", "--json",
                        "--backend", "jax", without_tensorflow=True)
    assert scored.returncode == 0, scored.stderr[-2000:]
    on_tf = bert_train("eval", "--run", str(out), "--data", data, "--batch-size", "8", "--json")
    a, b = json.loads(scored.stdout), json.loads(on_tf.stdout)
    assert a["examples"] == b["examples"] == 16
    assert abs(a["loss"] - b["loss"]) <= 1e-5 * abs(b["loss"])
    # An export gives the same bytes from either backend (and needs no TensorFlow).
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [f"w{i}" for i in range(115)]) + "\n")
    for fmt in ("tf1", "hf"):
        exported = {}
        for backend in ("jax", "tensorflow"):
            exported[backend] = tmp_path / f"{fmt}-{backend}"
            casing = ["--do-lower-case"] if fmt == "hf" else []
            done = bert_train("export", "--run", str(out), "--format", fmt, "--out", str(exported[backend]),
                              "--vocab", str(vocab), *casing, env={"KERAS_BACKEND": backend},
                              without_tensorflow=backend == "jax")
            assert done.returncode == 0, done.stderr[-2000:]
        files = sorted(p.name for p in exported["jax"].iterdir())
        assert files == sorted(p.name for p in exported["tensorflow"].iterdir()) and len(files) >= 3
        for name in files:
            assert (exported["jax"] / name).read_bytes() == (exported["tensorflow"] / name).read_bytes(), name
    # Google's TF1 layout and Hugging Face's both start a JAX run on an install without TensorFlow,
    # from exactly the weights they hold.
    for fmt, source in (("tf1", tmp_path / "tf1-jax" / "bert_model.ckpt"), ("hf", tmp_path / "hf-jax")):
        run = tmp_path / f"from-{fmt}"
        started = bert_train("pretrain", "--data", data, "--out", str(run), "--steps", "1", "--batch-size", "8",
                             "--init-checkpoint", str(source), "--learning-rate", "1e-30", "--warmup-steps", "0",
                             "--backend", "jax", without_tensorflow=True)
        assert started.returncode == 0, started.stderr[-2000:]
        assert f"initialised from {source}" in started.stdout
        a, b = weights(out, 2), weights(run, 1)
        # A learning rate of 1e-30 moves no weight (float32): the run starts from the exported ones.
        assert all(np.array_equal(a[k], b[k]) for k in a), fmt


def test_what_jax_does_not_run_yet_is_refused_before_any_work(data, tmp_path, monkeypatch):
    from bert_datagen.trainer.errors import TrainConfigError
    from bert_datagen.trainer.pretrain.config import TrainConfig
    from bert_datagen.trainer.pretrain.train import PretrainRun
    from bert_datagen.trainer.runtime import checkpoint as ckpt_lib

    def refused(**kw):
        cfg = TrainConfig(**{**run_spec(data, tmp_path / "run", backend="jax"), **kw})
        with pytest.raises(TrainConfigError) as caught:
            PretrainRun(cfg, log=lambda _: None)
        assert not (tmp_path / "run").exists()
        return str(caught.value)

    assert "--strategy tpu runs on TensorFlow only" in refused(strategy="tpu")
    assert "--strategy multi-worker: the cluster must be joined" in refused(strategy="multi-worker")
    monkeypatch.setattr(ckpt_lib, "reads_through_tf_data", lambda run_dir: True)
    assert "a run of an earlier version, which reads through tf.data" in refused()
