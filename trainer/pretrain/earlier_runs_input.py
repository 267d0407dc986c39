"""The input of a run started by an earlier version, which read through tf.data, and of no other run.

Such a run's checkpoints hold a tf.data iterator state (`trainer/runtime/checkpoint.py`'s
`reads_through_tf_data`), so it resumes on the batches it would have read only through the same
pipeline: seeded file order (reshuffled each epoch from that seed), deterministic parallel
interleave, the seeded shuffle buffer it recorded, batched parsing, prefetch. New runs read the
global order instead (`trainer/runtime/ordered_input.py`), which has no buffer: `--shuffle-buffer`
reaches this module only.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path

import tensorflow as tf

from bert_datagen.datagen.record_layout import INSTANCE_KEY, feature_spec
from bert_datagen.trainer.errors import CheckpointError, TrainConfigError
from bert_datagen.trainer.pretrain.config import TrainConfig
from bert_datagen.trainer.pretrain.dataset_info import DatasetInfo
from bert_datagen.trainer.runtime.checkpoint import INPUT_PREFIX
from bert_datagen.trainer.runtime.rundir import TRAIN_CONFIG_FILE

# The shuffle buffer of runs of earlier versions that recorded none (their default then).
EARLIER_RUNS_SHUFFLE_BUFFER = 10000


def earlier_run_input(info: DatasetInfo, cfg: TrainConfig, run_dir: Path) -> tuple[Iterator, tf.train.Checkpoint]:
    """The batches of the run in `run_dir` (started by an earlier version) and the checkpoint of their
    position; TrainConfigError for what only the global order of new runs can do."""
    for option, given in (("--skip-batches", cfg.skip_batches), ("--mix", cfg.mix)):
        if given:
            raise TrainConfigError(f"{run_dir}: the run was started by an earlier version that read its "
                                   f"input through tf.data; {option} needs the global order of new runs")
    iterator = iter(train_dataset(info, cfg.batch_size, cfg.seed, recorded_shuffle_buffer(run_dir, cfg.shuffle_buffer)))
    return iterator, tf.train.Checkpoint(iterator=iterator)


def recorded_shuffle_buffer(run_dir: str | Path, given: int | None) -> int:
    """The shuffle buffer of a run started by an earlier version (it reads through tf.data): the one
    it recorded; another given one is refused, as it would change the batches of the resumed run."""
    path = Path(run_dir) / TRAIN_CONFIG_FILE
    try:
        recorded = json.loads(path.read_text()).get("shuffle_buffer")
    except (OSError, ValueError, AttributeError):  # nothing recorded: the run starts reading now
        return EARLIER_RUNS_SHUFFLE_BUFFER if given is None else given
    recorded = EARLIER_RUNS_SHUFFLE_BUFFER if recorded is None else int(recorded)
    if given is not None and given != recorded:
        raise TrainConfigError(f"--shuffle-buffer {given}: {path} records {recorded}, the buffer this run (started by "
                               "an earlier version, reading through tf.data) reads with; resume it with that")
    return recorded


def train_dataset(info: DatasetInfo, batch_size: int, seed: int, shuffle_buffer: int = 10000,
                  cycle_length: int = 8, keep_identity: bool = False) -> tf.data.Dataset:
    """Endless, deterministic, shuffled batches of the train split.

    With dynamic masking each record travels with the epoch it was read in (the pass over the
    files its file was read in), and each batch is masked from (seed, record identity, epoch).
    """
    n_files = len(info.train_files)
    files = tf.data.Dataset.from_tensor_slices(info.train_files)
    files = files.shuffle(n_files, seed=seed, reshuffle_each_iteration=True).repeat()
    if info.masking == "dynamic":
        from bert_datagen.trainer.pretrain.dynamic_input import dynamic_batches

        records = files.enumerate().interleave(
            lambda i, f: tf.data.TFRecordDataset(f, buffer_size=1 << 20).map(lambda r: (r, i // n_files)),
            cycle_length=min(cycle_length, n_files), block_length=1,
            num_parallel_calls=tf.data.AUTOTUNE, deterministic=True,
        )
        records = records.shuffle(shuffle_buffer, seed=seed + 1, reshuffle_each_iteration=True)
        return dynamic_batches(records, info, batch_size, seed, parse_batch, keep_identity)
    records = files.interleave(
        lambda f: tf.data.TFRecordDataset(f, buffer_size=1 << 20),
        cycle_length=min(cycle_length, n_files), block_length=1,
        num_parallel_calls=tf.data.AUTOTUNE, deterministic=True,
    )
    records = records.shuffle(shuffle_buffer, seed=seed + 1, reshuffle_each_iteration=True)
    return parsed_batches(records, info, batch_size)


# What tf.data raises on a record it cannot read (a failed CRC, a truncated file) or parse.
_TF_DATA_ERRORS = (tf.errors.DataLossError, tf.errors.InvalidArgumentError)


def next_tf_data_batch(iterator: Iterator, data_error: Callable[[Exception], Exception]) -> dict:
    """The next batch of such a run; a record tf.data cannot read is `data_error(exc)`."""
    try:
        return next(iterator)
    except _TF_DATA_ERRORS as exc:
        raise data_error(exc) from exc


def restore_input_position(iterator_ckpt: tf.train.Checkpoint, path: Path) -> None:
    """The iterator's position from checkpoint directory `path`."""
    try:
        iterator_ckpt.read(str(path / INPUT_PREFIX)).assert_consumed()
    except (tf.errors.OpError, AssertionError, ValueError) as exc:
        raise CheckpointError(f"{path / INPUT_PREFIX}: cannot restore the input position: "
                              f"{getattr(exc, 'message', exc)}") from exc


def parse_batch(serialized: tf.Tensor, max_seq_length: int, max_predictions_per_seq: int,
                spec: dict[str, tuple[str, int]] | None = None) -> dict[str, tf.Tensor]:
    """Parse a batch of serialized examples with fixed-length features (the original's unless
    `spec` says otherwise); ints -> int32, but a record's 64-bit identity stays int64."""
    spec = spec or feature_spec(max_seq_length, max_predictions_per_seq)
    features = {name: tf.io.FixedLenFeature([length], tf.int64 if dtype == "int64" else tf.float32)
                for name, (dtype, length) in spec.items()}
    parsed = tf.io.parse_example(serialized, features)
    return {k: tf.cast(v, tf.int32) if v.dtype == tf.int64 and k != INSTANCE_KEY else v for k, v in parsed.items()}


def parsed_batches(records: tf.data.Dataset, info: DatasetInfo, batch_size: int) -> tf.data.Dataset:
    ds = records.batch(batch_size, drop_remainder=True)
    spec = info.features()
    ds = ds.map(lambda s: _with_sequence_weights_in_graph(parse_batch(s, info.max_seq_length, info.max_predictions_per_seq,
                                                            spec)),
                num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    options = tf.data.Options()
    options.deterministic = True
    return ds.with_options(options).prefetch(tf.data.AUTOTUNE)


def _with_sequence_weights_in_graph(batch: dict[str, tf.Tensor]) -> dict[str, tf.Tensor]:
    """`with_sequence_weights` inside a tf.data map (the eval split), where NumPy cannot run."""
    if "next_sentence_weights" in batch or "cls_positions" not in batch:
        return batch
    present = tf.reduce_max(batch["sequence_ids"], axis=-1, keepdims=True)
    slots = tf.range(1, tf.shape(batch["cls_positions"])[-1] + 1)[None, :]
    return {**batch, "next_sentence_weights": tf.cast(slots <= present, tf.float32)}
