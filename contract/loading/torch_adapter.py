"""A PyTorch ``IterableDataset`` over `NumpyBatches`. torch is an optional extra: only this module
imports it, and nothing else in the project imports this module.

Each item is one batch (a dict of tensors), so use it with ``DataLoader(ds, batch_size=None)``.
With ``num_workers=W`` worker ``w`` computes the rank's batches ``start + w, start + w + W, ...``
and DataLoader takes one item from each worker in turn, so batches come out in step order for any
W; ranks are DistributedSampler-style (``world_size``/``rank``, from torch.distributed when it is
initialised). Worker processes cannot tell the parent how far they are, so the position that
``state_dict()`` reports is counted where batches are consumed: iterate ``ds.loader(...)`` (a
DataLoader that counts) or the dataset itself (no workers). A DataLoader of one's own that would
lose the position (workers) or wrap every batch in another dimension (a ``batch_size``) is refused
with the reason. For Hugging Face Trainer and accelerate see `torch_shares`.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from types import FrameType
from typing import Any

import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from bert_datagen.contract.loading.batches import NumpyBatches
from bert_datagen.contract.loading.order import DEFAULT_BLOCK_SIZE
from bert_datagen.contract.loading.source import Source


def _world(world_size: int | None, rank: int | None) -> tuple[int, int]:
    if world_size is not None and rank is not None:
        return world_size, rank
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size(), dist.get_rank()
    return 1, 0


def torch_batches(source: Source, *, seed: int, batch_size: int, world_size: int | None = None,
                  rank: int | None = None, block_size: int = DEFAULT_BLOCK_SIZE, start: int = 0,
                  stop: int | None = None) -> TorchBatches:
    """The adapter; ``world_size``/``rank`` default to torch.distributed's, else one process."""
    world_size, rank = _world(world_size, rank)
    return TorchBatches(source, seed=seed, batch_size=batch_size, world_size=world_size, rank=rank,
                        block_size=block_size, start=start, stop=stop)


class TorchBatches(IterableDataset):
    """A rank's batches as dicts of tensors (see the module docstring)."""

    def __init__(self, source: Source, **kwargs: Any) -> None:
        self._numpy = NumpyBatches(source, **kwargs)  # holds the position; workers copy it
        self._counted = False  # set while loader() iterates: workers copy it, so they know the parent counts

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
        if info is None:  # in the consuming process: count as we go
            for batch in it:
                yield {k: torch.from_numpy(v) for k, v in batch.items()}
            return
        for batch in it.steps(it.step + info.id, info.num_workers):
            yield {k: torch.from_numpy(v) for k, v in batch.items()}

    def loader(self, num_workers: int = 0, **kwargs: Any) -> Iterator[dict]:
        """Batches through a DataLoader with ``num_workers`` workers, in step order; the position
        advances as they are consumed, so ``state_dict()`` is right after any of them."""
        if num_workers == 0:
            yield from self
            return
        self._counted = True
        try:
            dl = DataLoader(self, batch_size=None, num_workers=num_workers, **kwargs)
            iterator = iter(dl)  # the workers take their copies now
        finally:
            self._counted = False
        for batch in iterator:
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
