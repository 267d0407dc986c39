"""`bert-datagen batches TARGET --mix OTHER --weights 0.7,0.3`: the records of a global batch of a
weighted mixture (`contract/loading/mixture.py`), each with the dataset it came from and its place
in that dataset's own order."""

from __future__ import annotations

import numpy as np

from bert_datagen.contract.loading.mixture import MixedBatches
from bert_datagen.contract.loading.order import GlobalOrder
from bert_datagen.contract.loading.source import Source
from bert_datagen.datagen.record_layout import INSTANCE_KEY


def mixture_records(sources: list[Source], weights: list[float], seed: int, batch_size: int, step: int,
                    world_size: int, rank: int, block_size: int, window: int) -> list[dict]:
    """One dict per record of the share, in batch order: position, dataset (index and path), the
    position in the dataset's own order, epoch, shard, index, instance key."""
    mix = MixedBatches(sources, weights, seed=seed, batch_size=batch_size, world_size=world_size, rank=rank,
                       block_size=block_size, window=window)
    share = batch_size // world_size
    positions = np.arange(step * batch_size + rank * share, step * batch_size + (rank + 1) * share, dtype=np.int64)
    dataset, sub = mix.place(positions)
    rows = []
    for pos, d, p in zip(positions.tolist(), dataset.tolist(), sub.tolist(), strict=True):
        source = sources[d]
        placed = GlobalOrder(source.counts, source.fingerprint, seed, batch_size, block_size).place(np.array([p]))
        shard, index = int(placed.shard[0]), int(placed.index[0])
        row = {"position": pos, "dataset": d, "dataset_path": source.root, "dataset_position": p,
               "epoch": int(placed.epoch[0]), "shard": source.shards[shard].name, "shard_number": shard,
               "index": index}
        if source.has_instance_key:
            row[INSTANCE_KEY] = int(source.read(shard, index, index + 1)[INSTANCE_KEY][0, 0]) & ((1 << 64) - 1)
        rows.append(row)
    return rows
