"""Fine-tuning's training batches through the global sample order (`trainer/runtime/ordered_input.py`):
`bert_datagen.contract.loading.task_batches` computes them (the order, the epochs, length groups), so
the NumPy and PyTorch readers give a fine-tuning loop exactly these batches; here the trainer opens
the split through tf.io.gfile and names a loader error as its DataError."""

from __future__ import annotations

import numpy as np

from bert_datagen.contract.loading.order import GlobalOrder
from bert_datagen.contract.loading.source import LoadError, open_source
from bert_datagen.contract.loading.task_batches import BLOCK_SIZE, TaskBatches
from bert_datagen.trainer.errors import DataError
from bert_datagen.trainer.runtime.gfs import GFILE_FS

__all__ = ["BLOCK_SIZE", "FinetuneBatches"]


class FinetuneBatches:
    """``batch(step)``: this worker's share of training step ``step``'s batch (NumPy arrays)."""

    def __init__(self, data: str, split: str, seed: int, batch_size: int, per_epoch: int, world_size: int,
                 rank: int, group_by_length: bool, version: str | None = None) -> None:
        """``version``: the manifest's when the run opened the dataset (`TaskSplit.manifest_version`):
        a dataset replaced since is refused at the first batch, not read anew."""
        try:
            source = open_source(data, split, GFILE_FS, version)
            self.batches = TaskBatches(source, seed=seed, batch_size=batch_size, world_size=world_size, rank=rank,
                                       group_by_length=group_by_length)
        except LoadError as exc:
            raise DataError(str(exc)) from exc
        if self.batches.per_epoch != per_epoch:  # the run counts its epochs from the manifest's records
            raise DataError(f"{data}: split {split!r} holds {self.batches.per_epoch} batches of {batch_size} "
                            f"an epoch in its shards, the run expected {per_epoch}")
        self.max_seq_length = self.batches.max_seq_length

    @property
    def order(self) -> GlobalOrder:
        return self.batches.order

    def batch(self, step: int) -> dict[str, np.ndarray]:
        return self.batches.batch_at(step)
