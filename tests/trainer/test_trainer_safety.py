"""Nothing is lost and nothing waits forever in `bert-train`: a run knows its dataset, a
run with no completed step may restart with other settings, splits too small to give one batch and
other data problems are refused before the first step, output paths are checked before any work,
SIGINT stops at a consistent checkpoint, export replaces only its own earlier exports."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

from click.testing import CliRunner  # noqa: E402

from bert_datagen.trainer.cli import main  # noqa: E402
from bert_datagen.trainer.errors import CheckpointFormatError, DataError, TrainingError  # noqa: E402
from bert_datagen.trainer.interop.export import (  # noqa: E402
    EXPORT_MARK,
    TASK_FILE,
    export_hf,
    export_tf1,
    write_export_dir,
)
from bert_datagen.trainer.interop.tf1 import write_tf1_checkpoint  # noqa: E402
from bert_datagen.trainer.model.weights import expected_tf1_shapes  # noqa: E402
from bert_datagen.trainer.pretrain.config import TrainConfig  # noqa: E402
from bert_datagen.trainer.pretrain.data import open_pretraining_data  # noqa: E402
from bert_datagen.trainer.pretrain.train import pretrain  # noqa: E402
from bert_datagen.trainer.runtime import checkpoint as ckpt_lib  # noqa: E402
from tests.support.synthetic import write_synthetic_dataset  # noqa: E402

REPO = Path(__file__).resolve().parent.parent.parent
SHAPE = dict(seq_len=16, max_pred=3, vocab_size=40)
# A model smaller than "tiny": these tests are about runs, not about learning.
SMALL_BERT = {"vocab_size": 40, "hidden_size": 16, "num_hidden_layers": 1, "num_attention_heads": 2,
              "intermediate_size": 32, "max_position_embeddings": 16}
TF_STARTUP_LINES = ("oneDNN", "cuda", "CUDA", "cuDNN", "cuBLAS", "TensorRT", "port.cc", "cpu_feature_guard")


def make_data(path: Path, seed: int = 0, **kw) -> str:
    args = dict(SHAPE, train_shards=2, records_per_shard=16, eval_records=8, seed=seed)
    args.update(kw)
    return write_synthetic_dataset(str(path), **args)


def config(data: str, out: Path | str, **kw) -> TrainConfig:
    base = dict(data=data, out=str(out), bert_config=SMALL_BERT, batch_size=8, steps=4, learning_rate=1e-3,
                warmup_steps=1, seed=5, checkpoint_every=2, keep_checkpoints=10, log_every=1,
                eval_batches=1, shuffle_buffer=16)
    base.update(kw)
    return TrainConfig(**base)


def quiet(_: str) -> None:
    pass


def weights(run: Path) -> dict[str, np.ndarray]:
    return ckpt_lib.load_arrays(ckpt_lib.resolve_checkpoint(run), ckpt_lib.MODEL_FILE)


def assert_bitwise_equal(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for k in a:
        assert a[k].tobytes() == b[k].tobytes(), f"{k} differs"


def steps_of(run: Path) -> list[int]:
    return [step for step, _ in ckpt_lib.list_checkpoints(run)]


def cli(*args) -> tuple[int, str]:
    result = CliRunner().invoke(main, [str(a) for a in args])
    # A user error is a click exit (SystemExit), never another exception with a traceback.
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    assert "Traceback" not in result.output
    return result.exit_code, result.output


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> str:
    return make_data(tmp_path_factory.mktemp("safety") / "ds")


# ------------------------------------------------------------------ a run knows its data


def test_another_spelling_of_the_same_dataset_resumes(data, tmp_path, monkeypatch):
    monkeypatch.chdir(Path(data).parent)
    run = tmp_path / "run"
    pretrain(config("ds", run, steps=6), log=quiet, stop_at=2)
    (tmp_path / "link").symlink_to(Path(data))
    # relative -> with a trailing slash -> an absolute path through a symlink
    for spelling, stop in (("ds/", 3), (str(tmp_path / "link"), 5)):
        logs: list[str] = []
        pretrain(config(spelling, run, steps=6), log=logs.append, stop_at=stop)
        assert any(line.startswith("resumed from") for line in logs), (spelling, logs[:2])
    assert steps_of(run)[-1] == 5


def test_a_regenerated_dataset_is_refused_naming_both_fingerprints(tmp_path):
    path = tmp_path / "ds"
    make_data(path, seed=0)
    run = tmp_path / "run"
    pretrain(config(str(path), run), log=quiet, stop_at=2)
    started = json.loads((run / "dataset.json").read_text())["fingerprint"]
    shutil.rmtree(path)
    make_data(path, seed=1)  # same path, same shapes, other records
    now = open_pretraining_data(str(path)).identity["fingerprint"]
    assert now != started
    with pytest.raises(TrainingError, match="not the dataset this run was started on") as err:
        pretrain(config(str(path), run), log=quiet)
    assert started in str(err.value) and now in str(err.value)
    assert steps_of(run) == [2]  # refused before any step


def test_a_dataset_changed_during_the_run_is_refused_before_the_eval(tmp_path):
    path = tmp_path / "ds"
    make_data(path, seed=0)

    def regenerate_at_step_2(line: str) -> None:
        if line.startswith("step       2/"):
            shutil.rmtree(path)
            make_data(path, seed=1)

    with pytest.raises(TrainingError, match="not the dataset this run was started on"):
        pretrain(config(str(path), tmp_path / "run", eval_every=2, checkpoint_every=10),
                 log=regenerate_at_step_2)


# ------------------------------------------------------------------ restarting a run


def test_a_run_without_a_completed_step_may_restart_with_other_settings(data, tmp_path):
    run = tmp_path / "run"
    with pytest.raises(ckpt_lib.CheckpointError, match="nothing"):
        pretrain(config(data, run, init_from=str(tmp_path / "nothing")), log=quiet)
    corrected = config(data, run, learning_rate=5e-4)
    assert pretrain(corrected, log=quiet)["step"] == 4
    # With completed steps the run is locked to its settings, as before.
    with pytest.raises(TrainingError, match="started with other settings.*learning_rate"):
        pretrain(config(data, run, learning_rate=1e-3, steps=8), log=quiet)


def test_a_run_that_failed_on_corrupt_data_may_restart_on_good_data(data, tmp_path):
    bad = tmp_path / "bad"
    shutil.copytree(data, bad)
    shard = bad / "train" / "part-00001-of-00002.tfrecord"
    raw = bytearray(shard.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    shard.write_bytes(bytes(raw))
    run = tmp_path / "run"
    with pytest.raises(DataError, match="corrupt input"):
        pretrain(config(str(bad), run, steps=40, checkpoint_every=40), log=quiet)
    assert pretrain(config(data, run, steps=2), log=quiet)["step"] == 2


def test_a_step_that_fails_on_good_data_is_not_blamed_on_the_data(data, tmp_path, monkeypatch):
    """An InvalidArgumentError from the step itself (e.g. a collective left by another strategy in
    this process) on records that are all fine is a failed step, not 'corrupt input'."""
    import tensorflow as tf

    from bert_datagen.trainer.runtime import tf_training

    def failing_step(*_):
        raise tf.errors.InvalidArgumentError(None, None, "Shape mismatch in the collective instance 101")

    monkeypatch.setattr(tf_training, "make_train_step", lambda *args, **kwargs: failing_step)
    with pytest.raises(TrainingError, match="training step 1 failed: InvalidArgumentError: Shape mismatch"):
        pretrain(config(data, tmp_path / "run"), log=quiet)


# ------------------------------------------------------------------ data checks before the first step


def test_too_small_train_and_eval_splits_are_refused_before_the_first_step(tmp_path):
    small_train = make_data(tmp_path / "t", train_shards=1, records_per_shard=5)
    with pytest.raises(DataError, match="the train split has 5 records, fewer than one batch of 8"):
        pretrain(config(small_train, tmp_path / "r1"), log=quiet)
    small_eval = make_data(tmp_path / "e", eval_records=3)
    with pytest.raises(DataError, match="the eval split has 3 records, fewer than one batch of 8"):
        pretrain(config(small_eval, tmp_path / "r2"), log=quiet)
    assert not (tmp_path / "r1").exists() and not (tmp_path / "r2").exists()  # refused before any work


def test_a_truncated_shard_is_refused_before_the_first_step(data, tmp_path):
    bad = tmp_path / "bad"
    shutil.copytree(data, bad)
    shard = bad / "eval" / "part-00000-of-00001.tfrecord"
    shard.write_bytes(shard.read_bytes()[:-10])
    with pytest.raises(DataError, match=r"part-00000-of-00001.tfrecord: has \d+ bytes, .*manifest.json says"):
        pretrain(config(str(bad), tmp_path / "run"), log=quiet)
    assert not (tmp_path / "run").exists()


def test_empty_train_split_is_a_clear_error_not_a_hang_and_tf_start_up_logs_are_hidden(tmp_path):
    # A 0-record train split used to make the repeating input pipeline wait forever.
    empty = make_data(tmp_path / "empty", train_shards=2, records_per_shard=0)
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    env["PYTHONPATH"] = str(REPO)
    proc = subprocess.run([sys.executable, "-m", "bert_datagen.trainer.cli", "pretrain", "--data", empty, "--out",
                           str(tmp_path / "run"), "--steps", "2", "--batch-size", "8"],
                          capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr
    assert "the train split is empty, fewer than one batch of 8" in proc.stderr
    assert "Traceback" not in proc.stderr
    noise = [line for line in proc.stderr.splitlines() if any(s in line for s in TF_STARTUP_LINES)]
    assert not noise, noise


@pytest.mark.parametrize("module", ["examples.pretrain_demo", "examples.finetune_demo"])
def test_the_demos_quiet_tensorflow_as_bert_train_does(module):
    # `make pretrain` / `make finetune` run the demos with `python -m`: their entry must set up the
    # same quieting as `bert-train` (tests/trainer/test_finetune_demo.py checks the stderr of a whole run).
    import ast
    import importlib

    tree = ast.parse(Path(importlib.import_module(module).__file__).read_text())
    [entry] = [node for node in tree.body if isinstance(node, ast.If) and "__main__" in ast.unparse(node.test)]
    assert "run_quietly(main)" in ast.unparse(entry)


def test_tensorflow_quieting_leaves_a_users_log_level_alone():
    from bert_datagen.trainer import cli
    from bert_datagen.trainer.quiet import TF_NATIVE_NOISE, quiet_tensorflow_logs

    environ: dict[str, str] = {}
    assert quiet_tensorflow_logs(environ) is TF_NATIVE_NOISE and environ == {"TF_CPP_MIN_LOG_LEVEL": "2"}
    mine = {"TF_CPP_MIN_LOG_LEVEL": "0"}
    assert quiet_tensorflow_logs(mine) is None and mine == {"TF_CPP_MIN_LOG_LEVEL": "0"}
    assert cli.TrainGroup.stderr_noise in (TF_NATIVE_NOISE, None)  # the one setup, not a copy
    for line in (b"WARNING: All log messages before absl::InitializeLog() is called are written to STDERR",
                 b"I0000 00:00:1796176912.409377   11519 tf_record_dataset_op.cc:390] TFRecordDataset "
                 b"`buffer_size` is unspecified, default to 262144",
                 b"E0000 00:00:1796176910.618393   11168 cuda_platform.cc:52] failed call to cuInit: INTERNAL",
                 # a lost worker (the command's own line names it)
                 b"E0000 00:00:1796186559.001319    1212 ring_alg.cc:291] Aborting RingReduce with UNAVAILABLE: "
                 b"recvmsg:Connection reset by peer",
                 b"Additional GRPC error information from remote target /job:worker/replica:0/task:1 while "
                 b"calling /tensorflow.WorkerService/RecvBuf:",
                 b':UNKNOWN:Error received from peer  {grpc_status:14, grpc_message:"recvmsg:Connection reset"}',
                 b"E0000 00:00:1796186559.001391    1212 base_collective_executor.cc:252] "
                 b"BaseCollectiveExecutor::StartAbort UNAVAILABLE: recvmsg:Connection reset by peer"):
        assert TF_NATIVE_NOISE.match(line), line
    assert not TF_NATIVE_NOISE.match(b"Error: run: a real problem")
    assert not TF_NATIVE_NOISE.match(b"E0000 00:00:1796186559.001319    1212 op_kernel.cc:1840] OP_REQUIRES failed")


# ------------------------------------------------------------------ clean errors and output paths


def test_user_errors_are_one_clear_message(data, tmp_path):
    base = ["pretrain", "--steps", "2", "--batch-size", "8"]
    code, out = cli(*base, "--data", data, "--out", tmp_path / "a", "--init-from", tmp_path / "nothing")
    assert code == 1 and f"{tmp_path / 'nothing'}: neither a checkpoint" in out
    code, out = cli(*base, "--data", tmp_path / "missing", "--out", tmp_path / "b")
    assert code == 1 and "missing: not a dataset directory with manifest.json" in out
    bad = tmp_path / "bad"
    shutil.copytree(data, bad)
    shard = bad / "train" / "part-00000-of-00002.tfrecord"
    raw = bytearray(shard.read_bytes())
    raw[3] ^= 0xFF  # the first record's length header
    shard.write_bytes(bytes(raw))
    code, out = cli(*base, "--data", bad, "--out", tmp_path / "c")
    assert code == 1 and "corrupt input" in out and "part-00000-of-00002.tfrecord" in out
    task = tmp_path / "task"
    shutil.copytree(data, task)
    manifest = json.loads((task / "manifest.json").read_text())
    manifest["kind"] = "task"
    manifest["task"] = {"kind": "tsv", "type": "classification"}
    for name in ("masked_lm_positions", "masked_lm_ids", "masked_lm_weights", "next_sentence_labels"):
        del manifest["features"][name]  # what a task dataset lacks
    (task / "manifest.json").write_text(json.dumps(manifest))
    code, out = cli(*base, "--data", task, "--out", tmp_path / "d")
    assert code == 1 and "a 'task' dataset, not a pre-training dataset" in out
    for option, value in (("--learning-rate", "nan"), ("--weight-decay", "inf"), ("--batch-size", "0")):
        code, out = cli(*base[:3], "--data", data, "--out", tmp_path / "e", option, value)
        assert code == 2 and option in out, out
    assert not any((tmp_path / name).exists() for name in "abcde")


def test_out_that_cannot_hold_a_run_is_one_clear_error(data, tmp_path):
    base = ["pretrain", "--data", data, "--steps", "2", "--batch-size", "8"]
    afile = tmp_path / "afile"
    afile.write_text("mine")
    code, out = cli(*base, "--out", afile)
    assert code == 1 and f"--out {afile}: exists and is not a directory" in out
    code, out = cli(*base, "--out", "gs://bucket/run")
    assert code == 1 and "--out gs://bucket/run: must be a local directory" in out
    assert not Path("gs:").exists()
    code, out = cli(*base, "--out", afile / "run")
    assert code == 1 and f"{afile} is not a directory" in out
    assert afile.read_text() == "mine"
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("keep")
    code, out = cli(*base, "--out", foreign)
    assert code == 1 and "is not a bert-train run directory" in out
    assert [p.name for p in foreign.iterdir()] == ["notes.txt"]
    # sysfs refuses new directories even to root: an unwritable place on any Linux machine.
    if Path("/sys/kernel").is_dir():
        code, out = cli(*base, "--out", "/sys/bert-train-run")
        assert code == 1 and "--out /sys/bert-train-run: cannot write in /sys" in out


@pytest.mark.skipif(os.geteuid() == 0, reason="root ignores directory permissions")
def test_out_in_a_directory_without_permission_is_one_clear_error(data, tmp_path):
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        code, out = cli("pretrain", "--data", data, "--steps", "2", "--out", locked / "run")
        assert code == 1 and "cannot write in" in out and "Permission denied" in out
    finally:
        locked.chmod(0o700)


# ------------------------------------------------------------------ interrupts and atomic checkpoints


def test_sigint_stops_after_the_step_with_a_checkpoint_and_resumes_bitwise(data, tmp_path):
    pretrain(config(data, tmp_path / "ref", steps=6, checkpoint_every=4), log=quiet)

    def interrupt_at_step_3(line: str) -> None:
        if line.startswith("step       3/"):
            os.kill(os.getpid(), signal.SIGINT)

    run = tmp_path / "run"
    with pytest.raises(KeyboardInterrupt):
        pretrain(config(data, run, steps=6, checkpoint_every=4), log=interrupt_at_step_3)
    assert steps_of(run) == [3]  # the interrupted step's state, consistent, under its own step
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    pretrain(config(data, run, steps=6, checkpoint_every=4), log=quiet)
    assert_bitwise_equal(weights(run), weights(tmp_path / "ref"))


def test_an_interrupted_checkpoint_write_keeps_the_last_good_one(data, tmp_path, monkeypatch):
    pretrain(config(data, tmp_path / "ref"), log=quiet)
    run = tmp_path / "run"
    real_savez = np.savez
    calls = []

    def savez_then_interrupt(*args, **kwargs):
        calls.append(args[0])
        if len(calls) == 3:  # the second checkpoint's model file
            raise KeyboardInterrupt
        return real_savez(*args, **kwargs)

    monkeypatch.setattr(ckpt_lib.np, "savez", savez_then_interrupt)
    with pytest.raises(KeyboardInterrupt):
        pretrain(config(data, run), log=quiet)
    monkeypatch.setattr(ckpt_lib.np, "savez", real_savez)
    assert steps_of(run) == [2]
    assert not [p for p in run.iterdir() if p.name.startswith(".tmp-")]
    # What SIGKILL would leave mid-write: a temp checkpoint dir and a temp file; both are ours.
    (run / ".tmp-ckpt-00000004-x").mkdir()
    (run / ".tmp-ckpt-00000004-x" / "model.npz").write_bytes(b"half")
    (run / ".tmp-train_config.json-1").write_text("{")
    pretrain(config(data, run), log=quiet)
    assert_bitwise_equal(weights(run), weights(tmp_path / "ref"))
    assert not [p for p in run.iterdir() if p.name.startswith(".tmp-")]


# ------------------------------------------------------------------ export replaces only its own exports


TINY = {"vocab_size": 40, "hidden_size": 8, "num_hidden_layers": 1, "num_attention_heads": 2,
        "intermediate_size": 16, "max_position_embeddings": 16, "type_vocab_size": 2, "hidden_act": "gelu",
        "hidden_dropout_prob": 0.1, "attention_probs_dropout_prob": 0.1, "initializer_range": 0.02}
VOCAB = ("[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\n" + "".join(f"w{i}\n" for i in range(35))).encode()


def test_export_replaces_only_an_earlier_export_of_ours(tmp_path):
    arrays = {name: np.zeros(shape, np.float32) for name, shape in expected_tf1_shapes(TINY).items()}
    # A downloaded Hugging Face model with a model card: it has config.json, but it is not ours.
    downloaded = tmp_path / "downloaded"
    downloaded.mkdir()
    for name, text in (("config.json", "{}"), ("model.safetensors", "x"), ("README.md", "card")):
        (downloaded / name).write_text(text)
    with pytest.raises(CheckpointFormatError, match=r"not an earlier export of ours \(no valid bert_train_export"):
        export_hf(downloaded, arrays, TINY, VOCAB, overwrite=True)
    assert sorted(p.name for p in downloaded.iterdir()) == ["README.md", "config.json", "model.safetensors"]
    # Named as an export's files are, but nothing marks it as ours: a user's config alone.
    users = tmp_path / "users"
    users.mkdir()
    (users / "config.json").write_text('{"mine": true}')
    with pytest.raises(CheckpointFormatError, match=f"{users}: not an earlier export of ours"):
        export_hf(users, arrays, TINY, VOCAB, overwrite=True)
    assert (users / "config.json").read_text() == '{"mine": true}'
    afile = tmp_path / "afile"
    afile.write_text("mine")
    with pytest.raises(CheckpointFormatError, match="exists and is not a directory"):
        export_tf1(afile, arrays, TINY, VOCAB, overwrite=True)
    assert afile.read_text() == "mine"
    # Our own earlier export is replaced (tf1 by hf even), atomically, leaving no temp dirs.
    ours = export_tf1(tmp_path / "ours", arrays, TINY, VOCAB)
    export_hf(ours, arrays, TINY, VOCAB, overwrite=True)
    assert (ours / "config.json").is_file() and not (ours / "bert_config.json").exists()
    assert json.loads((ours / EXPORT_MARK).read_text())["written_by"] == "bert-train export"
    # Ours, but a user has put a file of theirs in it: replacing it whole would lose that file.
    (ours / "notes.txt").write_text("mine")
    with pytest.raises(CheckpointFormatError, match=r"holds files an export does not write \(notes.txt\)"):
        export_tf1(ours, arrays, TINY, VOCAB, overwrite=True)
    (ours / "notes.txt").unlink()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith((".tmp-", ".old-"))]
    # Killed mid-swap: the earlier export was set aside and a temp dir left; the next export puts the
    # earlier one back (so --overwrite is still needed) and removes the temp dir.
    os.replace(ours, tmp_path / f".old-{'a' * 32}-ours")
    (tmp_path / f".tmp-{'b' * 32}-ours").mkdir()
    with pytest.raises(CheckpointFormatError, match="not empty"):
        export_tf1(ours, arrays, TINY, VOCAB)
    assert (ours / "config.json").is_file()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith((".tmp-", ".old-"))]


def test_an_export_replaces_any_earlier_export_whichever_run_wrote_it(tmp_path):
    """A fine-tuned run's tf1 export adds task.json: a pre-training run's export --overwrite onto it
    refused that file as not an export's."""
    arrays = {name: np.zeros(shape, np.float32) for name, shape in expected_tf1_shapes(TINY).items()}

    def finetuned_tf1(tmp: Path) -> None:  # the files export_finetuned writes for --format tf1
        write_tf1_checkpoint(tmp / "bert_model.ckpt", arrays)
        (tmp / "bert_config.json").write_text(json.dumps(TINY))
        (tmp / "vocab.txt").write_bytes(VOCAB)
        (tmp / TASK_FILE).write_text('{"type": "classification", "labels": ["0", "1"]}\n')

    out = write_export_dir(tmp_path / "out", False, finetuned_tf1)
    export_tf1(out, arrays, TINY, VOCAB, overwrite=True)
    assert not (out / TASK_FILE).exists() and (out / "bert_config.json").is_file()
    write_export_dir(out, True, finetuned_tf1)  # and back again
    (out / "notes.txt").write_text("mine")  # a file of a user's is still refused
    with pytest.raises(CheckpointFormatError, match=r"holds files an export does not write \(notes.txt\)"):
        export_tf1(out, arrays, TINY, VOCAB, overwrite=True)
    assert (out / TASK_FILE).is_file() and (out / "notes.txt").read_text() == "mine"


def test_a_sigint_swallowed_during_start_up_stops_the_loop_before_its_first_step(monkeypatch):
    """A KeyboardInterrupt raised inside a third-party import can be swallowed there; the CLI's
    handler has recorded the SIGINT, and the loop honours it at its first safe point."""
    import threading

    from bert_datagen.cli import plumbing as cliutil
    from bert_datagen.trainer.runtime.stopping import interrupts_between_steps

    seen = threading.Event()
    seen.set()
    monkeypatch.setattr(cliutil, "_SIGINT_SEEN", seen)
    with interrupts_between_steps() as interrupted:
        assert interrupted()
    monkeypatch.setattr(cliutil, "_SIGINT_SEEN", threading.Event())
    with interrupts_between_steps() as interrupted:
        assert not interrupted()
