"""BERT: the encoder (`BertEncoder`) and the pre-training model on it (`BertPretrainer`: + MLM and
NSP heads), Keras 3 (`keras.ops`: the same code on TensorFlow and JAX), numerics of the original.

Everything RECIPE.md section 6 fixes is written out here rather than taken from Keras defaults,
because the defaults differ: GELU is the tanh approximation (`hidden_act="gelu_new"`, the default;
`"gelu"` selects the exact erf form of Hugging Face models), LayerNorm uses epsilon 1e-12, weights
start truncated-normal (stddev `initializer_range`, cut at 2 stddev), biases at zero, layers are
post-LayerNorm, padding gets an additive -10000 in the attention scores.

Forward pass::

    out = model(
        {"input_ids": [B,S] int, "input_mask": [B,S] 0/1, "segment_ids": [B,S] int,
         "masked_lm_positions": [B,P] int},          # optional; without it no mlm_logits
        training=False,                              # True applies dropout
        dropout_seed=None,                           # dropout_key(...) [3] (or a [2] seed); required when training
    )
    out["mlm_logits"]      # [B,P,V] float32
    out["nsp_logits"]      # [B,2]   float32 (index 0 = IsNext, 1 = NotNext)
    out["sequence_output"] # [B,S,H] final hidden states
    out["pooled_output"]   # [B,H]   tanh pooler on position 0

`BertEncoder` takes the same arguments and returns only the last two.

Packed rows (several sequences in one row, see docs/training.md) add `sequence_ids` [B,S] (1..n
per sequence, 0 on padding), `position_ids` [B,S] (restarting at 0 per sequence) and
`cls_positions` [B,N] (the row position of each sequence's [CLS]). Then attention is
block-diagonal (a token attends only to tokens of its own sequence), positions come from
`position_ids`, and the pooler reads each sequence's [CLS]: `pooled_output` is [B,N,H] and
`nsp_logits` [B,N,2]. Each sequence therefore computes what it would alone. Without these inputs
the original computation runs unchanged.

Dropout is stateless: every row's mask is a pure function of the step's key, the dropout site
and the row's position in the global batch (`model/dropout.py`, bits of our own, equal on both
backends), so a run that restarts from a checkpoint
draws exactly the masks the uninterrupted run would have, no random state needs saving, and the
masks do not depend on how the global batch is cut over replicas, workers or micro-batches. The
trainer derives the seed pair from (run seed, step) and the position from the replica's and the
micro-batch's place in the global batch (`trainer/runtime/step.py`).

All kernels are plain `[in, out]` matrices and every weight has an original TF1 name
(`tf1_variable_map`), so checkpoints convert without reshaping.
"""

from __future__ import annotations

import math

import keras
import numpy as np
from keras import ops

from bert_datagen.datagen.rng import Stream
from bert_datagen.trainer.model.config import BertConfig
from bert_datagen.trainer.model.dropout import dropout

LAYER_NORM_EPSILON = 1e-12
ATTENTION_MASK_VALUE = -10000.0


def gelu(x):
    """The tanh approximation of GELU used by the original BERT (`hidden_act="gelu_new"`)."""
    cdf = 0.5 * (1.0 + ops.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * ops.power(x, 3))))
    return x * cdf


def gelu_exact(x):
    """The exact GELU, x * Phi(x) with erf (`hidden_act="gelu"`, Hugging Face's default)."""
    return 0.5 * x * (1.0 + ops.erf(x * (1.0 / math.sqrt(2.0))))


ACTIVATIONS = {"gelu": gelu, "gelu_new": gelu, "gelu_exact": gelu_exact}


class SeededTruncatedNormal(keras.initializers.Initializer):
    """Normal(0, stddev) cut at 2 stddev (the original's initializer), drawn in NumPy from the
    project's counter-based stream of (seed, weight name): Keras's own initializers draw from each
    backend's generator, so the same seed would start TensorFlow and JAX runs from other weights.
    One stream per weight name, so the weights do not depend on the order layers are built in."""

    def __init__(self, stddev: float, seed: int, name: str):
        self.stddev, self.seed, self.name = stddev, seed, name

    def __call__(self, shape, dtype=None):
        values = truncated_normal_array(self.seed, self.name, tuple(shape), self.stddev)
        return ops.cast(values, dtype or "float32")

    def get_config(self) -> dict:
        return {"stddev": self.stddev, "seed": self.seed, "name": self.name}


