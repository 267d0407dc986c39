"""Fine-tuning's training batches through the global sample order (`trainer/run/ordered_input.py`).

Blocks of one record: each epoch is a full shuffle of the split by (seed, dataset, epoch), as the
original's per-epoch shuffle was, and batch ``b`` of epoch ``e`` is positions ``[b*B, (b+1)*B)`` of
that epoch (its last, partial batch left out). A worker of a cluster reads only its share of each
batch.

``--group-by-length``: the epoch is cut into windows of `GROUP_WINDOW` batches; a window's records
(leftovers beyond its whole batches left out) are sorted by length (stable), cut into batches, the
batches put in an order drawn from (seed, epoch, window), and each batch cut to the shortest bucket
length (`data.bucket_lengths`) that holds its longest example. Sorting needs the whole window, so
every worker reads the window and keeps its share of each batch.
"""

from __future__ import annotations

import numpy as np

from bert_datagen.contract.loading.batches import NumpyBatches
from bert_datagen.contract.loading.order import GlobalOrder, permutation
from bert_datagen.contract.loading.source import LoadError, open_source
from bert_datagen.datagen.rng import derive_key
from bert_datagen.trainer.finetune.data import GROUP_WINDOW, bucket_lengths
from bert_datagen.trainer.run.errors import DataError
from bert_datagen.trainer.run.gfs import GFILE_FS

BLOCK_SIZE = 1  # a full shuffle per epoch: task splits are small, and examples are often sorted


class FinetuneBatches:
    """``batch(step)``: this worker's share of training step ``step``'s batch (NumPy arrays)."""

    def __init__(self, data: str, split: str, seed: int, batch_size: int, per_epoch: int, world_size: int,
                 rank: int, group_by_length: bool) -> None:
        try:
            source = open_source(data, split, GFILE_FS)
            world = 1 if group_by_length else world_size
            self.batches = NumpyBatches(source, seed=seed, batch_size=batch_size, world_size=world,
                                        rank=0 if group_by_length else rank, block_size=BLOCK_SIZE)
        except LoadError as exc:
            raise DataError(str(exc)) from exc
        self.seed, self.per_epoch = seed, per_epoch
        self.world_size, self.rank, self.grouped = world_size, rank, group_by_length
        self.max_seq_length = int(source.spec["input_ids"][1])
        self._window: tuple[tuple[int, int], list[dict[str, np.ndarray]]] | None = None

    @property
    def order(self) -> GlobalOrder:
        return self.batches.order

    def batch(self, step: int) -> dict[str, np.ndarray]:
        if not self.grouped:
            return epoch_batch(self.batches, step, self.per_epoch)
        epoch, index = divmod(step, self.per_epoch)
        window, within = divmod(index, GROUP_WINDOW)
        if self._window is None or self._window[0] != (epoch, window):
            self._window = ((epoch, window), self._grouped_window(epoch, window))
        return rows_of_rank(self._window[1][within], self.world_size, self.rank)

    def _grouped_window(self, epoch: int, window: int) -> list[dict[str, np.ndarray]]:
        B, T = self.order.batch_size, self.order.total
        first = window * GROUP_WINDOW * B
        n = min(GROUP_WINDOW * B, T - first) // B * B
        records = self.batches.read_positions(np.arange(epoch * T + first, epoch * T + first + n, dtype=np.int64))
        by_length = np.argsort(records["input_mask"].sum(axis=1), kind="stable")
        key = derive_key(self.seed, "finetune-length-groups", self.order.fingerprint, epoch, window)
        draws = permutation(key, n // B)
        out = []
        for b in draws.tolist():
            rows = by_length[b * B:(b + 1) * B]
            out.append(trimmed({k: v[rows] for k, v in records.items()}, self.max_seq_length))
        return out


def trimmed(batch: dict[str, np.ndarray], max_seq_length: int) -> dict[str, np.ndarray]:
    """The batch cut to the shortest bucket length that holds its longest example: every per-token
    feature (those of ``max_seq_length`` values) loses padding columns no example uses."""
    longest = int(batch["input_mask"].sum(axis=1).max())
    length = next(n for n in bucket_lengths(max_seq_length) if n >= longest)
    return {k: v[:, :length] if v.ndim == 2 and v.shape[1] == max_seq_length else v for k, v in batch.items()}


def epoch_batch(batches: NumpyBatches, step: int, per_epoch: int) -> dict[str, np.ndarray]:
    """Fine-tuning's batch of training step ``step``: batch ``step mod per_epoch`` of its epoch, so
    every epoch is whole batches of one pass (an epoch's last, partial batch is left out)."""
    epoch, index = divmod(step, per_epoch)
    order = batches.order
    share = order.batch_size // batches.world_size
    start = epoch * order.total + index * order.batch_size + batches.rank * share
    return batches.read_positions(np.arange(start, start + share, dtype=np.int64))


def rows_of_rank(batch: dict[str, np.ndarray], world_size: int, rank: int) -> dict[str, np.ndarray]:
    """Rank ``rank``'s contiguous share of a whole global batch."""
    n = len(next(iter(batch.values())))
    share = n // world_size
    return {k: v[rank * share:(rank + 1) * share] for k, v in batch.items()}
