"""Fine-tuning keeps the promises pre-training keeps: where a run may be written (never over a
user's files, a dataset or a run of another kind), what it resumes on (the same settings and
dataset), how it stops (SIGINT/SIGTERM: a checkpoint of the last step), and where predictions
and temp files go."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

pytest.importorskip("tensorflow")

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from click.testing import CliRunner  # noqa: E402

from bert_datagen.trainer.cli import main  # noqa: E402
from bert_datagen.trainer.runtime import rundir  # noqa: E402
from tests.support.task_fixtures import classification_dataset, write_pretrain_run  # noqa: E402


def _invoke(args: list[str]):
    return CliRunner().invoke(main, args)


def _refused(result, *needles: str) -> None:
    """Exit 1 with one clean line naming what is wrong."""
    assert result.exit_code == 1, result.output
    assert "Traceback" not in result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("Error: "), result.output
    for needle in needles:
        assert needle in lines[0], result.output


@pytest.fixture(scope="module")
def task_data(tmp_path_factory) -> str:
    return classification_dataset(str(tmp_path_factory.mktemp("task") / "data"))


@pytest.fixture(scope="module")
def init_run(tmp_path_factory) -> str:
    return write_pretrain_run(str(tmp_path_factory.mktemp("pre") / "run"))


def _finetune_args(data: str, out: Path, init: str, *extra: str) -> list[str]:
    return ["finetune", "--data", data, "--out", str(out), "--init-from", init, "--max-steps", "2",
            "--batch-size", "8", "--log-every", "1000", *extra]


def test_finetune_refuses_a_directory_of_a_users_files(tmp_path, task_data, init_run, tree_snapshot):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "task.json").write_text("my notes\n")
    (out / "final_metrics.json").write_text("{}\n")
    before = tree_snapshot(tmp_path)
    _refused(_invoke(_finetune_args(task_data, out, init_run)), f"--out {out}", "not a bert-train run directory")
    assert tree_snapshot(tmp_path) == before


def test_epochs_past_what_the_order_holds_are_a_usage_error_before_any_work(tmp_path, task_data, init_run):
    """96 records, 12 steps an epoch: 1e300 epochs read positions past int64 (and 1e308 * 12 is inf,
    which int() cannot take): refused naming the option, exit 2, no run directory (issue 29, 5)."""
    for epochs in ("1e300", "1.7e308"):
        args = ["finetune", "--data", task_data, "--out", str(tmp_path / "run"), "--init-from", init_run,
                "--batch-size", "8", "--epochs", epochs]
        result = _invoke(args)
        assert result.exit_code == 2 and "--epochs" in result.output and "64-bit" in result.output, result.output
        assert "unexpected" not in result.output and not (tmp_path / "run").exists()
    result = _invoke([*args[:-2], "--epochs", "1e300", "--max-steps", str(2**62)])
    assert result.exit_code == 2 and "--max-steps" in result.output, result.output


def test_runs_are_refused_in_a_dataset(tmp_path, task_data, init_run, tree_snapshot):
    from tests.support.synthetic import write_synthetic_dataset

    pre = write_synthetic_dataset(str(tmp_path / "pre"), vocab_size=40)
    before = {p: tree_snapshot(Path(p)) for p in (task_data, pre)}
    for out in (Path(task_data), Path(task_data) / "run"):
        _refused(_invoke(_finetune_args(task_data, out, init_run)), f"--out {out}", f"dataset {task_data}")
    for out in (Path(pre), Path(task_data), Path(pre) / "run"):
        _refused(_invoke(["pretrain", "--data", pre, "--out", str(out), "--steps", "1"]),
                 f"--out {out}", "bert-datagen dataset")
    assert {p: tree_snapshot(Path(p)) for p in (task_data, pre)} == before


def test_pretrain_and_finetune_refuse_each_others_runs(tmp_path, task_data, init_run, tree_snapshot):
    from tests.support.synthetic import write_synthetic_dataset

    pre = write_synthetic_dataset(str(tmp_path / "pre"), vocab_size=40)
    tuned = tmp_path / "tuned"  # a fine-tuning run as it stands after its first write
    tuned.mkdir()
    (tuned / rundir.FINETUNE_CONFIG_FILE).write_text("{}\n")
    before = tree_snapshot(tmp_path)
    _refused(_invoke(["pretrain", "--data", pre, "--out", str(tuned), "--steps", "1"]),
             f"--out {tuned}: a fine-tuning run, not a pre-training run")
    _refused(_invoke(_finetune_args(task_data, Path(init_run), init_run)),
             f"--out {init_run}: a pre-training run, not a fine-tuning run")
    assert tree_snapshot(tmp_path) == before


def test_seeds_and_a_single_seed_do_not_nest_in_each_other(tmp_path, task_data, init_run, tree_snapshot):
    single = tmp_path / "single"
    single.mkdir()
    (single / rundir.FINETUNE_CONFIG_FILE).write_text("{}\n")
    multi = tmp_path / "multi"
    (multi / "seed-1").mkdir(parents=True)
    (multi / rundir.SEEDS_FILE).write_text('{"seeds": [1]}\n')
    (multi / "seed-1" / rundir.FINETUNE_CONFIG_FILE).write_text("{}\n")
    legacy = tmp_path / "legacy"  # a multi-seed run of a version that wrote no marker
    (legacy / "seed-3").mkdir(parents=True)
    (legacy / "seed-3" / rundir.FINETUNE_CONFIG_FILE).write_text("{}\n")
    before = tree_snapshot(tmp_path)
    _refused(_invoke(_finetune_args(task_data, single, init_run, "--seeds", "1,2")),
             f"--out {single}: a fine-tuning run, not a multi-seed fine-tuning run", "single --seed")
    for parent in (multi, legacy):
        _refused(_invoke(_finetune_args(task_data, parent, init_run, "--seed", "1")),
                 f"--out {parent}: a multi-seed fine-tuning run, not a fine-tuning run", "--seeds")
    # A seed-N/ that is not a run of ours stops --seeds before any seed trains.
    (multi / "seed-2").mkdir()
    (multi / "seed-2" / "notes.txt").write_text("mine\n")
    before = tree_snapshot(tmp_path)
    _refused(_invoke(_finetune_args(task_data, multi, init_run, "--seeds", "1,2")), str(multi / "seed-2"))
    assert tree_snapshot(tmp_path) == before


@pytest.fixture(scope="module")
def tuned_run(tmp_path_factory, task_data, init_run) -> Path:
    out = tmp_path_factory.mktemp("tuned") / "run"
    result = _invoke(_finetune_args(task_data, out, init_run))
    assert result.exit_code == 0, result.output
    return out


def test_finetune_resumes_only_on_its_dataset_and_settings(tmp_path, init_run):
    from bert_datagen.trainer.errors import TrainingError
    from bert_datagen.trainer.finetune.train import FinetuneConfig, finetune

    data = classification_dataset(str(tmp_path / "data"))
    cfg = FinetuneConfig(data=data, out=str(tmp_path / "run"), init_from=init_run, max_steps=4, batch_size=8,
                         checkpoint_every=2, log_every=1000)
    finetune(cfg, log=lambda _: None, stop_at=2)
    recorded = json.loads((tmp_path / "run" / rundir.DATASET_FILE).read_text())
    # A run of an older version lacks a later option in its record: it had its default then.
    settings = json.loads((tmp_path / "run" / rundir.FINETUNE_CONFIG_FILE).read_text())
    del settings["clip_norm"]
    (tmp_path / "run" / rundir.FINETUNE_CONFIG_FILE).write_text(json.dumps(settings))
    # The dataset regenerated at the same path (other rows): refused with both fingerprints.
    import shutil

    shutil.rmtree(tmp_path / "data")
    classification_dataset(str(tmp_path / "data"), seed=1)
    with pytest.raises(TrainingError, match=f"not the dataset this run was started on.*{recorded['fingerprint']}"):
        finetune(cfg, log=lambda _: None)
    from bert_datagen.trainer.runtime import checkpoint

    assert [step for step, _ in checkpoint.list_checkpoints(tmp_path / "run")] == [2]
    shutil.rmtree(tmp_path / "data")
    classification_dataset(str(tmp_path / "data"))
    lines: list[str] = []
    assert finetune(cfg, log=lines.append)["step"] == 4
    assert any(line.startswith("resumed from") for line in lines)


def _predict_args(run: Path, data: str, out: Path, *extra: str) -> list[str]:
    return ["predict", "--run", str(run), "--data", data, "--split", "dev", "--out", str(out), *extra]


def test_predict_never_replaces_what_it_did_not_write(tmp_path, task_data, tuned_run, tree_snapshot):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "predictions.tsv").write_text("my own\n")
    (mine / "metrics.json").write_text("{}\n")
    before = tree_snapshot(tmp_path)
    run_before = tree_snapshot(tuned_run)
    data_before = tree_snapshot(Path(task_data))
    for out in (mine, tuned_run, tuned_run / "eval", tuned_run / "preds", Path(task_data), Path(task_data) / "p"):
        for extra in ((), ("--overwrite",)):
            result = _invoke(_predict_args(tuned_run, task_data, out, *extra))
            _refused(result, f"--out {out}")
    assert tree_snapshot(tmp_path) == before
    assert tree_snapshot(tuned_run) == run_before
    assert tree_snapshot(Path(task_data)) == data_before


def test_predict_replaces_its_own_predictions_only_with_overwrite(tmp_path, task_data, tuned_run, tree_snapshot):
    from bert_datagen.trainer.finetune.evaluate import PREDICTIONS_RECORD

    out = tmp_path / "p"
    result = _invoke(_predict_args(tuned_run, task_data, out))
    assert result.exit_code == 0, result.output
    record = json.loads((out / PREDICTIONS_RECORD).read_text())
    assert record["written_by"] == "bert-train predict" and record["split"] == "dev" and record["complete"]
    assert sorted(record["files"]) == ["metrics.json", "predictions.tsv"]
    before = tree_snapshot(tmp_path)
    _refused(_invoke(_predict_args(tuned_run, task_data, out)), f"--out {out}", "--overwrite")
    assert tree_snapshot(tmp_path) == before
    # The unlabelled split writes no metrics.json: the earlier one (ours) goes, a user's file stays.
    (out / "notes.txt").write_text("mine\n")
    result = _invoke(["predict", "--run", str(tuned_run), "--data", task_data, "--split", "test", "--out", str(out),
                      "--overwrite"])
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in out.iterdir()) == sorted(["notes.txt", PREDICTIONS_RECORD, "predictions.tsv"])
    assert json.loads((out / PREDICTIONS_RECORD).read_text())["split"] == "test"
    # A user's metrics.json beside them is not the earlier predict's: the labelled split would
    # replace it, so --overwrite is refused, naming it.
    (out / "metrics.json").write_text("my own figures\n")
    before = tree_snapshot(tmp_path)
    _refused(_invoke(_predict_args(tuned_run, task_data, out, "--overwrite")), f"--out {out}: metrics.json was not "
             "written by the earlier `bert-train predict`")
    assert tree_snapshot(tmp_path) == before


def test_an_interrupted_predict_leaves_a_directory_overwrite_replaces(tmp_path, monkeypatch):
    from bert_datagen.trainer.finetune import evaluate

    out = tmp_path / "p"

    def killed_after_one_file(out_dir, dataset, result):
        (Path(out_dir) / "metrics.json").write_text("{}\n")
        raise KeyboardInterrupt

    monkeypatch.setattr(evaluate, "write_outputs", killed_after_one_file)
    with pytest.raises(KeyboardInterrupt):
        evaluate.write_predictions_dir(out, None, None, {"split": "dev"}, evaluate.check_predictions_out(out, False))
    assert "metrics.json" in evaluate.check_predictions_out(out, True)


class _Process:
    """One `python -m bert_datagen.trainer.cli ...` process whose stdout is collected as it comes."""

    def __init__(self, args: list[str], cwd: Path):
        import os
        import subprocess
        import threading

        repo = Path(__file__).resolve().parent.parent.parent
        env = dict(os.environ, PYTHONPATH=str(repo), PYTHONUNBUFFERED="1")
        self.proc = subprocess.Popen([sys.executable, "-m", "bert_datagen.trainer.cli", *args], stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True, env=env, cwd=cwd)
        self.lines: list[str] = []
        self.errors: list[str] = []
        self._readers = [threading.Thread(target=lambda s=s, into=into: into.extend(s), daemon=True)
                         for s, into in ((self.proc.stdout, self.lines), (self.proc.stderr, self.errors))]
        for reader in self._readers:
            reader.start()

    def wait_for(self, prefix: str, timeout: float = 180) -> None:
        import time

        deadline = time.monotonic() + timeout
        while not any(line.startswith(prefix) for line in self.lines):
            assert self.proc.poll() is None, f"ended before {prefix!r}: {''.join(self.lines)}{''.join(self.errors)}"
            assert time.monotonic() < deadline, f"no {prefix!r} in {timeout} s"
            time.sleep(0.01)

    def finish(self, timeout: float = 300) -> tuple[int, str, str]:
        self.proc.wait(timeout=timeout)
        for reader in self._readers:
            reader.join(timeout=10)
        return self.proc.returncode, "".join(self.lines), "".join(self.errors)


def _stopped_at_a_checkpoint(run: Path, code: int, stdout: str, stderr: str) -> int:
    """SIGINT or SIGTERM: the step done is saved and named, "interrupted", exit 130, no traceback."""
    from bert_datagen.trainer.runtime import checkpoint as ckpt_lib

    assert code == 130 and "interrupted" in stderr and "Traceback" not in stderr, stderr
    step = ckpt_lib.list_checkpoints(run)[-1][0]
    assert f"interrupted at step {step} (checkpoint {run / f'ckpt-{step:08d}'})" in stdout, stdout
    return step


@pytest.mark.integration
def test_finetune_stops_on_sigterm_at_a_checkpoint_and_resumes_to_the_end(tmp_path, task_data, init_run):
    """A scheduler's SIGTERM mid-epoch, then a rerun that resumes there. SIGINT takes the same path
    (the heavy test below sends both, one after the other)."""
    import signal

    run = tmp_path / "run"
    args = ["finetune", "--data", task_data, "--out", str(run), "--init-from", init_run, "--epochs", "10",
            "--batch-size", "8", "--log-every", "1", "--learning-rate", "1e-3"]
    first = _Process(args, tmp_path)
    first.wait_for("step      3/")
    first.proc.send_signal(signal.SIGTERM)
    stopped = _stopped_at_a_checkpoint(run, *first.finish())
    assert stopped % 12, "stopped at an epoch's end, where a checkpoint is saved anyway"
    code, stdout, stderr = _Process(args, tmp_path).finish()
    assert code == 0, stderr
    assert f"resumed from {run / f'ckpt-{stopped:08d}'}" in stdout
    assert (run / "final_metrics.json").is_file()
    assert not [p for p in (run, run / "eval") for q in p.iterdir() if q.name.startswith(rundir.TMP_MARK)]


@pytest.mark.integration
@pytest.mark.heavy
def test_finetune_stops_on_sigint_and_sigterm_at_a_checkpoint_and_resumes(tmp_path, task_data, init_run):
    import signal

    run = tmp_path / "run"
    args = ["finetune", "--data", task_data, "--out", str(run), "--init-from", init_run, "--epochs", "10",
            "--batch-size", "8", "--log-every", "1", "--learning-rate", "1e-3"]
    first = _Process(args, tmp_path)
    first.wait_for("step      3/")
    first.proc.send_signal(signal.SIGINT)
    stopped = _stopped_at_a_checkpoint(run, *first.finish())
    assert stopped % 12, "stopped at an epoch's end, where a checkpoint is saved anyway"
    second = _Process(args, tmp_path)
    second.wait_for(f"step {stopped + 2:>6}/")
    second.proc.send_signal(signal.SIGTERM)
    again = _stopped_at_a_checkpoint(run, *second.finish())
    assert again > stopped and any(line.startswith(f"resumed from {run / f'ckpt-{stopped:08d}'}")
                                   for line in second.lines)
    code, stdout, stderr = _Process(args, tmp_path).finish()
    assert code == 0, stderr
    assert f"resumed from {run / f'ckpt-{again:08d}'}" in stdout
    assert (run / "final_metrics.json").is_file()
    assert not [p for p in (run, run / "eval") for q in p.iterdir() if q.name.startswith(rundir.TMP_MARK)]


@pytest.mark.integration
def test_pretrain_stops_on_sigterm_at_a_checkpoint(tmp_path):
    import signal

    from tests.support.synthetic import write_synthetic_dataset

    data = write_synthetic_dataset(str(tmp_path / "ds"), seq_len=16, max_pred=3, vocab_size=40, train_shards=2,
                                   records_per_shard=24, eval_records=8)
    run = tmp_path / "run"
    args = ["pretrain", "--data", data, "--out", str(run), "--steps", "400", "--batch-size", "8",
            "--warmup-steps", "2", "--checkpoint-every", "1000", "--log-every", "1", "--eval-batches", "1"]
    proc = _Process(args, tmp_path)
    proc.wait_for("step       3/")
    proc.proc.send_signal(signal.SIGTERM)
    assert _stopped_at_a_checkpoint(run, *proc.finish()) >= 3


def test_prediction_files_use_the_marked_temp_form_that_cleanup_removes(tmp_path, monkeypatch):
    """Every file of RUN/eval/ and of a predictions directory goes through a marked temp name, and a
    rerun's `cleanup_temp` removes such leftovers in the run and in RUN/eval/."""
    import os
    from types import SimpleNamespace

    import numpy as np

    from bert_datagen.trainer.finetune import squad_postprocess
    from bert_datagen.trainer.finetune.evaluate import SplitPredictions, write_outputs

    renamed: list[str] = []
    real_replace = os.replace

    def record(src, dst):
        renamed.append(Path(src).name)
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", record)
    out = tmp_path / "run" / "eval"
    dataset = SimpleNamespace(task_type="classification", labels=["neg", "pos"])
    result = SplitPredictions("classification", {}, metrics={"accuracy": 1.0},
                              outputs={"predicted": np.array([0, 1])})
    write_outputs(out, dataset, result)
    squad_postprocess.write_raw_logits(out, np.array([1]), np.zeros((1, 4)), np.zeros((1, 4)))
    squad_postprocess.write_predictions(out, squad_postprocess.SquadPredictions({}, {}, {}), version_2=True)
    assert len(renamed) == 6 and all(name.startswith(rundir.TMP_MARK) for name in renamed), renamed
    monkeypatch.setattr(os, "replace", real_replace)

    for leftover in (tmp_path / "run" / ".tmp-final_metrics.json-12", out / ".tmp-predictions.tsv-12"):
        leftover.write_text("partial")
    (out / "notes.tmp").write_text("not ours")
    rundir.cleanup_temp(tmp_path / "run")
    assert sorted(p.name for p in out.iterdir()) == ["logits.npz", "metrics.json", "nbest_predictions.json",
                                                     "notes.tmp", "null_odds.json", "predictions.json",
                                                     "predictions.tsv"]
    assert not list((tmp_path / "run").glob(".tmp-*"))
