"""Training runs: bitwise reproducibility, exact resume, distribution, accumulation, input checks,
checkpoints, NaN handling and the CLI. Tiny models on small synthetic datasets."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

from click.testing import CliRunner  # noqa: E402

from bert_datagen.trainer.errors import TrainingError  # noqa: E402
from bert_datagen.trainer.model.config import BertConfig  # noqa: E402
from bert_datagen.trainer.pretrain.config import TrainConfig  # noqa: E402
from bert_datagen.trainer.pretrain.data import DataError, open_pretraining_data  # noqa: E402
from bert_datagen.trainer.pretrain.earlier_runs_input import train_dataset  # noqa: E402
from bert_datagen.trainer.pretrain.train import pretrain  # noqa: E402
from bert_datagen.trainer.runtime import checkpoint as ckpt_lib  # noqa: E402
from tests.support.synthetic import write_synthetic_dataset  # noqa: E402

REPO = Path(__file__).resolve().parent.parent.parent


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> str:
    return write_synthetic_dataset(str(tmp_path_factory.mktemp("data") / "ds"), seq_len=32, max_pred=5,
                                   vocab_size=120, train_shards=3, records_per_shard=40, eval_records=16)


def config(data: str, out: Path, **kw) -> TrainConfig:
    base = dict(data=data, out=str(out), model="tiny", batch_size=8, steps=6, learning_rate=2e-3,
                warmup_steps=2, seed=3, checkpoint_every=2, keep_checkpoints=2, log_every=3,
                eval_batches=1, shuffle_buffer=50)
    base.update(kw)
    return TrainConfig(**base)


def final_weights(run: Path) -> dict[str, np.ndarray]:
    return ckpt_lib.load_arrays(ckpt_lib.resolve_checkpoint(run), ckpt_lib.MODEL_FILE)


def final_slots(run: Path) -> dict[str, np.ndarray]:
    return ckpt_lib.load_arrays(ckpt_lib.resolve_checkpoint(run), ckpt_lib.OPTIMIZER_FILE)


def assert_bitwise_equal(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for k in a:
        assert a[k].tobytes() == b[k].tobytes(), f"{k} differs"


def test_same_seed_bitwise_identical_and_exact_resume(dataset, tmp_path):
    logs: list[str] = []
    first = pretrain(config(dataset, tmp_path / "a"), log=logs.append)
    pretrain(config(dataset, tmp_path / "b"), log=lambda _: None)
    a, b = final_weights(tmp_path / "a"), final_weights(tmp_path / "b")
    assert_bitwise_equal(a, b)
    assert_bitwise_equal(final_slots(tmp_path / "a"), final_slots(tmp_path / "b"))
    assert first["step"] == 6 and any("seq/s" in line for line in logs)

    # interrupted after step 4 (checkpoint), then the same command again
    stopped = pretrain(config(dataset, tmp_path / "c"), log=lambda _: None, stop_at=4)
    assert stopped["step"] == 4 and "eval" not in stopped
    resumed_log: list[str] = []
    pretrain(config(dataset, tmp_path / "c"), log=resumed_log.append)
    assert any("resumed from" in line and "ckpt-00000004" in line for line in resumed_log)
    assert_bitwise_equal(a, final_weights(tmp_path / "c"))
    assert_bitwise_equal(final_slots(tmp_path / "a"), final_slots(tmp_path / "c"))

    # the same command with other settings is refused (before any work is done)
    with pytest.raises(TrainingError, match="learning_rate: 0.002 -> 0.001"):
        pretrain(config(dataset, tmp_path / "a", learning_rate=1e-3), log=lambda _: None)

    # last k kept, each complete; state and configs written
    kept = [step for step, _ in ckpt_lib.list_checkpoints(tmp_path / "a")]
    assert kept == [4, 6]
    run = tmp_path / "a"
    assert json.loads((run / "bert_config.json").read_text())["hidden_size"] == 128
    assert json.loads((run / "train_config.json").read_text())["seed"] == 3
    assert (run / "final_metrics.json").is_file()
    assert list((run / "tensorboard" / "train").iterdir())
    slots = final_slots(run)
    assert int(slots["global_step"]) == 6 and "bert/pooler/dense/kernel/adam_m" in slots


def test_accumulation_equals_the_full_batch(dataset, tmp_path):
    # Dropout on (the tiny model's default 0.1): each row's mask is keyed by its place in the global
    # batch, so micro-batches draw the full batch's masks.
    bert = BertConfig.from_name("tiny", 120).to_dict()
    assert bert["hidden_dropout_prob"] == bert["attention_probs_dropout_prob"] == 0.1
    pretrain(config(dataset, tmp_path / "full", steps=2, bert_config=bert), log=lambda _: None)
    pretrain(config(dataset, tmp_path / "acc", steps=2, bert_config=bert, accumulation_steps=4),
             log=lambda _: None)
    full, acc = final_weights(tmp_path / "full"), final_weights(tmp_path / "acc")
    for k in full:
        np.testing.assert_allclose(acc[k], full[k], atol=2e-6, rtol=1e-5, err_msg=k)


MIRRORED_SCRIPT = textwrap.dedent("""
    import sys, numpy as np, tensorflow as tf
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
    from bert_datagen.trainer.runtime import checkpoint as ck
    from bert_datagen.trainer.model.config import BertConfig
    from bert_datagen.trainer.pretrain.config import TrainConfig
    from bert_datagen.trainer.pretrain.train import pretrain
    data, lamb_data, out = sys.argv[1:4]

    def worst(name, file=ck.MODEL_FILE):
        a = ck.load_arrays(ck.resolve_checkpoint(f"{out}/{name}-one-device"), file)
        b = ck.load_arrays(ck.resolve_checkpoint(f"{out}/{name}-mirrored"), file)
        assert a.keys() == b.keys()
        return max(float(np.abs(a[k].astype(np.float64) - b[k]).max()) for k in a), b

    bert = BertConfig.from_name("tiny", 120).to_dict()  # dropout 0.1, the default
    res = {}
    for strategy in ("one-device", "mirrored"):
        cfg = TrainConfig(data=data, out=f"{out}/adam-{strategy}", bert_config=bert, batch_size=8, steps=10,
                          learning_rate=2e-3, warmup_steps=1, seed=3, checkpoint_every=10, log_every=10,
                          eval_batches=1, strategy=strategy)
        res[strategy] = pretrain(cfg, log=print)
    print("REPLICAS", tf.distribute.MirroredStrategy([d.name for d in tf.config.list_logical_devices("CPU")]).num_replicas_in_sync)
    print("WORST", worst("adam")[0])
    print("LOSS", res["one-device"]["train"]["loss"], res["mirrored"]["train"]["loss"])
    # LAMB, on a model of another shape, in the same process (as a benchmark or a notebook runs a
    # second mirrored model: TF's collectives once failed on it with a shape mismatch).
    other = {**BertConfig.from_name("tiny", 60).to_dict(), "hidden_size": 64, "intermediate_size": 256}
    for strategy in ("one-device", "mirrored"):
        pretrain(TrainConfig(data=lamb_data, out=f"{out}/lamb-{strategy}", bert_config=other, batch_size=8, steps=3,
                             learning_rate=1e-2, warmup_steps=1, seed=3, checkpoint_every=3, log_every=3,
                             eval_batches=1, shuffle_buffer=16, strategy=strategy, optimizer="lamb"), log=print)
    for file in (ck.MODEL_FILE, ck.OPTIMIZER_FILE):
        value, arrays = worst("lamb", file)
        print("LAMB_WORST", value)
    print("LAMB_UPDATES", int(arrays["lamb_updates"]))