def truncated_normal_array(seed: int, name: str, shape: tuple[int, ...], stddev: float) -> np.ndarray:
    """float32 draws of N(0, stddev) kept within 2 stddev, in draw order (Box-Muller on the stream's
    uniforms; a draw outside the cut is skipped, as TensorFlow's truncated normal resamples)."""
    stream = Stream.for_purpose(seed, "bert-init", name)
    count = int(np.prod(shape, dtype=np.int64))
    kept: list[np.ndarray] = []
    have = 0
    while have < count:
        pairs = (count - have) + (count - have) // 16 + 16  # 95.4% fall inside the cut
        u1, u2 = stream.uniform_array(pairs), stream.uniform_array(pairs)
        z = np.sqrt(-2.0 * np.log1p(-u1)) * np.cos(2.0 * np.pi * u2)
        z = z[np.abs(z) < 2.0]
        kept.append(z)
        have += z.size
    return (np.concatenate(kept)[:count] * stddev).astype(np.float32).reshape(shape)


def truncated_normal(config: BertConfig, seed: int, name: str) -> keras.initializers.Initializer:
    return SeededTruncatedNormal(config.initializer_range, seed, name)


class LayerNorm(keras.layers.Layer):
    """LayerNorm over the last axis with epsilon 1e-12, computed in float32."""

    def __init__(self, hidden_size: int, **kwargs):
        super().__init__(**kwargs)
        self.gamma = self.add_weight(name="gamma", shape=(hidden_size,), initializer="ones")
        self.beta = self.add_weight(name="beta", shape=(hidden_size,), initializer="zeros")
        self.built = True

    def call(self, x):
        dtype = x.dtype
        x = ops.cast(x, "float32")
        mean, variance = ops.moments(x, axes=[-1], keepdims=True)
        y = (x - mean) * ops.rsqrt(variance + LAYER_NORM_EPSILON)
        y = y * ops.cast(self.gamma, "float32") + ops.cast(self.beta, "float32")
        return ops.cast(y, dtype)


def dense(config: BertConfig, seed: int, key: str, units: int, in_dim: int,
          dtype: str | None = None) -> keras.layers.Dense:
    """A plain `[in, out]` Dense; `key` (its TF1 name) seeds its initial kernel."""
    layer = keras.layers.Dense(
        units, kernel_initializer=truncated_normal(config, seed, key), bias_initializer="zeros",
        name=key.replace("/", "_"), dtype=dtype,
    )
    layer.build((None, in_dim))
    return layer


class Embeddings(keras.layers.Layer):
    """word + token type + position embeddings, summed, LayerNorm, dropout."""

    def __init__(self, config: BertConfig, seed: int, **kwargs):
        super().__init__(**kwargs)
        c, h = config, config.hidden_size
        self.config = c
        self.word_embeddings = self.add_weight(
            name="word_embeddings", shape=(c.vocab_size, h),
            initializer=truncated_normal(c, seed, "bert/embeddings/word_embeddings"))
        self.token_type_embeddings = self.add_weight(
            name="token_type_embeddings", shape=(c.type_vocab_size, h),
            initializer=truncated_normal(c, seed, "bert/embeddings/token_type_embeddings"))
        self.position_embeddings = self.add_weight(
            name="position_embeddings", shape=(c.max_position_embeddings, h),
            initializer=truncated_normal(c, seed, "bert/embeddings/position_embeddings"))
        self.layer_norm = LayerNorm(h, name="LayerNorm", dtype=self.dtype_policy)
        self.built = True

    def call(self, input_ids, segment_ids, dropout_seed=None, position_ids=None):
        seq_len = ops.shape(input_ids)[1]
        # Same summation order as the original: word, then token type, then position.
        x = ops.take(self.word_embeddings, input_ids, axis=0)
        x = x + ops.take(self.token_type_embeddings, segment_ids, axis=0)
        if position_ids is None:
            x = x + self.position_embeddings[None, :seq_len, :]
        else:
            x = x + ops.take(self.position_embeddings, position_ids, axis=0)
        x = ops.cast(x, self.compute_dtype)
        x = self.layer_norm(x)
        return dropout(x, self.config.hidden_dropout_prob, dropout_seed, site=0)


