"""Issue #43 point 7: each rank fetches its share. Over a whole epoch of a dataset whose epoch ends
in a partial window (read before as whole chunks by every rank: 1.75x the share at 4 ranks, 4.7x
at 16), and over the next epoch (which starts inside a global batch, so a full window's slots are
shifted), every rank of 1, 4 and 16 fetches at most 1.1x its share, record and index bytes together:
a rank reads the index lines of its own records, a block at a time, each block checked against its
digest (before, the whole index of every shard on every rank: 1.235x at 16 ranks). Records of 128
tokens, as pre-training's (the index is then 1.4% of the data), in the default blocks of 64."""

from __future__ import annotations

import numpy as np
import pytest

from bert_datagen.contract.loading.batches import NumpyBatches
from bert_datagen.contract.loading.order import DEFAULT_BLOCK_SIZE
from bert_datagen.contract.loading.source import open_source
from tests.support.counting_fs import CountingFS
from tests.support.synthetic import write_synthetic_dataset

B, BS, SEED = 32, DEFAULT_BLOCK_SIZE, 5
SHARDS, PER_SHARD = 3, 1500  # 4,500 records: 2 full windows of 2,048 and a tail window of 404 per epoch
RECORDS = {"seq_len": 128, "max_pred": 20, "vocab_size": 30522}


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> str:
    return write_synthetic_dataset(str(tmp_path_factory.mktemp("ds")), train_shards=SHARDS,
                                   records_per_shard=PER_SHARD, eval_records=0, **RECORDS)


def _steps(total: int, epochs: tuple[int, int]) -> tuple[int, int]:
    """The global batches wholly inside epochs ``[first, end)``."""
    return -(-epochs[0] * total // B), epochs[1] * total // B


def _epoch_bytes(dataset: str, world: int, rank: int, epochs: tuple[int, int], prefetch: bool,
                 ) -> tuple[CountingFS, float, int]:
    """A rank's reads over the global batches of these epochs: the counting filesystem, the rank's
    share of the record bytes, and the rows it was handed."""
    fs = CountingFS()
    source = open_source(dataset, fs=fs)
    total = sum(source.counts)
    start, stop = _steps(total, epochs)
    rows = sum(len(b["input_ids"]) for b in NumpyBatches(source, seed=SEED, batch_size=B, block_size=BS,
                                                          world_size=world, rank=rank, start=start,
                                                          stop=stop, prefetch=prefetch))
    data_bytes = sum(s.expected.bytes for s in source.shards)
    return fs, data_bytes * (stop - start) * B / total / world, rows


# Epoch 1 starts inside a global batch: its full windows' slots are shifted, and a run resumed
# there reads none of epoch 0's tail; over both, the batch that straddles them is read once.
@pytest.mark.parametrize("epochs", [(0, 1), (1, 2), (0, 2)], ids=["epoch0", "epoch1", "epochs0-1"])
@pytest.mark.parametrize("world", [1, 4, 16])
def test_every_rank_fetches_at_most_1_1x_its_share_over_an_epoch_with_a_partial_window(dataset, world, epochs):
    source = open_source(dataset)
    total = sum(source.counts)
    assert total % (B * BS), "the epoch must end in a partial window"
    index_bytes = sum(s.index[1].bytes for s in source.shards)
    worst = 0.0
    for rank in range(world):
        fs, share, rows = _epoch_bytes(dataset, world, rank, epochs, prefetch=rank % 2 == 0)
        start, stop = _steps(total, epochs)
        assert rows == (stop - start) * B // world
        worst = max(worst, (fs.record_bytes + fs.index_bytes) / share)
        # Never more than the whole index (its lines read once each), and a share of it on many ranks.
        assert fs.index_bytes <= index_bytes * 1.02 and (world < 16 or fs.index_bytes < index_bytes / 2)
    assert worst <= 1.1, f"world {world}, epochs {epochs}: a rank fetched {worst:.3f}x its share"


def test_the_tail_window_is_read_as_this_ranks_records_only(dataset):
    """The last window's records are one permutation: a rank reads the records at its positions."""
    source = open_source(dataset)
    total = sum(source.counts)
    tail_first_batch = (total // (B * BS)) * BS  # the first batch wholly in the tail window
    read: list[set[tuple[int, int]]] = []
    for rank in range(4):
        reader = NumpyBatches(open_source(dataset), seed=SEED, batch_size=B, block_size=BS, world_size=4,
                              rank=rank, start=tail_first_batch, stop=total // B, prefetch=False)
        got: set[tuple[int, int]] = set()
        real = reader.source.fetch

        def counting(ranges, *args, real=real, got=got, **kwargs):
            for shard, first, end in np.asarray(ranges).reshape(-1, 3).tolist():
                assert not got & {(shard, i) for i in range(first, end)}, "a record fetched twice"
                got.update((shard, i) for i in range(first, end))
            return real(ranges, *args, **kwargs)

        reader.source.fetch = counting
        list(reader)
        read.append(got)
        wanted = reader.order.place(np.concatenate([reader.order.batch_positions(s, 4, rank)
                                                    for s in range(tail_first_batch, total // B)]))
        assert got == set(zip(wanted.shard.tolist(), wanted.index.tolist(), strict=True))
    assert not any(read[a] & read[b] for a in range(4) for b in range(a + 1, 4))


@pytest.fixture(scope="module")
def second(tmp_path_factory) -> str:
    return write_synthetic_dataset(str(tmp_path_factory.mktemp("ds2")), train_shards=2, records_per_shard=1100,
                                   eval_records=0, seed=3, **RECORDS)


@pytest.mark.parametrize("world", [1, 4, 16])
def test_every_rank_of_a_mixture_fetches_at_most_1_1x_its_share(dataset, second, world):
    """A mixture's rank shares are not its datasets' chunk slots: each rank reads the records at its
    positions, whichever dataset they are in (read before as those datasets' whole windows: about
    N times the share)."""
    from bert_datagen.contract.loading.mixture import MixedBatches

    steps = 2 * (SHARDS * PER_SHARD) // B  # past an epoch of both datasets
    worst, worst_records = 0.0, 0.0
    whole_index = sum(s.index[1].bytes for p in (dataset, second) for s in open_source(p).shards)
    for rank in range(world):
        counting = [CountingFS(), CountingFS()]
        sources = [open_source(p, fs=fs) for p, fs in zip((dataset, second), counting, strict=True)]
        mix = MixedBatches(sources, [0.6, 0.4], seed=SEED, batch_size=B, block_size=BS, world_size=world,
                           rank=rank, stop=steps, window=256, prefetch=rank % 2 == 0)
        labels = np.concatenate([b["mixture_dataset"] for b in mix])
        assert len(labels) == steps * B // world
        share = sum(sum(s.expected.bytes for s in src.shards) / sum(src.counts) * int((labels == d).sum())
                    for d, src in enumerate(sources))
        worst = max(worst, sum(fs.record_bytes + fs.index_bytes for fs in counting) / share)
        worst_records = max(worst_records, sum(fs.record_bytes for fs in counting) / share)
        assert sum(fs.index_bytes for fs in counting) <= whole_index * 1.02
    assert worst_records <= 1.1, f"world {world}: a rank of a mixture fetched {worst_records:.3f}x its share of records"
    # A rank's records are scattered over each dataset's windows (a mixture's rank shares are not a
    # dataset's chunk slots), so its index lines are nearly all of them: 1.4% of the data, a fixed
    # cost per rank that passes a tenth of the share beyond 7 ranks (docs/loading.md).
    if world <= 4:
        assert worst <= 1.1, f"world {world}: a rank of a mixture fetched {worst:.3f}x its share"
