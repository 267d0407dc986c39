"""A PyTorch ``IterableDataset`` over the reader of the split's kind (`readers.batches_for`:
`NumpyBatches`, or fine-tuning's `TaskBatches` for a task split). torch is an optional extra: only
the glue modules import it (`tests/project/test_optional_frameworks.py`), and nothing else of ours
imports them.

Each item is one batch (a dict of tensors), so use it with ``DataLoader(ds, batch_size=None)``;
ranks are DistributedSampler-style (``world_size``/``rank``, from torch.distributed when it is
initialised). With workers, iterate ``ds.loader(num_workers=W)``: each worker takes the batches of a
window of the order at a time and hands them over together (`torch_workers`), DataLoader takes one
item from each worker in turn, so batches come out in step order for any W, and the position that
``state_dict()`` reports is counted where batches are consumed (worker processes cannot tell the
parent how far they are). A DataLoader of one's own that would lose the position (workers) or wrap
every batch in another dimension (a ``batch_size``) is refused with the reason. For Hugging Face
Trainer and accelerate see `torch_shares`.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from types import FrameType
from typing import Any

import torch
from torch.utils.data import IterableDataset, get_worker_info

from bert_datagen.contract.loading.kinds import batches_for, epoch_end, steps_per_epoch
from bert_datagen.contract.loading.source import Source
from bert_datagen.contract.loading.stepping import world_and_rank
from bert_datagen.contract.loading.torch_workers import grouped_batches


def torch_world(world_size: int | None, rank: int | None) -> tuple[int, int]:
    """The world size and rank given, else torch.distributed's when it is initialised, else (1, 0);
    one without the other is an ArgumentError naming the missing one (`stepping.world_and_rank`)."""
    world_size, rank = world_and_rank(world_size, rank, "torch.distributed's when it is initialised, else one "
                                      "process reading whole batches")
    if world_size is not None and rank is not None:
        return world_size, rank
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size(), dist.get_rank()
    return 1, 0


def torch_batches(source: Source, *, seed: int, batch_size: int, world_size: int | None = None,
                  rank: int | None = None, block_size: int | None = None, start: int = 0,
                  stop: int | None = None, group_by_length: bool = False,
                  epoch_size: int | None = None) -> TorchBatches:
    """The adapter; ``world_size``/``rank`` default to torch.distributed's, else one process. The
    reader is the split's kind's (`readers.batches_for`: pre-training's global order, or fine-tuning's
    batches of a task split, ``group_by_length`` as `bert-train finetune --group-by-length`);
    ``epoch_size`` (samples, a multiple of ``batch_size``): ``len(ds)`` is the steps of an epoch and
    each iteration gives the rest of the current epoch (`readers.Epochs`)."""
    world_size, rank = torch_world(world_size, rank)
    return TorchBatches(source, seed=seed, batch_size=batch_size, world_size=world_size, rank=rank,
                        block_size=block_size, start=start, stop=stop, group_by_length=group_by_length,
                        epoch_size=epoch_size)


class TorchBatches(IterableDataset):
    """A rank's batches as dicts of tensors (see the module docstring)."""

    def __init__(self, source: Source, epoch_size: int | None = None, **kwargs: Any) -> None:
        self._numpy = batches_for(source, **kwargs)  # holds the position; workers copy it
        self._counted = False  # set while a counting loader iterates: workers copy it, so they know the parent counts
        self._per_epoch = None if epoch_size is None else steps_per_epoch(epoch_size, self._numpy.order.batch_size)

    def __len__(self) -> int:
        """The steps of an epoch (only with ``epoch_size``: without one the stream has no epochs
        of whole batches)."""
        if self._per_epoch is None:
            raise TypeError("this TorchBatches has no len(): give torch_batches an epoch_size")
        return self._per_epoch

    def _end(self) -> int | None:
        """Where an iteration that starts now stops: the epoch's end (with epoch_size), or stop."""
        it = self._numpy
        return it.stop if self._per_epoch is None else epoch_end(it.step, self._per_epoch, it.stop)

    def __iter__(self) -> Iterator[dict]:
        _refuse_wrapping(sys._getframe(1))
        info = get_worker_info()
        if info is not None and not self._counted:
            raise RuntimeError("TorchBatches in a DataLoader with workers: the workers cannot report how far they "
                               "are, so state_dict() would lose the position; iterate ds.loader(num_workers=...) "
                               "or torch_shares.share_loader(...), which count the batches handed out")
        return self._batches(info)

    def _batches(self, info: Any) -> Iterator[dict]:
        it = self._numpy
        end = self._end()
        if info is None:  # in the consuming process: count as we go
            while end is None or it.step < end:
                batch = it.batch_at(it.step)
                it.step += 1
                yield {k: torch.from_numpy(v) for k, v in batch.items()}
            return
        step = it.step + info.id
        while end is None or step < end:
            yield {k: torch.from_numpy(v) for k, v in it.batch_at(step).items()}
            step += info.num_workers

    def loader(self, num_workers: int = 0, **kwargs: Any) -> Iterator[dict]:
        """Batches through a DataLoader with ``num_workers`` workers, in step order; the position
        advances as they are consumed, so ``state_dict()`` is right after any of them. Workers take
        a window's batches each and hand them over together (`torch_workers`)."""
        if num_workers == 0:
            yield from self
            return
        for batch in grouped_batches(self._numpy, self._numpy.step, self._end(), num_workers, **kwargs):
            self._numpy.step += 1
            yield batch

    def state_dict(self) -> dict:
        return self._numpy.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self._numpy.load_state_dict(state)


def _refuse_wrapping(caller: FrameType | None) -> None:
    """Refuse a DataLoader that batches our items: each item is a whole batch already, and default
    collation would stack ``batch_size`` of them into a new leading dimension without a word. The
    fetcher that calls ``iter(dataset)`` says whether it collates (torch's own attribute; a fetcher
    of another shape passes)."""
    fetcher = caller.f_locals.get("self") if caller is not None else None
    if getattr(fetcher, "auto_collation", False) and getattr(fetcher, "dataset", None) is not None:
        raise TypeError("each item of TorchBatches is a whole batch: DataLoader(ds, batch_size=N) would stack N "
                        "of them into one more dimension; use DataLoader(ds, batch_size=None) or ds.loader(...)")
