"""`--strategy multi-worker` under faults and cluster-size changes, on real worker processes
(localhost, CPU, the tiny model with its default dropout, --accumulation-steps 2 on --masking dynamic data).

To keep the suite's time, one run goes through every change and ends compared with one
uninterrupted 1-process run of the same global batch:
  2 workers, one SIGKILLed after a checkpoint -> the other stops with one line (bounded time)
  -> resumed as 1 process (2 -> 1) and stopped -> relaunched as 2 workers (1 -> 2) to the end.
Every step's loss, the checkpoint the 2 workers wrote, the final weights and the eval metrics
equal the uninterrupted run's (1e-5), and the run directory holds the same files as its own: only the
chief wrote. Changing the global batch on resume is refused.
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

tf = pytest.importorskip("tensorflow")

from click.testing import CliRunner  # noqa: E402

from bert_datagen.trainer.cli import main  # noqa: E402
from bert_datagen.trainer.model.config import BertConfig  # noqa: E402
from bert_datagen.trainer.pretrain.config import TrainConfig  # noqa: E402
from bert_datagen.trainer.pretrain.train import pretrain  # noqa: E402
from bert_datagen.trainer.runtime import checkpoint as ckpt_lib  # noqa: E402
from tests.support.cluster import REPO, finish, free_ports, tf_config  # noqa: E402
from tests.support.synthetic import write_synthetic_dataset  # noqa: E402

CLUSTER_TIMEOUT = 10
SETTINGS = dict(batch_size=8, accumulation_steps=2, steps=12, learning_rate=2e-3, warmup_steps=1, seed=3,
                checkpoint_every=2, keep_checkpoints=20, log_every=1, eval_batches=1)


def cli_args(data: str, bert_file: Path, out: Path) -> list[str]:
    options = [f"--{k.replace('_', '-')}={v}" for k, v in SETTINGS.items()]
    return ["pretrain", "--data", data, "--bert-config", str(bert_file), "--out", str(out), *options,
            "--strategy", "multi-worker", f"--cluster-timeout={CLUSTER_TIMEOUT}"]


def worker(args: list[str], tf_config_value: str) -> subprocess.Popen:
    """A worker as a user starts it (TF_CPP_MIN_LOG_LEVEL unset: the command quiets TensorFlow)."""
    env = {k: v for k, v in os.environ.items() if k not in ("TF_CONFIG", "TF_CPP_MIN_LOG_LEVEL")}
    env.update(TF_CONFIG=tf_config_value, CUDA_VISIBLE_DEVICES="")
    return subprocess.Popen([sys.executable, "-m", "bert_datagen.trainer.cli", *args], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def model(run: Path, step: int | None = None) -> dict[str, np.ndarray]:
    ckpt = ckpt_lib.resolve_checkpoint(run) if step is None else ckpt_lib.checkpoint_dir(run, step)
    return ckpt_lib.load_arrays(ckpt, ckpt_lib.MODEL_FILE)


def max_diff(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> float:
    assert a.keys() == b.keys()
    return max(float(np.abs(a[k] - b[k]).max()) for k in a)


def losses_by_step(run: Path) -> dict[int, list[float]]:
    """Every logged training loss of a run, by step (a step redone after a resume is logged twice)."""
    found: dict[int, list[float]] = {}
    for path in sorted((run / "tensorboard" / "train").iterdir()):
        for event in tf.compat.v1.train.summary_iterator(str(path)):
            for value in event.summary.value:
                if value.tag == "loss":
                    found.setdefault(event.step, []).append(float(value.simple_value))
    return found


def run_files(run: Path) -> list[str]:
    return sorted(str(p.relative_to(run)) for p in run.rglob("*")
                  if "tensorboard" not in p.parts and not p.name.startswith(".bert-datagen"))


def json_without(path: Path, drop: set[str]) -> dict:
    return {k: v for k, v in json.loads(path.read_text()).items() if k not in drop}


def assert_nothing_half_written_looks_complete(run: Path) -> None:
    for child in run.iterdir():
        if child.name.startswith("ckpt-"):
            names = {p.name for p in child.iterdir()}
            assert {ckpt_lib.MODEL_FILE, ckpt_lib.OPTIMIZER_FILE, ckpt_lib.STATE_FILE} <= names, child
    assert not (run / "final_metrics.json").exists()


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The dataset, the model config and the uninterrupted 1-process run."""
    root = tmp_path_factory.mktemp("mw-faults")
    data = write_synthetic_dataset(str(root / "ds"), seq_len=32, max_pred=5, vocab_size=120, train_shards=2,
                                   records_per_shard=24, eval_records=8, masking="dynamic")
    bert = BertConfig.from_name("tiny", 120).to_dict()  # dropout 0.1, the default
    bert_file = root / "bert_config.json"
    bert_file.write_text(json.dumps(bert))
    result = pretrain(TrainConfig(data=data, out=str(root / "one"), bert_config=bert, strategy="one-device",
                                  **SETTINGS), log=lambda _: None)
    return data, bert_file, root / "one", result


