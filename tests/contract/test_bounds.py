"""Ranges before work (issue 29, point 5): every integer option of both CLIs is checked to its real
range and every float option to a finite number before anything is written (exit 2 naming the
option); the loaders' arguments are checked as a ValueError naming the argument."""

from __future__ import annotations

import importlib

import click
import numpy as np
import pytest
from click.testing import CliRunner

from bert_datagen.cli.plumbing import FiniteFloat, Int
from bert_datagen.contract.bounds import INT64_MAX, MAX_SEED, max_batches
from bert_datagen.contract.loading.batches import NumpyBatches
from bert_datagen.contract.loading.order import GlobalOrder, epoch_order
from bert_datagen.contract.loading.skips import SkipError, batch_of_step, merge, parse_ranges
from bert_datagen.contract.loading.source import open_source
from bert_datagen.pipelines import cli as datagen_cli
from bert_datagen.trainer import cli as train_cli
from tests.support.synthetic import write_synthetic_dataset

# The required arguments of each command, pointing at OUT (the output it would write) where it has one.
BASE = {
    ("bert-datagen", "vocab"): ["--input", "IN", "--output", "OUT"],
    ("bert-datagen", "run"): ["--input", "IN", "--vocab", "V", "--output", "OUT"],
    ("bert-datagen", "task"): ["--task", "tsv", "--split", "train=IN", "--vocab", "V", "--output", "OUT"],
    ("bert-datagen", "verify"): ["DATA"],
    ("bert-datagen", "inspect"): ["DATA"],
    ("bert-datagen", "stats"): ["DATA", "--plot", "OUT"],
    ("bert-datagen", "diff"): ["DATA", "DATA"],
    ("bert-datagen", "batches"): ["DATA", "--seed", "1", "--batch-size", "4", "--step", "0"],
    ("bert-train", "pretrain"): ["--data", "DATA", "--out", "OUT", "--steps", "2"],
    ("bert-train", "eval"): ["--run", "RUN", "--data", "DATA"],
    ("bert-train", "finetune"): ["--data", "DATA", "--out", "OUT", "--init-from", "RUN"],
    ("bert-train", "predict"): ["--run", "RUN", "--data", "DATA", "--split", "dev", "--out", "OUT"],
    ("bert-train", "export"): ["--run", "RUN", "--format", "hf", "--out", "OUT"],
}
GROUPS = {"bert-datagen": datagen_cli, "bert-train": train_cli}


def _commands():
    for cli_name, module in GROUPS.items():
        for name, target in module.COMMANDS.items():
            module_name, attr = target.split(":")
            yield cli_name, name, getattr(importlib.import_module(module_name), attr)


def _options():
    for cli_name, name, command in _commands():
        for param in command.params:
            if isinstance(param, click.Option) and not param.is_flag:
                yield cli_name, name, param


def test_every_number_option_has_a_checked_type():
    """An option typed `int` or `float` (click's INT, IntRange, FLOAT, FloatRange) takes values no code
    can hold (2**70) or NaN; every one is `Int` or `FiniteFloat`, so the table below covers it too."""
    assert {(c, n) for c, n, _ in _commands()} == set(BASE), "a new command: give its required arguments in BASE"
    loose = [f"{c} {n} {p.opts[0]}" for c, n, p in _options()
             if isinstance(p.type, (click.types.IntParamType, click.types.FloatParamType))]
    assert not loose, f"options to type with plumbing.Int / FiniteFloat: {loose}"
    assert sum(isinstance(p.type, Int) for *_, p in _options()) >= 50


def _bad_values(param: click.Option) -> list[str]:
    if isinstance(param.type, Int):
        values = [str(param.type.max + 1), str(2**64)]
        if param.type.min > -INT64_MAX - 1:
            values.append(str(param.type.min - 1))
        return values
    if isinstance(param.type, FiniteFloat):
        return ["nan", "inf", "-inf"]
    return []


CASES = [(c, n, p.opts[0], v) for c, n, p in _options() for v in _bad_values(p)]


@pytest.mark.parametrize(("cli_name", "command", "option", "value"), CASES,
                         ids=[f"{c}-{n}-{o}={v[:8]}" for c, n, o, v in CASES])
