"""A rank's shares as a PyTorch DataLoader that Hugging Face `Trainer` and `accelerate` use as is.

`share_loader` is a ``DataLoader`` over a map-style dataset of the run's global positions, with a
batch sampler that hands out this rank's share of global batches ``start, start + 1, ...``: the
sampler lives in the consuming process, so with ``num_workers`` the batches still come in step
order, and the loader counts the batches it has handed out (``state_dict()`` is right after any
of them, whatever the workers have read ahead).

Why not `accelerator.prepare` it: accelerate re-shards any DataLoader it prepares (alternate batches
per rank, or rank 0's batches cut and sent round), which is how a 2-rank Trainer ends up training on
the wrong data. A share loader is marked as prepared already, so ``accelerator.prepare(model, opt,
loader)`` and Trainer hand it back untouched and each rank trains on its own share. Trainer moves
the batches to its device itself; with plain accelerate pass ``device=accelerator.device``.

Every fetch checks that the positions asked for are exactly this rank's share of one global batch,
so a loader wired any other way (a DataLoader of our own with a batch size, a sampler wrapped by
accelerate, a dispatching loader) is an error naming what to use, never a silent re-cut.

A task split is read in fine-tuning's order (`TaskBatches`: what `bert-train finetune` reads at each
step, its epochs and length groups): the loader's "positions" of step ``s`` then only name the step,
and a fetch is this rank's share of fine-tuning's batch ``s``. The loader has epochs: ``len()`` is the
steps an iteration gives (the rest of the current epoch), each iteration ends at its epoch's end, and
``set_epoch(e)`` (which Trainer calls, on the loader or, on resume, on the sampler under its skip)
moves to epoch ``e``'s first step, so Trainer's epochs are fine-tuning's.

Only this module and `torch_adapter` import torch; nothing of ours imports them.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Protocol

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, Sampler

from bert_datagen.contract.bounds import ArgumentError, check_int, max_batches
from bert_datagen.contract.features import TASK
from bert_datagen.contract.loading.batches import NumpyBatches
from bert_datagen.contract.loading.hf import TASK_LABELS, hf_inputs
from bert_datagen.contract.loading.kinds import batches_for, epoch_end
from bert_datagen.contract.loading.order import check_step, check_world
from bert_datagen.contract.loading.source import LoadError, Source
from bert_datagen.contract.loading.task_batches import TaskBatches
from bert_datagen.contract.loading.torch_adapter import torch_world
from bert_datagen.contract.loading.torch_workers import quiet_generator
from bert_datagen.contract.manifest import Manifest, ManifestError

_WHOLE_BATCHES = ("share_loader(...) hands out whole batches of this rank's share: iterate it as it is "
                  "(Trainer: return it from get_train_dataloader; accelerate: it passes prepare() untouched)")


class PositionReader(Protocol):
    """What a share loader reads from: `NumpyBatches` or a mixture (`mixture.MixedBatches`)."""

    @property
    def batch_size(self) -> int: ...

    def read_positions(self, positions: np.ndarray) -> dict[str, np.ndarray]: ...

    def state_dict(self) -> dict: ...

    def load_state_dict(self, state: dict) -> None: ...


class _NumpyReader:
    """`NumpyBatches` as a PositionReader (its step is the loader's, not the iterator's)."""

    def __init__(self, batches: NumpyBatches) -> None:
        self.batches = batches

    @property
    def batch_size(self) -> int:
        return self.batches.order.batch_size

    def read_positions(self, positions: np.ndarray) -> dict[str, np.ndarray]:
        return self.batches.read_positions(positions)

    def state_dict(self) -> dict:
        return self.batches.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.batches.load_state_dict(state)


class _TaskReader:
    """`TaskBatches` as a PositionReader: the loader's positions of step ``s`` name the step, and read
    this rank's share of fine-tuning's batch ``s`` (`ShareRecords` has checked they are the share)."""

    def __init__(self, batches: TaskBatches) -> None:
        self.batches = batches
        self.per_epoch = batches.per_epoch  # the loader's epochs are fine-tuning's

    @property
    def batch_size(self) -> int:
        return self.batches.order.batch_size

    def read_positions(self, positions: np.ndarray) -> dict[str, np.ndarray]:
        return self.batches.batch_at(int(positions[0]) // self.batch_size)

    def state_dict(self) -> dict:
        return self.batches.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.batches.load_state_dict(state)


def _check_trainable(source: Source) -> None:
    """LoadError unless the task split holds its type's training labels, as `bert-train finetune`
    requires: a split written without them (an unlabelled test split's label_ids are zeros, a span
    split written to predict on has no answer positions) would train on labels that are not there."""
    try:
        manifest = Manifest.load(source.root, source.fs)
        task_type = manifest.task["type"]  # type: ignore[index]
        labelled = manifest.splits[source.split].labelled
    except (ManifestError, OSError, KeyError, TypeError) as e:
        raise LoadError(f"{source.root}: cannot read the task's type and labels from its manifest: {e}") from e
    if task_type not in TASK_LABELS:
        raise LoadError(f"{source.root}: task type {task_type!r} is not one of {', '.join(TASK_LABELS)}")
    missing = [name for name in TASK_LABELS[task_type] if name not in source.spec]
    if not labelled or missing:
        why = "is not labelled" if not labelled else f"has no {' or '.join(missing)} (it was written to predict on)"
        raise LoadError(f"{source.root}: split {source.split!r} of this {task_type} task {why}: a share loader "
                        "trains on it; read a split written for training (bert-datagen task --train-splits)")


class ShareRecords(Dataset):
    """The records of the run's global positions; a fetch is one rank's share of one global batch."""

    def __init__(self, reader: PositionReader, world_size: int, rank: int, hf: bool, nsp: bool) -> None:
        check_world(reader.batch_size, world_size, rank)
        self.reader, self.world_size, self.rank, self.hf, self.nsp = reader, world_size, rank, hf, nsp
        self.share = reader.batch_size // world_size

    def __len__(self) -> int:
        raise TypeError(f"a share dataset has no length to sample from: {_WHOLE_BATCHES}")

    def __getitem__(self, index: int) -> Any:
        raise TypeError(f"a share dataset is read a share at a time, not record {index}: {_WHOLE_BATCHES}")

    def __getitems__(self, positions: list[int]) -> dict[str, torch.Tensor]:
        pos = np.asarray(positions, np.int64)
        B = self.reader.batch_size
        step = int(pos[0]) // B if len(pos) else -1
        first = step * B + self.rank * self.share
        if len(pos) != self.share or not (pos == np.arange(first, first + self.share)).all():
            raise ValueError(f"rank {self.rank} of {self.world_size} was asked for positions {pos[:3].tolist()}... "
                             f"({len(pos)} of them), not its share of a global batch of {B}: the loader was "
                             f"re-cut (a batch size, a sampler of another, accelerate's re-sharding); {_WHOLE_BATCHES}")
        batch = self.reader.read_positions(pos)
        if self.hf:
            batch = hf_inputs(batch, nsp=self.nsp)
        return {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in batch.items()}


class ShareSampler(Sampler[list[int]]):
    """This rank's positions of global batches ``start, start + 1, ...`` (below ``stop``; with
    ``per_epoch``, below the end of ``start``'s epoch too)."""

    def __init__(self, batch_size: int, world_size: int, rank: int, start: int, stop: int | None,
                 per_epoch: int | None = None) -> None:
        self.batch_size, self.world_size, self.rank = batch_size, world_size, rank
        self.start, self.stop, self.per_epoch = start, stop, per_epoch

    def count(self, start: int) -> int:
        """The batches an iteration from step ``start`` gives (TypeError when it has no end)."""
        end = self._end(start)
        if end is None:
            raise TypeError("an endless share sampler has no length (give stop=... for one)")
        return max(end - start, 0)

    def _end(self, start: int) -> int | None:
        return self.stop if self.per_epoch is None else epoch_end(start, self.per_epoch, self.stop)

    def set_epoch(self, epoch: int) -> None:
        """Start at epoch ``epoch``'s first step (only a loader with epochs: the pre-training stream has none)."""
        if self.per_epoch is not None:
            self.start = check_int(epoch, "epoch", 0, (max_batches(self.batch_size) - 1) // self.per_epoch) * self.per_epoch

    def __iter__(self) -> Iterator[list[int]]:
        share = self.batch_size // self.world_size
        step, end = self.start, self._end(self.start)
        while end is None or step < end:
            first = step * self.batch_size + self.rank * share
            yield list(range(first, first + share))
            step += 1

    def __len__(self) -> int:
        return self.count(self.start)


def _whole(batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return batch  # the dataset already returns the batch: nothing to collate


class ShareLoader(DataLoader):
    """See the module docstring. ``step`` is the next global batch it will hand out."""

    _is_accelerate_prepared = True  # accelerate's own mark: prepare() returns it as it is

    def __init__(self, reader: PositionReader, *, world_size: int, rank: int, start: int = 0, stop: int | None = None,
                 hf: bool = True, nsp: bool = True, device: Any = None, **kwargs: Any) -> None:
        for taken in ("batch_size", "batch_sampler", "sampler", "shuffle", "collate_fn", "drop_last"):
            if taken in kwargs:
                raise TypeError(f"share_loader takes no {taken}: the global order makes the batches")
        check_step(start, reader.batch_size)
        if stop is not None:
            check_int(stop, "stop", 0, max_batches(reader.batch_size))
        self.reader = reader
        self.step = start
        self.device = device
        sampler = ShareSampler(reader.batch_size, world_size, rank, start, stop, getattr(reader, "per_epoch", None))
        kwargs.setdefault("generator", quiet_generator())
        super().__init__(ShareRecords(reader, world_size, rank, hf, nsp), collate_fn=_whole, batch_sampler=sampler,
                         **kwargs)

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:  # type: ignore[override]
        self.batch_sampler.start = self.step  # a new pass continues where the last one stopped
        for batch in super().__iter__():
            self.step += 1
            yield batch if self.device is None else {k: v.to(self.device) for k, v in batch.items()}

    def __len__(self) -> int:
        """The batches an iteration that starts now gives (TypeError for an endless stream)."""
        return self.batch_sampler.count(self.step)

    def set_epoch(self, epoch: int) -> None:
        """A task split's loader: the next batch is epoch ``epoch``'s first (Trainer calls it at
        each epoch). The pre-training stream has no epochs: nothing changes."""
        sampler = self.batch_sampler
        sampler.set_epoch(epoch)
        if sampler.per_epoch is not None:
            self.step = sampler.start

    def state_dict(self) -> dict:
        state = self.reader.state_dict()
        state["step"] = self.step
        return state

    def load_state_dict(self, state: dict) -> None:
        self.reader.load_state_dict(state)
        self.step = int(state["step"])


def share_loader(source: Source | TaskBatches | PositionReader, *, seed: int | None = None,
                 batch_size: int | None = None, world_size: int | None = None, rank: int | None = None,
                 block_size: int | None = None, group_by_length: bool = False, start: int = 0,
                 stop: int | None = None, hf: bool = True, nsp: bool = True, device: Any = None,
                 **kwargs: Any) -> ShareLoader:
    """This rank's shares of the global batches ``start ..`` (``stop``), as Hugging Face inputs
    (``hf=False``: our feature names). ``source`` is a `Source` (then ``seed`` and the global
    ``batch_size``) or a reader already made (a mixture, a `TaskBatches` of this rank); a task split
    is read in fine-tuning's order (``group_by_length`` as `bert-train finetune --group-by-length`;
    ``block_size`` is pre-training's, default 64). ``world_size``/``rank`` default to
    torch.distributed's. Other keyword arguments (``num_workers``, ``pin_memory``,
    ``multiprocessing_context``, ...) go to the DataLoader."""
    world_size, rank = torch_world(world_size, rank)
    if isinstance(source, Source):
        if seed is None or batch_size is None:
            raise TypeError("share_loader(source, ...) needs seed= and batch_size= (the global batch)")
        task = source.kind == TASK
        # A pre-training reader is asked for positions, so it is the whole run's (world 1).
        made = batches_for(source, seed=seed, batch_size=batch_size, world_size=world_size if task else 1,
                           rank=rank if task else 0, block_size=block_size, group_by_length=group_by_length)
        if task:
            _check_trainable(source)
        source = made
    elif group_by_length:
        raise ArgumentError("group_by_length", "group_by_length is a task split's, given with its Source (a reader "
                            "already made keeps its own)")
    elif batch_size is not None and batch_size != _batch_size(source):
        raise ArgumentError("batch_size", f"batch_size {batch_size} for a reader made with a global batch of "
                            f"{_batch_size(source)}: make the reader with the batch the run trains on")
    if isinstance(source, TaskBatches):
        if (source.world_size, source.rank) != (world_size, rank):
            raise ArgumentError("rank", f"a TaskBatches of rank {source.rank} of {source.world_size} in the loader "
                                f"of rank {rank} of {world_size}: it reads that rank's shares")
        reader: PositionReader = _TaskReader(source)
    elif isinstance(source, NumpyBatches):
        reader = _NumpyReader(source)
    else:
        reader = source
    return ShareLoader(reader, world_size=world_size, rank=rank, start=start, stop=stop, hf=hf, nsp=nsp,
                       device=device, **kwargs)


def _batch_size(reader: Any) -> int:
    order = getattr(reader, "order", None)
    return int(order.batch_size if order is not None else reader.batch_size)


def trainer_loader(args: Any, source: Source | PositionReader, *, seed: int, block_size: int | None = None,
                   group_by_length: bool = False, stop: int | None = None, hf: bool = True,
                   nsp: bool = True) -> ShareLoader:
    """The training loader of a `transformers.Trainer` run with TrainingArguments ``args``: global
    batch ``per_device_train_batch_size x world_size``, this process's share, the run's DataLoader
    settings. Return it from ``get_train_dataloader``; on resume Trainer skips the batches it has
    trained on by their positions (nothing is read for them). Pre-training: set ``max_steps`` (the
    loader is endless unless ``stop`` is given). A task split: Trainer's epochs are fine-tuning's
    (``num_train_epochs`` or ``max_steps``)."""
    task = isinstance(source, TaskBatches) or (isinstance(source, Source) and source.kind == TASK)
    if task and args.gradient_accumulation_steps != 1:
        raise ArgumentError("gradient_accumulation_steps", (
            f"gradient_accumulation_steps {args.gradient_accumulation_steps}: each optimizer step would take that "
            "many consecutive fine-tuning batches, an order no bert-train finetune run reads (its "
            "--accumulation-steps splits one batch); set it to 1 and the global batch with "
            "per_device_train_batch_size"))
    batch_size = args.per_device_train_batch_size * args.world_size
    options: dict[str, Any] = {"num_workers": args.dataloader_num_workers, "pin_memory": args.dataloader_pin_memory}
    if args.dataloader_num_workers:
        options.update(persistent_workers=args.dataloader_persistent_workers,
                       prefetch_factor=args.dataloader_prefetch_factor,
                       multiprocessing_context=args.dataloader_multiprocessing_context)
    return share_loader(source, seed=seed, batch_size=batch_size, world_size=args.world_size,
                        rank=args.process_index, block_size=block_size, group_by_length=group_by_length, stop=stop,
                        hf=hf, nsp=nsp, **options)
