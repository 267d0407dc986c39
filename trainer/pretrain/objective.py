"""Pre-training losses and metrics, as the original computes them.

MLM loss = sum(weight * CE) / (sum(weight) + 1e-5) over the masked positions of the batch; NSP loss
= mean CE; total = MLM + NSP. Cross-entropies come from `log_softmax`, as in the original.

The training step works with *sums* (`batch_sums`) so that a batch split over replicas or
micro-batches adds up to exactly the loss of the whole batch.
"""

from __future__ import annotations

import tensorflow as tf

MLM_DENOMINATOR_EPSILON = 1e-5


def masked_lm_cross_entropy(logits: tf.Tensor, label_ids: tf.Tensor) -> tf.Tensor:
    """[B,P] cross-entropy of each prediction slot (padding slots included; weight them out)."""
    log_probs = tf.nn.log_softmax(tf.cast(logits, tf.float32), axis=-1)
    return -tf.gather(log_probs, tf.cast(label_ids, tf.int32), axis=-1, batch_dims=2)


def masked_lm_loss(logits: tf.Tensor, label_ids: tf.Tensor, weights: tf.Tensor) -> tf.Tensor:
    weights = tf.cast(weights, tf.float32)
    numerator = tf.reduce_sum(weights * masked_lm_cross_entropy(logits, label_ids))
    return numerator / (tf.reduce_sum(weights) + MLM_DENOMINATOR_EPSILON)


def next_sentence_cross_entropy(logits: tf.Tensor, labels: tf.Tensor) -> tf.Tensor:
    log_probs = tf.nn.log_softmax(tf.cast(logits, tf.float32), axis=-1)
    labels = tf.reshape(tf.cast(labels, tf.int32), [-1])
    return -tf.gather(log_probs, labels, axis=-1, batch_dims=1)


def next_sentence_loss(logits: tf.Tensor, labels: tf.Tensor) -> tf.Tensor:
    return tf.reduce_mean(next_sentence_cross_entropy(logits, labels))


def batch_sums(outputs: dict, batch: dict) -> dict[str, tf.Tensor]:
    """Additive statistics of one (sub-)batch; `losses_from_sums` turns them into losses.

    A batch without `next_sentence_labels` (data without NSP) has no NSP terms: `nsp_examples` 0.
    Packed rows (`next_sentence_weights` [B,N]) count sequences, not rows: `examples` is the number
    of sequences present, and each contributes its own NSP cross-entropy, as it would unpacked.
    """
    if "next_sentence_weights" in batch:
        return _packed_sums(outputs, batch)
    examples = tf.cast(tf.shape(batch["input_ids"])[0], tf.float32)
    mlm = {**_mlm_sums(outputs, batch), "examples": examples}
    if "next_sentence_labels" not in batch:
        zero = tf.constant(0.0, tf.float32)
        return {**mlm, "nsp_ce": zero, "nsp_correct": zero, "nsp_examples": zero}
    labels = tf.reshape(tf.cast(batch["next_sentence_labels"], tf.int32), [-1])
    nsp_ce = next_sentence_cross_entropy(outputs["nsp_logits"], labels)
    nsp_hit = tf.cast(tf.equal(tf.argmax(outputs["nsp_logits"], axis=-1, output_type=tf.int32), labels),
                      tf.float32)
    return {
        **mlm,
        "nsp_ce": tf.reduce_sum(nsp_ce),
        "nsp_correct": tf.reduce_sum(nsp_hit),
        "nsp_examples": examples,
    }


def _mlm_sums(outputs: dict, batch: dict) -> dict[str, tf.Tensor]:
    weights = tf.cast(batch["masked_lm_weights"], tf.float32)
    mlm_ce = masked_lm_cross_entropy(outputs["mlm_logits"], batch["masked_lm_ids"])
    mlm_hit = tf.cast(tf.equal(tf.argmax(outputs["mlm_logits"], axis=-1, output_type=tf.int32),
                               tf.cast(batch["masked_lm_ids"], tf.int32)), tf.float32)
    return {"mlm_ce": tf.reduce_sum(weights * mlm_ce), "mlm_weight": tf.reduce_sum(weights),
            "mlm_correct": tf.reduce_sum(weights * mlm_hit)}


def _packed_sums(outputs: dict, batch: dict) -> dict[str, tf.Tensor]:
    present = tf.cast(batch["next_sentence_weights"], tf.float32)  # [B,N]
    sequences = tf.reduce_sum(present)
    sums = {**_mlm_sums(outputs, batch), "examples": sequences}
    if "next_sentence_labels" not in batch:
        zero = tf.constant(0.0, tf.float32)
        return {**sums, "nsp_ce": zero, "nsp_correct": zero, "nsp_examples": zero}
    logits = outputs["nsp_logits"]  # [B,N,2]
    labels = tf.cast(batch["next_sentence_labels"], tf.int32)
    log_probs = tf.nn.log_softmax(tf.cast(logits, tf.float32), axis=-1)
    nsp_ce = -tf.gather(log_probs, labels, axis=-1, batch_dims=2)
    nsp_hit = tf.cast(tf.equal(tf.argmax(logits, axis=-1, output_type=tf.int32), labels), tf.float32)
    return {**sums, "nsp_ce": tf.reduce_sum(present * nsp_ce), "nsp_correct": tf.reduce_sum(present * nsp_hit),
            "nsp_examples": sequences}


def losses_from_sums(sums: dict) -> dict[str, float]:
    """Losses and accuracies (Python floats) from summed statistics; no nsp_* without NSP data."""
    s = {k: float(v) for k, v in sums.items()}
    mlm_loss = s["mlm_ce"] / (s["mlm_weight"] + MLM_DENOMINATOR_EPSILON)
    out = {"loss": mlm_loss, "mlm_loss": mlm_loss, "mlm_accuracy": s["mlm_correct"] / max(s["mlm_weight"], 1e-12)}
    if s.get("nsp_examples", s["examples"]) > 0:
        nsp_loss = s["nsp_ce"] / max(s["examples"], 1.0)
        out.update(loss=mlm_loss + nsp_loss, nsp_loss=nsp_loss,
                   nsp_accuracy=s["nsp_correct"] / max(s["examples"], 1.0))
    return out
