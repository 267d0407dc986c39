"""Fine-tuning task heads on the BERT encoder, and their losses (RECIPE.md section 10).

The encoder is `bert_datagen.trainer.model.bert.BertPretrainer` without its pre-training heads (the backbone); one
`TaskHead` sits beside it (the task), as keras-hub splits backbone and task:

- classification: pooled output -> dropout 0.1 -> dense to num_labels; mean cross-entropy;
- regression: pooled output -> dropout 0.1 -> dense to 1; mean squared error;
- span: sequence output -> dense to 2 (start, end logits); mean of the start and end
  cross-entropies over the window's positions;
- tagging: sequence output -> dropout 0.1 -> dense to num_labels per position; cross-entropy
  averaged over the positions whose label is not -1 (the other positions add nothing, not even to
  the denominator).

Head weights use the original fine-tuning checkpoint names and layouts (`output_weights`
[num_outputs, H], `output_bias`; `cls/squad/...` for span), truncated-normal(0.02) seeded by name
through datagen/rng.py like every encoder weight, bias 0.

Losses are computed as SUMS plus the count they are divided by (`task_sums`), so a batch split over
replicas or accumulation micro-batches adds up to exactly the loss of the whole batch.
"""

from __future__ import annotations

import keras
import tensorflow as tf

from bert_datagen.trainer.model.bert import BertPretrainer, dropout, tf1_variable_map, truncated_normal
from bert_datagen.trainer.run.config import BertConfig

TASK_TYPES = ("classification", "regression", "span", "tagging")
HEAD_DROPOUT = 0.1  # the original's keep_prob 0.9, whatever the encoder's dropout
HEAD_DROPOUT_SITE = 1_000_003  # a dropout site no encoder layer uses
IGNORE_LABEL = -1


def head_names(task_type: str) -> tuple[str, str]:
    """TF1 names of the head's (weights, bias)."""
    if task_type == "span":
        return "cls/squad/output_weights", "cls/squad/output_bias"
    return "output_weights", "output_bias"


def num_outputs(task_type: str, num_labels: int) -> int:
    if task_type == "regression":
        return 1
    if task_type == "span":
        return 2
    if num_labels < 2:
        raise ValueError(f"a {task_type} task needs at least 2 labels, got {num_labels}")
    return num_labels


class TaskHead(keras.layers.Layer):
    """One dense layer in the original layout: logits = x @ output_weights^T + output_bias."""

    def __init__(self, config: BertConfig, seed: int, task_type: str, num_labels: int, **kwargs):
        super().__init__(**kwargs)
        if task_type not in TASK_TYPES:
            raise ValueError(f"unknown task type {task_type!r}; choose one of {', '.join(TASK_TYPES)}")
        self.task_type = task_type
        self.num_labels = num_labels
        weights_name, bias_name = head_names(task_type)
        outputs = num_outputs(task_type, num_labels)
        self.output_weights = self.add_weight(
            name="output_weights", shape=(outputs, config.hidden_size),
            initializer=truncated_normal(config, seed, weights_name))
        self.output_bias = self.add_weight(name="output_bias", shape=(outputs,), initializer="zeros")
        self.built = True

    def call(self, x: tf.Tensor) -> tf.Tensor:
        w = tf.cast(self.output_weights, x.dtype)
        logits = tf.matmul(x, w, transpose_b=True) if x.shape.rank == 2 else tf.einsum("bsh,oh->bso", x, w)
        return tf.cast(logits + tf.cast(self.output_bias, x.dtype), tf.float32)


class FineTuneModel(keras.Model):
    """Encoder (no pre-training heads) + task head. Outputs (float32):

    classification {"logits": [B,K]}; regression {"logits": [B]}; span {"start_logits": [B,S],
    "end_logits": [B,S]}; tagging {"logits": [B,S,K]}.
    """

    def __init__(self, config: BertConfig, task_type: str, num_labels: int, seed: int = 12345, dtype=None,
                 **kwargs):
        super().__init__(name=kwargs.pop("name", "bert_finetune"), dtype=dtype, **kwargs)
        self.config = config
        self.task_type = task_type
        self.num_labels = num_labels
        self.encoder = BertPretrainer(config, seed=seed, dtype=self.dtype_policy, pretraining_heads=False,
                                      name="bert")
        self.head = TaskHead(config, seed, task_type, num_labels, name="head", dtype=self.dtype_policy)
        self.built = True

    def call(self, inputs, training=False, dropout_seed=None):
        seed = tf.convert_to_tensor(dropout_seed) if training and dropout_seed is not None else None
        if training and seed is None:
            raise ValueError("training=True needs a dropout_seed ([2] int tensor)")
        encoded = self.encoder(inputs, training=training, dropout_seed=seed)
        if self.task_type in ("classification", "regression"):
            pooled = dropout(encoded["pooled_output"], HEAD_DROPOUT, seed, HEAD_DROPOUT_SITE)
            logits = self.head(pooled)
            return {"logits": logits[:, 0] if self.task_type == "regression" else logits}
        if self.task_type == "span":
            logits = self.head(encoded["sequence_output"])
            return {"start_logits": logits[:, :, 0], "end_logits": logits[:, :, 1]}
        sequence = dropout(encoded["sequence_output"], HEAD_DROPOUT, seed, HEAD_DROPOUT_SITE)
        return {"logits": self.head(sequence)}


