"""The training input of a fine-tuning run started by an earlier version, which read through tf.data
(its checkpoints record no input order), and of no other run: the epochs' batches exactly as that
version made them, from the run's step on. New runs read the global order
(`trainer/finetune/ordered.py`)."""

from __future__ import annotations

from collections.abc import Callable, Iterator

from bert_datagen.trainer.finetune.config import FinetuneConfig
from bert_datagen.trainer.finetune.data import TaskSplit
from bert_datagen.trainer.finetune.tf_data import TF_DATA_ERRORS, split_data_error, train_batches


def _batches_from(split: TaskSplit, cfg: FinetuneConfig, steps_per_epoch: int, step: int) -> Iterator[dict]:
    """Batches from global step `step` on, epoch after epoch (each epoch its own shuffle)."""
    epoch, offset = divmod(step, steps_per_epoch)
    while True:
        ds = train_batches(split, cfg.batch_size, cfg.seed, epoch, group_by_length=cfg.group_by_length)
        yield from (iter(ds.skip(offset)) if offset else iter(ds))
        epoch, offset = epoch + 1, 0


def earlier_run_batches(split: TaskSplit, cfg: FinetuneConfig, steps_per_epoch: int, step: int) -> Callable[[], dict]:
    """`next()` of those batches; a record tf.data cannot read is a DataError naming it."""
    batches = _batches_from(split, cfg, steps_per_epoch, step)

    def next_batch() -> dict:
        try:
            return next(batches)
        except TF_DATA_ERRORS as exc:
            raise split_data_error(split, exc) from exc

    return next_batch