""")


def test_mirrored_over_two_cpus_equals_one_device(dataset, tmp_path):
    # Adam (the default) and LAMB, dropout on (masks keyed by each row's place in the global batch).
    lamb_data = write_synthetic_dataset(str(tmp_path / "lamb-ds"), seq_len=16, max_pred=3, vocab_size=60,
                                        train_shards=2, records_per_shard=16, eval_records=8)
    script = tmp_path / "mirrored.py"
    script.write_text(MIRRORED_SCRIPT)
    proc = subprocess.run([sys.executable, str(script), dataset, lamb_data, str(tmp_path)], capture_output=True,
                          text=True, timeout=400, cwd=REPO, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"})
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    lines = [line.split(" ", 1) for line in proc.stdout.splitlines()]
    found = {k: v for k, v in lines if k in ("REPLICAS", "WORST", "LOSS", "LAMB_UPDATES")}
    assert proc.stdout.count("2 replica(s)") == 2
    assert int(found["REPLICAS"]) == 2
    assert float(found["WORST"]) < 1e-5
    one, two = map(float, found["LOSS"].split())
    assert one == pytest.approx(two, rel=1e-5)
    lamb_worst = [float(v) for k, v in lines if k == "LAMB_WORST"]
    assert len(lamb_worst) == 2 and max(lamb_worst) < 1e-5, lamb_worst  # the weights and LAMB's moments
    assert found["LAMB_UPDATES"] == "3"


def test_data_model_mismatch_is_a_clear_error(dataset, tmp_path):
    wrong_vocab = BertConfig.from_name("tiny", 999).to_dict()
    with pytest.raises(DataError, match="vocab has 120 tokens.*vocab_size is 999"):
        pretrain(config(dataset, tmp_path / "x", bert_config=wrong_vocab), log=lambda _: None)
    short = BertConfig.from_name("tiny", 120, max_position_embeddings=16).to_dict()
    with pytest.raises(DataError, match="32 tokens exceed the model's max_position_embeddings 16"):
        pretrain(config(dataset, tmp_path / "y", bert_config=short), log=lambda _: None)


def test_tfrecord_globs_need_explicit_lengths_and_then_work(dataset, tmp_path):
    glob = os.path.join(dataset, "train", "*.tfrecord")
    with pytest.raises(DataError, match="--max-seq-length"):
        open_pretraining_data(glob)
    info = open_pretraining_data(glob, 32, 5)
    assert len(info.train_files) == 3 and info.vocab_size is None
    batch = next(iter(train_dataset(info, 4, seed=1, shuffle_buffer=10)))
    assert batch["input_ids"].shape == (4, 32) and batch["masked_lm_weights"].dtype == tf.float32
    res = pretrain(config(glob, tmp_path / "g", steps=2, max_seq_length=32, max_predictions_per_seq=5,
                          vocab_size=120), log=lambda _: None)
    assert res["eval"] is None  # no eval split given
    # wrong lengths: parsing fails with an error naming a file
    with pytest.raises(DataError, match=r"part-0000\d-of-00003.tfrecord: record 0: feature input_ids has 32"):
        pretrain(config(glob, tmp_path / "h", steps=2, max_seq_length=64, max_predictions_per_seq=5,
                        vocab_size=120), log=lambda _: None)


def test_input_order_is_seeded(dataset):
    info = open_pretraining_data(dataset)

    def first_ids(seed):
        return next(iter(train_dataset(info, 8, seed=seed, shuffle_buffer=50)))["input_ids"].numpy()

    assert np.array_equal(first_ids(1), first_ids(1))
    assert not np.array_equal(first_ids(1), first_ids(2))


def test_corrupted_record_names_the_file(dataset, tmp_path):
    import shutil

    bad = tmp_path / "bad"
    shutil.copytree(dataset, bad)
    shard = bad / "train" / "part-00001-of-00003.tfrecord"
    raw = bytearray(shard.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    shard.write_bytes(bytes(raw))
    with pytest.raises(DataError, match=r"corrupt input: .*part-00001-of-00003.tfrecord: record \d+ at byte \d+: (length|payload) CRC"):
        pretrain(config(str(bad), tmp_path / "run", steps=40, shuffle_buffer=10), log=lambda _: None)


def test_nan_loss_stops_and_keeps_the_last_good_checkpoint(dataset, tmp_path):
    with pytest.raises(TrainingError, match="loss is nan.*last good checkpoint"):
        pretrain(config(dataset, tmp_path / "nan", steps=30, learning_rate=1e30, warmup_steps=0,
                        checkpoint_every=1, keep_checkpoints=50), log=lambda _: None)
    kept = ckpt_lib.list_checkpoints(tmp_path / "nan")
    assert kept
    state = ckpt_lib.load_state(kept[-1][1])
    assert np.isfinite(state["metrics"].get("loss", 0.0)) or state["metrics"] == {}


def test_phase_two_init_from_another_run_at_longer_sequences(dataset, tmp_path):
    long_data = write_synthetic_dataset(str(tmp_path / "long"), seq_len=64, max_pred=10, vocab_size=120,
                                        train_shards=1, records_per_shard=32, eval_records=8)
    pretrain(config(dataset, tmp_path / "p1", steps=2), log=lambda _: None)
    logs: list[str] = []
    pretrain(config(long_data, tmp_path / "p2", steps=2, init_from=str(tmp_path / "p1"), eval_batches=1),
             log=logs.append)
    assert any("initialised from" in line and "p1/ckpt-00000002" in line for line in logs)
    p1 = final_weights(tmp_path / "p1")
    fresh = final_weights(tmp_path / "p2")
    assert fresh.keys() == p1.keys()
    with pytest.raises(ckpt_lib.CheckpointError, match="neither a checkpoint"):
        pretrain(config(long_data, tmp_path / "p3", steps=2, init_from=str(tmp_path / "nothing")), log=lambda _: None)


def test_cli_pretrain_then_eval(dataset, tmp_path):
    from bert_datagen.trainer.cli import main

    run = tmp_path / "cli"
    args = ["pretrain", "--data", dataset, "--out", str(run), "--steps", "2", "--batch-size", "8",
            "--warmup-steps", "1", "--checkpoint-every", "2", "--log-every", "1",
            "--eval-batches", "1", "--learning-rate", "1e-3"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    assert "step       2/2" in result.output and "eval at step 2" in result.output
    result = CliRunner().invoke(main, ["eval", "--run", str(run), "--data", dataset, "--json", "--batch-size", "8"])
    assert result.exit_code == 0, result.output
    figures = json.loads(result.output[result.output.index("{"):])
    assert figures["step"] == 2 and figures["examples"] == 16 and 0 <= figures["mlm_accuracy"] <= 1
    result = CliRunner().invoke(main, ["pretrain", "--data", str(tmp_path / "missing"), "--out", str(tmp_path / "o"),
                                       "--steps", "2"])
    assert result.exit_code != 0 and "missing: not a dataset directory with manifest.json" in result.output


def test_mixed_precision_runs_close_to_float32(dataset, tmp_path):
    ref = pretrain(config(dataset, tmp_path / "f32", steps=2), log=lambda _: None)
    reference = final_weights(tmp_path / "f32")
    for precision in ("mixed_bfloat16", "mixed_float16"):
        res = pretrain(config(dataset, tmp_path / precision, steps=2, precision=precision), log=lambda _: None)
        assert res["train"]["loss"] == pytest.approx(ref["train"]["loss"], rel=0.02), precision
        weights = final_weights(tmp_path / precision)
        assert all(w.dtype == np.float32 for w in weights.values())  # master weights stay float32
        assert ("loss_scale" in final_slots(tmp_path / precision)) == (precision == "mixed_float16")
        # Two Adam steps of lr 2e-3 move a weight by up to 4e-3; bfloat16 activations (8-bit mantissa)
        # leave differences of that order on a few weights (measured up to 6.3e-3 on 0.5% of them).
        np.testing.assert_allclose(weights["bert/pooler/dense/kernel"], reference["bert/pooler/dense/kernel"],
                                   atol=1e-2)


@pytest.mark.integration
def test_jit_compiled_step_matches_the_graph_step(dataset, tmp_path):
    # Without dropout: XLA's stateless generator yields other bits than TensorFlow's CPU kernel for
    # the same Philox key, so --jit runs draw other (equally deterministic) dropout masks.
    bert = BertConfig.from_name("tiny", 120, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0).to_dict()
    pretrain(config(dataset, tmp_path / "graph", steps=2, bert_config=bert), log=lambda _: None)
    pretrain(config(dataset, tmp_path / "xla", steps=2, jit=True, bert_config=bert), log=lambda _: None)
    a, b = final_weights(tmp_path / "graph"), final_weights(tmp_path / "xla")
    for k in a:
        np.testing.assert_allclose(b[k], a[k], atol=1e-5, err_msg=k)