class EncoderLayer(keras.layers.Layer):
    """Post-LayerNorm transformer layer: self-attention block, then the GELU feed-forward block."""

    def __init__(self, config: BertConfig, seed: int, index: int, **kwargs):
        super().__init__(**kwargs)
        c, h = config, config.hidden_size
        self.config = c
        self.index = index
        self.activation = ACTIVATIONS[c.hidden_act]
        p = f"bert/encoder/layer_{index}/"
        policy = self.dtype_policy
        self.query = dense(c, seed, p + "attention/self/query", h, h, policy)
        self.key = dense(c, seed, p + "attention/self/key", h, h, policy)
        self.value = dense(c, seed, p + "attention/self/value", h, h, policy)
        self.attention_output = dense(c, seed, p + "attention/output/dense", h, h, policy)
        self.attention_norm = LayerNorm(h, name="attention_LayerNorm", dtype=policy)
        self.intermediate = dense(c, seed, p + "intermediate/dense", c.intermediate_size, h, policy)
        self.output_dense = dense(c, seed, p + "output/dense", h, c.intermediate_size, policy)
        self.output_norm = LayerNorm(h, name="output_LayerNorm", dtype=policy)
        self.built = True

    def call(self, x, attention_bias, dropout_seed=None):
        c = self.config
        site = 1 + 3 * self.index
        batch = ops.shape(x)[0]
        heads, size = c.num_attention_heads, c.head_size

        def split_heads(t):  # [B,S,H] -> [B,S,A,d]
            return ops.reshape(t, (batch, -1, heads, size))

        q, k, v = split_heads(self.query(x)), split_heads(self.key(x)), split_heads(self.value(x))
        bias = ops.cast(attention_bias, q.dtype)
        # float16 keeps the spelled-out steps: JAX's fused attention accumulates float16 products in
        # float32, a dot XLA's CPU backend refuses under jit.
        fused = (dropout_seed is None or c.attention_probs_dropout_prob == 0) and q.dtype != "float16"
        if fused:
            # Nothing between the softmax and the product with the values: the backend's fused
            # attention (a flash kernel on GPUs), with the original's additive -10000 as its bias.
            context = ops.dot_product_attention(q, k, v, bias=bias, scale=1.0 / math.sqrt(size))
        else:  # dropout on the attention probabilities, as the original: the steps spelled out
            q, k, v = (ops.transpose(t, (0, 2, 1, 3)) for t in (q, k, v))  # [B,A,S,d]
            scores = ops.matmul(q, ops.transpose(k, (0, 1, 3, 2))) * (1.0 / math.sqrt(size)) + bias
            probs = dropout(ops.softmax(scores, axis=-1), c.attention_probs_dropout_prob, dropout_seed, site)
            context = ops.transpose(ops.matmul(probs, v), (0, 2, 1, 3))
        context = ops.reshape(context, (batch, -1, c.hidden_size))

        attended = dropout(self.attention_output(context), c.hidden_dropout_prob, dropout_seed, site + 1)
        x = self.attention_norm(attended + x)
        ffn = self.output_dense(self.activation(self.intermediate(x)))
        ffn = dropout(ffn, c.hidden_dropout_prob, dropout_seed, site + 2)
        return self.output_norm(ffn + x)


