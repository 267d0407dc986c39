"""Map-style access to a split: ``len(records)`` and ``records[i]``, record ``i`` of the split decoded
(docs/loading.md), as MosaicML streaming's ``len(ds)`` / ``ds[i]`` offer.

Record ``i`` counts through the split's shards in manifest order (shard 0's records, then shard
1's, ...), the order `bert-datagen inspect` shows. A record is what the readers decode (every
feature the manifest lists, integers as int32 except a 64-bit ``instance_key``, floats float32), one
value array per feature without the batch dimension; a slice or a sequence of indices gives a batch
(arrays with a leading dimension). Records of dynamic-masking data are as stored, unmasked: their
masks are drawn per epoch of a run (the batch readers apply them). The object is picklable and keeps
no open file, so it can be given to a ``torch.utils.data.DataLoader`` as a map-style dataset with
any sampler.
"""

from __future__ import annotations

import numbers
from collections.abc import Sequence

import numpy as np

from bert_datagen.contract.loading.source import Source


class SplitRecords:
    """``len()`` records; ``[i]`` (negative counts from the end), ``[a:b:c]`` or ``[[i, j, ...]]``."""

    def __init__(self, source: Source) -> None:
        self.source = source
        self._firsts = np.concatenate([[0], np.cumsum(source.counts)]).astype(np.int64)

    def __len__(self) -> int:
        return int(self._firsts[-1])

    def __getitem__(self, key: int | slice | Sequence[int] | np.ndarray) -> dict[str, np.ndarray]:
        if isinstance(key, numbers.Integral) and not isinstance(key, bool):
            i = int(key) + len(self) if key < 0 else int(key)
            if not 0 <= i < len(self):
                raise IndexError(f"record {int(key)} is not in the split's {len(self)} records")
            return {k: v[0] for k, v in self._read(np.array([i], np.int64)).items()}
        if isinstance(key, slice):
            return self._read(np.arange(*key.indices(len(self)), dtype=np.int64))
        indices = np.asarray(key)
        if indices.ndim != 1 or (indices.size and not np.issubdtype(indices.dtype, np.integer)):
            raise TypeError(f"records are indexed by an integer, a slice or a list of integers, not {key!r}")
        indices = np.where(indices < 0, indices + len(self), indices).astype(np.int64)
        if indices.size and (indices.min() < 0 or indices.max() >= len(self)):
            raise IndexError(f"records {indices.min()} .. {indices.max()} are not all in the split's {len(self)} records")
        return self._read(indices)

    def _read(self, indices: np.ndarray) -> dict[str, np.ndarray]:
        """The records at these split indices, in the order given: one decode call, each shard's
        records read in file order as runs of consecutive records."""
        if not len(indices):
            return self.source.read_ranges([], model_inputs=True)
        by_file = np.argsort(indices, kind="stable")
        ordered = indices[by_file]
        shard = np.searchsorted(self._firsts, ordered, side="right") - 1
        index = ordered - self._firsts[shard]
        run = np.flatnonzero(np.concatenate([[True], (np.diff(ordered) != 1) | (np.diff(shard) != 0)]))
        length = np.diff(np.append(run, len(ordered)))
        ranges = np.stack([shard[run], index[run], index[run] + length], axis=1)
        rows = np.empty(len(indices), np.int64)
        rows[by_file] = np.arange(len(indices))
        return self.source.read_ranges(ranges, model_inputs=True, order=rows)
