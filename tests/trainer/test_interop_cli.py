"""`bert-train export` and `--init-checkpoint` on a real (tiny) run."""

from __future__ import annotations

import json

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

from click.testing import CliRunner  # noqa: E402

from bert_datagen.trainer.cli import main  # noqa: E402
from bert_datagen.trainer.errors import TrainConfigError  # noqa: E402
from bert_datagen.trainer.interop.restore import read_checkpoint_arrays  # noqa: E402
from bert_datagen.trainer.model.config import BertConfig  # noqa: E402
from bert_datagen.trainer.model.weights import expected_tf1_shapes  # noqa: E402
from bert_datagen.trainer.runtime import checkpoint as ckpt_lib  # noqa: E402
from tests.support.interop_names import VOCAB, assert_bitwise_equal  # noqa: E402
from tests.support.synthetic import write_synthetic_dataset  # noqa: E402

BERT = {"vocab_size": 40, "hidden_size": 16, "num_hidden_layers": 2, "num_attention_heads": 2,
        "intermediate_size": 24, "max_position_embeddings": 16}
EXPECTED = expected_tf1_shapes(BertConfig.from_dict(BERT))


def bert_train(*args: str) -> str:
    result = CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result.output


def bert_train_fails(*args: str) -> str:
    result = CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)
    assert result.exit_code != 0
    return result.output


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A dataset whose vocab has BERT's special tokens, and a 2-step run on it."""
    root = tmp_path_factory.mktemp("interop-cli")
    data = write_synthetic_dataset(str(root / "ds"), seq_len=16, max_pred=3, vocab_size=40,
                                   train_shards=1, records_per_shard=16, eval_records=16)
    config = root / "bert_config.json"
    config.write_text(json.dumps(BERT))
    bert_train("pretrain", "--data", data, "--out", root / "run", "--bert-config", config, "--steps", 2,
               "--batch-size", 8, "--warmup-steps", 1, "--learning-rate", 1e-3, "--checkpoint-every", 2,
               "--eval-batches", 1)
    vocab = root / "vocab.txt"
    vocab.write_text("\n".join(VOCAB) + "\n")
    return {"root": root, "data": data, "run": root / "run", "vocab": vocab}


def run_weights(run_dir) -> dict[str, np.ndarray]:
    return ckpt_lib.load_arrays(ckpt_lib.resolve_checkpoint(run_dir), ckpt_lib.MODEL_FILE)


def test_export_tf1_has_original_names_and_round_trips(run, tmp_path):
    out = tmp_path / "tf1"
    bert_train("export", "--run", run["run"], "--format", "tf1", "--out", out, "--vocab", run["vocab"])
    weights = run_weights(run["run"])
    expected = EXPECTED
    assert dict(tf.train.list_variables(str(out / "bert_model.ckpt"))) == {n: list(s) for n, s in expected.items()}
    back, _ = read_checkpoint_arrays(out / "bert_model.ckpt", expected)
    assert_bitwise_equal(weights, back)
    assert json.loads((out / "bert_config.json").read_text())["hidden_size"] == 16
    assert (out / "vocab.txt").read_bytes() == run["vocab"].read_bytes()

    # eval on the exported original-layout checkpoint gives the run's own figures.
    ours = json.loads(bert_train("eval", "--run", run["run"], "--data", run["data"], "--batch-size", 8, "--json"))
    theirs = json.loads(bert_train("eval", "--init-checkpoint", out / "bert_model.ckpt", "--data", run["data"],
                                   "--batch-size", 8, "--json"))
    for key in ("mlm_loss", "mlm_accuracy", "nsp_loss", "nsp_accuracy", "examples"):
        assert theirs[key] == pytest.approx(ours[key], abs=1e-6), key


def test_export_hf_and_init_a_new_run_from_it(run, tmp_path):
    out = tmp_path / "hf"
    bert_train("export", "--run", run["run"], "--format", "hf", "--out", out, "--vocab", run["vocab"],
               "--no-do-lower-case")
    assert sorted(p.name for p in out.iterdir()) == ["bert_train_export.json", "config.json", "model.safetensors",
                                                    "tokenizer_config.json", "vocab.txt"]
    assert json.loads((out / "tokenizer_config.json").read_text())["do_lower_case"] is False
    back, _ = read_checkpoint_arrays(out, EXPECTED)
    assert_bitwise_equal(run_weights(run["run"]), back)

    # No --bert-config: the Hugging Face config.json defines the model (not the default size).
    new_run = tmp_path / "from-hf"
    log = bert_train("pretrain", "--data", run["data"], "--out", new_run, "--init-checkpoint", out,
                     "--steps", 1, "--batch-size", 8, "--warmup-steps", 1, "--checkpoint-every", 1,
                     "--eval-batches", 1)
    assert "initialised from" in log and str(out) in log
    state = ckpt_lib.load_state(ckpt_lib.resolve_checkpoint(new_run))
    assert {k: state["bert_config"][k] for k in BERT} == BERT
    # Step 0 of a warmup has learning rate 0: the first checkpoint holds the imported weights.
    assert_bitwise_equal(run_weights(run["run"]), run_weights(new_run))


def test_export_vocab_from_manifest_is_checked(run, tmp_path):
    # The synthetic dataset's vocab has no [CLS]/[SEP]/...: shipping it would make a broken tokenizer.
    output = bert_train_fails("export", "--run", run["run"], "--format", "hf", "--out", tmp_path / "x")
    assert "lacks the special tokens" in output
    assert not (tmp_path / "x").exists()


