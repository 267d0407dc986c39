"""Each JAX host's share of the global batches as global `jax.Array`s, read ahead on a thread.

Under ``jax.distributed`` every process reads only its own share (`NumpyBatches` with world size
``jax.process_count()``) and `jax.make_array_from_process_local_data` joins the shares into arrays
of the global batch, laid out by a sharding of the batch dimension. Which share a process reads
follows the sharding: the rows its devices hold must be one whole share (``B / processes``
consecutive rows of the global batch), else it is refused (a mesh whose devices interleave hosts
would put one host's records in another host's rows). The default sharding splits the batch over
``jax.devices()`` in order, so process ``p`` holds rows ``[p*B/N, (p+1)*B/N)``.

Nothing is narrowed. JAX without x64 (its default) would cast an int64 array to int32 without a
word, cutting a record's 64-bit ``instance_key`` (dynamic masking data; a packed row's slots) to its
low 32 bits; so while ``jax_enable_x64`` is off, every 64-bit integer feature comes as uint32 words
instead: shape ``[..., 2]``, ``[..., 0]`` the low and ``[..., 1]`` the high 32 bits of the value's
two's complement (`join_words` gives the int64 back). With x64 on, int64 comes as it is. Other
64-bit features (none of ours) are refused with a TypeError naming the feature.

Only this module imports jax (an optional extra); nothing of ours imports it.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from bert_datagen.contract.bounds import check_int
from bert_datagen.contract.loading.batches import NumpyBatches
from bert_datagen.contract.loading.order import DEFAULT_BLOCK_SIZE, check_order
from bert_datagen.contract.loading.source import Source

_END = object()
_LOW = np.uint64(0xFFFFFFFF)


def split_words(values: np.ndarray) -> np.ndarray:
    """A 64-bit integer array as uint32 words: shape ``values.shape + (2,)``, low word first."""
    bits = np.asarray(values).view(np.uint64)  # the two's complement bits of int64, as they are for uint64
    return np.stack([(bits & _LOW).astype(np.uint32), (bits >> np.uint64(32)).astype(np.uint32)], axis=-1)


def join_words(words: Any) -> np.ndarray:
    """The int64 values of `split_words`' layout (a NumPy array, or a jax.Array fetched to the host)."""
    words = np.asarray(words)
    if words.dtype != np.uint32 or words.shape[-1:] != (2,):
        raise ValueError(f"expected uint32 words of shape [..., 2], got {words.dtype} {words.shape}")
    return ((words[..., 1].astype(np.uint64) << np.uint64(32)) | words[..., 0].astype(np.uint64)).view(np.int64)


def exact_for_jax(name: str, values: np.ndarray) -> np.ndarray:
    """``values`` as JAX will hold them without a bit lost: as they are, or (x64 off) a 64-bit
    integer feature as `split_words`; TypeError naming the feature for another 64-bit dtype."""
    if values.dtype.itemsize < 8 or jax.config.jax_enable_x64:
        return values
    if values.dtype.kind in "iu":
        return split_words(values)
    raise TypeError(f"feature {name!r} is {values.dtype}, which JAX without x64 would narrow to 32 bits: "
                    "enable it (jax.config.update('jax_enable_x64', True)) to read this dataset")


def batch_sharding(axis: str = "data") -> NamedSharding:
    """The batch dimension split over every device of every process, in ``jax.devices()`` order."""
    return NamedSharding(Mesh(np.array(jax.devices()), (axis,)), PartitionSpec(axis))


def host_share(sharding: Any, batch_size: int) -> tuple[int, int]:
    """(share index, number of shares) of this process under ``sharding``: the rows of a global
    batch its devices hold, which must be one whole, aligned share. ValueError names the rows."""
    processes = jax.process_count()
    if batch_size % processes:
        raise ValueError(f"the global batch size {batch_size} is not a multiple of the {processes} JAX processes")
    share = batch_size // processes
    rows: set[int] = set()
    for index in sharding.addressable_devices_indices_map((batch_size,)).values():
        rows.update(range(batch_size)[index[0]] if index else range(batch_size))
    first = min(rows)
    if rows != set(range(first, first + share)) or first % share:
        raise ValueError(f"process {jax.process_index()}'s devices hold rows {sorted(rows)[:4]}... of a global batch "
                         f"of {batch_size}, not one whole share of {share} consecutive rows: shard the batch over the "
                         "devices in process order (batch_sharding())")
    return first // share, processes


class JaxBatches:
    """Global batches ``start, start + 1, ...`` (below ``stop``) as dicts of `jax.Array`, this
    process reading its share; ``prefetch`` batches are read and placed ahead on a thread.
    ``state_dict()`` counts the batches handed out."""

    def __init__(self, source: Source, *, seed: int, batch_size: int, sharding: Any = None,
                 block_size: int = DEFAULT_BLOCK_SIZE, start: int = 0, stop: int | None = None,
                 prefetch: int = 2) -> None:
        # The order's arguments before the sharding is asked for rows (a batch of 0 has none).
        check_order(seed, batch_size, block_size)
        check_int(prefetch, "prefetch", 1)
        self.sharding = sharding if sharding is not None else batch_sharding()
        rank, world = host_share(self.sharding, batch_size)
        self.numpy = NumpyBatches(source, seed=seed, batch_size=batch_size, world_size=world, rank=rank,
                                  block_size=block_size, start=start, stop=stop)
        self.batch_size, self.prefetch = batch_size, prefetch
        self.step = start
        self._queue: queue.Queue | None = None

    def global_batch(self, local: dict[str, np.ndarray]) -> dict[str, jax.Array]:
        """This process's share as arrays of the global batch (64-bit integers as uint32 words while
        JAX's x64 is off: see the module docstring)."""
        exact = {k: exact_for_jax(k, v) for k, v in local.items()}
        return {k: jax.make_array_from_process_local_data(self.sharding, v, (self.batch_size, *v.shape[1:]))
                for k, v in exact.items()}

    def __iter__(self) -> Iterator[dict[str, jax.Array]]:
        return self

    def __next__(self) -> dict[str, jax.Array]:
        if self._queue is None:
            self.numpy.step = self.step
            self._queue = queue.Queue(self.prefetch)
            threading.Thread(target=self._fill, args=(self._queue,), daemon=True).start()
        item = self._queue.get()
        if item is _END:
            self._queue = None
            raise StopIteration
        if isinstance(item, BaseException):
            self._queue = None
            raise item
        self.step += 1
        return item

    def _fill(self, out: queue.Queue) -> None:
        try:
            for local in self.numpy:
                out.put(self.global_batch(local))
            out.put(_END)
        except Exception as e:  # handed to the consumer, raised where it reads
            out.put(e)

    def state_dict(self) -> dict:
        state = self.numpy.state_dict()
        state["step"] = self.step
        return state

    def load_state_dict(self, state: dict) -> None:
        """Continue at ``state["step"]`` (any number of processes); call before iterating."""
        if self._queue is not None:
            raise RuntimeError("load_state_dict while batches are being read ahead: make a new JaxBatches")
        self.numpy.load_state_dict(state)
        self.step = self.numpy.step