class BertEncoder(keras.Model):
    """The backbone: embeddings, the transformer layers and the pooler. Outputs `sequence_output`
    and `pooled_output`; the pre-training heads (`BertPretrainer`) and the fine-tuning task heads
    (`bert_datagen.trainer.model.heads`) sit on it."""

    def __init__(self, config: BertConfig, seed: int = 12345, dtype: str | None = None, **kwargs) -> None:
        super().__init__(name=kwargs.pop("name", "bert"), dtype=dtype, **kwargs)
        c, h = config, config.hidden_size
        self.config = c
        self.seed = seed
        policy = self.dtype_policy
        self.embeddings = Embeddings(c, seed, name="embeddings", dtype=policy)
        self.encoder_layers = [EncoderLayer(c, seed, i, name=f"layer_{i}", dtype=policy)
                               for i in range(c.num_hidden_layers)]
        self.pooler = dense(c, seed, "bert/pooler/dense", h, h, policy)
        self.built = True

    def call(self, inputs: dict, training: bool = False, dropout_seed=None) -> dict:
        if training and dropout_seed is None and (
            self.config.hidden_dropout_prob > 0 or self.config.attention_probs_dropout_prob > 0
        ):
            raise ValueError("training=True needs a dropout_seed (dropout_key: [3] int tensor, or a [2] seed)")
        seed = dropout_seed if training else None
        input_ids = ops.cast(inputs["input_ids"], "int32")
        segment_ids = ops.cast(inputs["segment_ids"], "int32")
        packed = "sequence_ids" in inputs  # a row of several sequences (`bert-datagen run --packing`)
        position_ids = ops.cast(inputs["position_ids"], "int32") if packed else None

        x = self.embeddings(input_ids, segment_ids, dropout_seed=seed, position_ids=position_ids)
        attention_bias = _attention_bias(inputs)
        for layer in self.encoder_layers:
            x = layer(x, attention_bias, dropout_seed=seed)
        # Packed: each sequence's [CLS] -> [B,N,H]; else the row's first position -> [B,H].
        first = gather_rows(x, inputs["cls_positions"]) if packed else x[:, 0, :]
        pooled = ops.tanh(self.pooler(first))
        return {"sequence_output": x, "pooled_output": pooled}


def gather_rows(x, positions):
    """x [B,S,...] at `positions` [B,P] of each row: [B,P,...]."""
    index = ops.cast(positions, "int32")
    index = ops.reshape(index, (*ops.shape(index), *([1] * (len(x.shape) - 2))))
    return ops.take_along_axis(x, index, axis=1)


def _attention_bias(inputs: dict):
    """0 where a query may attend to a key, -10000 elsewhere: [B,1,1,S] masking padding, or for
    packed rows [B,1,S,S], where a query attends to the keys of its own sequence only (the same
    -10000, so a sequence's scores equal its scores alone: exp underflows to 0 either way)."""
    if "sequence_ids" not in inputs:
        mask = ops.cast(inputs["input_mask"], "float32")
        return (1.0 - mask[:, None, None, :]) * ATTENTION_MASK_VALUE
    sequence_ids = ops.cast(inputs["sequence_ids"], "int32")
    same = ops.logical_and(ops.equal(sequence_ids[:, :, None], sequence_ids[:, None, :]),
                           ops.not_equal(sequence_ids[:, None, :], 0))
    return (1.0 - ops.cast(same, "float32")[:, None, :, :]) * ATTENTION_MASK_VALUE


class BertPretrainer(keras.Model):
    """The encoder (`BertEncoder`) with the masked-LM head and the next-sentence head."""

    def __init__(self, config: BertConfig, seed: int = 12345, dtype: str | None = None, **kwargs) -> None:
        super().__init__(name=kwargs.pop("name", "bert"), dtype=dtype, **kwargs)
        c, h = config, config.hidden_size
        self.config = c
        self.seed = seed
        policy = self.dtype_policy
        # Created first, as when the encoder's layers were this model's own: weights are seeded by
        # name either way, but `weights` keeps its order (encoder, then heads).
        self.encoder = BertEncoder(c, seed, dtype=policy, name="bert_encoder")
        self.mlm_transform = dense(c, seed, "cls/predictions/transform/dense", h, h, policy)
        self.mlm_norm = LayerNorm(h, name="cls_predictions_LayerNorm", dtype=policy)
        self.mlm_output_bias = self.add_weight(name="mlm_output_bias", shape=(c.vocab_size,),
                                               initializer="zeros")
        self.nsp_output_weights = self.add_weight(
            name="nsp_output_weights", shape=(2, h),
            initializer=truncated_normal(c, seed, "cls/seq_relationship/output_weights"))
        self.nsp_output_bias = self.add_weight(name="nsp_output_bias", shape=(2,), initializer="zeros")
        self.built = True

    def call(self, inputs: dict, training: bool = False, dropout_seed=None) -> dict:
        out = dict(self.encoder(inputs, training=training, dropout_seed=dropout_seed))
        # Logits leave the model in float32 whatever the compute dtype (losses need the range).
        # Packed rows pool [B,N,H]: the [2,H] head applies per sequence ([B,N,2]).
        out["nsp_logits"] = ops.cast(
            ops.matmul(out["pooled_output"], ops.transpose(self.nsp_output_weights)) + self.nsp_output_bias,
            "float32",
        )
        if "masked_lm_positions" in inputs:
            out["mlm_logits"] = self.masked_lm_logits(out["sequence_output"], inputs["masked_lm_positions"])
        return out

    def masked_lm_logits(self, sequence_output, positions):
        picked = gather_rows(sequence_output, positions)  # [B,P,H]
        h = self.mlm_norm(ACTIVATIONS[self.config.hidden_act](self.mlm_transform(picked)))
        # Tied output matrix: the word embeddings, transposed. Flattened to 2-D first: a [B,P,H] x
        # [V,H] matmul would broadcast the matrix over B and build a [B,V,H] gradient.
        flat = ops.reshape(h, (-1, self.config.hidden_size))
        embeddings = ops.cast(self.encoder.embeddings.word_embeddings, flat.dtype)
        logits = ops.matmul(flat, ops.transpose(embeddings)) + ops.cast(self.mlm_output_bias, flat.dtype)
        logits = ops.reshape(logits, (ops.shape(positions)[0], -1, self.config.vocab_size))
        return ops.cast(logits, "float32")


