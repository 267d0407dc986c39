"""`--optimizer lamb`: the update against a NumPy transcription of NVIDIA's/MLPerf's LAMB, step by
step; exclusions, zero norms, skipped steps, checkpointed count; a tiny run resumes bitwise. LAMB on two
mirrored replicas against one device: `test_trainer_runs.py::test_mirrored_over_two_cpus_equals_one_device`."""

from __future__ import annotations

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

from click.testing import CliRunner  # noqa: E402

from bert_datagen.trainer.cli import main as train_cli  # noqa: E402
from bert_datagen.trainer.errors import TrainConfigError  # noqa: E402
from bert_datagen.trainer.pretrain.config import TrainConfig  # noqa: E402
from bert_datagen.trainer.pretrain.train import pretrain  # noqa: E402
from bert_datagen.trainer.runtime import checkpoint as ckpt_lib  # noqa: E402
from bert_datagen.trainer.runtime.optimizer import LAMB_UPDATES_KEY, AdamWeightDecay, Lamb, make_optimizer  # noqa: E402
from tests.support.synthetic import write_synthetic_dataset  # noqa: E402

NAMES = ["layer_0/dense/kernel", "layer_0/dense/bias", "layer_0/LayerNorm/gamma", "embeddings/word_embeddings"]


def np_lamb(w, g, m, v, t, lr, excluded, wd=0.01, b1=0.9, b2=0.999, eps=1e-6):
    """One LAMB update in float64, transcribed from the definition (not from our code)."""
    m = b1 * m + (1 - b1) * g
    v = b2 * v + (1 - b2) * g * g
    m_hat, v_hat = m / (1 - b1**t), v / (1 - b2**t)
    u = m_hat / (np.sqrt(v_hat) + eps)
    ratio = 1.0
    if not excluded:
        u = u + wd * w
        w_norm, u_norm = np.linalg.norm(w), np.linalg.norm(u)
        ratio = w_norm / u_norm if w_norm > 0 and u_norm > 0 else 1.0
    return w - lr * ratio * u, m, v


def shape_of(name: str) -> tuple[int, ...]:
    return (5, 3) if name.endswith(("kernel", "embeddings")) else (3,)


def test_lamb_matches_the_numpy_transcription_over_several_steps():
    rng = np.random.default_rng(11)
    init = {n: rng.normal(0, 1, shape_of(n)).astype(np.float32) for n in NAMES}
    variables = {n: tf.Variable(init[n]) for n in NAMES}
    opt = Lamb(variables)
    assert opt.adapt == [True, False, False, True] and opt.decay == opt.adapt
    for step in range(6):
        # each step from the optimizer's own state, so float32 rounding cannot pile up over steps
        slots = opt.slot_arrays()
        state = {n: (variables[n].numpy().astype(np.float64), slots[n + "/adam_m"].astype(np.float64),
                     slots[n + "/adam_v"].astype(np.float64)) for n in NAMES}
        grads = {n: rng.normal(0, 0.5 + step, init[n].shape).astype(np.float32) for n in NAMES}
        lr = np.float32(1e-2 * (step + 1))
        opt.apply([tf.constant(grads[n]) for n in NAMES], tf.constant(lr))
        slots = opt.slot_arrays()
        for n in NAMES:
            w, m, v = np_lamb(*state[n][:1], grads[n].astype(np.float64), *state[n][1:], step + 1, float(lr),
                              excluded=any(k in n for k in ("bias", "LayerNorm")))
            np.testing.assert_allclose(variables[n].numpy(), w, atol=1e-6, rtol=0, err_msg=f"{n} step {step}")
            np.testing.assert_allclose(slots[n + "/adam_m"], m, atol=1e-6, rtol=0)
            np.testing.assert_allclose(slots[n + "/adam_v"], v, atol=1e-6, rtol=1e-6)
    assert int(opt.slot_arrays()[LAMB_UPDATES_KEY]) == 6


