"""Our records as Hugging Face model inputs, in NumPy (any framework converts the arrays as they are).

| ours | Hugging Face | how |
|---|---|---|
| `input_ids` | `input_ids` | as is (int64) |
| `segment_ids` | `token_type_ids` | as is |
| `input_mask` | `attention_mask` | as is, `[B, L]`; packed rows: `[B, 1, L, L]` float, 0 where a token may attend and the float32 minimum where not (another sequence of the row) |
| `masked_lm_positions/ids/weights` | `labels` | `[B, L]`: the masked token's id at each position whose weight is > 0, -100 (what Hugging Face's cross-entropy skips) elsewhere |
| `next_sentence_labels` | `next_sentence_label` | `[B]` |
| packed `position_ids` | `position_ids` | as is: positions restart at each sequence's `[CLS]` |
| task `label_ids` | `labels` | `[B]` (classification, regression) or `[B, L]` (tagging) |

Packed rows and NSP: `BertForPreTraining`'s NSP head reads the row's first `[CLS]` only, and a
packed row holds one NSP label per sequence, so `hf_inputs` refuses it (`nsp=False` leaves the label
out: train the masked LM, e.g. `BertForMaskedLM`, or unpacked data for NSP).
"""

from __future__ import annotations

import numpy as np

IGNORE_INDEX = -100  # Hugging Face's cross-entropy skips these labels
PACKED_FEATURE = "sequence_ids"  # only packed rows carry it


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
    elif "label_ids" in batch:
        out["labels"] = np.asarray(batch["label_ids"])
        if out["labels"].ndim == 2 and out["labels"].shape[1] == 1:  # one label a record
            out["labels"] = out["labels"][:, 0]
    if nsp and "next_sentence_labels" in batch:
        labels = np.asarray(batch["next_sentence_labels"], np.int64)
        if packed and labels.shape[-1] > 1:
            raise HFMappingError(
                "packed rows hold one NSP label per sequence, and BertForPreTraining's NSP head reads only "
                "the row's first [CLS]: pass nsp=False (masked LM only) or read unpacked data for NSP")
        out["next_sentence_label"] = labels.reshape(-1)
    return out


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
