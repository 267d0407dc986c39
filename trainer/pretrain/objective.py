"""Pre-training losses and metrics, as the original computes them.

MLM loss = sum(weight * CE) / (sum(weight) + 1e-5) over the masked positions of the batch; NSP loss
= mean CE; total = MLM + NSP. Cross-entropies come from `log_softmax`, as in the original.

The training step works with *sums* (`batch_sums`) so that a batch split over replicas or
micro-batches adds up to exactly the loss of the whole batch.
"""

from __future__ import annotations

from keras import ops

from bert_datagen.trainer.model.heads import cross_entropy, hits

MLM_DENOMINATOR_EPSILON = 1e-5


def masked_lm_cross_entropy(logits, label_ids):
    """[B,P] cross-entropy of each prediction slot (padding slots included; weight them out)."""
    return cross_entropy(logits, label_ids)


def next_sentence_cross_entropy(logits, labels):
    return cross_entropy(logits, ops.reshape(labels, (-1,)))


def batch_sums(outputs: dict, batch: dict) -> dict:
    """Additive statistics of one (sub-)batch; `losses_from_sums` turns them into losses.

    A batch without `next_sentence_labels` (data without NSP) has no NSP terms: `nsp_examples` 0.
    Packed rows (`next_sentence_weights` [B,N]) count sequences, not rows: `examples` is the number
    of sequences present, and each contributes its own NSP cross-entropy, as it would unpacked.
    """
    if "next_sentence_weights" in batch:
        return _packed_sums(outputs, batch)
    examples = ops.cast(ops.shape(batch["input_ids"])[0], "float32")
    mlm = {**_mlm_sums(outputs, batch), "examples": examples}
    if "next_sentence_labels" not in batch:
        zero = ops.zeros((), "float32")
        return {**mlm, "nsp_ce": zero, "nsp_correct": zero, "nsp_examples": zero}
    labels = ops.reshape(ops.cast(batch["next_sentence_labels"], "int32"), (-1,))
    return {
        **mlm,
        "nsp_ce": ops.sum(next_sentence_cross_entropy(outputs["nsp_logits"], labels)),
        "nsp_correct": ops.sum(hits(outputs["nsp_logits"], labels)),
        "nsp_examples": examples,
    }


def _mlm_sums(outputs: dict, batch: dict) -> dict:
    weights = ops.cast(batch["masked_lm_weights"], "float32")
    mlm_ce = masked_lm_cross_entropy(outputs["mlm_logits"], batch["masked_lm_ids"])
    mlm_hit = hits(outputs["mlm_logits"], batch["masked_lm_ids"])
    return {"mlm_ce": ops.sum(weights * mlm_ce), "mlm_weight": ops.sum(weights),
            "mlm_correct": ops.sum(weights * mlm_hit)}


def _packed_sums(outputs: dict, batch: dict) -> dict:
    present = ops.cast(batch["next_sentence_weights"], "float32")  # [B,N]
    sequences = ops.sum(present)
    sums = {**_mlm_sums(outputs, batch), "examples": sequences}
    if "next_sentence_labels" not in batch:
        zero = ops.zeros((), "float32")
        return {**sums, "nsp_ce": zero, "nsp_correct": zero, "nsp_examples": zero}
    logits = outputs["nsp_logits"]  # [B,N,2]
    labels = batch["next_sentence_labels"]
    return {**sums, "nsp_ce": ops.sum(present * cross_entropy(logits, labels)),
            "nsp_correct": ops.sum(present * hits(logits, labels)), "nsp_examples": sequences}


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