def test_out_of_range_option_is_a_usage_error_before_any_work(cli_name, command, option, value, tmp_path,
                                                              monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(GROUPS[cli_name].main, [command, *BASE[(cli_name, command)], option, value])
    assert result.exit_code == 2, result.output
    assert f"'{option}'" in result.output and "Traceback" not in result.output, result.output
    assert not (tmp_path / "OUT").exists()
    assert [p.name for p in tmp_path.iterdir()] == []


# Bounds that depend on another option: the batches a global order of that batch size can index.
DEPENDENT = [
    (datagen_cli, ["batches", "DATA", "--seed", "1", "--batch-size", "4", "--step", str(2**62)], "--step"),
    (datagen_cli, ["batches", "DATA", "--seed", "1", "--batch-size", "256", "--step", str(2**60)], "--step"),
    (datagen_cli, ["batches", "DATA", "--seed", "1", "--batch-size", "4", "--step", "0", "--block-size",
                   str(2**62)], "--block-size"),
    (train_cli, ["pretrain", "--data", "DATA", "--out", "OUT", "--steps", "2", "--skip-batches",
                 f"0-{INT64_MAX}"], "--skip-batches"),
    (train_cli, ["pretrain", "--data", "DATA", "--out", "OUT", "--steps", "2", "--skip-batches",
                 f"0-{2**70}"], "--skip-batches"),
    (train_cli, ["pretrain", "--data", "DATA", "--out", "OUT", "--steps", str(2**62), "--batch-size", "4"],
     "--steps"),
    (datagen_cli, ["vocab", "--input", "IN", "--output", "OUT", "--layout", "compact", "--num-unused", str(2**62)],
     "--num-unused"),
]


@pytest.mark.parametrize(("group", "args", "option"), DEPENDENT, ids=[" ".join(a[:1] + a[-2:]) for _, a, _ in DEPENDENT])
def test_positions_past_int64_are_refused_naming_the_option(group, args, option, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(group.main, args)
    assert result.exit_code == 2 and option in result.output and "Traceback" not in result.output, result.output
    assert "unexpected" not in result.output
    assert [p.name for p in tmp_path.iterdir()] == []


# ---------------------------------------------------------------- the loaders' API

B = 4


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    d = str(tmp_path_factory.mktemp("ds"))
    write_synthetic_dataset(d, train_shards=2, records_per_shard=20, eval_records=0)
    return open_source(d)


@pytest.mark.parametrize("step", [-1, 1.5, "3", None, True, max_batches(B), 2**64])
def test_a_step_outside_the_order_is_a_value_error_naming_it(source, step):
    it = NumpyBatches(source, seed=1, batch_size=B)
    with pytest.raises(ValueError, match="step"):
        it.batch_at(step)
    state = it.state_dict()
    with pytest.raises(ValueError, match="step"):
        it.load_state_dict({**state, "step": step})
    assert it.step == 0  # a refused state leaves the loader where it was
    with pytest.raises(ValueError, match="step"):
        NumpyBatches(source, seed=1, batch_size=B, start=step)


def test_the_last_step_the_order_holds_is_accepted(source):
    it = NumpyBatches(source, seed=1, batch_size=B)
    last = max_batches(B) - 1
    it.load_state_dict({**it.state_dict(), "step": last})
    assert len(next(it)["input_ids"]) == B
    assert int(it.order.batch_positions(last)[-1]) == last * B + B - 1 <= INT64_MAX


@pytest.mark.parametrize(("kwargs", "name"), [
    ({"seed": -5}, "seed"), ({"seed": MAX_SEED + 1}, "seed"), ({"seed": 1.5}, "seed"), ({"seed": "1"}, "seed"),
    ({"batch_size": 0}, "batch_size"), ({"batch_size": 2.0}, "batch_size"),
    ({"block_size": 0}, "block_size"), ({"block_size": 2**62}, "block_size"),
    ({"world_size": 0}, "world_size"), ({"rank": -1}, "rank"), ({"world_size": "2"}, "world_size"),
    ({"stop": -1}, "stop"), ({"stop": 2.5}, "stop"),
])
def test_loader_arguments_out_of_range_are_value_errors_naming_them(source, kwargs, name):
    args = {"seed": 1, "batch_size": B, **kwargs}
    with pytest.raises(ValueError, match=name):
        NumpyBatches(source, **args)
    if not {"world_size", "rank", "stop"} & set(kwargs):
        with pytest.raises(ValueError, match=name):
            GlobalOrder(source.counts, source.fingerprint, args["seed"], args["batch_size"],
                        args.get("block_size", 64))


def test_positions_epochs_and_skips_out_of_range_are_value_errors(source):
    order = GlobalOrder(source.counts, source.fingerprint, 1, B)
    for positions in ([-1], [0.5], np.array([INT64_MAX + 1], np.uint64)):
        with pytest.raises(ValueError, match="positions"):
            order.place(positions)
        with pytest.raises(ValueError, match="positions"):
            NumpyBatches(source, seed=1, batch_size=B).read_positions(positions)
    with pytest.raises(ValueError, match="epoch"):
        epoch_order(source.counts, source.fingerprint, 1, INT64_MAX // order.total, B)
    with pytest.raises(SkipError, match="past the last one"):
        parse_ranges(f"0-{2**64}")
    for bad in ([(-1, 3)], [(1.5, 3)], [(5, 3)], [("1", "2")]):
        with pytest.raises(ValueError, match="skipped range"):
            merge(bad)
    for step in (-1, 0.5):
        with pytest.raises(ValueError, match="step"):
            batch_of_step(step, [])


def test_torch_adapter_refuses_a_bad_state(source):
    pytest.importorskip("torch")
    from bert_datagen.contract.loading.torch_adapter import torch_batches

    ds = torch_batches(source, seed=1, batch_size=B, world_size=1, rank=0)
    for step in (-1, 2.0, "1"):
        with pytest.raises(ValueError, match="step"):
            ds.load_state_dict({**ds.state_dict(), "step": step})
    with pytest.raises(ValueError, match="seed"):
        torch_batches(source, seed=-1, batch_size=B, world_size=1, rank=0)


@pytest.mark.parametrize("command", ["finetune", "predict"])
def test_null_score_diff_threshold_nan_is_refused_by_predict_as_by_finetune(command, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(train_cli.main, [command, *BASE[("bert-train", command)],
                                                 "--null-score-diff-threshold", "nan"])
    assert result.exit_code == 2 and "'--null-score-diff-threshold'" in result.output, result.output
    assert "not a finite number" in result.output and not (tmp_path / "OUT").exists()
