"""Our records as Hugging Face model inputs, in NumPy (any framework converts the arrays as they are).

| ours | Hugging Face | how |
|---|---|---|
| `input_ids` | `input_ids` | as is (int64) |
| `segment_ids` | `token_type_ids` | as is |
| `input_mask` | `attention_mask` | as is, `[B, L]`; packed rows: `[B, 1, L, L]` float, 0 where a token may attend and the float32 minimum where not (another sequence of the row) |
| `masked_lm_positions/ids/weights` | `labels` | `[B, L]`: the masked token's id at each position whose weight is > 0, -100 (what Hugging Face's cross-entropy skips) elsewhere |
| `next_sentence_labels` | `next_sentence_label` | `[B]` |
| packed `position_ids` | `position_ids` | as is: positions restart at each sequence's `[CLS]` |
| task `label_ids` | `labels` | classification: `[B]` int64; regression: `[B]` float32; tagging: `[B, L]` int64, -100 where ours is -1 (no label: `[CLS]`, `[SEP]`, a word's later pieces, padding) |
| task `start_positions`, `end_positions` | the same | span: `[B]` int64 each (an unanswerable window's are 0, `[CLS]`, as Hugging Face's) |
| `is_real_example`, `is_impossible`, `unique_ids` | (left out) | fine-tuning's loss reads none of them (`trainer/model/heads.py`) |

Packed rows and NSP: `BertForPreTraining`'s NSP head reads the row's first `[CLS]` only, and a
packed row holds one NSP label per sequence, so `hf_inputs` refuses it (`nsp=False` leaves the label
out: train the masked LM, e.g. `BertForMaskedLM`, or unpacked data for NSP).
"""

from __future__ import annotations

import numpy as np

from bert_datagen.datagen.tasks.config import CLASSIFICATION, REGRESSION, SPAN, TAGGING

IGNORE_INDEX = -100  # Hugging Face's cross-entropy skips these labels
PACKED_FEATURE = "sequence_ids"  # only packed rows carry it
TASK_IGNORE = -1  # a tagging position without a label in our records (`trainer/model/heads.py` IGNORE_LABEL)
# Per task type: the features fine-tuning's head trains on (`trainer/model/heads.py`).
TASK_LABELS = {CLASSIFICATION: ("label_ids",), REGRESSION: ("label_ids",), SPAN: ("start_positions", "end_positions"),
               TAGGING: ("label_ids",)}


class HFMappingError(ValueError):
    """A batch that has no faithful Hugging Face form (names why)."""


def hf_inputs(batch: dict[str, np.ndarray], nsp: bool = True) -> dict[str, np.ndarray]:
    """A batch of ours (the loaders' dict of arrays) as keyword arguments of a Hugging Face BERT model
    (see the module docstring). ``nsp=False`` leaves ``next_sentence_label`` out."""
    if "input_ids" not in batch or "input_mask" not in batch:
        raise HFMappingError(f"a batch needs input_ids and input_mask, this one has {sorted(batch)}")
    ids = np.asarray(batch["input_ids"], np.int64)
    out = {"input_ids": ids, "attention_mask": np.asarray(batch["input_mask"], np.int64)}
    if "segment_ids" in batch:
        out["token_type_ids"] = np.asarray(batch["segment_ids"], np.int64)
    packed = PACKED_FEATURE in batch
    if packed:
        out["position_ids"] = np.asarray(batch["position_ids"], np.int64)
        out["attention_mask"] = packed_attention_mask(batch[PACKED_FEATURE])
    if "masked_lm_positions" in batch:
        out["labels"] = mlm_labels(ids.shape, batch["masked_lm_positions"], batch["masked_lm_ids"],
                                   batch["masked_lm_weights"])
    elif "label_ids" in batch or "start_positions" in batch or "end_positions" in batch:
        out.update(task_labels(batch))
    if nsp and "next_sentence_labels" in batch:
        labels = np.asarray(batch["next_sentence_labels"], np.int64)
        if packed and labels.shape[-1] > 1:
            raise HFMappingError(
                "packed rows hold one NSP label per sequence, and BertForPreTraining's NSP head reads only "
                "the row's first [CLS]: pass nsp=False (masked LM only) or read unpacked data for NSP")
        out["next_sentence_label"] = labels.reshape(-1)
    return out


def task_labels(batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The Hugging Face label arguments of a task batch (see the module docstring); HFMappingError,
    naming what the batch holds, for labels that have no faithful form."""
    width = np.shape(batch["input_ids"])[1]
    if "start_positions" in batch or "end_positions" in batch:
        if "label_ids" in batch or not {"start_positions", "end_positions"} <= set(batch):
            raise HFMappingError(f"a span batch needs start_positions and end_positions and no label_ids, this one "
                                 f"has {sorted(k for k in batch if k in ('label_ids', 'start_positions', 'end_positions'))}")
        return {name: _one_per_record(batch[name], name, "i") for name in ("start_positions", "end_positions")}
    labels = np.asarray(batch["label_ids"])
    if labels.ndim == 2 and labels.shape[1] == 1:  # one label a record: classification (int64), regression (float32)
        return {"labels": _one_per_record(labels, "label_ids", "if")}
    if labels.ndim == 2 and labels.shape[1] == width and width > 1 and labels.dtype.kind == "i":
        if labels.size and labels.min() < TASK_IGNORE:
            raise HFMappingError(f"tagging label_ids hold {int(labels.min())}: a label is >= 0, or {TASK_IGNORE} "
                                 "where a token has none")
        return {"labels": np.where(labels == TASK_IGNORE, IGNORE_INDEX, labels).astype(np.int64)}
    raise HFMappingError(f"label_ids of shape {labels.shape} and dtype {labels.dtype} beside input_ids of width {width}: "
                         "neither one label a record (classification, regression) nor one a token (tagging)")


def _one_per_record(values: np.ndarray, name: str, kinds: str) -> np.ndarray:
    """``[B, 1]`` -> ``[B]``: int64 for integer labels, float32 for a regression's."""
    values = np.asarray(values)
    if values.ndim != 2 or values.shape[1] != 1 or values.dtype.kind not in kinds:
        raise HFMappingError(f"{name} of shape {values.shape} and dtype {values.dtype}: one "
                             f"{'integer' if kinds == 'i' else 'number'} a record expected")
    return values[:, 0].astype(np.int64 if values.dtype.kind == "i" else np.float32)


def mlm_labels(shape: tuple[int, ...], positions: np.ndarray, ids: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """``[B, L]`` labels: ``ids`` at the ``positions`` whose weight is > 0, IGNORE_INDEX elsewhere."""
    labels = np.full(shape, IGNORE_INDEX, np.int64)
    live = np.asarray(weights) > 0
    rows = np.broadcast_to(np.arange(shape[0])[:, None], live.shape)
    labels[rows[live], np.asarray(positions)[live]] = np.asarray(ids)[live]
    return labels


def packed_attention_mask(sequence_ids: np.ndarray) -> np.ndarray:
    """``[B, 1, L, L]`` additive mask: a token attends to the tokens of its own sequence only.
    Padding (sequence id 0) attends to padding, so no row of the softmax is empty (its outputs
    carry no label). Additive float32, the form both eager and SDPA attention take."""
    seq = np.asarray(sequence_ids)
    same = seq[:, :, None] == seq[:, None, :]
    mask = np.where(same, np.float32(0), np.finfo(np.float32).min).astype(np.float32)
    return mask[:, None]
