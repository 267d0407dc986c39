"""`bert-datagen task` refuses what `run` refuses (outputs that are not a
dataset's own directory, an empty train split), warns where `run` warns, and refuses options and
inputs that would give a dataset other than the one asked for."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from bert_datagen.pipelines.cli import main
from tests.support.pipeline_corpus import write_vocab
from tests.support.taskdata_corpus import write_conll, write_pair_tsv, write_squad


def cli(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, list(args))
    return result.exit_code, result.output


@pytest.fixture
def files(tmp_path) -> dict[str, Path]:
    data = tmp_path / "data"
    data.mkdir()
    return {"root": tmp_path, "data": data, "vocab": write_vocab(tmp_path / "vocab.txt"),
            "train.tsv": write_pair_tsv(data / "train.tsv", 12, 3),
            "train.json": write_squad(data / "train.json", 4, 6),
            "train.conll": write_conll(data / "train.conll", 6, 8)}


def tsv_args(files, out: Path, *extra: str, train: Path | None = None) -> list[str]:
    return ["task", "--task", "tsv", "--text-a", "sentence1", "--text-b", "sentence2", "--label", "label",
            "--split", f"train={train or files['train.tsv']}", "--vocab", str(files["vocab"]), "--output", str(out),
            "--max-seq-length", "32", "--quiet", *extra]


# ---------------------------------------------------------------- 1: the output directory


@pytest.mark.parametrize("case", ["notes", "run_dir", "input_folder"])
def test_output_that_is_not_a_datasets_own_directory_is_refused(files, tree_snapshot, case) -> None:
    out = files["root"] / "out"
    out.mkdir()
    if case == "notes":
        (out / "notes.txt").write_text("mine\n")
        expected = "is not empty and holds no bert-datagen dataset (notes.txt"
    elif case == "run_dir":
        (out / "train_config.json").write_text("{}\n")
        (out / "checkpoints").mkdir()
        expected = "is a bert-train run directory (it holds train_config.json)"
    else:
        out = files["data"]
        expected = f"holds this command's input {files['train.tsv']}"
    before = tree_snapshot(files["root"])
    code, output = cli(*tsv_args(files, out))
    assert code == 1 and expected in output, output
    assert "Traceback" not in output and len(output.strip().splitlines()) == 1
    assert tree_snapshot(files["root"]) == before


def test_empty_output_directory_is_fine(files) -> None:
    out = files["root"] / "out"
    (out / "train").mkdir(parents=True)  # empty folders hold nothing to lose or to mix with
    code, output = cli(*tsv_args(files, out))
    assert code == 0, output
    code, output = cli("verify", str(out))
    assert code == 0, output


# ---------------------------------------------------------------- 2: an empty train split


def test_header_only_train_file_is_refused(files, tree_snapshot) -> None:
    header_only = files["data"] / "header.tsv"
    header_only.write_text("index\tsentence1\tsentence2\tlabel\n")
    out = files["root"] / "out"
    before = tree_snapshot(files["root"])
    code, output = cli(*tsv_args(files, out, "--labels", "entailment,neutral", train=header_only))
    assert code == 1 and f"split 'train' ({header_only}) has no examples" in output, output
    assert tree_snapshot(files["root"]) == before


# ---------------------------------------------------------------- 3: [UNK] warning, as `run` gives


def test_uncased_vocab_without_lowercasing_warns(files) -> None:
    cased = files["data"] / "cased.tsv"
    lines = files["train.tsv"].read_text().splitlines()
    cased.write_text("\n".join([lines[0]] + [line.title().replace("\tEntailment", "\tentailment")
                                             .replace("\tNeutral", "\tneutral").replace("\tContradiction",
                                                                                        "\tcontradiction")
                                             for line in lines[1:]]) + "\n")
    code, output = cli(*tsv_args(files, files["root"] / "ok", train=cased))
    assert code == 0 and "warning" not in output, output
    code, output = cli(*tsv_args(files, files["root"] / "unk", "--no-lower-case", train=cased))
    assert code == 0, output
    assert "[UNK] (above 1%)" in output and "check that it is cased like this run" in output, output


# ---------------------------------------------------------------- 7, 8: splits and SQuAD files


def squad_args(files, out: Path, *splits: str, kind: str = "squad") -> list[str]:
    return ["task", "--task", kind, *(a for s in splits for a in ("--split", s)), "--vocab", str(files["vocab"]),
            "--output", str(out), "--max-seq-length", "48", "--doc-stride", "16", "--max-query-length", "12",
            "--quiet"]


@pytest.mark.parametrize("name, message", [("data", "is a directory; give its files (e.g. train="),
                                           ("README.md", "is the name of a file every dataset holds"),
                                           ("Manifest.json", "is the name of a file every dataset holds"),
                                           ("vocab.txt", "is the name of a file every dataset holds")])
def test_split_that_is_a_directory_or_clashes_with_our_files_is_a_usage_error(files, tree_snapshot, name,
                                                                              message) -> None:
    split = f"train={files['data']}" if name == "data" else f"{name}={files['train.json']}"
    before = tree_snapshot(files["root"])
    code, output = cli(*squad_args(files, files["root"] / "out", f"train={files['train.json']}"
                                   if name != "data" else split, *([split] if name != "data" else [])))
    assert code == 2 and message in output, output
    assert "Traceback" not in output and "RuntimeError" not in output
    assert tree_snapshot(files["root"]) == before


def _squad(path: Path, qas: list[dict]) -> Path:
    import json

    context = "the cat sat on the mat ."
    path.write_text(json.dumps({"version": "x", "data": [{"title": "t", "paragraphs": [
        {"context": context, "qas": qas}]}]}))
    return path


def test_squad2_file_with_task_squad_is_refused(files, tree_snapshot) -> None:
    v2 = _squad(files["data"] / "v2.json", [
        {"id": "a", "question": "who ?", "answers": [{"text": "cat", "answer_start": 4}], "is_impossible": False},
        {"id": "b", "question": "why ?", "answers": [], "is_impossible": True}])
    before = tree_snapshot(files["root"])
    code, output = cli(*squad_args(files, files["root"] / "out", f"train={files['train.json']}", f"dev={v2}"))
    assert code == 1 and f"{v2}: line 1: question 'b'" in output and "use --task squad2" in output, output
    assert tree_snapshot(files["root"]) == before
    code, output = cli(*squad_args(files, files["root"] / "out2", f"train={v2}", kind="squad2"))
    assert code == 0, output


def test_duplicate_question_ids_are_refused(files, tree_snapshot) -> None:
    qa = {"id": "q1", "question": "who ?", "answers": [{"text": "cat", "answer_start": 4}]}
    twice = _squad(files["data"] / "twice.json", [qa, {**qa, "question": "what ?"}])
    other = _squad(files["data"] / "other.json", [qa])
    before = tree_snapshot(files["root"])
    code, output = cli(*squad_args(files, files["root"] / "out", f"train={files['train.json']}", f"dev={twice}"))
    assert code == 1 and f"{twice}: question id 'q1' at data[0].paragraphs[0].qas[1] is used twice" in output, output
    code, output = cli(*squad_args(files, files["root"] / "out", f"train={files['train.json']}",
                                   f"dev={files['data']}/[ot]*.json"))
    assert code == 1 and f"{twice}: question id 'q1'" in output and f"first at {other}" in output, output
    assert tree_snapshot(files["root"]) == before


# ---------------------------------------------------------------- 5: options the run would ignore


@pytest.mark.parametrize("kind, option, value", [("conll", "--doc-stride", "32"), ("conll", "--max-query-length", "8"),
                                                 ("tsv", "--scheme", "iob1"), ("squad", "--tag-column", "1"),
                                                 ("tsv", "--token-column", "0"), ("squad", "--labels", "a,b")])
def test_task_options_that_do_not_apply_are_usage_errors(files, tree_snapshot, kind, option, value) -> None:
    source = {"conll": "train.conll", "tsv": "train.tsv", "squad": "train.json"}[kind]
    args = ["task", "--task", kind, "--split", f"train={files[source]}", "--vocab", str(files["vocab"]),
            "--output", str(files["root"] / "out"), option, value]
    if kind == "tsv":
        args += ["--text-a", "sentence1", "--label", "label"]
    before = tree_snapshot(files["root"])
    code, output = cli(*args)
    assert code == 2 and f"{option} does not apply" in output and f"--task {kind}" in output, output
    assert tree_snapshot(files["root"]) == before


def test_defaults_of_options_that_do_not_apply_are_fine(files) -> None:
    code, output = cli("task", "--task", "conll", "--split", f"train={files['train.conll']}", "--vocab",
                       str(files["vocab"]), "--output", str(files["root"] / "ner"), "--max-seq-length", "16",
                       "--scheme", "iob2", "--quiet")
    assert code == 0, output


@pytest.mark.parametrize("extra, option", [(["--objective", "doc-sentences", "--short-seq-prob", "0.2"],
                                            "--short-seq-prob"),
                                           (["--input-format", "sentences", "--text-field", "body"], "--text-field"),
                                           (["--input-format", "jsonl", "--text-layout", "book"], "--text-layout")])
def test_run_options_that_do_not_apply_are_usage_errors(files, tree_snapshot, extra, option) -> None:
    before = tree_snapshot(files["root"])
    code, output = cli("run", "--input", str(files["train.tsv"]), "--vocab", str(files["vocab"]), "--output",
                       str(files["root"] / "out"), *extra)
    assert code == 2 and f"{option} does not apply here" in output, output
    assert tree_snapshot(files["root"]) == before


# ---------------------------------------------------------------- 9: SIGTERM is Ctrl-C


def test_sigterm_cleans_up_like_ctrl_c(files, tree_snapshot) -> None:
    """A real process (the handler is installed only for a command line): SIGTERM once the staging
    directory exists gives "interrupted", exit 130, and the old dataset exactly as it was."""
    import os
    import signal
    import subprocess
    import sys
    import time

    from bert_datagen.pipelines.beam.outputs import MARK

    out = files["root"] / "ds"
    code, output = cli(*tsv_args(files, out))
    assert code == 0, output
    big = files["data"] / "big.tsv"
    lines = files["train.tsv"].read_text().splitlines()
    big.write_text("\n".join([lines[0]] + lines[1:] * 400) + "\n")
    before = tree_snapshot(out)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent.parent)}
    proc = subprocess.Popen([sys.executable, "-m", "bert_datagen.pipelines.cli", *tsv_args(files, out, "--overwrite", train=big)],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while not any(out.glob(f"{MARK}staging-*")) and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.002)
        assert proc.poll() is None, f"the run ended before its staging directory showed (rc {proc.returncode})"
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 130 and stderr.strip().splitlines()[-1] == "interrupted", stderr[-2000:]
    assert "Traceback" not in stderr
    assert tree_snapshot(out) == before  # the staging directory is gone too


# ---------------------------------------------------------------- 4: JSONL labels written two ways


def _jsonl(path: Path, labels: list) -> Path:
    import json

    path.write_text("".join(json.dumps({"text": f"the cat sat {i} .", "label": lab}) + "\n"
                            for i, lab in enumerate(labels)))
    return path


@pytest.mark.parametrize("labels, message", [
    ([0, 1, 1.0], "line 3: label 1.0 is the number written 1 on line 2 of"),
    ([0, 1, True], "line 3: label 'true' is a boolean, but the label on line 1 of"),
    (["0", 1], "line 2: label '1' is a number, but the label on line 1 of"),
])
def test_jsonl_labels_written_two_ways_are_refused(files, tree_snapshot, labels, message) -> None:
    train = _jsonl(files["data"] / "mixed.jsonl", labels)
    before = tree_snapshot(files["root"])
    code, output = cli("task", "--task", "jsonl", "--text-a", "text", "--label", "label", "--split",
                       f"train={train}", "--vocab", str(files["vocab"]), "--output", str(files["root"] / "out"))
    assert code == 1 and f"{train}: {message}" in output, output
    assert tree_snapshot(files["root"]) == before


def test_jsonl_labels_of_one_form_are_fine(files) -> None:
    from bert_datagen.contract.manifest import MANIFEST_NAME

    for name, labels, extra in (("ints", [0, 1, 1, 0], []), ("bools", [True, False, True], []),
                                ("floats", [0.5, 1, 1.0, 2], ["--regression"])):
        train = _jsonl(files["data"] / f"{name}.jsonl", labels)
        out = files["root"] / name
        code, output = cli("task", "--task", "jsonl", "--text-a", "text", "--label", "label", "--split",
                           f"train={train}", "--vocab", str(files["vocab"]), "--output", str(out), "--quiet", *extra)
        assert code == 0 and (out / MANIFEST_NAME).is_file(), (name, output)


# ---------------------------------------------------------------- 6: training splits by name


def test_train_splits_names_the_training_splits(files) -> None:
    import json

    dev = write_pair_tsv(files["data"] / "dev.tsv", 6, 4)
    default, named = files["root"] / "default", files["root"] / "named"
    code, output = cli(*tsv_args(files, default, "--split", f"dev={dev}"))
    assert code == 0, output
    code, output = cli(*[a.replace("train=", "small=") for a in tsv_args(files, named, "--split", f"dev={dev}",
                                                                          "--train-splits", "small")])
    assert code == 0, output
    m_default = json.loads((default / "manifest.json").read_text())
    m_named = json.loads((named / "manifest.json").read_text())
    assert "train_splits" not in m_default["config"]  # datasets without the option keep their bytes
    assert m_named["config"]["train_splits"] == ["small"]
    assert {s: i["mode"] for s, i in m_named["splits"].items()} == {"small": "train", "dev": "predict"}
    # The same seeded order as a split named train: the same records.
    for a, b in zip(sorted((default / "train").glob("part-*")), sorted((named / "small").glob("part-*")),
                    strict=True):
        assert a.read_bytes() == b.read_bytes()
    code, output = cli("verify", str(named))
    assert code == 0, output


def test_train_splits_must_name_given_splits(files, tree_snapshot) -> None:
    before = tree_snapshot(files["root"])
    code, output = cli(*tsv_args(files, files["root"] / "out", "--train-splits", "small"))
    assert code == 2 and "--train-splits: 'small' is not one of the --split names (train)" in output, output
    assert tree_snapshot(files["root"]) == before


@pytest.mark.integration  # imports TensorFlow
def test_finetune_on_a_predict_split_says_how_to_make_it_a_training_split(files) -> None:
    pytest.importorskip("tensorflow")
    from bert_datagen.trainer.cli import main as train_main

    dev = write_pair_tsv(files["data"] / "dev.tsv", 6, 4)
    data = files["root"] / "ds"
    assert cli(*tsv_args(files, data, "--split", f"dev={dev}"))[0] == 0
    result = CliRunner().invoke(train_main, ["finetune", "--data", str(data), "--out", str(files["root"] / "run"),
                                             "--train-split", "dev", "--init-checkpoint", str(files["root"] / "x")])
    assert result.exit_code == 1, result.output
    assert "split 'dev' cannot be trained on: it was written to predict on" in result.output
    assert "bert-datagen task --train-splits dev" in result.output and "labelled=True" not in result.output


# ---------------------------------------------------------------- issue #43 point 5: sizes and counts bounded


@pytest.mark.parametrize(("option", "value", "message"), [
    ("--target-shard-mb", "1e-5", "not in the range [0.01, 65536]"),
    ("--target-shard-mb", "1e-9", "not in the range [0.01, 65536]"),
    ("--target-shard-mb", "1e308", "not in the range [0.01, 65536]"),
    ("--target-shard-mb", "nan", "not a finite number"),
    ("--num-shards", "1000000000", "--num-shards 1000000000 must be in [1, 100,000]"),
    ("--direct_num_workers=9223372036854775808", None, "--direct_num_workers 9223372036854775808 is not in [0, "),
])
def test_shard_sizes_counts_and_beam_options_are_bounded(files, tree_snapshot, option, value, message) -> None:
    """A tiny --target-shard-mb ended in ZeroDivisionError (unexpected), a huge one in OverflowError:
    both, like a shard count past the cap and Beam's worker counts, are usage errors before any work."""
    before = tree_snapshot(files["root"])
    code, output = cli(*tsv_args(files, files["root"] / "out", option, *([value] if value else [])))
    assert code == 2 and message in output and option.split("=")[0] in output, output
    assert "Traceback" not in output and "unexpected" not in output
    assert tree_snapshot(files["root"]) == before


def test_task_config_bounds_the_target_and_the_shards_it_makes(tmp_path) -> None:
    from bert_datagen.datagen.config import MAX_SHARDS, ConfigError
    from bert_datagen.datagen.tasks.config import TaskConfig
    from bert_datagen.pipelines.beam.errors import extract_input_error
    from bert_datagen.pipelines.tasks.graph import WriteSplit

    for value in (1e-9, 1e308):
        with pytest.raises(ConfigError, match="--target-shard-mb"):
            TaskConfig(kind="glue/sst2", target_shard_mb=value)
    with pytest.raises(ConfigError, match="--num-shards"):
        TaskConfig(kind="glue/sst2", num_shards=MAX_SHARDS + 1)
    write = WriteSplit(TaskConfig(kind="glue/sst2", target_shard_mb=0.01), str(tmp_path))
    assert write._shards_for(MAX_SHARDS * int(0.01 * 2**20), "train") == MAX_SHARDS
    with pytest.raises(RuntimeError) as raised:
        write._shards_for(MAX_SHARDS * int(0.01 * 2**20) + 1, "train")
    assert "the train split would be 100,001 shards" in extract_input_error(raised.value)
