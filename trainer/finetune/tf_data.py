"""Task splits through tf.data, for the fine-tuning runs of an earlier version alone (their
checkpoints record no input order: `earlier_runs_input.py`), and as the independent reading the
tests compare the shared loaders with. Batch b of epoch e is a pure function of (seed, epoch)."""

from __future__ import annotations

import tensorflow as tf

from bert_datagen.contract.loading.source import check_unchanged as check_manifest_unchanged
from bert_datagen.contract.loading.task_batches import GROUP_WINDOW, bucket_lengths
from bert_datagen.trainer.errors import DataError
from bert_datagen.trainer.finetune.data import TaskSplit, check_unchanged
from bert_datagen.trainer.pretrain.data import find_bad_record
from bert_datagen.trainer.runtime import gfs
from bert_datagen.trainer.runtime.gfs import GFILE_FS

# What tf.data raises on a record it cannot read (a failed CRC, a truncated file) or parse.
TF_DATA_ERRORS = (tf.errors.DataLossError, tf.errors.InvalidArgumentError)



def _checked(ds: tf.data.Dataset, split: TaskSplit) -> tf.data.Dataset:
    """``ds`` whose every batch, once its records are read, passes only while the dataset is still
    the one opened: a replacement stops the reading (as an InvalidArgumentError, which
    `split_data_error` names) before any of its records reaches a figure or a prediction."""
    if split.manifest_version is None:
        return ds

    def unchanged() -> bool:
        check_manifest_unchanged(split.root, split.manifest_version, GFILE_FS)  # a ValueError: tf's InvalidArgument
        return True

    def after_check(batch: dict[str, tf.Tensor]) -> dict[str, tf.Tensor]:
        done = tf.py_function(unchanged, [], tf.bool)
        with tf.control_dependencies([done]):
            return {k: tf.identity(v) for k, v in batch.items()}

    return ds.map(after_check, deterministic=True)


def split_data_error(split: TaskSplit, exc: Exception) -> DataError:
    """The DataError for a tf.data failure while reading `split`: the dataset replaced under it, or
    the shard and record at fault, found as pre-training finds them
    (bert_datagen.trainer.pretrain.data.find_bad_record)."""
    try:
        check_unchanged(split)
    except DataError as replaced:
        return replaced
    where = find_bad_record(split.files, 0, 0, split.features)
    if where is not None:
        return DataError(f"corrupt input: {where}")
    # TensorFlow's message goes on with the graph's stack trace: its first line is the reason.
    reason = str(getattr(exc, "message", exc)).strip().splitlines()[0]
    return DataError(f"{', '.join(split.files)}: reading split {split.name!r} failed: {type(exc).__name__}: {reason}")



def parse_batch(serialized: tf.Tensor, features: dict[str, tuple[str, int]]) -> dict[str, tf.Tensor]:
    spec = {name: tf.io.FixedLenFeature([length], tf.int64 if dtype == "int64" else tf.float32)
            for name, (dtype, length) in features.items()}
    parsed = tf.io.parse_example(serialized, spec)
    return {k: tf.cast(v, tf.int32) if v.dtype == tf.int64 else v for k, v in parsed.items()}


def _options() -> tf.data.Options:
    options = tf.data.Options()
    options.deterministic = True
    return options


def train_batches(split: TaskSplit, batch_size: int, seed: int, epoch: int,
                  group_by_length: bool = False) -> tf.data.Dataset:
    """One epoch of full batches, shuffled over the whole split by (seed, epoch).

    `group_by_length`: the same shuffle, then each window of `GROUP_WINDOW` batches is sorted by
    length, cut into batches, and those batches are put in an order drawn from (seed, epoch,
    window); each batch is cut to its bucket length (`bucket_length`). Still floor(records /
    batch_size) batches, a pure function of (seed, epoch)."""
    records = gfs.record_dataset(split.files)
    shuffle_seed = (seed * 1000003 + epoch) & 0x7FFFFFFF
    records = records.shuffle(max(split.records, 1), seed=shuffle_seed, reshuffle_each_iteration=False)
    if group_by_length:
        return _grouped(records, split, batch_size, shuffle_seed)
    ds = records.batch(batch_size, drop_remainder=True)
    ds = ds.map(lambda s: parse_batch(s, split.features), num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    return _checked(ds, split).with_options(_options()).prefetch(tf.data.AUTOTUNE)


def bucket_length(longest: tf.Tensor, max_seq_length: int) -> tf.Tensor:
    """The shortest bucket length that holds `longest` tokens."""
    buckets = tf.constant(bucket_lengths(max_seq_length), tf.int32)
    return tf.gather(buckets, tf.reduce_sum(tf.cast(buckets < tf.cast(longest, tf.int32), tf.int32)))


def trim_batch(batch: dict[str, tf.Tensor], max_seq_length: int) -> dict[str, tf.Tensor]:
    """The batch cut to its bucket length: every per-token feature (those of `max_seq_length`
    values) loses padding columns that no example of the batch uses."""
    length = bucket_length(tf.reduce_max(tf.reduce_sum(batch["input_mask"], axis=1)), max_seq_length)
    return {k: v[:, :length] if v.shape.rank == 2 and v.shape[1] == max_seq_length else v for k, v in batch.items()}


def _grouped(records: tf.data.Dataset, split: TaskSplit, batch_size: int, seed: int) -> tf.data.Dataset:
    seq_len = split.features["input_ids"][1]

    def sort_window(index, serialized):
        full = tf.shape(serialized)[0] // batch_size * batch_size  # the window's own leftovers go
        parsed = parse_batch(serialized[:full], split.features)
        order = tf.argsort(tf.reduce_sum(parsed["input_mask"], axis=1), stable=True)
        draw = tf.random.stateless_uniform([full // batch_size], seed=tf.stack([tf.constant(seed, tf.int64), index]),
                                           alg="philox")
        batches = tf.reshape(tf.gather(order, tf.argsort(draw)[:, None] * batch_size + tf.range(batch_size)), [-1])
        return {k: tf.reshape(tf.gather(v, batches), [-1, batch_size] + v.shape[1:].as_list())
                for k, v in parsed.items()}

    ds = records.batch(batch_size * GROUP_WINDOW).enumerate().map(sort_window, num_parallel_calls=tf.data.AUTOTUNE,
                                                                     deterministic=True)
    ds = ds.unbatch().map(lambda b: trim_batch(b, seq_len), num_parallel_calls=tf.data.AUTOTUNE,
                               deterministic=True)
    return _checked(ds, split).with_options(_options()).prefetch(tf.data.AUTOTUNE)


def ordered_batches(split: TaskSplit, batch_size: int) -> tf.data.Dataset:
    """The split in record order, once; the last batch may be short."""
    records = gfs.record_dataset(split.files)
    ds = records.batch(batch_size).map(lambda s: parse_batch(s, split.features),
                                       num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    return _checked(ds, split).with_options(_options()).prefetch(tf.data.AUTOTUNE)
