"""Fine-tuning keeps pre-training's promises on its input: options in range, the vocab and the task
a model was trained with, shards checked before the first step and named when a record is bad."""

from __future__ import annotations

import os
import stat

import pytest

tf = pytest.importorskip("tensorflow")

from click.testing import CliRunner  # noqa: E402
from task_fixtures import classification_dataset, tiny_bert, write_pretrain_run  # noqa: E402

from trainer.cli import main  # noqa: E402


def _invoke(args: list[str]):
    return CliRunner().invoke(main, args)


@pytest.fixture(scope="module")
def init_run(tmp_path_factory) -> str:
    return write_pretrain_run(str(tmp_path_factory.mktemp("pre") / "run"), tiny_bert())


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> str:
    return classification_dataset(str(tmp_path_factory.mktemp("cls") / "data"))


@pytest.mark.parametrize("seeds", [["--seed", "-1"], ["--seed", str(2**32)], ["--seeds", "1,-1"]])
def test_finetune_seed_out_of_range_is_one_line_exit_2(tmp_path, init_run, data, seeds):
    result = _invoke(["finetune", "--data", data, "--out", str(tmp_path / "run"), "--init-from", init_run, *seeds])
    assert result.exit_code == 2, result.output
    assert seeds[0] in result.output and "Traceback" not in result.output and "unexpected" not in result.output
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("seed", ["-1", str(2**32)])
def test_pretrain_seed_out_of_range_is_one_line_exit_2(tmp_path, seed):
    from trainer.synthetic import write_synthetic_dataset

    pre = write_synthetic_dataset(str(tmp_path / "pre"), vocab_size=40)
    result = _invoke(["pretrain", "--data", pre, "--out", str(tmp_path / "run"), "--steps", "1", "--seed", seed])
    assert result.exit_code == 2, result.output
    assert "--seed" in result.output and "Traceback" not in result.output and "unexpected" not in result.output


def test_regression_banner_and_hf_export_file_modes(tmp_path, init_run):
    """A regression head has no labels to count; every exported file gets the umask's mode."""
    data = classification_dataset(str(tmp_path / "reg"), regression=True)
    run = tmp_path / "run"
    result = _invoke(["finetune", "--data", data, "--out", str(run), "--init-from", init_run, "--max-steps", "1",
                      "--batch-size", "8", "--eval-split", "none"])
    assert result.exit_code == 0, result.output
    assert "glue/stsb (regression), 96 train records" in result.output and "0 labels" not in result.output
    old = os.umask(0o022)
    try:
        result = _invoke(["export", "--run", str(run), "--format", "hf", "--out", str(tmp_path / "hf")])
    finally:
        os.umask(old)
    assert result.exit_code == 0, result.output
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in (tmp_path / "hf").iterdir() if p.is_file()}
    assert "model.safetensors" in modes and set(modes.values()) == {0o644}, modes
