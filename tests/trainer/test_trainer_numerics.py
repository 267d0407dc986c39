"""The trainer's numerics against formulas and an independent NumPy BERT written from RECIPE.md."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

from bert_datagen.trainer.errors import TrainConfigError  # noqa: E402
from bert_datagen.trainer.model.bert import LayerNorm, build_model, gelu, tf1_variable_map  # noqa: E402
from bert_datagen.trainer.model.config import BertConfig  # noqa: E402
from bert_datagen.trainer.pretrain.objective import (  # noqa: E402
    MLM_DENOMINATOR_EPSILON,
    masked_lm_cross_entropy,
    next_sentence_cross_entropy,
)
from bert_datagen.trainer.runtime.optimizer import AdamWeightDecay  # noqa: E402
from bert_datagen.trainer.runtime.updates import learning_rate, uses_weight_decay  # noqa: E402

# ---------------------------------------------------------------- a NumPy BERT from the recipe



def masked_lm_loss(logits, label_ids, weights):
    """The original's masked-LM loss of one whole batch, from the trainer's per-slot cross-entropy."""
    weights = tf.cast(weights, tf.float32)
    numerator = tf.reduce_sum(weights * masked_lm_cross_entropy(logits, label_ids))
    return numerator / (tf.reduce_sum(weights) + MLM_DENOMINATOR_EPSILON)


def next_sentence_loss(logits, labels):
    return tf.reduce_mean(next_sentence_cross_entropy(logits, labels))


def np_gelu(x):
    return 0.5 * x * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (x + 0.044715 * x**3)))


def np_layer_norm(x, gamma, beta):
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + 1e-12) * gamma + beta


def np_softmax(x):
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def np_bert_forward(w: dict, cfg: BertConfig, ids, mask, segments, positions):
    """Float64 forward pass from the recipe, reading weights by their TF1 names."""
    w = {k: v.astype(np.float64) for k, v in w.items()}
    b, s = ids.shape
    a, d = cfg.num_attention_heads, cfg.hidden_size // cfg.num_attention_heads
    x = (w["bert/embeddings/word_embeddings"][ids] + w["bert/embeddings/token_type_embeddings"][segments]
         + w["bert/embeddings/position_embeddings"][:s][None])
    x = np_layer_norm(x, w["bert/embeddings/LayerNorm/gamma"], w["bert/embeddings/LayerNorm/beta"])
    bias = (1.0 - mask[:, None, None, :].astype(np.float64)) * -10000.0
    for i in range(cfg.num_hidden_layers):
        p = f"bert/encoder/layer_{i}/"

        def lin(t, name, p=p):
            return t @ w[p + name + "/kernel"] + w[p + name + "/bias"]

        def heads(t):
            return t.reshape(b, s, a, d).transpose(0, 2, 1, 3)

        q, k, v = heads(lin(x, "attention/self/query")), heads(lin(x, "attention/self/key")), heads(
            lin(x, "attention/self/value"))
        probs = np_softmax(q @ k.transpose(0, 1, 3, 2) / np.sqrt(d) + bias)
        ctx = (probs @ v).transpose(0, 2, 1, 3).reshape(b, s, -1)
        x = np_layer_norm(lin(ctx, "attention/output/dense") + x, w[p + "attention/output/LayerNorm/gamma"],
                          w[p + "attention/output/LayerNorm/beta"])
        ffn = lin(np_gelu(lin(x, "intermediate/dense")), "output/dense")
        x = np_layer_norm(ffn + x, w[p + "output/LayerNorm/gamma"], w[p + "output/LayerNorm/beta"])
    pooled = np.tanh(x[:, 0] @ w["bert/pooler/dense/kernel"] + w["bert/pooler/dense/bias"])
    nsp = pooled @ w["cls/seq_relationship/output_weights"].T + w["cls/seq_relationship/output_bias"]
    picked = x[np.arange(b)[:, None], positions]
    h = np_gelu(picked @ w["cls/predictions/transform/dense/kernel"] + w["cls/predictions/transform/dense/bias"])
    h = np_layer_norm(h, w["cls/predictions/transform/LayerNorm/gamma"], w["cls/predictions/transform/LayerNorm/beta"])
    mlm = h @ w["bert/embeddings/word_embeddings"].T + w["cls/predictions/output_bias"]
    return mlm, nsp


@pytest.fixture(scope="module")
def tiny():
    cfg = BertConfig.from_name("tiny", vocab_size=97)
    model = build_model(cfg, seed=7)
    rng = np.random.default_rng(0)
    # Non-trivial biases, LayerNorm parameters and heads: zeros/ones would hide wiring mistakes.
    for name, var in tf1_variable_map(model).items():
        if not name.endswith(("kernel", "embeddings", "output_weights")):
            var.assign(rng.normal(0, 0.1, var.shape).astype(np.float32) + (1.0 if name.endswith("gamma") else 0.0))
    return cfg, model


def test_gelu_is_the_tanh_formula():
    x = np.linspace(-6, 6, 1001).astype(np.float32)
    got = gelu(tf.constant(x)).numpy()
    np.testing.assert_allclose(got, np_gelu(x.astype(np.float64)), atol=1e-6)
    # and not the exact erf form Keras uses by default (they differ by up to ~5e-4)
    erf_form = 0.5 * x * (1 + np.vectorize(math.erf)(x / np.sqrt(2)))
    assert np.abs(got - erf_form).max() > 1e-4


def test_layer_norm_formula_with_epsilon_1e12():
    rng = np.random.default_rng(1)
    x = rng.normal(3, 2, (4, 7, 16)).astype(np.float32)
    layer = LayerNorm(16)
    layer.gamma.assign(rng.normal(1, 0.2, 16).astype(np.float32))
    layer.beta.assign(rng.normal(0, 0.2, 16).astype(np.float32))
    got = layer(tf.constant(x)).numpy()
    np.testing.assert_allclose(got, np_layer_norm(x.astype(np.float64), layer.gamma.numpy(), layer.beta.numpy()),
                               atol=2e-5)
    # a near-constant row: epsilon 1e-12 (not Keras's 1e-3) keeps the normalisation sharp
    flat = np.full((1, 16), 5.0, np.float32)
    flat[0, 0] += 1e-3
    out = LayerNorm(16)(tf.constant(flat)).numpy()
    assert abs(out[0, 0]) > 3.0


def test_forward_pass_matches_numpy_reference(tiny):
    cfg, model = tiny
    rng = np.random.default_rng(2)
    b, s, p = 3, 24, 5
    ids = rng.integers(0, cfg.vocab_size, (b, s))
    mask = np.ones((b, s), np.int64)
    mask[1, 15:] = 0  # padding in the batch
    mask[2, 9:] = 0
    segments = np.zeros((b, s), np.int64)
    segments[:, 6:] = 1
    positions = np.sort(rng.integers(1, 9, (b, p)), axis=1)
    out = model({"input_ids": ids, "input_mask": mask, "segment_ids": segments, "masked_lm_positions": positions})
    weights = {k: v.numpy() for k, v in tf1_variable_map(model).items()}
    mlm, nsp = np_bert_forward(weights, cfg, ids, mask, segments, positions)
    assert out["mlm_logits"].shape == (b, p, cfg.vocab_size) and out["nsp_logits"].shape == (b, 2)
    np.testing.assert_allclose(out["mlm_logits"].numpy(), mlm, atol=1e-5, rtol=0)
    np.testing.assert_allclose(out["nsp_logits"].numpy(), nsp, atol=1e-5, rtol=0)


def test_padding_does_not_leak_into_real_positions(tiny):
    cfg, model = tiny
    rng = np.random.default_rng(3)
    ids = rng.integers(0, cfg.vocab_size, (1, 16))
    mask = np.zeros((1, 16), np.int64)
    mask[0, :10] = 1
    base = {"input_ids": ids, "input_mask": mask, "segment_ids": np.zeros_like(ids),
            "masked_lm_positions": np.array([[1, 2, 3]])}
    other = dict(base, input_ids=np.where(mask == 1, ids, (ids + 13) % cfg.vocab_size))
    a, b = model(base), model(other)
    # -10000 is not -inf: leakage is ~exp(-10000), zero in float32
    np.testing.assert_allclose(a["mlm_logits"].numpy(), b["mlm_logits"].numpy(), atol=1e-6)


def test_dropout_is_a_pure_function_of_the_seed(tiny):
    cfg, model = tiny
    x = {"input_ids": np.arange(16)[None] % cfg.vocab_size, "input_mask": np.ones((1, 16), np.int64),
         "segment_ids": np.zeros((1, 16), np.int64), "masked_lm_positions": np.array([[1, 2]])}
    s1 = tf.constant([1, 2], tf.int64)
    a = model(x, training=True, dropout_seed=s1)["mlm_logits"].numpy()
    b = model(x, training=True, dropout_seed=s1)["mlm_logits"].numpy()
    c = model(x, training=True, dropout_seed=tf.constant([1, 3], tf.int64))["mlm_logits"].numpy()
    assert np.array_equal(a, b) and not np.array_equal(a, c)
    with pytest.raises(ValueError, match="dropout_seed"):
        model(x, training=True)


def test_tf1_variable_map_names_and_shapes(tiny):
    cfg, model = tiny
    m = tf1_variable_map(model)
    h, v, f = cfg.hidden_size, cfg.vocab_size, cfg.intermediate_size
    assert len(m) == len(model.weights) == 5 + 16 * cfg.num_hidden_layers + 2 + 4 + 3
    expect = {
        "bert/embeddings/word_embeddings": (v, h),
        "bert/embeddings/position_embeddings": (512, h),
        "bert/embeddings/token_type_embeddings": (2, h),
        "bert/encoder/layer_1/attention/self/query/kernel": (h, h),
        "bert/encoder/layer_0/intermediate/dense/kernel": (h, f),
        "bert/encoder/layer_0/output/dense/kernel": (f, h),
        "bert/encoder/layer_1/output/LayerNorm/gamma": (h,),
        "bert/pooler/dense/kernel": (h, h),
        "cls/predictions/output_bias": (v,),
        "cls/seq_relationship/output_weights": (2, h),
        "cls/seq_relationship/output_bias": (2,),
    }
    for name, shape in expect.items():
        assert tuple(m[name].shape) == shape, name


def test_initialisation_truncated_normal_and_zero_biases():
    cfg = BertConfig.from_name("mini", vocab_size=3000)
    m = tf1_variable_map(build_model(cfg, seed=1))
    emb = m["bert/embeddings/word_embeddings"].numpy()
    assert np.abs(emb).max() <= 0.04 + 1e-7  # cut at 2 stddev
    assert 0.016 < emb.std() < 0.019  # stddev of a N(0, 0.02) truncated at 2 sigma is 0.0176
    assert not m["bert/encoder/layer_0/attention/self/query/bias"].numpy().any()
    assert np.all(m["bert/embeddings/LayerNorm/gamma"].numpy() == 1)
    again = tf1_variable_map(build_model(cfg, seed=1))
    assert all(np.array_equal(v.numpy(), again[k].numpy()) for k, v in m.items())


def test_mlm_and_nsp_loss_on_a_crafted_batch():
    v = 4
    logits = np.zeros((1, 3, v), np.float32)
    logits[0, 0] = [2.0, 0.0, 0.0, 0.0]
    logits[0, 1] = [0.0, 1.0, 0.0, 0.0]
    logits[0, 2] = [9.0, 9.0, 9.0, 9.0]  # padding slot: weight 0 must remove it
    ids = np.array([[0, 3, 1]])
    weights = np.array([[1.0, 1.0, 0.0]], np.float32)
    ce0 = -(2.0 - np.log(np.exp(2.0) + 3))
    ce1 = -(0.0 - np.log(np.exp(1.0) + 3))
    expected = (ce0 + ce1) / (2.0 + 1e-5)
    got = float(masked_lm_loss(tf.constant(logits), tf.constant(ids), tf.constant(weights)))
    assert got == pytest.approx(expected, rel=1e-6)
    # no real predictions at all: 0 / 1e-5, not NaN
    assert float(masked_lm_loss(tf.constant(logits), tf.constant(ids), tf.zeros((1, 3)))) == 0.0
    nsp = float(next_sentence_loss(tf.constant([[1.0, 0.0], [0.0, 3.0]]), tf.constant([[0], [1]])))
    assert nsp == pytest.approx((np.log(1 + np.exp(-1.0)) + np.log(1 + np.exp(-3.0))) / 2, rel=1e-6)


@pytest.mark.parametrize(
    "step,expected",
    [(0, 0.0), (1, 1e-4 * 1 / 100), (99, 1e-4 * 99 / 100), (100, 1e-4 * (1 - 100 / 1000)),
     (999, 1e-4 * (1 - 999 / 1000)), (1000, 0.0), (1500, 0.0)],
)
def test_schedule_at_its_boundaries(step, expected):
    # float32 arithmetic, like the original's graph: 1 - 999/1000 carries a ~1e-5 relative error
    assert learning_rate(step, 1e-4, 100, 1000) == pytest.approx(expected, rel=5e-5, abs=1e-12)
    assert learning_rate(step, 1e-4, 100, 1000).dtype == np.float32


def test_schedule_jumps_at_the_crossover_and_works_without_warmup():
    # warmup ends at 0.5e-4 * ... : the warmup line reaches lr0 while the decay line is lower
    assert learning_rate(499, 1.0, 500, 1000) == pytest.approx(499 / 500)
    assert learning_rate(500, 1.0, 500, 1000) == pytest.approx(0.5)
    assert learning_rate(0, 2.0, 0, 10) == pytest.approx(2.0)
    assert learning_rate(5, 2.0, 0, 10) == pytest.approx(1.0)


def test_weight_decay_exclusions_follow_the_original_names():
    assert uses_weight_decay("bert/encoder/layer_0/attention/self/query/kernel")
    assert uses_weight_decay("bert/embeddings/word_embeddings")
    assert uses_weight_decay("cls/seq_relationship/output_weights")
    assert not uses_weight_decay("bert/encoder/layer_0/attention/output/LayerNorm/gamma")
    assert not uses_weight_decay("bert/pooler/dense/bias")
    assert not uses_weight_decay("cls/predictions/output_bias")


def np_adam_weight_decay(w, g, m, v, lr, decay, wd=0.01, b1=0.9, b2=0.999, eps=1e-6):
    m = b1 * m + (1 - b1) * g
    v = b2 * v + (1 - b2) * g * g
    update = m / (np.sqrt(v) + eps) + (wd * w if decay else 0.0)
    return w - lr * update, m, v


def test_optimizer_steps_match_numpy_recipe():
    rng = np.random.default_rng(4)
    names = ["layer/dense/kernel", "layer/dense/bias", "layer/LayerNorm/gamma"]
    init = {n: rng.normal(0, 1, (3, 4) if n.endswith("kernel") else (4,)).astype(np.float32) for n in names}
    variables = {n: tf.Variable(init[n]) for n in names}
    opt = AdamWeightDecay(variables)
    ref = {n: (init[n].astype(np.float64), 0.0, 0.0) for n in names}
    for step in range(3):
        grads = {n: rng.normal(0, 0.5, init[n].shape).astype(np.float32) for n in names}
        lr = np.float32(1e-2 * (step + 1))
        opt.apply([tf.constant(grads[n]) for n in names], tf.constant(lr))
        ref = {n: np_adam_weight_decay(*ref[n][:1], grads[n], *ref[n][1:], float(lr), decay=n.endswith("kernel"))
               for n in names}
    for n in names:
        np.testing.assert_allclose(variables[n].numpy(), ref[n][0], atol=1e-6, rtol=1e-6)
        np.testing.assert_allclose(opt.slot_arrays()[n + "/adam_v"], ref[n][2], rtol=1e-5)
    # no bias correction: after one step from zero slots, a Keras-style corrected Adam would move
    # each weight by ~lr; the original moves it by lr * (1-b1)/sqrt(1-b2) ~ 3.16 lr
    w = {"x/kernel": tf.Variable(np.zeros(1, np.float32))}
    AdamWeightDecay(w).apply([tf.constant([1.0])], tf.constant(np.float32(0.1)))
    assert float(w["x/kernel"].numpy()[0]) == pytest.approx(-0.1 * 0.1 / (np.sqrt(0.001) + 1e-6), rel=1e-5)


def test_skipped_update_leaves_everything_unchanged():
    v = {"a/kernel": tf.Variable(np.ones(3, np.float32))}
    opt = AdamWeightDecay(v)
    opt.apply([tf.constant([np.nan, 1.0, 1.0])], tf.constant(np.float32(0.1)), ok=tf.constant(False))
    assert np.array_equal(v["a/kernel"].numpy(), np.ones(3)) and not opt.slot_arrays()["a/kernel/adam_m"].any()


def test_bert_config_original_json_round_trip(tmp_path):
    original = {"attention_probs_dropout_prob": 0.1, "hidden_act": "gelu", "hidden_dropout_prob": 0.1,
                "hidden_size": 768, "initializer_range": 0.02, "intermediate_size": 3072,
                "max_position_embeddings": 512, "num_attention_heads": 12, "num_hidden_layers": 12,
                "type_vocab_size": 2, "vocab_size": 30522}
    path = tmp_path / "bert_config.json"
    path.write_text(json.dumps(original))
    cfg = BertConfig.from_json_file(path)
    assert cfg == BertConfig.from_name("base", 30522)
    assert json.loads(cfg.to_json()) == original
    assert BertConfig.from_name("large", 30522).num_hidden_layers == 24
    with pytest.raises(TrainConfigError, match="multiple"):
        BertConfig(vocab_size=10, hidden_size=100, num_attention_heads=3)
    with pytest.raises(TrainConfigError, match="unknown model size"):
        BertConfig.from_name("huge", 10)
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(TrainConfigError, match="bad.json"):
        BertConfig.from_json_file(tmp_path / "bad.json")
