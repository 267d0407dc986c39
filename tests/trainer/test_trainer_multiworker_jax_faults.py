"""`--strategy multi-worker` on the JAX backend under a killed process and cluster-size changes
(issue #42 point 4), on real processes joined with `jax.distributed` (127.0.0.1, CPU), the tiny
model with its default dropout, `--accumulation-steps 2` on `--masking dynamic` data: the chain of
test_trainer_multiworker_faults.py on JAX.

One run goes through every change and ends compared with one uninterrupted JAX process:
  2 processes, worker 1 SIGKILLed after a checkpoint -> the chief stops with one line (bounded time)
  -> resumed as 1 process (2 -> 1) and stopped -> relaunched as 2 processes (1 -> 2) to the end.
The checkpoint the 2 processes wrote, the weights at each point, every step's loss and the eval
metrics equal the uninterrupted run's (1e-5); only the chief wrote; another global batch on resume
is refused. The chain takes four launches (`heavy`); the suite runs its first part, the kill.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("jax")

from bert_datagen.trainer.model.config import BertConfig  # noqa: E402
from bert_datagen.trainer.runtime import checkpoint as ckpt_lib  # noqa: E402
from tests.support.cluster import LOOPBACK, REPO, bert_train_jax, finish, free_ports, tf_config  # noqa: E402
from tests.support.events import scalars  # noqa: E402
from tests.support.synthetic import write_synthetic_dataset  # noqa: E402

CLUSTER_TIMEOUT = 10
SETTINGS = dict(batch_size=8, accumulation_steps=2, steps=12, learning_rate=2e-3, warmup_steps=1, seed=3,
                checkpoint_every=2, keep_checkpoints=20, log_every=1, eval_batches=1)


def cli_args(data: str, bert_file: Path, out: Path, strategy: str = "multi-worker") -> list[str]:
    options = [f"--{k.replace('_', '-')}={v}" for k, v in SETTINGS.items()]
    more = [f"--cluster-timeout={CLUSTER_TIMEOUT}"] if strategy == "multi-worker" else []
    return ["pretrain", "--data", data, "--bert-config", str(bert_file), "--out", str(out), *options,
            "--backend", "jax", "--strategy", strategy, *more]


def model(run: Path, step: int | None = None) -> dict[str, np.ndarray]:
    ckpt = ckpt_lib.resolve_checkpoint(run) if step is None else ckpt_lib.checkpoint_dir(run, step)
    return ckpt_lib.load_arrays(ckpt, ckpt_lib.MODEL_FILE)


def differences(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> tuple[float, float]:
    """(largest |a - b|, |a - b| / |b| over the whole model)."""
    assert a.keys() == b.keys()
    worst = max(float(np.abs(a[k] - b[k]).max()) for k in a)
    diff = np.sqrt(sum(float(np.sum((a[k].astype(np.float64) - b[k]) ** 2)) for k in a))
    return worst, float(diff / np.sqrt(sum(float(np.sum(b[k].astype(np.float64) ** 2)) for k in a)))


def run_files(run: Path) -> list[str]:
    return sorted(str(p.relative_to(run)) for p in run.rglob("*")
                  if "tensorboard" not in p.parts and not p.name.startswith(".bert-datagen"))


def resume_in_one_process(run: Path, stop_at: int, tmp: Path) -> None:
    """The run resumed by one JAX process (`--strategy one-device`) and stopped after step `stop_at`."""
    recorded = json.loads((run / "train_config.json").read_text())
    spec = tmp / "resume.json"
    spec.write_text(json.dumps({"runs": [{**recorded, "strategy": "one-device", "stop_at": stop_at}]}))
    env = {k: v for k, v in os.environ.items() if k not in ("TF_CONFIG", "XLA_FLAGS")}
    done = subprocess.run([sys.executable, "-m", "tests.support.backend_runs", str(spec)], cwd=REPO,
                          env={**env, "KERAS_BACKEND": "jax", "JAX_PLATFORMS": "cpu"}, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]


@pytest.fixture
def started():
    """The processes a test starts; any still running at its end (a failed assertion) are killed."""
    procs: list[subprocess.Popen] = []
    yield procs
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)


def dataset(root: Path) -> tuple[str, Path]:
    data = write_synthetic_dataset(str(root / "ds"), seq_len=32, max_pred=5, vocab_size=120, train_shards=2,
                                   records_per_shard=24, eval_records=8, masking="dynamic")
    bert_file = root / "bert_config.json"
    bert_file.write_text(json.dumps(BertConfig.from_name("tiny", 120).to_dict()))  # dropout 0.1, the default
    return data, bert_file


def kill_worker_1_after_the_first_checkpoint(data: str, bert_file: Path, run: Path, started: list) -> int:
    """2 processes (worker 1 without TensorFlow); worker 1 SIGKILLed as soon as the chief has a checkpoint
    (stopped first, so no step runs between). The chief must stop with one line naming worker 1 and
    its last checkpoint, within the bound, leaving only whole checkpoints; returns that checkpoint's step."""
    ports = free_ports(2)
    workers = [bert_train_jax(cli_args(data, bert_file, run), tf_config(ports, i, LOOPBACK),
                              without_tensorflow=i == 1) for i in range(2)]
    started.extend(workers)
    deadline = time.monotonic() + 600  # start-up on a loaded machine, not what is tested
    while not ckpt_lib.list_checkpoints(run):
        assert time.monotonic() < deadline and all(p.poll() is None for p in workers), \
            [finish(p, timeout=5) for p in workers if p.poll() is not None]
        time.sleep(0.01)
    os.kill(workers[1].pid, signal.SIGSTOP)
    os.kill(workers[1].pid, signal.SIGKILL)
    killed = time.monotonic()
    rc, out, err = finish(workers[0], timeout=6 * CLUSTER_TIMEOUT)
    stopped_after = time.monotonic() - killed
    workers[1].wait(timeout=30)
    lines = [line for line in err.splitlines() if line.strip()]
    print("STOPPED_AFTER_S", round(stopped_after, 1), lines[-1:])
    assert rc == 1, out[-2000:] + err[-3000:]
    assert len(lines) == 1 and lines[0].startswith("Error: training step "), err[-3000:]
    kept = ckpt_lib.list_checkpoints(run)
    first = kept[-1][0]
    assert "lost worker 1 of the cluster" in lines[0], lines[0]
    assert f"the run can be resumed from {ckpt_lib.checkpoint_dir(run, first)}" in lines[0], lines[0]
    assert stopped_after < 4 * CLUSTER_TIMEOUT
    for _, path in kept:  # nothing half-written looks complete
        assert {ckpt_lib.MODEL_FILE, ckpt_lib.OPTIMIZER_FILE, ckpt_lib.STATE_FILE} <= {p.name for p in path.iterdir()}
    assert not (run / "final_metrics.json").exists()
    return first


