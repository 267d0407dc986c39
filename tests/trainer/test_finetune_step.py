"""The fine-tuning step under the settings the pre-training tests cover (tests/trainer/test_trainer_runs.py):
two mirrored replicas, mixed precision and an XLA-compiled step. Fine-tuning shares that step
(trainer/runtime/step.py), but through its own objective, heads and loop; tiny task datasets."""

from __future__ import annotations

import math
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

from bert_datagen.trainer.finetune.train import FinetuneConfig, FinetuneRun, finetune  # noqa: E402
from bert_datagen.trainer.runtime import checkpoint as ckpt_lib  # noqa: E402
from tests.support.task_fixtures import classification_dataset, write_pretrain_run  # noqa: E402
from tests.support.xla_checks import Recorded, assert_static_and_compiled, to_object_store  # noqa: E402

REPO = Path(__file__).resolve().parent.parent.parent
TESTS = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def init_run(tmp_path_factory) -> str:
    return write_pretrain_run(str(tmp_path_factory.mktemp("pre") / "run"))


def _cfg(data: str, out: Path, init: str, **kw) -> FinetuneConfig:
    base = {"epochs": 1, "max_steps": 3, "learning_rate": 1e-3, "batch_size": 8, "log_every": 1, "seed": 5}
    base.update(kw)
    return FinetuneConfig(data=data, out=str(out), init_from=init, **base)


def _arrays(run: Path, file: str = ckpt_lib.MODEL_FILE) -> dict[str, np.ndarray]:
    return ckpt_lib.load_arrays(ckpt_lib.resolve_checkpoint(run), file)


def _logged_losses(lines: list[str]) -> list[float]:
    return [float(m.group(1)) for line in lines if (m := re.search(r"^step +\d+/\d+ +loss (\S+)", line))]


def _assert_finite_metrics(result: dict) -> None:
    assert result["final"], result
    assert all(math.isfinite(v) for v in result["final"].values()), result["final"]


MIRRORED = textwrap.dedent("""
    import sys, numpy as np, tensorflow as tf
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
    from bert_datagen.trainer.runtime import checkpoint as ck
    from bert_datagen.trainer.finetune.train import FinetuneConfig, FinetuneRun
    data, init, out = sys.argv[1:4]
    runs = {"one-device": {"strategy": "one-device"}, "one-device-acc2": {"strategy": "one-device", "accumulation_steps": 2},
            "mirrored-acc2": {"strategy": "mirrored", "accumulation_steps": 2}}
    for name, kw in runs.items():
        run = FinetuneRun(FinetuneConfig(data=data, out=f"{out}/{name}", init_from=init, epochs=1, max_steps=10,
                                         learning_rate=1e-3, batch_size=8, log_every=10, seed=5, **kw), log=print)
        print("REPLICAS", name, run.training.replicas)
        result = run.run()
        print("METRICS", name, *(f"{k}={v!r}" for k, v in sorted(result["final"].items())))
    for name in ("one-device-acc2", "mirrored-acc2"):
        for file in (ck.MODEL_FILE, ck.OPTIMIZER_FILE):
            a = ck.load_arrays(ck.resolve_checkpoint(f"{out}/one-device"), file)
            b = ck.load_arrays(ck.resolve_checkpoint(f"{out}/{name}"), file)
            assert a.keys() == b.keys()
            print("WORST", name, file, max(float(np.abs(a[k].astype(np.float64) - b[k]).max()) for k in a))
    start = ck.load_arrays(ck.resolve_checkpoint(init), ck.MODEL_FILE)
    trained = ck.load_arrays(ck.resolve_checkpoint(f"{out}/one-device"), ck.MODEL_FILE)
    print("MOVED", max(float(np.abs(trained[k] - start[k]).max()) for k in trained if k in start))
""")


