"""Timing `bert-train` runs from their step lines, and the TensorFlow / JAX comparison built on it."""

import sys
import time
from pathlib import Path

import pytest

from benchmarks import backend_speed
from benchmarks.trainer_runs import TimedRun, compare_backends, log_every, summarise, timed_run

# A stand-in for `bert-train`: a slow start (compilation), then a step line every 5 steps of 20 ms,
# then (were it not killed) a long final phase.
FAKE_RUN = """
import sys, time
print("new run (seed 1); data: seq 128, 1 replica(s), float32, Keras on jax", flush=True)
time.sleep(1.0)
for step in range(1, 41):
    time.sleep(0.02)
    if step % 5 == 0:
        print(f"step {step:>7}/100000  loss {10 - step / 10:.4f}  mlm_acc 0.0  12.0 seq/s", flush=True)
time.sleep(60)
"""


def test_a_run_is_timed_after_its_warm_steps_and_killed_after_the_timed_ones():
    start = time.perf_counter()
    run = timed_run([sys.executable, "-c", FAKE_RUN], warm=5, timed=10, backend="jax")
    assert time.perf_counter() - start < 20  # killed at step 15, not left to sleep its 60 s
    assert run.error is None and run.backend == "jax"
    assert run.steps == 10
    assert 0.15 < run.seconds < 2.0  # ten steps of 20 ms, not the 1 s start
    assert run.start_seconds > 1.0  # the start and the first five steps
    assert run.loss == pytest.approx(8.5)
    assert run.steps_per_second == pytest.approx(10 / run.seconds)


def test_a_run_that_stops_early_reports_its_last_line():
    script = "import sys; print('step 1/10  loss 1.0'); print('Error: --backend: jax is not installed'); sys.exit(2)"
    run = timed_run([sys.executable, "-c", script], warm=5, timed=10, backend="jax")
    assert run.error == "Error: --backend: jax is not installed"
    assert run.steps_per_second is None


def test_a_run_that_hangs_is_stopped_at_the_timeout():
    run = timed_run([sys.executable, "-c", "import time; time.sleep(60)"], warm=1, timed=1, timeout=1.0)
    assert run.error == "timed out after 1 s"


def test_log_every_lands_on_both_ends_of_the_timed_window():
    assert log_every(5, 20) == 5 and log_every(2, 8) == 2 and log_every(3, 10) == 1
    with pytest.raises(ValueError):
        log_every(0, 10)


def test_backends_alternate_abba_and_the_ratio_is_of_totals():
    order = []

    def job(backend):
        order.append(backend)
        seconds = {"tensorflow": 2.0, "jax": 1.0}[backend] * (2 if len(order) > 2 else 1)  # round 2 is slower
        return TimedRun(backend, steps=10, seconds=seconds, start_seconds=5.0, loss=1.0)

    runs = compare_backends(job, rounds=2)
    assert order == ["tensorflow", "jax", "jax", "tensorflow"]
    figures = summarise(runs, batch_size=8)
    assert figures["tensorflow"]["steps_per_second"] == pytest.approx(20 / 6.0)
    assert figures["jax"]["sequences_per_second"] == pytest.approx(8 * 20 / 3.0)
    assert figures["jax_over_tensorflow"] == pytest.approx(2.0)
    assert figures["pair_ratios"] == pytest.approx([2.0, 2.0])


def test_a_backend_whose_runs_fail_has_no_rate_and_no_ratio():
    runs = {"tensorflow": [TimedRun("tensorflow", steps=10, seconds=1.0)],
            "jax": [TimedRun("jax", error="finetune does not run on the JAX backend yet")]}
    figures = summarise(runs, batch_size=32)
    assert figures["jax"]["steps_per_second"] is None
    assert figures["jax"]["errors"] == ["finetune does not run on the JAX backend yet"]
    assert figures["jax_over_tensorflow"] is None and figures["pair_ratios"] == []


def test_each_job_runs_on_both_backends_with_jit_on_tensorflow_only(tmp_path: Path, capsys):
    seen = []

    def fake(job, work, backend, with_option, counter):
        seen.append((job.name, backend, with_option))
        return TimedRun(backend, steps=job.timed, seconds=1.0 if backend == "jax" else 2.0)

    jobs = [backend_speed.Job("pretrain x", ("pretrain",), 8, 2, 4), backend_speed.Job("finetune y", ("finetune",), 32, 5, 10)]
    results = backend_speed.run_jobs(jobs, tmp_path, run=fake, has_option=lambda command: command == "pretrain")
    assert [s for s in seen if s[0] == "finetune y"] == [("finetune y", b, False) for b in
                                                         ("tensorflow", "jax", "jax", "tensorflow")]
    assert results["pretrain x"]["jax_over_tensorflow"] == pytest.approx(2.0)
    assert results["pretrain x"]["backend_option"] is True and results["finetune y"]["backend_option"] is False
    backend_speed.print_rows(results)
    assert "2.00" in capsys.readouterr().out


def test_a_backend_run_passes_jit_to_tensorflow_and_backend_to_both(tmp_path: Path, monkeypatch):
    calls = []
    monkeypatch.setattr(backend_speed, "timed_run", lambda command, **kw: calls.append((command, kw)) or TimedRun("x"))
    job = backend_speed.Job("pretrain x", ("pretrain", "--data", "d"), 8, 2, 4)
    for backend in ("tensorflow", "jax"):
        backend_speed.backend_run(job, tmp_path, backend, True, [0])
    (tf_cmd, tf_kw), (jax_cmd, jax_kw) = calls
    assert "--jit" in tf_cmd and "--jit" not in jax_cmd
    assert tf_cmd[tf_cmd.index("--backend") + 1] == "tensorflow" and jax_cmd[jax_cmd.index("--backend") + 1] == "jax"
    assert tf_kw["env"]["KERAS_BACKEND"] == "tensorflow" and jax_kw["env"]["KERAS_BACKEND"] == "jax"
    assert tf_cmd[tf_cmd.index("--log-every") + 1] == "2" and (tf_kw["warm"], tf_kw["timed"]) == (2, 4)
