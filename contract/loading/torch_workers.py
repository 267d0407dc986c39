"""DataLoader workers that hand batches to the training process a group at a time, for
`TorchBatches.loader` (docs/loading.md, "Workers"). Imports torch: only the adapter imports this.

What a plain ``DataLoader(ds, batch_size=None, num_workers=W)`` costs: each batch crosses from the
worker as one new shared-memory segment per feature (created, its pages faulted in and filled, its
descriptor sent, mapped: about three times a plain copy of the bytes), and worker ``w`` taking steps
``w, w + W, ...`` decodes the whole window share its batch is in, as every other worker does, so the
decoding is done ``W`` times. Measured: 3.5-12x slower than no workers.

Here a worker takes a *group* of consecutive steps: those that read one window of the order (a
pre-training window of ``block_size`` batches; a fine-tuning window of `GROUP_WINDOW` batches, which
`TaskBatches` reads at once). Worker ``w`` takes groups ``w, w + W, ...`` of the steps from the
loader's start, so each window is decoded once, by one worker; DataLoader takes one item from each
worker in turn, so the training process gets them in step order and cuts each back into batches
(views). A group crosses as one array per feature, in shared memory the worker fills itself, in the
narrowest dtype that holds its values exactly (token ids below 65,536 as 16 bits, masks and segment
ids as 8, 0/1 weights as 8-bit integers): about a third of the bytes. The training process widens
each array back to the reader's dtype, so the batches are bitwise the reader's.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from bert_datagen.contract.loading.batches import NumpyBatches

_NARROW = (np.uint8, np.int8, np.uint16, np.int16, np.int32)


def group_end(reader: Any, step: int) -> int:
    """The first step after the group of ``step``: the steps whose first record is in the window of
    ``step``'s first record (a fine-tuning reader says where its own windows end)."""
    if not isinstance(reader, NumpyBatches):
        return reader.group_end(step)
    o = reader.order
    window = o.batch_size * o.block_size
    epoch, offset = divmod(step * o.batch_size, o.total)
    end = epoch * o.total + min((offset // window + 1) * window, o.total)  # the window's last position + 1
    return -(-end // o.batch_size)


def group_arrays(reader: Any, start: int, end: int) -> tuple[list[dict[str, tuple[int, ...]]], dict[str, np.ndarray]]:
    """Steps ``[start, end)`` of the reader: each batch's feature shapes and, per feature, the
    batches' values end to end, flat (pre-training: one read of all the group's positions)."""
    if isinstance(reader, NumpyBatches):
        o = reader.order
        positions = np.concatenate([o.batch_positions(s, reader.world_size, reader.rank) for s in range(start, end)])
        share = o.batch_size // reader.world_size
        arrays = reader.read_positions(positions)
        shapes = [{k: (share, *v.shape[1:]) for k, v in arrays.items()}] * (end - start)
        return shapes, {k: v.reshape(-1) for k, v in arrays.items()}
    batches = [reader.batch_at(s) for s in range(start, end)]
    return ([{k: v.shape for k, v in b.items()} for b in batches],
            {k: np.concatenate([b[k].reshape(-1) for b in batches]) for k in batches[0]})


def _narrowed(values: np.ndarray) -> np.ndarray:
    """``values`` in the narrowest dtype that holds them exactly (themselves when none does)."""
    if not values.size:
        return values
    if values.dtype.kind == "f":
        bits = np.int32 if values.itemsize == 4 else np.int64
        small = values.astype(np.uint8)
        return small if (small.astype(values.dtype).view(bits) == values.view(bits)).all() else values
    low, high = int(values.min()), int(values.max())
    for dtype in _NARROW:
        if np.dtype(dtype).itemsize < values.itemsize and np.iinfo(dtype).min <= low and high <= np.iinfo(dtype).max:
            return values.astype(dtype)
    return values


def _keep(item: Any) -> Any:
    """DataLoader's collate_fn: items cross as they are (NumPy arrays, pickled through the worker's
    pipe) rather than as tensors (a new shared-memory segment each; see the module docstring)."""
    return item


class _Groups(IterableDataset):
    """Items: groups of steps ``[start, stop)`` (``stop`` None: no end), worker ``w`` of ``W`` taking
    every ``W``-th: (each batch's shapes, each feature's dtype, one narrowed flat tensor per feature)."""

    def __init__(self, reader: Any, start: int, stop: int | None) -> None:
        self.reader, self.start, self.stop = reader, start, stop

    def __iter__(self) -> Iterator[tuple[list, dict[str, str], dict[str, np.ndarray]]]:
        info = get_worker_info()
        worker, workers = (0, 1) if info is None else (info.id, info.num_workers)
        step, group = self.start, 0
        while self.stop is None or step < self.stop:
            end = group_end(self.reader, step)
            end = end if self.stop is None else min(end, self.stop)
            if group % workers == worker:
                shapes, flat = group_arrays(self.reader, step, end)
                yield shapes, {k: v.dtype.str for k, v in flat.items()}, {k: _narrowed(v) for k, v in flat.items()}
            step, group = end, group + 1


def _batches(item: tuple[list, dict[str, str], dict[str, np.ndarray]], pin: bool) -> Iterator[dict[str, torch.Tensor]]:
    """A group's batches, widened back to the reader's dtypes (views of one array per feature)."""
    shapes, dtypes, narrowed = item
    # NumPy's astype, not torch's: its large allocations are backed by huge pages, and page faults
    # are most of a widening's cost (measured: 4 ms against 23 ms for 30 MB of int16).
    flat = {k: torch.from_numpy(v.astype(np.dtype(dtypes[k]), copy=False)) for k, v in narrowed.items()}
    if pin:
        flat = {k: v.pin_memory() for k, v in flat.items()}
    at = dict.fromkeys(flat, 0)
    for batch_shapes in shapes:
        batch = {}
        for k, v in flat.items():
            shape = tuple(batch_shapes[k])
            size = int(np.prod(shape))
            batch[k] = v[at[k]:at[k] + size].view(shape)
            at[k] += size
        yield batch


def quiet_generator() -> torch.Generator:
    """The generator our DataLoaders draw their per-iteration base seed from. Without one, every
    ``iter()`` of a DataLoader takes a number from torch's global generator, the one dropout uses:
    a run resumed from its saved RNG state then starts a new iterator after the restore and drops
    out other units than the run that never stopped. Our batches use no torch randomness (the order
    comes from the dataset's seed), so a private generator changes nothing else."""
    return torch.Generator().manual_seed(0)


def grouped_batches(reader: Any, start: int, stop: int | None, num_workers: int,
                    **kwargs: Any) -> Iterator[dict[str, torch.Tensor]]:
    """Batches ``start, start + 1, ...`` (below ``stop``) of ``reader`` as dicts of tensors, in step
    order, decoded by ``num_workers`` DataLoader workers a group each (kwargs go to the DataLoader)."""
    pin = bool(kwargs.pop("pin_memory", False)) and torch.cuda.is_available()
    kwargs.setdefault("generator", quiet_generator())
    loader = DataLoader(_Groups(reader, start, stop), batch_size=None, num_workers=num_workers, collate_fn=_keep,
                        **kwargs)
    for item in loader:
        yield from _batches(item, pin)
