"""Fine-tuning task heads on the BERT encoder, and their losses (RECIPE.md section 10).

The encoder is `bert_datagen.trainer.model.bert.BertEncoder` (the backbone); one `TaskHead` sits on
it (the task), as keras-hub splits backbone and task. One head class per task type (`HEADS`), each
owning its outputs, its loss sums, its TF1 names and its Hugging Face architecture:

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

from typing import ClassVar

import keras
from keras import ops

from bert_datagen.trainer.model.bert import BertEncoder, tf1_variable_map, truncated_normal
from bert_datagen.trainer.model.config import BertConfig
from bert_datagen.trainer.model.dropout import dropout

HEAD_DROPOUT = 0.1  # the original's keep_prob 0.9, whatever the encoder's dropout
HEAD_DROPOUT_SITE = 1_000_003  # a dropout site no encoder layer uses
IGNORE_LABEL = -1


def cross_entropy(logits, labels):
    """-log softmax(logits)[label] along the last axis, in float32 (labels: logits' shape minus it)."""
    log_probs = ops.log_softmax(ops.cast(logits, "float32"), axis=-1)
    picked = ops.take_along_axis(log_probs, ops.expand_dims(ops.cast(labels, "int32"), -1), axis=-1)
    return -picked[..., 0]


def hits(logits, labels):
    """1.0 where the arg-max of `logits` (last axis) is the label, else 0.0."""
    predicted = ops.cast(ops.argmax(logits, axis=-1), "int32")
    return ops.cast(ops.equal(predicted, ops.cast(labels, "int32")), "float32")


def _count(labels):
    return ops.cast(ops.size(labels), "float32")


class TaskHead(keras.layers.Layer):
    """One dense layer in the original layout: logits = x @ output_weights^T + output_bias.

    A subclass per task type says what the layer reads, what it outputs and how it is scored and
    named; the class attributes are read without building a head (exports, data checks).
    """

    task_type: ClassVar[str]
    output_names: ClassVar[tuple[str, ...]] = ("logits",)
    tf1_names: ClassVar[tuple[str, str]] = ("output_weights", "output_bias")  # (weights, bias)
    hf_architecture: ClassVar[str]
    hf_head: ClassVar[str] = "classifier"  # the Linear's name in the HF model
    hf_problem_type: ClassVar[str | None] = None
    # Whether the loss reaches the pooler; without it the pooler is neither trained nor exported to
    # HF (whose QA and token-classification models have none).
    reads_pooler: ClassVar[bool] = False
    # One logit per label: the task needs a label set of at least 2.
    per_label: ClassVar[bool] = True

    def __init__(self, config: BertConfig, seed: int, num_labels: int, **kwargs):
        super().__init__(**kwargs)
        self.num_labels = num_labels
        outputs = self.num_outputs(num_labels)
        self.output_weights = self.add_weight(
            name="output_weights", shape=(outputs, config.hidden_size),
            initializer=truncated_normal(config, seed, self.tf1_names[0]))
        self.output_bias = self.add_weight(name="output_bias", shape=(outputs,), initializer="zeros")
        self.built = True

    @classmethod
    def num_outputs(cls, num_labels: int) -> int:
        if num_labels < 2:
            raise ValueError(f"a {cls.task_type} task needs at least 2 labels, got {num_labels}")
        return num_labels

    @classmethod
    def hf_labels(cls, labels: list[str]) -> list[str]:
        """The HF config's id2label, in id order."""
        return list(labels)

    def logits(self, x):
        w = ops.cast(self.output_weights, x.dtype)
        logits = ops.matmul(x, ops.transpose(w)) if len(x.shape) == 2 else ops.einsum("bsh,oh->bso", x, w)
        return ops.cast(logits + ops.cast(self.output_bias, x.dtype), "float32")

    def call(self, encoded: dict, dropout_seed=None) -> dict:
        """`encoded`: the encoder's outputs; `dropout_seed` None when not training."""
        raise NotImplementedError

    @staticmethod
    def denominator(batch: dict):
        """What this (sub-)batch adds to the count its loss is averaged over: its examples."""
        return ops.cast(ops.shape(batch["input_ids"])[0], "float32")

    @staticmethod
    def sums(outputs: dict, batch: dict) -> dict:
        """Additive statistics of a (sub-)batch: `loss_sum` / `loss_count` is its mean loss;
        `correct` / `count` its accuracy."""
        raise NotImplementedError


class ClassificationHead(TaskHead):
    """Pooled output -> dropout 0.1 -> dense to num_labels; mean cross-entropy."""

    task_type = "classification"
    hf_architecture = "BertForSequenceClassification"
    hf_problem_type = "single_label_classification"
    reads_pooler = True

    def call(self, encoded, dropout_seed=None):
        pooled = dropout(encoded["pooled_output"], HEAD_DROPOUT, dropout_seed, HEAD_DROPOUT_SITE)
        return {"logits": self.logits(pooled)}

    @staticmethod
    def sums(outputs, batch):
        labels = ops.reshape(ops.cast(batch["label_ids"], "int32"), (-1,))
        logits = outputs["logits"]
        n = _count(labels)
        return {"loss_sum": ops.sum(cross_entropy(logits, labels)), "loss_count": n,
                "correct": ops.sum(hits(logits, labels)), "count": n}


class RegressionHead(TaskHead):
    """Pooled output -> dropout 0.1 -> dense to 1; mean squared error (no accuracy: `correct` 0)."""

    task_type = "regression"
    hf_architecture = "BertForSequenceClassification"
    hf_problem_type = "regression"
    reads_pooler = True
    per_label = False

    @classmethod
    def num_outputs(cls, num_labels: int) -> int:
        return 1

    @classmethod
    def hf_labels(cls, labels: list[str]) -> list[str]:
        return ["LABEL_0"]

    def call(self, encoded, dropout_seed=None):
        pooled = dropout(encoded["pooled_output"], HEAD_DROPOUT, dropout_seed, HEAD_DROPOUT_SITE)
        return {"logits": self.logits(pooled)[:, 0]}

    @staticmethod
    def sums(outputs, batch):
        labels = ops.reshape(ops.cast(batch["label_ids"], "float32"), (-1,))
        n = _count(labels)
        error = ops.sum(ops.square(outputs["logits"] - labels))
        return {"loss_sum": error, "loss_count": n, "correct": ops.zeros((), "float32"), "count": n}


class SpanHead(TaskHead):
    """Sequence output -> dense to 2 (start, end logits), no dropout of its own; the mean of the
    start and end cross-entropies; correct = exact start and end."""

    task_type = "span"
    output_names = ("start_logits", "end_logits")
    tf1_names = ("cls/squad/output_weights", "cls/squad/output_bias")
    hf_architecture = "BertForQuestionAnswering"
    hf_head = "qa_outputs"
    per_label = False

    @classmethod
    def num_outputs(cls, num_labels: int) -> int:
        return 2

    @classmethod
    def hf_labels(cls, labels: list[str]) -> list[str]:
        return ["LABEL_0", "LABEL_1"]

    def call(self, encoded, dropout_seed=None):
        logits = self.logits(encoded["sequence_output"])
        return {"start_logits": logits[:, :, 0], "end_logits": logits[:, :, 1]}

    @staticmethod
    def sums(outputs, batch):
        starts = ops.reshape(ops.cast(batch["start_positions"], "int32"), (-1,))
        ends = ops.reshape(ops.cast(batch["end_positions"], "int32"), (-1,))
        ce = 0.5 * (cross_entropy(outputs["start_logits"], starts) + cross_entropy(outputs["end_logits"], ends))
        hit = hits(outputs["start_logits"], starts) * hits(outputs["end_logits"], ends)
        n = _count(starts)
        return {"loss_sum": ops.sum(ce), "loss_count": n, "correct": ops.sum(hit), "count": n}


class TaggingHead(TaskHead):
    """Sequence output -> dropout 0.1 -> dense to num_labels per position; cross-entropy over the
    positions whose label is not -1 (the others add nothing, not even to the denominator)."""

    task_type = "tagging"
    hf_architecture = "BertForTokenClassification"

    def call(self, encoded, dropout_seed=None):
        sequence = dropout(encoded["sequence_output"], HEAD_DROPOUT, dropout_seed, HEAD_DROPOUT_SITE)
        return {"logits": self.logits(sequence)}

    @staticmethod
    def denominator(batch):
        return ops.sum(ops.cast(ops.not_equal(batch["label_ids"], IGNORE_LABEL), "float32"))

    @staticmethod
    def sums(outputs, batch):
        labels = ops.cast(batch["label_ids"], "int32")  # [B,S], -1 where ignored
        keep = ops.not_equal(labels, IGNORE_LABEL)
        safe = ops.where(keep, labels, 0)
        weight = ops.cast(keep, "float32")
        ce = cross_entropy(outputs["logits"], safe)
        n = ops.sum(weight)
        return {"loss_sum": ops.sum(ce * weight), "loss_count": n,
                "correct": ops.sum(hits(outputs["logits"], safe) * weight), "count": n}


HEADS: dict[str, type[TaskHead]] = {h.task_type: h for h in (ClassificationHead, RegressionHead, SpanHead, TaggingHead)}
TASK_TYPES = tuple(HEADS)


def head_class(task_type: str) -> type[TaskHead]:
    try:
        return HEADS[task_type]
    except KeyError:
        raise ValueError(f"unknown task type {task_type!r}; choose one of {', '.join(TASK_TYPES)}") from None


def num_outputs(task_type: str, num_labels: int) -> int:
    return head_class(task_type).num_outputs(num_labels)


class FineTuneModel(keras.Model):
    """Encoder + task head. Outputs (float32):

    classification {"logits": [B,K]}; regression {"logits": [B]}; span {"start_logits": [B,S],
    "end_logits": [B,S]}; tagging {"logits": [B,S,K]}.
    """

    def __init__(self, config: BertConfig, task_type: str, num_labels: int, seed: int = 12345, dtype=None,
                 **kwargs):
        super().__init__(name=kwargs.pop("name", "bert_finetune"), dtype=dtype, **kwargs)
        head = head_class(task_type)
        self.config = config
        self.task_type = task_type
        self.num_labels = num_labels
        self.encoder = BertEncoder(config, seed=seed, dtype=self.dtype_policy, name="bert")
        self.head = head(config, seed, num_labels, name="head", dtype=self.dtype_policy)
        self.built = True

    def call(self, inputs, training=False, dropout_seed=None):
        seed = dropout_seed if training else None
        if training and seed is None:
            raise ValueError("training=True needs a dropout_seed (dropout_key: [3] int tensor, or a [2] seed)")
        encoded = self.encoder(inputs, training=training, dropout_seed=seed)
        return self.head(encoded, dropout_seed=seed)


def build_finetune_model(config: BertConfig, task_type: str, num_labels: int, seed: int = 12345,
                         dtype: str | None = None) -> FineTuneModel:
    return FineTuneModel(config, task_type, num_labels, seed=seed, dtype=dtype)


def finetune_variable_map(model: FineTuneModel) -> dict[str, keras.Variable]:
    """Every weight under its TF1 name: the encoder's `bert/...` names plus the head's."""
    names = dict(tf1_variable_map(model.encoder))
    weights_name, bias_name = model.head.tf1_names
    names[weights_name] = model.head.output_weights
    names[bias_name] = model.head.output_bias
    if len(names) != len(model.weights):
        raise RuntimeError("finetune_variable_map does not cover the model")
    return names


def trained_variable_map(model: FineTuneModel) -> dict[str, keras.Variable]:
    """The weights the task's loss reaches. Span and tagging heads never see the pooler: like the
    original (whose optimizer skips variables without a gradient) it is neither updated nor decayed."""
    names = finetune_variable_map(model)
    if not model.head.reads_pooler:
        names = {n: v for n, v in names.items() if not n.startswith("bert/pooler/")}
    return names


def encoder_variable_map(model: FineTuneModel) -> dict[str, keras.Variable]:
    return dict(tf1_variable_map(model.encoder))


def task_sums(task_type: str, outputs: dict, batch: dict) -> dict:
    """The task head's `sums` (additive statistics of a (sub-)batch)."""
    return head_class(task_type).sums(outputs, batch)

