"""The reader of any dataset kind, and epochs of a chosen size (docs/loading.md).

`batches_for` gives the reader a training run of the split's kind uses: the pre-training global
order (`NumpyBatches`: unpacked or packed rows, static or dynamic masking, every feature the
manifest lists) or fine-tuning's batches for a task split (`TaskBatches`: epochs, length groups).

`Epochs` cuts a reader's step sequence into epochs of ``epoch_size`` samples, as MosaicML streaming's
``epoch_size`` does: epoch ``e`` is steps ``[e*n, (e+1)*n)`` with ``n = epoch_size / batch_size``.
The sequence itself does not change, so an epoch smaller than the data is the next ``n`` batches of
the shuffled stream (every record once before any comes again) and a larger one runs on into the
data's next pass; either way a pure function of the dataset's fingerprint, the seed and the batch
size, the same for any world size, and resumable at any step.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from bert_datagen.contract.bounds import ArgumentError, check_int, max_batches
from bert_datagen.contract.features import TASK
from bert_datagen.contract.loading.batches import NumpyBatches
from bert_datagen.contract.loading.order import DEFAULT_BLOCK_SIZE
from bert_datagen.contract.loading.source import Source
from bert_datagen.contract.loading.task_batches import BLOCK_SIZE, TaskBatches

Reader = NumpyBatches | TaskBatches


def batches_for(source: Source, *, seed: int, batch_size: int, world_size: int | None = None,
                rank: int | None = None, block_size: int | None = None, group_by_length: bool = False,
                start: int = 0, stop: int | None = None) -> Reader:
    """The reader of ``source``'s kind (see the module docstring); ``block_size`` is pre-training's
    (default 64), ``group_by_length`` fine-tuning's (ArgumentError, naming it, on the other kind);
    ``world_size`` and ``rank`` both or neither (one process)."""
    common = dict(seed=seed, batch_size=batch_size, world_size=world_size, rank=rank, start=start, stop=stop)
    if source.kind == TASK:
        if block_size not in (None, BLOCK_SIZE):
            raise ArgumentError("block_size", f"block_size {block_size!r}: fine-tuning's order of a task split "
                                f"reads blocks of {BLOCK_SIZE} record (a full shuffle each epoch)")
        return TaskBatches(source, group_by_length=group_by_length, **common)
    if group_by_length:
        raise ArgumentError("group_by_length", "group_by_length is fine-tuning's (task datasets); "
                            f"{source.root} is pre-training data")
    return NumpyBatches(source, block_size=DEFAULT_BLOCK_SIZE if block_size is None else block_size, **common)


def steps_per_epoch(epoch_size: int, batch_size: int) -> int:
    """The steps of an epoch of ``epoch_size`` samples; ArgumentError unless it is a positive
    multiple of the global batch size (an epoch is whole global batches, so that every rank and
    every world size sees the same epochs)."""
    check_int(epoch_size, "epoch_size", 1)
    if epoch_size % batch_size:
        raise ArgumentError("epoch_size", f"epoch_size {epoch_size} is not a multiple of the global batch size "
                            f"{batch_size}")
    check_int(epoch_size // batch_size, "epoch_size", 1, max_batches(batch_size),
              " batches (the positions of its steps fit in 64 bits)")
    return epoch_size // batch_size


def epoch_end(step: int, per_epoch: int, stop: int | None) -> int:
    """The step an iteration that is at ``step`` ends before: its epoch's end, or ``stop`` first."""
    end = (step // per_epoch + 1) * per_epoch
    return end if stop is None else min(end, stop)


class Epochs:
    """A reader (`batches_for`) in epochs of ``epoch_size`` samples: ``len()`` is the steps of an
    epoch, ``for batch in epochs`` gives the rest of the current epoch and stops (the next ``for``
    goes on with the next epoch), ``set_epoch(e)`` moves to the start of epoch ``e``. The position
    is the reader's step: ``state_dict``/``load_state_dict`` are the reader's."""

    def __init__(self, reader: Reader, epoch_size: int) -> None:
        self.reader = reader
        self.per_epoch = steps_per_epoch(epoch_size, reader.order.batch_size)
        self.epoch_size = epoch_size

    def __len__(self) -> int:
        return self.per_epoch

    @property
    def epoch(self) -> int:
        """The epoch the next batch belongs to."""
        return self.reader.step // self.per_epoch

    def set_epoch(self, epoch: int) -> None:
        check_int(epoch, "epoch", 0, (max_batches(self.reader.order.batch_size) - 1) // self.per_epoch)
        self.reader.step = epoch * self.per_epoch

    def __iter__(self) -> Iterator[dict[str, np.ndarray]]:
        reader = self.reader
        end = epoch_end(reader.step, self.per_epoch, reader.stop)
        while reader.step < end:
            batch = reader.batch_at(reader.step)
            reader.step += 1
            yield batch

    def state_dict(self) -> dict:
        return self.reader.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.reader.load_state_dict(state)