def test_export_refuses_to_clobber(run, tmp_path):
    target = tmp_path / "precious"
    target.mkdir()
    (target / "notes.txt").write_text("keep me")
    args = ["export", "--run", run["run"], "--format", "tf1", "--vocab", run["vocab"], "--out", target]
    assert "not empty" in bert_train_fails(*args)
    assert "not an earlier export" in bert_train_fails(*args, "--overwrite")
    assert (target / "notes.txt").read_text() == "keep me"
    bert_train(*args[:-1], tmp_path / "again")
    bert_train(*args[:-1], tmp_path / "again", "--overwrite")
    assert not [p for p in tmp_path.iterdir() if p.name.startswith((".tmp-", ".old-"))]


def test_init_checkpoint_with_wrong_config_is_a_clear_cli_error(run, tmp_path):
    out = tmp_path / "tf1"
    bert_train("export", "--run", run["run"], "--format", "tf1", "--out", out, "--vocab", run["vocab"])
    wrong = tmp_path / "wrong_config.json"
    wrong.write_text(json.dumps({**BERT, "intermediate_size": 20}))
    output = bert_train_fails("eval", "--init-checkpoint", out / "bert_model.ckpt", "--bert-config", wrong,
                              "--data", run["data"])
    assert "0 missing, 6 mis-shaped" in output
    assert "bert/encoder/layer_1/output/dense/kernel: checkpoint has [24, 16], model needs [20, 16]" in output
    output = bert_train_fails("eval", "--run", run["run"], "--init-checkpoint", out, "--data", run["data"])
    assert "exactly one of --run and --init-checkpoint" in output


def test_export_takes_vocab_and_casing_from_the_manifest(tmp_path):
    import hashlib

    from bert_datagen.trainer.interop.export import ExportConfig, resolve_vocab

    data = write_synthetic_dataset(str(tmp_path / "ds"), seq_len=16, max_pred=3, vocab_size=40,
                                   train_shards=1, records_per_shard=4, eval_records=0)
    vocab = ("\n".join(VOCAB) + "\n").encode()
    (tmp_path / "ds" / "vocab.txt").write_bytes(vocab)
    manifest = json.loads((tmp_path / "ds" / "manifest.json").read_text())
    manifest["vocab"]["sha256"] = hashlib.sha256(vocab).hexdigest()
    (tmp_path / "ds" / "manifest.json").write_text(json.dumps(manifest))

    cfg = ExportConfig(run="unused", format="hf", out="unused")
    found = resolve_vocab(cfg, data)
    assert found.data == vocab and found.do_lower_case is True
    assert resolve_vocab(ExportConfig(run="r", format="hf", out="o", do_lower_case=False), data).do_lower_case is False

    (tmp_path / "ds" / "vocab.txt").write_bytes(vocab + b"extra\n")
    with pytest.raises(TrainConfigError, match="does not match the sha256"):
        resolve_vocab(cfg, data)
    with pytest.raises(TrainConfigError, match="pass --vocab FILE"):
        resolve_vocab(cfg, str(tmp_path / "no-such-dataset"))


def _no_space_line(output: str, out) -> None:
    """One `Error:` line naming a file of the export (not its temp directory) and the cause."""
    import os

    lines = [line for line in output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith(f"Error: {out}") and ".tmp-" not in lines[0], output
    assert lines[0].endswith(os.strerror(28)) and "unexpected" not in output and "Safetensor" not in output, output


def test_export_on_a_real_full_disk_is_one_line_naming_the_file(run, full_disk):
    """12 KiB free of 64: the lock file and config.json fit, the weights (30 KB) do not; then none:
    the lock file itself cannot be written. Each time the disk is left as it was."""
    args = ["export", "--run", run["run"], "--vocab", run["vocab"], "--out", full_disk / "e"]
    filler = full_disk / "filler"
    filler.write_bytes(b"\0" * 52 * 1024)
    _no_space_line(bert_train_fails(*args, "--format", "hf", "--do-lower-case"), full_disk / "e" / "model.safetensors")
    _no_space_line(bert_train_fails(*args, "--format", "tf1"), full_disk / "e" / "bert_model.ckpt.data-")
    with open(filler, "ab", buffering=0) as f:
        with pytest.raises(OSError):
            while True:
                f.write(b"\0" * 1024)
    _no_space_line(bert_train_fails(*args, "--format", "hf", "--do-lower-case"), full_disk / ".bert-datagen-lock-e")
    assert [p.name for p in full_disk.iterdir()] == ["filler"]


def test_export_with_no_space_at_the_lowest_write_names_the_file(run, tmp_path, monkeypatch):
    """safetensors says "SafetensorError: ... I/O error ... (os error 28)": as the export file it was
    writing. (The tf1 writer is our own: tests/trainer/test_tf_bundle.py fills its disk.)"""
    import safetensors
    import safetensors.numpy

    def no_space_safetensors(*args, **kwargs):
        raise safetensors.SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")

    monkeypatch.setattr(safetensors.numpy, "save_file", no_space_safetensors)
    args = ["export", "--run", run["run"], "--vocab", run["vocab"], "--out", tmp_path / "e"]
    _no_space_line(bert_train_fails(*args, "--format", "hf", "--do-lower-case"), tmp_path / "e" / "model.safetensors")
    assert list(tmp_path.iterdir()) == []