@pytest.fixture
def started():
    """The worker processes a test starts; any still running at its end (a failed assertion) are killed."""
    procs: list[subprocess.Popen] = []
    yield procs
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)


@pytest.mark.integration
def test_killed_worker_then_resumed_on_other_cluster_sizes_equals_one_uninterrupted_process(reference, tmp_path,
                                                                                           started):
    data, bert_file, one, one_result = reference
    run = tmp_path / "run"
    ports = free_ports(2)
    workers = [worker(cli_args(data, bert_file, run), tf_config(ports, i)) for i in range(2)]
    started.extend(workers)

    # Kill worker 1 as soon as the chief has a checkpoint (stopped first, so no step runs between).
    # Reaching it is start-up (two TensorFlow imports, the join, two steps), not what is tested:
    # the wait is long enough for a loaded machine (`make test`), and ends early if a worker exits.
    deadline = time.monotonic() + 600
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
    assert "lost worker 1 of the cluster" in lines[0] and "the run can be resumed from" in lines[0], lines[0]
    assert stopped_after < 4 * CLUSTER_TIMEOUT
    assert_nothing_half_written_looks_complete(run)
    kept = ckpt_lib.list_checkpoints(run)
    first = kept[-1][0]
    assert first < SETTINGS["steps"]
    worst_two = max_diff(model(one, first), model(run, first))
    print("MAX_ABS_WEIGHT_DIFF_2_WORKERS_VS_1_AT_STEP", first, worst_two)
    assert worst_two <= 1e-5

    # Changing the global batch on resume is refused (one line), before any work.
    res = CliRunner().invoke(main, ["pretrain", "--data", data, "--bert-config", str(bert_file), "--out", str(run),
                                    "--batch-size", "16", "--steps", str(SETTINGS["steps"]),
                                    "--strategy", "one-device"])
    assert res.exit_code == 1 and "batch_size: 8 -> 16" in res.output, res.output
    assert len(res.output.strip().splitlines()) == 1, res.output
    assert ckpt_lib.list_checkpoints(run) == kept

    # 2 -> 1: the same run resumed by one process, stopped two steps later.
    recorded = json.loads((run / "train_config.json").read_text())
    resumed = pretrain(TrainConfig(**{**recorded, "strategy": "one-device"}), log=lambda _: None, stop_at=first + 2)
    assert resumed["step"] == first + 2
    worst_elastic = max_diff(model(one, first + 2), model(run, first + 2))
    print("MAX_ABS_WEIGHT_DIFF_2_TO_1_AT_STEP", first + 2, worst_elastic)
    assert worst_elastic <= 1e-5

    # 1 -> 2: every worker's command again, to the end.
    ports = free_ports(2)
    workers = [worker(cli_args(data, bert_file, run), tf_config(ports, i)) for i in range(2)]
    started.extend(workers)
    results = [finish(p) for p in workers]
    for rc, out, err in results:
        assert rc == 0, out[-2000:] + err[-3000:]
    assert f"resumed from {ckpt_lib.checkpoint_dir(run, first + 2)}" in results[0][1]
    for index, (_, out, _) in enumerate(results):  # each reads its share of every global batch
        assert f"worker {index} of 2 reads its share of each global batch (4 of 8 sequences)" in out
    worst = max_diff(model(one), model(run))
    print("MAX_ABS_WEIGHT_DIFF_FINAL", worst)
    assert worst <= 1e-5
    reference_losses, losses = losses_by_step(one), losses_by_step(run)
    assert sorted(losses) == sorted(reference_losses) == list(range(1, SETTINGS["steps"] + 1))
    for step, (expected,) in reference_losses.items():
        assert losses[step] == pytest.approx([expected] * len(losses[step]), abs=1e-5), step
    final = json.loads((run / "final_metrics.json").read_text())
    for k, v in one_result["eval"].items():
        assert final["eval"][k] == pytest.approx(v, abs=1e-5), k

    # Only the chief wrote: the run directory holds what the one process's holds (the same files,
    # the same records but for the strategy, the same checkpoints), one event file per launch.
    assert run_files(run) == run_files(one)
    assert len(list((run / "tensorboard" / "train").iterdir())) == 3  # 2 workers, 1 process, 2 workers
    drop = {"strategy", "out"}
    assert json_without(run / "train_config.json", drop) == json_without(one / "train_config.json", drop)
    for name in ("bert_config.json", "dataset.json"):
        assert (run / name).read_text() == (one / name).read_text()
    for step in range(SETTINGS["checkpoint_every"], SETTINGS["steps"] + 1, SETTINGS["checkpoint_every"]):
        s1, s2 = (ckpt_lib.load_state(ckpt_lib.checkpoint_dir(r, step)) for r in (one, run))
        assert s1["step"] == s2["step"] == step and s1["data_fingerprint"] == s2["data_fingerprint"]
