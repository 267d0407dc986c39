"""`--strategy multi-worker` on real worker processes: 2 workers on localhost (CPU) against one
process with the same global batch, dropout on (the default models' 0.1: masks are keyed by each
row's place in the global batch, not by worker), 20 steps; one writer; a worker alone stops within
--cluster-timeout. The plain pretraining pair is `heavy`: the suite's fault test
(test_trainer_multiworker_faults.py) holds the same equalities and the one writer through a kill,
a 2 -> 1 and a 1 -> 2 resume."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

from bert_datagen.trainer.model.config import BertConfig  # noqa: E402
from bert_datagen.trainer.runtime import checkpoint as ckpt_lib  # noqa: E402
from tests.support.cluster import bert_train, finish, finish_all, free_ports, tf_config, train_scalars  # noqa: E402
from tests.support.synthetic import write_synthetic_dataset  # noqa: E402

TIMING = {"sequences_per_second"}


def json_without(path: Path, drop: set[str]):
    def clean(x):
        if isinstance(x, dict):
            return {k: clean(v) for k, v in x.items() if k not in drop}
        return x
    return clean(json.loads(path.read_text()))


def close(two: float, one: float, halves: float) -> bool:
    """The cluster's figure equals one process's to 1e-5, give or take a few times the distance from
    it of the same process's figure with the gradient summed in two halves: a loss spike (this run's gradient norm
    goes 2 -> 33 at step 19) turns the ~1e-6 differences float32 sums in another order leave in the
    weights into larger ones in the figures, for a process on its own as much as for a cluster."""
    return abs(two - one) <= 1e-5 * (1 + abs(one)) + 4 * abs(halves - one)


@pytest.mark.heavy  # the suite holds both promises in test_trainer_multiworker_faults.py, through faults
def test_two_workers_equal_one_process_and_only_the_chief_writes(tmp_path):
    data = write_synthetic_dataset(str(tmp_path / "ds"), seq_len=32, max_pred=5, vocab_size=120, train_shards=2,
                                   records_per_shard=32, eval_records=16)
    bert = tmp_path / "bert_config.json"
    config = BertConfig.from_name("tiny", 120)
    assert config.hidden_dropout_prob == config.attention_probs_dropout_prob == 0.1
    bert.write_text(json.dumps(config.to_dict()))
    common = ["pretrain", "--data", data, "--bert-config", str(bert), "--batch-size", "8", "--steps", "20",
              "--learning-rate", "2e-3", "--warmup-steps", "1", "--seed", "3", "--checkpoint-every", "10",
              "--log-every", "1", "--eval-batches", "1"]
    ports = free_ports(2)
    one = bert_train([*common, "--out", str(tmp_path / "one"), "--strategy", "one-device"])
    # The control: the same process summing the batch's gradient in another order (two halves, as
    # the two workers do), which shows how far float32 rounding alone moves this run's figures.
    control = bert_train([*common, "--out", str(tmp_path / "halves"), "--strategy", "one-device",
                          "--accumulation-steps", "2"])
    workers = [bert_train([*common, "--out", str(tmp_path / "two"), "--strategy", "multi-worker",
                           "--cluster-timeout", "120"], tf_config(ports, i)) for i in range(2)]
    results = finish_all([one, *workers, control])[:3]
    for rc, out, err in results:
        assert rc == 0, out[-2000:] + err[-3000:]
    assert "2 replica(s)" in results[1][1]
    for index, (_, out, _) in enumerate(results[1:]):  # each reads its share of every global batch
        assert f"worker {index} of 2 reads its share of each global batch (4 of 8 sequences)" in out

    a = ckpt_lib.load_arrays(ckpt_lib.resolve_checkpoint(tmp_path / "one"), ckpt_lib.MODEL_FILE)
    b = ckpt_lib.load_arrays(ckpt_lib.resolve_checkpoint(tmp_path / "two"), ckpt_lib.MODEL_FILE)
    assert a.keys() == b.keys()
    worst = max(float(np.abs(a[k] - b[k]).max()) for k in a)
    print("MAX_ABS_WEIGHT_DIFF", worst)
    assert worst < 1e-5
    losses_one, losses_two = train_scalars(tmp_path / "one", "loss"), train_scalars(tmp_path / "two", "loss")
    losses_halves = train_scalars(tmp_path / "halves", "loss")
    assert sorted(losses_one) == list(range(1, 21)) and losses_one.keys() == losses_two.keys()
    for step, loss in losses_one.items():
        assert close(losses_two[step], loss, losses_halves[step]), step

    # The same run directory apart from timing: the same files, the same records (the config's
    # strategy and --out aside), the same checkpoints; the non-chief wrote nothing beside the chief.
    def names(run: Path) -> list[str]:
        return sorted(str(p.relative_to(run)) for p in run.rglob("*")
                      if "tensorboard" not in p.parts and not p.name.startswith(".bert-datagen"))
    assert names(tmp_path / "one") == names(tmp_path / "two")
    for run in ("one", "two"):
        assert len(list((tmp_path / run / "tensorboard" / "train").iterdir())) == 1
    assert json_without(tmp_path / "one" / "train_config.json", {"strategy", "out"}) == \
        json_without(tmp_path / "two" / "train_config.json", {"strategy", "out"})
    for name in ("bert_config.json", "dataset.json"):
        assert (tmp_path / "one" / name).read_text() == (tmp_path / "two" / name).read_text()
    fm_one = json_without(tmp_path / "one" / "final_metrics.json", TIMING | {"run_dir"})
    fm_two = json_without(tmp_path / "two" / "final_metrics.json", TIMING | {"run_dir"})
    assert fm_one.keys() == fm_two.keys()
    fm_halves = json_without(tmp_path / "halves" / "final_metrics.json", TIMING | {"run_dir"})
    for part in ("train", "eval"):
        for k, v in fm_one[part].items():
            assert close(fm_two[part][k], v, fm_halves[part][k]), (part, k)
    for step in (10, 20):
        s1 = ckpt_lib.load_state(ckpt_lib.checkpoint_dir(tmp_path / "one", step))
        s2 = ckpt_lib.load_state(ckpt_lib.checkpoint_dir(tmp_path / "two", step))
        assert s1["step"] == s2["step"] == step and s1["data_fingerprint"] == s2["data_fingerprint"]


@pytest.mark.integration
def test_two_workers_fine_tune_as_one_process(tmp_path):
    # A classification task, dropout on everywhere: the encoder's 0.1 and the head's own 0.1.
    from tests.support.task_fixtures import classification_dataset, tiny_bert, write_pretrain_run

    data = classification_dataset(str(tmp_path / "task"), n_train=64, n_dev=8)
    bert = tiny_bert()
    assert bert.hidden_dropout_prob == bert.attention_probs_dropout_prob == 0.1
    init = write_pretrain_run(str(tmp_path / "init"), bert)
    common = ["finetune", "--data", data, "--init-from", init, "--max-steps", "20", "--batch-size", "8",
              "--learning-rate", "1e-3", "--log-every", "1", "--seed", "3", "--accumulation-steps", "2"]
    ports = free_ports(2)
    procs = [bert_train([*common, "--out", str(tmp_path / "one"), "--strategy", "one-device"])]
    procs += [bert_train([*common, "--out", str(tmp_path / "two"), "--strategy", "multi-worker",
                          "--cluster-timeout", "120"], tf_config(ports, i)) for i in range(2)]
    for rc, out, err in finish_all(procs):
        assert rc == 0, out[-2000:] + err[-3000:]
    a = ckpt_lib.load_arrays(ckpt_lib.resolve_checkpoint(tmp_path / "one"), ckpt_lib.MODEL_FILE)
    b = ckpt_lib.load_arrays(ckpt_lib.resolve_checkpoint(tmp_path / "two"), ckpt_lib.MODEL_FILE)
    worst = max(float(np.abs(a[k] - b[k]).max()) for k in a)
    print("MAX_ABS_WEIGHT_DIFF_FINETUNE", worst)
    assert worst < 1e-5
    la, lb = train_scalars(tmp_path / "one", "loss"), train_scalars(tmp_path / "two", "loss")
    assert sorted(la) == list(range(1, 21)) and la.keys() == lb.keys()
    for step in la:
        assert lb[step] == pytest.approx(la[step], rel=1e-5, abs=1e-5), step
    ea = json.loads((tmp_path / "one" / "final_metrics.json").read_text())["final"]
    eb = json.loads((tmp_path / "two" / "final_metrics.json").read_text())["final"]
    assert ea.keys() == eb.keys()
    for k, v in ea.items():
        assert eb[k] == pytest.approx(v, abs=1e-6), k
    assert sorted(p.name for p in (tmp_path / "one" / "eval").iterdir()) == \
        sorted(p.name for p in (tmp_path / "two" / "eval").iterdir())


@pytest.mark.integration
def test_a_worker_alone_stops_within_the_cluster_timeout(tmp_path):
    data = write_synthetic_dataset(str(tmp_path / "ds"), seq_len=32, max_pred=5, vocab_size=120,
                                   train_shards=1, records_per_shard=16, eval_records=8)
    proc = bert_train(["pretrain", "--data", data, "--out", str(tmp_path / "run"), "--batch-size", "8",
                       "--steps", "2", "--strategy", "multi-worker", "--cluster-timeout", "3"],
                      tf_config(free_ports(2), 1))
    rc, out, err = finish(proc, timeout=60)
    assert rc == 1
    assert "worker 1 could not join the cluster within 3 s (--cluster-timeout)" in err
    assert not (tmp_path / "run").exists() or not any((tmp_path / "run").iterdir())


def test_a_malformed_tf_config_is_one_line(tmp_path):
    from click.testing import CliRunner

    from bert_datagen.trainer.cli import main

    for value, expected in (("", "needs TF_CONFIG"), ("{", "TF_CONFIG is malformed"),
                            ('{"cluster": {"worker": ["a:1"]}, "task": {"type": "worker", "index": 3}}',
                             "index in 0..0")):
        res = CliRunner().invoke(main, ["pretrain", "--data", str(tmp_path), "--out", str(tmp_path / "r"),
                                        "--steps", "1", "--strategy", "multi-worker"],
                                 env={"TF_CONFIG": value})
        assert res.exit_code == 1, res.output
        assert expected in res.output and len(res.output.strip().splitlines()) == 1, res.output


@pytest.mark.integration
def test_workers_that_disagree_stop_before_anything_is_written(tmp_path):
    data = write_synthetic_dataset(str(tmp_path / "ds"), seq_len=32, max_pred=5, vocab_size=120,
                                   train_shards=1, records_per_shard=32, eval_records=16)
    common = ["pretrain", "--data", data, "--out", str(tmp_path / "run"), "--steps", "2", "--strategy",
              "multi-worker", "--cluster-timeout", "120"]
    ports = free_ports(2)
    # Today's failure: worker 1 asked for 16, worker 0 for 8; both used to exit 0 at 12 a step.
    workers = [bert_train([*common, "--batch-size", size], tf_config(ports, i)) for i, size in enumerate(("8", "16"))]
    for rc, out, err in finish_all(workers):
        lines = [line for line in err.splitlines() if line.strip()]
        assert rc == 1, out[-2000:] + err[-3000:]
        assert lines[-1] == ("Error: the workers disagree on --batch-size: worker 0 has 8, worker 1 has 16; every "
                             "worker must run the same command (only TF_CONFIG's task index differs)"), err[-3000:]
        assert "Traceback" not in err and "step" not in out, out[-2000:]
    assert not (tmp_path / "run").exists()


def test_the_first_difference_names_the_option_and_both_values():
    from bert_datagen.trainer.errors import TrainConfigError
    from bert_datagen.trainer.runtime.cluster import check_same_records

    base = {"--batch-size": 8, "--skip-batches": [], "--out": "/runs/a", "the checkpoint it resumes from": "ckpt-00000010"}
    check_same_records([base, dict(base), dict(base)])
    cases = [({"--skip-batches": [[3, 5]]}, "--skip-batches: worker 0 has [], worker 2 has [[3, 5]]"),
             ({"--out": "/runs/b"}, '--out: worker 0 has "/runs/a", worker 2 has "/runs/b"'),
             ({"the checkpoint it resumes from": "none (a new run)"},
              'the checkpoint it resumes from: worker 0 has "ckpt-00000010", worker 2 has "none (a new run)"')]
    for change, expected in cases:
        with pytest.raises(TrainConfigError, match=re.escape(expected)):
            check_same_records([base, dict(base), {**base, **change}])


def test_a_port_in_use_names_host_and_port(tmp_path):
    import socket

    from click.testing import CliRunner

    from bert_datagen.trainer.cli import main

    with socket.socket() as taken:
        taken.bind(("localhost", 0))
        taken.listen()
        port = taken.getsockname()[1]
        value = json.dumps({"cluster": {"worker": [f"localhost:{port}", "localhost:1"]},
                            "task": {"type": "worker", "index": 0}})
        res = CliRunner().invoke(main, ["pretrain", "--data", str(tmp_path), "--out", str(tmp_path / "r"),
                                        "--steps", "1", "--strategy", "multi-worker"], env={"TF_CONFIG": value})
    assert res.exit_code == 1, res.output
    assert res.output.strip() == (f"Error: worker 0 cannot listen on localhost:{port} (its TF_CONFIG address): the "
                                  "port is in use; free the port or give this worker another one in every "
                                  "worker's TF_CONFIG"), res.output
    assert not (tmp_path / "r").exists()
