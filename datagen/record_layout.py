"""The pre-training record layout: feature names, objectives and maskings, the feature specs of
records and packed rows, and the word bits of dynamic masking with a word segmenter.

Everything that says what a record holds lives here; `bert_datagen.datagen.records` encodes
records to this layout, `bert_datagen.datagen.record_rules` checks them against it, and
`bert_datagen.contract.features` says which of these features a manifest must list.
"""

from __future__ import annotations

import numpy as np

INT_FEATURES = (
    "input_ids",
    "input_mask",
    "segment_ids",
    "masked_lm_positions",
    "masked_lm_ids",
    "next_sentence_labels",
)
FLOAT_FEATURES = ("masked_lm_weights",)
# Deterministic serialization writes map entries in key order.
FEATURE_ORDER = tuple(sorted(INT_FEATURES + FLOAT_FEATURES))
# The record's identity (the instance's 64-bit key as int64) in records of dynamic masking, which
# carry no masked_lm_* features: the trainer masks them, keyed by this identity.
INSTANCE_KEY = "instance_key"
MASKED_LM_FEATURES = ("masked_lm_positions", "masked_lm_ids", "masked_lm_weights")
# Records of dynamic masking with a word segmenter (docs/chinese.md): which tokens continue a
# segmented word, the one thing the trainer's masks need that the token ids do not say. A bitmap,
# bit j of value k for position 28k + j: 28 bits fill four varint bytes exactly (a record grows by
# about max_seq_length / 7 bytes, not by max_seq_length), and every value fits the int32 that the
# loaders and the trainer narrow integer features to.
WORD_BITS = "word_continues_bits"
WORD_BITS_PER_VALUE = 28
OBJECTIVES = ("nsp", "doc-sentences", "full-sentences")  # sentence pairs + NSP; RoBERTa's packed inputs
MASKINGS = ("static", "dynamic")  # dupe_factor masked copies; one unmasked copy the trainer masks


def feature_spec(max_seq_length: int, max_predictions_per_seq: int, objective: str = "nsp",
                 masking: str = "static", max_sequences_per_row: int = 0,
                 word_bits: bool = False) -> dict[str, tuple[str, int]]:
    """Name -> (dtype, length) of every feature, as the original trainer parses them.

    The defaults are the original record. Without NSP there is no ``next_sentence_labels``; with
    dynamic masking there are no ``masked_lm_*`` features but an ``instance_key``, and with
    ``word_bits`` (data of a word segmenter) the ``word_continues_bits`` its masks are drawn from
    (static masking needs none: its masks are made before the words are dropped).
    ``max_sequences_per_row`` > 0: packed rows (``packed_feature_spec``).
    """
    if max_sequences_per_row:
        return packed_feature_spec(max_seq_length, max_predictions_per_seq, max_sequences_per_row, objective)
    if objective not in OBJECTIVES:
        raise ValueError(f"objective {objective!r} is not one of {', '.join(OBJECTIVES)}")
    if masking not in MASKINGS:
        raise ValueError(f"masking {masking!r} is not one of {', '.join(MASKINGS)}")
    s, p = max_seq_length, max_predictions_per_seq
    spec = {
        "input_ids": ("int64", s),
        "input_mask": ("int64", s),
        "segment_ids": ("int64", s),
        "masked_lm_positions": ("int64", p),
        "masked_lm_ids": ("int64", p),
        "masked_lm_weights": ("float32", p),
        "next_sentence_labels": ("int64", 1),
    }
    if objective != "nsp":
        del spec["next_sentence_labels"]
    if masking == "dynamic":
        for name in MASKED_LM_FEATURES:
            del spec[name]
        spec[INSTANCE_KEY] = ("int64", 1)
        if word_bits:
            spec[WORD_BITS] = ("int64", word_bits_length(s))
    return spec


def word_bits_length(max_seq_length: int) -> int:
    """The values of a record's ``word_continues_bits``."""
    return -(-max_seq_length // WORD_BITS_PER_VALUE)


def pack_word_bits(continues: np.ndarray) -> np.ndarray:
    """``word_continues_bits`` (n, word_bits_length(L)) int64 of a (n, L) boolean mask."""
    continues = np.asarray(continues, dtype=bool)
    n, length = continues.shape
    width = word_bits_length(length)
    padded = np.zeros((n, width * WORD_BITS_PER_VALUE), dtype=np.int64)
    padded[:, :length] = continues
    weights = np.int64(1) << np.arange(WORD_BITS_PER_VALUE, dtype=np.int64)
    return (padded.reshape(n, width, WORD_BITS_PER_VALUE) * weights).sum(axis=2)


def unpack_word_bits(values: np.ndarray, max_seq_length: int) -> np.ndarray:
    """The (n, max_seq_length) boolean mask of ``word_continues_bits`` (int64 or int32 values)."""
    values = np.asarray(values, dtype=np.int64)
    bits = (values[:, :, None] >> np.arange(WORD_BITS_PER_VALUE, dtype=np.int64)) & 1
    return bits.reshape(values.shape[0], -1)[:, :max_seq_length].astype(bool)


# Packed rows (docs/packing.md): per token, which sequence (1..n, 0 on padding) and its position in it.
PACKED_TOKEN_FEATURES = ("sequence_ids", "position_ids")
# Per sequence slot of a row (S slots; an absent sequence has 0 and weight 0).
PACKED_SLOT_FEATURES = ("cls_positions", INSTANCE_KEY, "next_sentence_labels", "next_sentence_weights")


def packed_feature_spec(max_seq_length: int, max_predictions_per_seq: int, max_sequences_per_row: int,
                        objective: str = "nsp") -> dict[str, tuple[str, int]]:
    """Name -> (dtype, length) of a packed row: up to S whole instances of one length-L row.

    Token features as in an instance, plus ``sequence_ids`` and ``position_ids``; the masked-LM
    features have room for every sequence's predictions (P * S, row positions); per sequence slot
    its ``cls_positions``, its ``instance_key`` (the instance's identity: how ``unpack`` restores
    key order) and, with NSP, ``next_sentence_labels`` / ``next_sentence_weights``.
    """
    if objective not in OBJECTIVES:
        raise ValueError(f"objective {objective!r} is not one of {', '.join(OBJECTIVES)}")
    s, p, n = max_seq_length, max_predictions_per_seq, max_sequences_per_row
    spec = {
        "input_ids": ("int64", s),
        "input_mask": ("int64", s),
        "segment_ids": ("int64", s),
        "sequence_ids": ("int64", s),
        "position_ids": ("int64", s),
        "masked_lm_positions": ("int64", p * n),
        "masked_lm_ids": ("int64", p * n),
        "masked_lm_weights": ("float32", p * n),
        "cls_positions": ("int64", n),
        INSTANCE_KEY: ("int64", n),
        "next_sentence_labels": ("int64", n),
        "next_sentence_weights": ("float32", n),
    }
    if objective != "nsp":
        del spec["next_sentence_labels"], spec["next_sentence_weights"]
    return spec