@pytest.mark.integration
def test_mirrored_over_two_cpus_equals_one_device(tmp_path, init_run):
    # Dropout on everywhere (the encoder's 0.1 and the classification head's own 0.1).
    data = classification_dataset(str(tmp_path / "cls"))
    script = tmp_path / "mirrored.py"
    script.write_text(MIRRORED)
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONPATH": os.pathsep.join([str(REPO), str(TESTS)])}
    proc = subprocess.run([sys.executable, str(script), data, init_run, str(tmp_path)], capture_output=True,
                          text=True, timeout=400, cwd=REPO, env=env)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    lines = proc.stdout.splitlines()
    replicas = {w[1]: int(w[2]) for w in (line.split() for line in lines) if w[0] == "REPLICAS"}
    assert replicas == {"one-device": 1, "one-device-acc2": 1, "mirrored-acc2": 2}
    for line in (line for line in lines if line.startswith("METRICS")):
        values = [float(item.split("=", 1)[1]) for item in line.split()[2:]]
        assert values and all(math.isfinite(v) for v in values), line
    worst = {(w[1], w[2]): float(w[3]) for w in (line.split() for line in lines) if w[0] == "WORST"}
    assert len(worst) == 4
    # Accumulation, then two replicas with accumulation: the same gradients summed in another order.
    assert max(worst.values()) < 1e-5, worst
    # The runs trained at all (runs that never moved their weights would pass the check above too).
    moved = [float(line.split()[1]) for line in lines if line.startswith("MOVED")]
    assert moved and moved[0] > 1e-4, moved


def _update(run: Path, start: dict[str, np.ndarray]) -> np.ndarray:
    """All encoder weights' change over the run, as one vector."""
    trained = _arrays(run)
    return np.concatenate([(trained[k] - start[k]).ravel() for k in sorted(trained) if k in start])


@pytest.mark.integration
def test_mixed_precision_runs_close_to_float32(tmp_path, init_run):
    data = classification_dataset(str(tmp_path / "data"))
    start = _arrays(Path(init_run))
    ref_log: list[str] = []
    ref = finetune(_cfg(data, tmp_path / "f32", init_run), log=ref_log.append)
    _assert_finite_metrics(ref)
    ref_losses = _logged_losses(ref_log)
    reference = _update(tmp_path / "f32", start)
    assert len(ref_losses) == 3 and np.abs(reference).max() > 1e-3
    for precision in ("mixed_bfloat16", "mixed_float16"):
        log: list[str] = []
        res = finetune(_cfg(data, tmp_path / precision, init_run, precision=precision), log=log.append)
        _assert_finite_metrics(res)
        assert _logged_losses(log) == pytest.approx(ref_losses, rel=0.02), precision
        assert all(w.dtype == np.float32 for w in _arrays(tmp_path / precision).values())  # float32 master weights
        slots = _arrays(tmp_path / precision, ckpt_lib.OPTIMIZER_FILE)
        assert ("loss_scale" in slots) == (precision == "mixed_float16")
        if precision == "mixed_float16":  # every step finite, applied and counted at the initial scale
            assert (float(slots["loss_scale"]), int(slots["loss_scale_good_steps"])) == (2.0**15, 3)
        # The same update direction as float32's. Not close weights, as pre-training asserts: with
        # hidden size 16 and Adam's sign-like first steps, tiny gradients of either sign move a
        # weight by the full step (measured cosine 0.83 bfloat16, 0.91 float16; unrelated updates,
        # or a run whose float16 steps all overflowed and were skipped, give about 0 or nan).
        update = _update(tmp_path / precision, start)
        cosine = float(update @ reference / (np.linalg.norm(update) * np.linalg.norm(reference)))
        assert cosine > 0.6, (precision, cosine)


@pytest.mark.integration
def test_jit_compiled_step_matches_the_graph_step(tmp_path, init_run):
    # Dropout on (the encoder's 0.1 and the classification head's own): XLA draws the same masks.
    data = classification_dataset(str(tmp_path / "cls"))
    graph = finetune(_cfg(data, tmp_path / "graph", init_run, max_steps=6), log=lambda _: None)
    # TPU readiness (tests/trainer/test_trainer_tpu_ready.py), here where an XLA run is paid for
    # anyway: the data read through tf.io.gfile (ram:// for gs://), the step compiled from static shapes.
    remote = to_object_store(data, f"ram://{tmp_path.name}/cls")
    run = FinetuneRun(_cfg(remote, tmp_path / "xla", init_run, jit=True, max_steps=6), log=lambda _: None)
    run.training.step_function = recorded = Recorded(run.training.step_function)
    xla = run.run()
    assert_static_and_compiled(recorded, micro_batch=8)
    _assert_finite_metrics(graph)
    _assert_finite_metrics(xla)
    a, b = _arrays(tmp_path / "graph"), _arrays(tmp_path / "xla")
    start = _arrays(Path(init_run))
    assert not np.array_equal(a["bert/encoder/layer_0/output/dense/kernel"],
                              start["bert/encoder/layer_0/output/dense/kernel"])
    worst = max(float(np.abs(b[k] - a[k]).max()) for k in a)
    print("MAX_ABS_WEIGHT_DIFF_JIT", worst)
    assert worst <= 1e-5
