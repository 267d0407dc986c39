"""Dynamic masking in the input pipeline (data generated with `bert-datagen run --masking dynamic`).

Each batch of unmasked records is masked by `bert_datagen.datagen.dynamic.mask_records`, the same NumPy function
the tests call: the recipe's selection rule of static masking (with the dataset's own masking
options and vocab), keyed by (run seed, record identity, epoch). It runs as one vectorized
`tf.numpy_function` per batch (a word segmenter's data passes its records' `word_continues_bits`
too), on the host, before the batch is cut into replicas and micro-steps,
so neither changes a mask; the tf.data iterator state saved with each checkpoint holds each
pending record's epoch, so a resumed run sees the masks the uninterrupted one would have.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import tensorflow as tf

from bert_datagen.datagen.dynamic import mask_records
from bert_datagen.datagen.record_layout import INSTANCE_KEY, WORD_BITS


class DynamicMaskError(ValueError):
    """A dynamic-masking dataset whose manifest or vocab cannot say how to mask it."""


def dynamic_batches(records: tf.data.Dataset, info, batch_size: int, seed: int, parse_batch: Callable,
                    keep_identity: bool = False) -> tf.data.Dataset:
    """Batches of (serialized record, epoch) pairs, parsed (`bert_datagen.trainer.pretrain.data.parse_batch`) and masked;
    the identity and epoch are dropped unless `keep_identity` (for checks: `instance_key`, `epoch`)."""
    from bert_datagen.trainer.pretrain.data import dataset_masking, dataset_vocab

    if info.manifest is None:
        raise DynamicMaskError(f"{info.source}: dynamic masking needs the dataset's manifest and vocab")
    config, vocab = dataset_masking(info), dataset_vocab(info)
    seq, preds = info.max_seq_length, info.max_predictions_per_seq
    spec = info.features()

    def mask_numpy(input_ids, input_mask, identity, epoch, *word_bits):
        masked = mask_records(input_ids, input_mask, identity, epoch, seed, config, vocab, *word_bits)
        return (masked.input_ids.astype(np.int32), masked.masked_lm_positions.astype(np.int32),
                masked.masked_lm_ids.astype(np.int32), masked.masked_lm_weights.astype(np.float32))

    def parse_and_mask(serialized, epoch):
        batch = parse_batch(serialized, seq, preds, spec)
        identity = batch.pop(INSTANCE_KEY)[:, 0]
        # The words of a segmenter's data: for the masks only, the model does not read them.
        word_bits = [batch.pop(WORD_BITS)] if WORD_BITS in batch else []
        if keep_identity:
            batch[INSTANCE_KEY], batch["epoch"] = identity, epoch
        ids, positions, labels, weights = tf.numpy_function(
            mask_numpy, [batch["input_ids"], batch["input_mask"], identity, epoch, *word_bits],
            [tf.int32, tf.int32, tf.int32, tf.float32], stateful=False)
        batch["input_ids"] = tf.ensure_shape(ids, [None, seq])
        batch["masked_lm_positions"] = tf.ensure_shape(positions, [None, preds])
        batch["masked_lm_ids"] = tf.ensure_shape(labels, [None, preds])
        batch["masked_lm_weights"] = tf.ensure_shape(weights, [None, preds])
        return batch

    ds = records.batch(batch_size, drop_remainder=True)
    ds = ds.map(parse_and_mask, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    options = tf.data.Options()
    options.deterministic = True
    # The masking function is pure (no state outside its inputs), so the iterator's checkpoint
    # may leave it out.
    options.experimental_external_state_policy = tf.data.experimental.ExternalStatePolicy.IGNORE
    return ds.with_options(options).prefetch(tf.data.AUTOTUNE)