def build_finetune_model(config: BertConfig, task_type: str, num_labels: int, seed: int = 12345,
                         dtype: str | None = None) -> FineTuneModel:
    return FineTuneModel(config, task_type, num_labels, seed=seed, dtype=dtype)


def finetune_variable_map(model: FineTuneModel) -> dict[str, keras.Variable]:
    """Every weight under its TF1 name: the encoder's `bert/...` names plus the head's."""
    names = dict(tf1_variable_map(model.encoder))
    weights_name, bias_name = head_names(model.task_type)
    names[weights_name] = model.head.output_weights
    names[bias_name] = model.head.output_bias
    if len(names) != len(model.weights):
        raise RuntimeError("finetune_variable_map does not cover the model")
    return names


def trained_variable_map(model: FineTuneModel) -> dict[str, keras.Variable]:
    """The weights the task's loss reaches. Span and tagging heads never see the pooler: like the
    original (whose optimizer skips variables without a gradient) it is neither updated nor decayed."""
    names = finetune_variable_map(model)
    if model.task_type in ("span", "tagging"):
        names = {n: v for n, v in names.items() if not n.startswith("bert/pooler/")}
    return names


def encoder_variable_map(model: FineTuneModel) -> dict[str, keras.Variable]:
    return dict(tf1_variable_map(model.encoder))


# ------------------------------------------------------------------ losses


def _cross_entropy(logits: tf.Tensor, labels: tf.Tensor) -> tf.Tensor:
    log_probs = tf.nn.log_softmax(tf.cast(logits, tf.float32), axis=-1)
    return -tf.gather(log_probs, tf.cast(labels, tf.int32)[..., None], axis=-1, batch_dims=labels.shape.rank)[..., 0]


def task_sums(task_type: str, outputs: dict, batch: dict) -> dict[str, tf.Tensor]:
    """Additive statistics of a (sub-)batch: `loss_sum` / `loss_count` is its mean loss; `correct`
    / `count` its accuracy (exact start and end for span; labelled positions for tagging)."""
    if task_type == "classification":
        labels = tf.reshape(tf.cast(batch["label_ids"], tf.int32), [-1])
        logits = outputs["logits"]
        hits = tf.equal(tf.argmax(logits, axis=-1, output_type=tf.int32), labels)
        n = tf.cast(tf.size(labels), tf.float32)
        return {"loss_sum": tf.reduce_sum(_cross_entropy(logits, labels)), "loss_count": n,
                "correct": tf.reduce_sum(tf.cast(hits, tf.float32)), "count": n}
    if task_type == "regression":
        labels = tf.reshape(tf.cast(batch["label_ids"], tf.float32), [-1])
        n = tf.cast(tf.size(labels), tf.float32)
        error = tf.reduce_sum(tf.square(outputs["logits"] - labels))
        return {"loss_sum": error, "loss_count": n, "correct": tf.constant(0.0), "count": n}
    if task_type == "span":
        starts = tf.reshape(tf.cast(batch["start_positions"], tf.int32), [-1])
        ends = tf.reshape(tf.cast(batch["end_positions"], tf.int32), [-1])
        ce = 0.5 * (_cross_entropy(outputs["start_logits"], starts) + _cross_entropy(outputs["end_logits"], ends))
        hit = tf.logical_and(tf.equal(tf.argmax(outputs["start_logits"], -1, output_type=tf.int32), starts),
                             tf.equal(tf.argmax(outputs["end_logits"], -1, output_type=tf.int32), ends))
        n = tf.cast(tf.size(starts), tf.float32)
        return {"loss_sum": tf.reduce_sum(ce), "loss_count": n,
                "correct": tf.reduce_sum(tf.cast(hit, tf.float32)), "count": n}
    labels = tf.cast(batch["label_ids"], tf.int32)  # tagging: [B,S], -1 where ignored
    keep = tf.not_equal(labels, IGNORE_LABEL)
    safe = tf.where(keep, labels, 0)
    weight = tf.cast(keep, tf.float32)
    ce = _cross_entropy(outputs["logits"], safe)
    hits = tf.cast(tf.equal(tf.argmax(outputs["logits"], -1, output_type=tf.int32), safe), tf.float32)
    n = tf.reduce_sum(weight)
    return {"loss_sum": tf.reduce_sum(ce * weight), "loss_count": n, "correct": tf.reduce_sum(hits * weight),
            "count": n}


def task_loss(task_type: str, outputs: dict, batch: dict) -> tf.Tensor:
    """The mean loss of one whole batch (the original's formula)."""
    sums = task_sums(task_type, outputs, batch)
    return sums["loss_sum"] / tf.maximum(sums["loss_count"], 1.0)
