"""`--strategy multi-worker` on the JAX backend (issue #42 point 4): 2 processes joined with
`jax.distributed` on 127.0.0.1 (CPU, gloo collectives), against one process with the same global
batch, dropout on (the models' default 0.1) and `--accumulation-steps 2`, 20 steps of pre-training
and of fine-tuning; each process fetches only its share of the training records; only the chief
writes; workers that disagree stop before step 1; a lone worker stops within --cluster-timeout.
One worker of each pair runs as an install without TensorFlow does (its import blocked). The
killed worker and the elastic resume are in test_trainer_multiworker_jax_faults.py, whose chain
also holds the pre-training pair's equalities and one writer: that pair is `heavy`.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("jax")

from bert_datagen.trainer.model.config import BertConfig  # noqa: E402
from bert_datagen.trainer.runtime import checkpoint as ckpt_lib  # noqa: E402
from tests.support.cluster import LOOPBACK, bert_train_jax, finish, finish_all, free_ports, tf_config  # noqa: E402
from tests.support.events import scalars  # noqa: E402
from tests.support.synthetic import write_synthetic_dataset  # noqa: E402
from tests.support.without_tensorflow import MARK  # noqa: E402

DISAGREE = ("Error: the workers disagree on --batch-size: worker 0 has 8, worker 1 has 16; every worker must run "
            "the same command (only TF_CONFIG's task index differs)")


def model(run: Path) -> dict[str, np.ndarray]:
    return ckpt_lib.load_arrays(ckpt_lib.resolve_checkpoint(run), ckpt_lib.MODEL_FILE)


def weight_differences(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> tuple[float, float]:
    """(largest |a - b| of any weight, |a - b| / |b| over the whole model): float sums in another
    order (a gradient summed over 2 processes' devices) move single weights by rounding, which Adam
    scales where a weight's gradient is near 0, so the model's relative difference is the measure."""
    assert a.keys() == b.keys()
    worst = max(float(np.abs(a[k] - b[k]).max()) for k in a)
    diff = np.sqrt(sum(float(np.sum((a[k].astype(np.float64) - b[k]) ** 2)) for k in a))
    size = np.sqrt(sum(float(np.sum(b[k].astype(np.float64) ** 2)) for k in a))
    return worst, float(diff / size)


def run_files(run: Path) -> list[str]:
    return sorted(str(p.relative_to(run)) for p in run.rglob("*")
                  if "tensorboard" not in p.parts and not p.name.startswith(".bert-datagen"))


def json_without(path: Path, drop: set[str]) -> dict:
    return {k: v for k, v in json.loads(path.read_text()).items() if k not in drop}


def train_bytes(counts: Path, data: str) -> int:
    """The record bytes a process fetched from the dataset's train shards."""
    return sum(n for path, n in json.loads(counts.read_text()).items() if Path(path).parent.name == "train"
               and Path(path).is_relative_to(data))


def check_shares(counts: list[Path], data: str) -> None:
    """Each of 2 processes fetched about half the training record bytes one process fetched for the same
    steps: the rows of its rank in each global batch (`counts`: one process's, then each worker's)."""
    fetched = [train_bytes(c, data) for c in counts]
    print("TRAIN_RECORD_BYTES one, worker 0, worker 1:", fetched)
    assert fetched[0] > 0
    for share in fetched[1:]:
        assert 0.45 * fetched[0] <= share <= 0.55 * fetched[0], fetched


def check_ran(results: list[tuple[int, str, str]], blocked: list[bool]) -> None:
    for (rc, out, err), without_tensorflow in zip(results, blocked, strict=True):
        assert rc == 0, out[-2000:] + err[-3000:]
        if without_tensorflow:
            assert err.rstrip().endswith(f"{MARK} none"), err[-2000:]


@pytest.fixture(scope="module")
def pretraining(tmp_path_factory) -> tuple[str, Path]:
    root = tmp_path_factory.mktemp("mw-jax")
    data = write_synthetic_dataset(str(root / "ds"), seq_len=32, max_pred=5, vocab_size=120, train_shards=2,
                                   records_per_shard=32, eval_records=16)
    config = BertConfig.from_name("tiny", 120)
    assert config.hidden_dropout_prob == config.attention_probs_dropout_prob == 0.1
    bert = root / "bert_config.json"
    bert.write_text(json.dumps(config.to_dict()))
    return data, bert


@pytest.mark.heavy  # the suite holds these promises in the fault chain (test_trainer_multiworker_jax_faults.py)
def test_two_jax_processes_pretrain_as_one_and_each_reads_its_share(pretraining, tmp_path):
    data, bert = pretraining
    common = ["pretrain", "--data", data, "--bert-config", str(bert), "--batch-size", "8", "--steps", "20",
              "--accumulation-steps", "2", "--learning-rate", "2e-3", "--warmup-steps", "1", "--seed", "3",
              "--checkpoint-every", "10", "--log-every", "1", "--eval-batches", "1", "--backend", "jax"]
    ports = free_ports(2)
    counts = [tmp_path / f"counts-{name}.json" for name in ("one", "w0", "w1")]
    blocked = [False, False, True]  # worker 1 as an install without TensorFlow
    procs = [bert_train_jax([*common, "--out", str(tmp_path / "one"), "--strategy", "one-device"], counts=counts[0])]
    procs += [bert_train_jax([*common, "--out", str(tmp_path / "two"), "--strategy", "multi-worker",
                              "--cluster-timeout", "120"], tf_config(ports, i, LOOPBACK), counts=counts[1 + i],
                             without_tensorflow=blocked[1 + i]) for i in range(2)]
    procs.append(bert_train_jax([*common, "--out", str(tmp_path / "devices"), "--strategy", "mirrored"], devices=2))
    results = finish_all(procs)
    check_ran(results, [*blocked, False])
    # The program of 2 processes is that of 2 devices in one process: the same weights, bit for bit.
    two, devices = model(tmp_path / "two"), model(tmp_path / "devices")
    assert all(np.array_equal(two[k], devices[k]) for k in two)
    for index, (_, out, err) in enumerate(results[1:3]):
        assert "2 replica(s)" in out and out.splitlines()[0].endswith("Keras on jax"), out[:500]
        assert f"worker {index} of 2 reads its share of each global batch (4 of 8 sequences)" in out
        assert "Gloo" not in out and not err.replace(f"{MARK} none", "").strip(), (out[-1000:], err[-2000:])

    worst, relative = weight_differences(model(tmp_path / "two"), model(tmp_path / "one"))
    print("MAX_ABS_WEIGHT_DIFF", worst, "RELATIVE", relative)
    assert worst <= 1e-5 and relative <= 1e-5
    one, two = scalars(tmp_path / "one", "loss"), scalars(tmp_path / "two", "loss")
    assert sorted(one) == sorted(two) == list(range(1, 21))
    for step, (loss,) in one.items():
        assert two[step] == [pytest.approx(loss, rel=1e-5, abs=1e-5)], step
    metrics = {run: json.loads((tmp_path / run / "final_metrics.json").read_text())["eval"] for run in ("one", "two")}
    for name, value in metrics["one"].items():
        assert metrics["two"][name] == pytest.approx(value, rel=1e-5, abs=1e-5), name

    check_shares(counts, data)

    # Only the chief wrote: the files of the one process's run, one event file, the same records.
    assert run_files(tmp_path / "two") == run_files(tmp_path / "one")
    assert len(list((tmp_path / "two" / "tensorboard" / "train").iterdir())) == 1
    drop = {"strategy", "out"}
    assert json_without(tmp_path / "two" / "train_config.json", drop) == \
        json_without(tmp_path / "one" / "train_config.json", drop)
    for name in ("bert_config.json", "dataset.json"):
        assert (tmp_path / "two" / name).read_text() == (tmp_path / "one" / name).read_text()


@pytest.mark.integration
def test_two_jax_processes_fine_tune_as_one(tmp_path):
    from tests.support.task_fixtures import classification_dataset, tiny_bert, write_pretrain_run

    data = classification_dataset(str(tmp_path / "task"), n_train=64, n_dev=8)
    bert = tiny_bert()
    assert bert.hidden_dropout_prob == bert.attention_probs_dropout_prob == 0.1
    init = write_pretrain_run(str(tmp_path / "init"), bert)
    common = ["finetune", "--data", data, "--init-from", init, "--max-steps", "20", "--batch-size", "8",
              "--learning-rate", "1e-3", "--log-every", "1", "--seed", "3", "--accumulation-steps", "2",
              "--backend", "jax"]
    ports = free_ports(2)
    counts = [tmp_path / f"counts-{name}.json" for name in ("one", "w0", "w1")]
    blocked = [False, True, False]  # worker 0, the chief, as an install without TensorFlow
    procs = [bert_train_jax([*common, "--out", str(tmp_path / "one"), "--strategy", "one-device"], counts=counts[0])]
    procs += [bert_train_jax([*common, "--out", str(tmp_path / "two"), "--strategy", "multi-worker",
                              "--cluster-timeout", "120"], tf_config(ports, i, LOOPBACK), counts=counts[1 + i],
                             without_tensorflow=blocked[1 + i]) for i in range(2)]
    check_ran(finish_all(procs), blocked)
    check_shares(counts, data)
    worst, relative = weight_differences(model(tmp_path / "two"), model(tmp_path / "one"))
    print("MAX_ABS_WEIGHT_DIFF_FINETUNE", worst, "RELATIVE", relative)
    assert worst <= 1e-5 and relative <= 1e-5
    one, two = scalars(tmp_path / "one", "loss"), scalars(tmp_path / "two", "loss")
    assert sorted(one) == sorted(two) == list(range(1, 21))
    for step, (loss,) in one.items():
        assert two[step] == [pytest.approx(loss, rel=1e-5, abs=1e-5)], step
    final = {run: json.loads((tmp_path / run / "final_metrics.json").read_text())["final"] for run in ("one", "two")}
    assert final["one"].keys() == final["two"].keys()
    for name, value in final["one"].items():
        assert final["two"][name] == pytest.approx(value, abs=1e-6), name
    assert run_files(tmp_path / "two") == run_files(tmp_path / "one")  # eval/ predictions by the chief alone
    assert (tmp_path / "two" / "eval" / "predictions.tsv").read_text() == \
        (tmp_path / "one" / "eval" / "predictions.tsv").read_text()


@pytest.mark.integration
def test_jax_workers_that_disagree_stop_before_step_one(pretraining, tmp_path):
    data, _ = pretraining
    common = ["pretrain", "--data", data, "--out", str(tmp_path / "run"), "--steps", "2", "--backend", "jax",
              "--strategy", "multi-worker", "--cluster-timeout", "120"]
    ports = free_ports(2)
    workers = [bert_train_jax([*common, "--batch-size", size], tf_config(ports, i, LOOPBACK),
                              without_tensorflow=i == 1) for i, size in enumerate(("8", "16"))]
    for index, (rc, out, err) in enumerate(finish_all(workers)):
        lines = [line for line in err.splitlines() if line.strip() and not line.startswith(MARK)]
        assert rc == 1, out[-2000:] + err[-3000:]
        assert lines == [DISAGREE], (index, err[-3000:])
        assert "step" not in out, out[-2000:]
    assert not (tmp_path / "run").exists()


@pytest.mark.integration
def test_a_jax_worker_that_stops_before_the_start_stops_the_others_at_once(pretraining, tmp_path):
    # Worker 1 is given a dataset that is not there: its own error, and the chief's, before step 1
    # (without the exchange's stop mark the chief would wait out --cluster-timeout for its record).
    data, _ = pretraining
    ports = free_ports(2)
    workers = [bert_train_jax(["pretrain", "--data", data if i == 0 else str(tmp_path / "missing"), "--out",
                               str(tmp_path / "run"), "--batch-size", "8", "--steps", "2", "--backend", "jax",
                               "--strategy", "multi-worker", "--cluster-timeout", "300"], tf_config(ports, i, LOOPBACK))
               for i in range(2)]
    started = time.monotonic()
    (rc0, out0, err0), (rc1, out1, err1) = finish_all(workers, timeout=120)
    print("STOPPED_AFTER_S", round(time.monotonic() - started, 1))
    assert rc0 == rc1 == 1, err0[-2000:] + err1[-2000:]
    assert err0.strip() == ("Error: worker 1 stopped before step 1 (its own error says why); every worker's "
                            "command must start again"), err0[-2000:]
    assert err1.strip().startswith(f"Error: {tmp_path / 'missing'}: ") and len(err1.strip().splitlines()) == 1
    assert time.monotonic() - started < 120 and not (tmp_path / "run").exists()


@pytest.mark.integration
def test_a_lone_jax_worker_stops_within_the_cluster_timeout(pretraining, tmp_path):
    data, _ = pretraining
    ports = free_ports(2)
    procs = {index: bert_train_jax(["pretrain", "--data", data, "--out", str(tmp_path / f"run{index}"),
                                    "--batch-size", "8", "--steps", "2", "--backend", "jax", "--strategy",
                                    "multi-worker", "--cluster-timeout", "3"],
                                   tf_config(ports if index else free_ports(2), index, LOOPBACK))
             for index in (0, 1)}  # the chief alone with its coordinator; worker 1 with nobody at worker 0's
    for index, proc in procs.items():
        rc, out, err = finish(proc, timeout=90)
        lines = [line for line in err.splitlines() if line.strip()]
        assert rc == 1, out[-2000:] + err[-3000:]
        assert len(lines) == 1 and f"worker {index} could not join the cluster within 3 s (--cluster-timeout)" \
            in lines[0], err[-3000:]
        run = tmp_path / f"run{index}"
        assert not run.exists() or not any(run.iterdir())


def test_a_collective_failed_by_a_lost_process_is_told_from_other_errors():
    from bert_datagen.trainer.backends.jax_cluster import lost_process

    gloo = ValueError("UNKNOWN: Gloo all-reduce failed: [external/gloo/gloo/transport/tcp/pair.cc:547] Connection "
                      "closed by peer [127.0.0.1]:44928")
    assert lost_process(gloo) == "UNKNOWN: Gloo all-reduce failed: Connection closed by peer [127.0.0.1]:44928"
    service = RuntimeError("UNAVAILABLE: The following tasks are unhealthy (stopped sending heartbeats):\n1")
    assert lost_process(service) == "UNAVAILABLE: The following tasks are unhealthy (stopped sending heartbeats):"
    for other in (ValueError("Incompatible shapes for broadcasting: (8, 32) and (4, 32)"),
                  RuntimeError("INVALID_ARGUMENT: buffer has been deleted or donated"), KeyError("Gloo")):
        assert lost_process(other) is None, other


def test_a_lost_process_is_one_line_naming_it_and_the_checkpoint_to_resume_from(tmp_path, monkeypatch):
    from bert_datagen.trainer.runtime import cluster

    run = tmp_path / "run"
    ckpt_lib.save_checkpoint(str(run), 4, {"w": np.zeros(2, np.float32)}, {}, {"step": 4})
    monkeypatch.setattr(cluster, "worker_share", lambda: (2, 0))
    line = str(cluster.lost_worker_error("training step 5", str(run), "UNKNOWN: Gloo all-reduce failed"))
    assert line == (f"training step 5: lost worker 1 of the cluster (UNKNOWN: Gloo all-reduce failed); the run can "
                    f"be resumed from {run / 'ckpt-00000004'}: start every worker's command again")
    monkeypatch.setattr(cluster, "worker_share", lambda: (3, 2))  # JAX's collectives do not say which of two
    line = str(cluster.lost_worker_error("evaluation", str(tmp_path / "none"), "why"))
    assert line.startswith("evaluation: lost a worker of the cluster (why)") and "from the start" in line


def test_multi_worker_on_jax_needs_the_cluster_joined_and_tpu_stays_refused():
    from types import SimpleNamespace

    from bert_datagen.trainer.errors import TrainConfigError
    from bert_datagen.trainer.runtime.training import refuse_unported_on_jax

    for strategy, expected in (("multi-worker", "the cluster must be joined before anything runs on JAX"),
                               ("tpu", "--strategy tpu runs on TensorFlow only")):
        with pytest.raises(TrainConfigError, match=expected):
            refuse_unported_on_jax(SimpleNamespace(backend="jax", strategy=strategy, precision="float32"))
    refuse_unported_on_jax(SimpleNamespace(backend="tensorflow", strategy="multi-worker", precision="float32"))


def test_a_jax_start_record_counts_replicas_per_worker(tmp_path, monkeypatch):
    from bert_datagen.trainer.runtime import cluster

    monkeypatch.setattr(cluster, "worker_share", lambda: (2, 1))
    record = cluster.start_record({"batch_size": 8}, str(tmp_path / "run"), "fp", {"hidden_size": 32}, 4)
    assert record["replicas per worker"] == 2 and record["--batch-size"] == 8