def test_lamb_differs_from_adamw_and_a_layer_moves_by_lr_times_its_norm():
    rng = np.random.default_rng(2)
    w0 = rng.normal(0, 1, (4, 4)).astype(np.float32)
    g = rng.normal(0, 1, (4, 4)).astype(np.float32)
    lamb_vars, adam_vars = {"k/kernel": tf.Variable(w0)}, {"k/kernel": tf.Variable(w0)}
    Lamb(lamb_vars).apply([tf.constant(g)], tf.constant(np.float32(0.1)))
    AdamWeightDecay(adam_vars).apply([tf.constant(g)], tf.constant(np.float32(0.1)))
    step = lamb_vars["k/kernel"].numpy() - w0
    # the trust ratio makes each layer's step lr * ||w||, whatever the gradient's scale
    assert np.linalg.norm(step) == pytest.approx(0.1 * np.linalg.norm(w0), rel=1e-5)
    assert not np.allclose(step, adam_vars["k/kernel"].numpy() - w0)


def test_zero_weights_use_ratio_one_and_a_skipped_step_changes_nothing():
    variables = {"z/kernel": tf.Variable(np.zeros(3, np.float32))}
    opt = Lamb(variables)
    opt.apply([tf.constant([1.0, -2.0, 0.5])], tf.constant(np.float32(0.1)))
    # bias-corrected first step: m_hat = g, v_hat = g^2, so u = g / (|g| + eps); ratio 1 for w = 0
    np.testing.assert_allclose(variables["z/kernel"].numpy(), -0.1 * np.sign([1.0, -2.0, 0.5]), rtol=1e-5)
    before = {k: v.copy() for k, v in opt.slot_arrays().items()}
    w_before = variables["z/kernel"].numpy().copy()
    opt.apply([tf.constant([np.nan, 1.0, 1.0])], tf.constant(np.float32(0.1)), ok=tf.constant(False))
    assert np.array_equal(variables["z/kernel"].numpy(), w_before)
    for k, v in opt.slot_arrays().items():
        assert np.array_equal(v, before[k]), k
    assert int(opt.slot_arrays()[LAMB_UPDATES_KEY]) == 1  # the skipped step does not count


def test_slot_arrays_round_trip_and_refuse_adamw_slots():
    variables = {"a/kernel": tf.Variable(np.ones(2, np.float32))}
    opt = Lamb(variables)
    opt.apply([tf.constant([0.5, 0.25])], tf.constant(np.float32(0.1)))
    arrays = opt.slot_arrays()
    other = Lamb({"a/kernel": tf.Variable(np.ones(2, np.float32))})
    other.load_slot_arrays(arrays)
    assert int(other.updates.numpy()) == 1
    with pytest.raises(ValueError, match=LAMB_UPDATES_KEY):
        other.load_slot_arrays({k: v for k, v in arrays.items() if k != LAMB_UPDATES_KEY}, "x.npz")


def test_optimizer_option_is_validated():
    assert isinstance(make_optimizer("adamw", {"a/kernel": tf.Variable([1.0])}), AdamWeightDecay)
    with pytest.raises(TrainConfigError, match="optimizer 'sgd'"):
        TrainConfig(data="d", out="o", optimizer="sgd")
    result = CliRunner().invoke(train_cli, ["pretrain", "--data", "d", "--out", "o", "--steps", "1",
                                            "--optimizer", "sgd"])
    assert result.exit_code == 2 and "--optimizer" in result.output


def test_a_lamb_run_resumes_bitwise(tmp_path):
    data = write_synthetic_dataset(str(tmp_path / "ds"), seq_len=16, max_pred=3, vocab_size=60,
                                   train_shards=2, records_per_shard=16, eval_records=8)

    def cfg(out: str) -> TrainConfig:
        return TrainConfig(data=data, out=str(tmp_path / out), batch_size=4, steps=4, learning_rate=1e-2,
                           warmup_steps=1, seed=5, checkpoint_every=2, log_every=2, eval_batches=1,
                           shuffle_buffer=16, optimizer="lamb")

    pretrain(cfg("a"), log=lambda _: None)
    pretrain(cfg("b"), log=lambda _: None, stop_at=2)
    pretrain(cfg("b"), log=lambda _: None)
    for file in (ckpt_lib.MODEL_FILE, ckpt_lib.OPTIMIZER_FILE):
        a = ckpt_lib.load_arrays(ckpt_lib.resolve_checkpoint(tmp_path / "a"), file)
        b = ckpt_lib.load_arrays(ckpt_lib.resolve_checkpoint(tmp_path / "b"), file)
        assert a.keys() == b.keys()
        assert all(a[k].tobytes() == b[k].tobytes() for k in a), file
    assert int(a[LAMB_UPDATES_KEY]) == 4
