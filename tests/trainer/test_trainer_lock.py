"""`bert-train` commands that write (pretrain, finetune, export, predict) hold their output's lock
(`bert_datagen.cli.lock`): a second command on the same path is refused before any work, with one line
naming the path and the holder; a resumed run is locked too."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("tensorflow")

from click.testing import CliRunner  # noqa: E402

from bert_datagen.cli import lock  # noqa: E402
from bert_datagen.trainer.cli import main  # noqa: E402
from bert_datagen.trainer.errors import TrainingError  # noqa: E402
from bert_datagen.trainer.finetune.cli import predict_run  # noqa: E402
from bert_datagen.trainer.finetune.train import FinetuneConfig, finetune, finetune_seeds  # noqa: E402
from bert_datagen.trainer.interop.export import write_export_dir  # noqa: E402
from bert_datagen.trainer.runtime import rundir  # noqa: E402
from tests.support.lock_holder import Holder  # noqa: E402
from tests.support.pipeline_corpus import tree_snapshot  # noqa: E402

REPO = Path(__file__).resolve().parent.parent.parent


def environment() -> dict[str, str]:
    # As a user's shell has it: importing bert_datagen.trainer.cli here set TF_CPP_MIN_LOG_LEVEL in this process.
    environ = {k: v for k, v in os.environ.items() if k not in ("TF_CPP_MIN_LOG_LEVEL", "BERT_DATAGEN_DEBUG")}
    return {**environ, "PYTHONPATH": str(REPO)}


@pytest.fixture
def held(tmp_path):
    holders: list[Holder] = []

    def hold(path: Path) -> Holder:
        holders.append(Holder(path))
        return holders[-1]

    yield hold
    for holder in holders:
        holder.stop()


def refused(holder: Holder, path: Path) -> str:
    return f"{path}: is being written by another command: pid {holder.proc.pid}"


def test_pretrain_into_a_locked_run_is_refused_before_any_work(tmp_path, held) -> None:
    run = tmp_path / "run"
    run.mkdir()
    (run / rundir.TRAIN_CONFIG_FILE).write_text("{}\n")  # a run to resume
    holder = held(run)
    before = tree_snapshot(tmp_path)
    result = subprocess.run([sys.executable, "-m", "bert_datagen.trainer.cli", "pretrain", "--data", str(tmp_path / "nodata"),
                             "--out", str(run), "--steps", "1"], capture_output=True, text=True,
                            env=environment(), timeout=120)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 1 and len(lines) == 1, result.stderr
    assert lines[0].startswith(f"Error: {refused(holder, run)}") and "Traceback" not in result.stderr
    assert tree_snapshot(tmp_path) == before


def test_finetune_and_its_seeds_into_a_locked_run_are_refused(tmp_path, held) -> None:
    run = tmp_path / "ft"
    holder = held(run)
    cfg = FinetuneConfig(data=str(tmp_path / "task"), out=str(run), init_from=str(tmp_path / "pre"))
    before = tree_snapshot(tmp_path)
    for start in (lambda: finetune(cfg), lambda: finetune_seeds(cfg, [1, 2])):
        with pytest.raises(TrainingError) as exc:
            start()
        assert str(exc.value).startswith(refused(holder, run))
    assert tree_snapshot(tmp_path) == before
    holder.stop()
    holder = held(run / "seed-2")  # one sub-run of a --seeds run is being written by another command
    before = tree_snapshot(tmp_path)
    with pytest.raises(TrainingError) as exc:
        finetune_seeds(cfg, [2])
    assert str(exc.value).startswith(refused(holder, run / "seed-2"))
    assert tree_snapshot(tmp_path) == before


def test_export_and_predict_into_a_locked_out_are_refused(tmp_path, held) -> None:
    export, predictions = tmp_path / "export", tmp_path / "predictions"
    export_holder, predict_holder = held(export), held(predictions)
    before = tree_snapshot(tmp_path)
    written = []
    with pytest.raises(TrainingError) as exc:
        write_export_dir(export, False, written.append)
    assert str(exc.value).startswith(refused(export_holder, export)) and not written
    with pytest.raises(TrainingError) as exc:
        predict_run(str(tmp_path / "ft"), str(tmp_path / "task"), "dev", str(predictions))
    assert str(exc.value).startswith(refused(predict_holder, predictions))
    assert tree_snapshot(tmp_path) == before
    code = CliRunner().invoke(main, ["export", "--run", str(tmp_path / "ft"), "--format", "tf1",
                                     "--out", str(export)])
    assert code.exit_code == 1 and "Traceback" not in code.output


def test_export_after_the_holder_dies_and_the_lock_file_it_leaves(tmp_path) -> None:
    out = tmp_path / "export"
    holder = Holder(out)
    holder.kill()
    assert os.path.exists(lock.lock_path_for(str(out)))  # left behind, harmless

    def write(tmp: Path) -> None:
        (tmp / "bert_config.json").write_text("{}\n")

    assert write_export_dir(out, False, write) == out
    assert sorted(p.name for p in tmp_path.iterdir()) == ["export"]  # the stale lock file is gone too


def test_a_stale_lock_inside_an_empty_run_dir_does_not_make_it_foreign(tmp_path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    (run / lock.INSIDE_LOCK_NAME).write_bytes(b"")  # left by a killed run under a read-only parent
    rundir.check_out_dir(str(run))
    (run / "notes.txt").write_text("mine\n")
    with pytest.raises(Exception, match="is not a bert-train run directory"):
        rundir.check_out_dir(str(run))
