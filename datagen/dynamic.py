"""Dynamic masking (``masking="dynamic"``, RECIPE.md section 11): a new mask each epoch, each one a
pure function of (seed, record identity, epoch).

Data generated with dynamic masking is written once and unmasked, each record with its
``instance_key`` (the 64-bit identity key of the instance). The trainer masks every record it
reads with ``mask_records``: exactly the static rule of ``bert_datagen.datagen.masking`` (candidates,
``num_to_predict``, token / word / span groups, ``mask_ratios``; with a word segmenter its words,
which such records carry as ``word_continues_bits``), drawn from the mask key

    mix64(mix64(derive_key(seed, "dynamic-mask-v1") ^ instance_key) + (epoch + 1) * GOLDEN)

i.e. draw ``epoch + 1`` of the record's own counter-based stream (``bert_datagen.datagen.rng``). Neither the
order records arrive in, nor the batch, replica or accumulation step they land in, can change a
record's mask: replay a step and it sees the same masks; resume mid-epoch and the rest of the
epoch is masked as it would have been.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from bert_datagen.datagen.config import DatagenConfig
from bert_datagen.datagen.masking import MaskedBatch, mask_batch
from bert_datagen.datagen.record_layout import WORD_BITS, unpack_word_bits
from bert_datagen.datagen.rng import GOLDEN, MASK64, derive_key, mix64_array


def dynamic_mask_keys(seed: int, instance_keys: np.ndarray, epochs: np.ndarray | int) -> np.ndarray:
    """The mask key of each record (identity key, uint64 or its int64 bits) in each epoch."""
    identity = np.asarray(instance_keys)
    identity = identity.view(np.uint64) if identity.dtype == np.int64 else identity.astype(np.uint64)
    stream = mix64_array(np.uint64(derive_key(int(seed), "dynamic-mask-v1")) ^ identity)
    epoch = np.asarray(epochs, dtype=np.uint64)
    with np.errstate(over="ignore"):  # arithmetic mod 2**64, on purpose
        return mix64_array(stream + (epoch + np.uint64(1)) * np.uint64(GOLDEN & MASK64))


def mask_records(input_ids: np.ndarray, input_mask: np.ndarray, instance_keys: np.ndarray,
                 epochs: np.ndarray | int, seed: int, config: DatagenConfig, vocab: Any,
                 word_bits: np.ndarray | None = None) -> MaskedBatch:
    """Mask unmasked records as static masking would with their epoch's key (vectorized).

    ``word_bits``: the records' ``word_continues_bits``, which data of a word segmenter
    (``config.word_segmenter``) carries and must be given: its whole words are the segmented ones.
    """
    ids = np.asarray(input_ids)
    continues = None
    if config.word_segmenter is not None:
        if word_bits is None:
            raise ValueError(f"records of data segmented with {config.word_segmenter!r} are masked by its words: "
                             f"pass their {WORD_BITS}")
        continues = unpack_word_bits(word_bits, ids.shape[1])
    lengths = np.asarray(input_mask).sum(axis=1).astype(np.int64)
    keys = dynamic_mask_keys(seed, instance_keys, epochs)
    return mask_batch(ids, lengths, keys, config, vocab, continues)
