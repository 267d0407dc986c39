"""Each option check lives in one place, the config's validation: the library raises it, and the
CLI reports the same message as a usage error (exit 2) before any work."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from bert_datagen.datagen.config import ConfigError, DatagenConfig
from bert_datagen.datagen.tasks.config import TaskConfig
from bert_datagen.pipelines.beam.runners import RunnerError, RunnerOptions
from bert_datagen.pipelines.cli import main
from bert_datagen.pipelines.pretraining import run as pretraining_run
from bert_datagen.pipelines.tasks import run as task_run


def message_of(error_type: type[Exception], make) -> str:
    with pytest.raises(error_type) as info:
        make()
    return str(info.value)


def refused(args: list[str], message: str) -> None:
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 2 and f"Error: {message}" in result.output, result.output


@pytest.fixture
def stop_before_work(monkeypatch):
    """The drivers replaced by a stub that records what the CLI passed down."""
    seen: list[tuple] = []

    def stub(config, **kwargs):
        seen.append((config, kwargs))
        raise pretraining_run.DatagenError("stub: no work")

    monkeypatch.setattr(pretraining_run, "generate_dataset", stub)
    monkeypatch.setattr(task_run, "generate_task_dataset", stub)
    return seen


def run_args(tmp_path, *extra: str) -> list[str]:
    return ["run", "--input", str(tmp_path / "in.txt"), "--vocab", "v", "--output", str(tmp_path / "out"), *extra]


def task_args(tmp_path, *extra: str) -> list[str]:
    return ["task", "--task", "tsv", "--text-a", "0", "--label", "1", "--vocab", "v",
            "--output", str(tmp_path / "out"), *extra]


def test_dupe_factor_with_dynamic_masking_is_the_configs_check(tmp_path, stop_before_work) -> None:
    message = message_of(ConfigError, lambda: DatagenConfig(masking="dynamic", dupe_factor=2))
    assert message.startswith("--dupe-factor 2 with --masking dynamic")
    refused(run_args(tmp_path, "--masking", "dynamic", "--dupe-factor", "2"), message)
    assert stop_before_work == []
    # The one copy dynamic data has is no conflict, and it is the default of --masking dynamic.
    for extra in (["--dupe-factor", "1"], []):
        result = CliRunner().invoke(main, run_args(tmp_path, "--masking", "dynamic", *extra))
        assert result.exit_code == 1 and "stub: no work" in result.output, result.output
    assert [c.dupe_factor for c, _ in stop_before_work] == [1, 1]


def test_split_names_are_the_configs_check_in_the_cli_and_the_library(tmp_path, stop_before_work) -> None:
    config = TaskConfig(kind="tsv", text_a="0", label="1")
    twice = message_of(ConfigError, lambda: config.check_split_names(["train", "dev", "train"]))
    assert twice == "--split: split 'train' is given twice"
    refused(task_args(tmp_path, "--split", "train=a.tsv", "--split", "train=b.tsv"), twice)
    named = TaskConfig(kind="tsv", text_a="0", label="1", train_splits=("small",))
    unknown = message_of(ConfigError, lambda: named.check_split_names(["train"]))
    refused(task_args(tmp_path, "--split", "train=a.tsv", "--train-splits", "small"), unknown)
    config.check_split_names(["dev"])  # the default training split may be absent: predict splits only
    assert stop_before_work == []


def test_the_library_refuses_split_names_before_looking_for_files(tmp_path) -> None:
    config = TaskConfig(kind="tsv", text_a="0", label="1")
    out = tmp_path / "out"
    with pytest.raises(ConfigError, match="split 'train' is given twice"):
        task_run.generate_task_dataset(config, splits=["train=missing*.tsv", "train=b.tsv"], vocab_path="v",
                                       output_dir=str(out))
    named = TaskConfig(kind="tsv", text_a="0", label="1", train_splits=("small",))
    with pytest.raises(ConfigError, match="--train-splits: 'small' is not one of the --split names"):
        task_run.generate_task_dataset(named, splits=["train=missing*.tsv"], vocab_path="v", output_dir=str(out))
    assert not out.exists()


def test_runner_options_are_checked_by_runner_options(tmp_path, stop_before_work) -> None:
    message = message_of(RunnerError, lambda: RunnerOptions("DaskRunner", dask_workers=0))
    assert message.startswith("--dask-workers 0 must be in [1, ") and "a core of this machine" in message
    refused(run_args(tmp_path, "--runner", "DaskRunner", "--dask-workers", "0"), message)
    refused(task_args(tmp_path, "--split", "train=a.tsv", "--dask-workers", "0"), message)
    assert message_of(RunnerError, lambda: RunnerOptions("SparkRunner")).startswith("--runner 'SparkRunner'")
    assert stop_before_work == []


def test_the_cli_passes_one_runner_options_down(tmp_path, stop_before_work) -> None:
    for args in (run_args(tmp_path, "--runner", "daskrunner", "--dask-workers", "3", "--direct_num_workers=2"),
                 task_args(tmp_path, "--split", "train=a.tsv", "--runner", "daskrunner", "--dask-workers", "3",
                           "--direct_num_workers=2")):
        result = CliRunner().invoke(main, args)
        assert result.exit_code == 1 and "stub: no work" in result.output, result.output
    expected = RunnerOptions("DaskRunner", ("--direct_num_workers=2",), dask_scheduler=None, dask_workers=3)
    assert [kwargs["runner"] for _, kwargs in stop_before_work] == [expected, expected]


@pytest.mark.parametrize(("extra", "message"), [
    (["--dask-workers", "4"], "--dask-workers does not apply here: --runner DirectRunner is not DaskRunner"),
    (["--runner", "DataflowRunner", "--dask-scheduler", "tcp://h:8786"],
     "--dask-scheduler does not apply here: --runner DataflowRunner is not DaskRunner"),
    (["--runner", "DaskRunner", "--dask-scheduler", "tcp://h:8786", "--dask-workers", "4"],
     "--dask-workers does not apply here: a running scheduler is given"),
    (["--runner", "DaskRunner", "--dask_client_address=tcp://h:8786", "--dask-workers", "4"],
     "--dask-workers does not apply here: a running scheduler is given"),
])
def test_dask_options_another_runner_ignores_are_refused(tmp_path, stop_before_work, extra, message) -> None:
    refused(run_args(tmp_path, *extra), message)
    refused(task_args(tmp_path, "--split", "train=a.tsv", *extra), message)
    assert stop_before_work == []


def test_options_the_run_would_not_read_are_refused(tmp_path, stop_before_work) -> None:
    refused(run_args(tmp_path, "--num-shards", "3", "--target-shard-mb", "8"),
            "--target-shard-mb does not apply here: --num-shards fixes the train shards")
    refused(task_args(tmp_path, "--split", "train=a.tsv", "--num-shards", "3", "--target-shard-mb", "8"),
            "--target-shard-mb does not apply here: --num-shards fixes the shards of every split")
    refused(run_args(tmp_path, "--input-format", "sentences", "--sentence-splitter", "nupunkt"),
            "--sentence-splitter does not apply here: --input-format sentences gives the sentences")
    refused(run_args(tmp_path, "--read-chunk-mb", "8"),
            "--read-chunk-mb does not apply here: --input-format text files are read whole")
    assert stop_before_work == []
    # The eval split is sized by --target-shard-mb whatever --num-shards says.
    result = CliRunner().invoke(main, run_args(tmp_path, "--num-shards", "3", "--target-shard-mb", "8",
                                               "--eval-fraction", "0.1", "--input-format", "jsonl",
                                               "--read-chunk-mb", "8"))
    assert result.exit_code == 1 and "stub: no work" in result.output, result.output
    assert stop_before_work[0][1]["read_chunk_mb"] == 8 and stop_before_work[0][0].target_shard_mb == 8