@pytest.mark.integration
def test_a_killed_jax_process_stops_the_chief_with_one_line(tmp_path, started):
    data, bert_file = dataset(tmp_path)
    assert kill_worker_1_after_the_first_checkpoint(data, bert_file, tmp_path / "run", started) < SETTINGS["steps"]


@pytest.mark.heavy  # its kill is the suite's test above; the resumes take 4 launches (about 2 minutes here)
def test_a_killed_jax_process_then_resumed_on_other_cluster_sizes_equals_one_uninterrupted_process(tmp_path,
                                                                                                   started):
    data, bert_file = dataset(tmp_path)
    one, run = tmp_path / "one", tmp_path / "run"
    reference = bert_train_jax(cli_args(data, bert_file, one, "one-device"))
    started.append(reference)
    first = kill_worker_1_after_the_first_checkpoint(data, bert_file, run, started)
    kept = ckpt_lib.list_checkpoints(run)
    assert first < SETTINGS["steps"]
    rc, out, err = finish(reference, timeout=300)
    assert rc == 0, err[-3000:]
    worst, relative = differences(model(run, first), model(one, first))
    print("2_PROCESSES_VS_1_AT_STEP", first, worst, relative)
    assert worst <= 1e-5 and relative <= 1e-5

    # Another global batch on resume is refused (one line), before any work.
    refused = bert_train_jax(["pretrain", "--data", data, "--bert-config", str(bert_file), "--out", str(run),
                              "--batch-size", "16", "--steps", str(SETTINGS["steps"]), "--backend", "jax",
                              "--strategy", "one-device"])
    rc, out, err = finish(refused, timeout=120)
    assert rc == 1 and "batch_size: 8 -> 16" in err and len(err.strip().splitlines()) == 1, err[-2000:]
    assert ckpt_lib.list_checkpoints(run) == kept

    # 2 -> 1: the same run resumed by one process, stopped two steps later.
    resume_in_one_process(run, first + 2, tmp_path)
    worst, relative = differences(model(run, first + 2), model(one, first + 2))
    print("2_TO_1_AT_STEP", first + 2, worst, relative)
    assert worst <= 1e-5 and relative <= 1e-5

    # 1 -> 2: every process's command again, to the end.
    ports = free_ports(2)
    workers = [bert_train_jax(cli_args(data, bert_file, run), tf_config(ports, i, LOOPBACK)) for i in range(2)]
    started.extend(workers)
    results = [finish(p) for p in workers]
    for index, (rc, out, err) in enumerate(results):
        assert rc == 0, out[-2000:] + err[-3000:]
        assert f"worker {index} of 2 reads its share of each global batch (4 of 8 sequences)" in out
    assert f"resumed from {ckpt_lib.checkpoint_dir(run, first + 2)}" in results[0][1]
    worst, relative = differences(model(run), model(one))
    print("FINAL", worst, relative)
    assert worst <= 1e-5 and relative <= 1e-5
    reference_losses, losses = scalars(one, "loss"), scalars(run, "loss")
    assert sorted(losses) == sorted(reference_losses) == list(range(1, SETTINGS["steps"] + 1))
    for step, (expected,) in reference_losses.items():  # steps redone after the kill are logged twice
        assert losses[step] == pytest.approx([expected] * len(losses[step]), rel=1e-5, abs=1e-5), step
    final, expected = (json.loads((r / "final_metrics.json").read_text())["eval"] for r in (run, one))
    for name, value in expected.items():
        assert final[name] == pytest.approx(value, rel=1e-5, abs=1e-5), name

    # Only the chief wrote: the files of the one process's run, one event file per launch.
    assert run_files(run) == run_files(one)
    assert len(list((run / "tensorboard" / "train").iterdir())) == 3  # 2 processes, 1 process, 2 processes
    drop = {"strategy", "out"}
    assert {k: v for k, v in json.loads((run / "train_config.json").read_text()).items() if k not in drop} == \
        {k: v for k, v in json.loads((one / "train_config.json").read_text()).items() if k not in drop}