def build_model(config: BertConfig, seed: int = 12345, dtype: str | None = None) -> BertPretrainer:
    """A fully built pre-training model (all weights created and initialised from `seed`)."""
    return BertPretrainer(config, seed=seed, dtype=dtype)


def tf1_variable_map(model: BertPretrainer | BertEncoder) -> dict[str, keras.Variable]:
    """Every weight of `model` (the pre-trainer, or an encoder alone) under its original TF1
    checkpoint name, in original shapes.

    Kernels are `[in, out]`, `cls/seq_relationship/output_weights` is `[2, H]`: exactly the shapes
    of Google's checkpoints. Raises if a weight of the model is missing from the map.
    """
    encoder = model if isinstance(model, BertEncoder) else model.encoder
    m: dict[str, keras.Variable] = {}
    e = encoder.embeddings
    m["bert/embeddings/word_embeddings"] = e.word_embeddings
    m["bert/embeddings/token_type_embeddings"] = e.token_type_embeddings
    m["bert/embeddings/position_embeddings"] = e.position_embeddings
    _put_norm(m, "bert/embeddings/LayerNorm", e.layer_norm)
    for i, layer in enumerate(encoder.encoder_layers):
        p = f"bert/encoder/layer_{i}/"
        _put_dense(m, p + "attention/self/query", layer.query)
        _put_dense(m, p + "attention/self/key", layer.key)
        _put_dense(m, p + "attention/self/value", layer.value)
        _put_dense(m, p + "attention/output/dense", layer.attention_output)
        _put_norm(m, p + "attention/output/LayerNorm", layer.attention_norm)
        _put_dense(m, p + "intermediate/dense", layer.intermediate)
        _put_dense(m, p + "output/dense", layer.output_dense)
        _put_norm(m, p + "output/LayerNorm", layer.output_norm)
    _put_dense(m, "bert/pooler/dense", encoder.pooler)
    if isinstance(model, BertPretrainer):
        _put_dense(m, "cls/predictions/transform/dense", model.mlm_transform)
        _put_norm(m, "cls/predictions/transform/LayerNorm", model.mlm_norm)
        m["cls/predictions/output_bias"] = model.mlm_output_bias
        m["cls/seq_relationship/output_weights"] = model.nsp_output_weights
        m["cls/seq_relationship/output_bias"] = model.nsp_output_bias

    mapped = {id(v) for v in m.values()}
    missing = [v.path for v in model.weights if id(v) not in mapped]
    if missing or len(mapped) != len(model.weights):
        raise RuntimeError(f"tf1_variable_map does not cover the model: unmapped {missing}")
    return m


def _put_dense(m: dict, prefix: str, layer: keras.layers.Dense) -> None:
    m[prefix + "/kernel"] = layer.kernel
    m[prefix + "/bias"] = layer.bias


def _put_norm(m: dict, prefix: str, layer: LayerNorm) -> None:
    m[prefix + "/gamma"] = layer.gamma
    m[prefix + "/beta"] = layer.beta
