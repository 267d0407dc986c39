"""Several processes on the JAX backend (`--strategy multi-worker`): joining them with
`jax.distributed`, laying a global batch over every process's devices, the start-up exchange, and
telling a lost process from a failing step.

The cluster is the one TF_CONFIG describes (`runtime/cluster.py`): worker 0's address is the
coordinator's (it runs JAX's coordination service on that port), the others' addresses are only
counted. One program runs on all processes: the global batch is one array over all devices
(each process holds its share), the weights are replicated, and XLA inserts the gradient sum across
processes, so the step is the one of a single process (`backends/jax.py`).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import sys
import time
from collections.abc import Iterator

import jax
import numpy as np

# Where each process puts its start record in the coordinator's key-value store (`exchange`).
_START_KEY = "bert-train/start/{}"


def join(coordinator: str, processes: int, process_id: int, timeout: int) -> None:
    """Join the cluster; returns once every process has (JAX's own deadline is left longer than the
    caller's watchdog, which stops a process that waits `timeout` seconds with one line).

    A process that stops sending heartbeats for `timeout` seconds is lost to the others, and the
    service waits as long for every process at the end."""
    # CPU collectives across processes need an implementation: gloo, which CPU jaxlibs ship (the
    # default in jaxlib 0.10; set for versions whose default is none). GPUs and TPUs use their own.
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(coordinator_address=coordinator, num_processes=processes, process_id=process_id,
                               initialization_timeout=timeout + 60, heartbeat_timeout_seconds=timeout,
                               shutdown_timeout_seconds=timeout)


def global_sharding() -> jax.sharding.NamedSharding:
    """A global batch's layout: split along its first axis over every device of every process, in
    process order, so process p's devices hold rows [p * B / P, (p + 1) * B / P), the share worker p
    reads (`cluster.worker_share`); ValueError where the processes' device counts differ."""
    devices = sorted(jax.devices(), key=lambda d: (d.process_index, d.id))
    local = len(jax.local_devices())
    if len(devices) != local * jax.process_count():
        raise ValueError(f"the processes have different numbers of devices ({len(devices)} in all, {local} here): "
                         "every worker must have as many")
    mesh = jax.sharding.Mesh(np.array(devices), ("data",))
    return jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("data"))


def exchange(record: str, timeout: int) -> list[str | None]:
    """Every process's `record` (in process order), through the coordinator's key-value store; None
    for a process that stopped before sending one (`mark_stopped`). A process that sent nothing within
    `timeout` seconds is a TimeoutError naming it."""
    client = _client()
    me = jax.process_index()
    client.key_value_set(_START_KEY.format(me), json.dumps({"record": record}))
    deadline = time.monotonic() + timeout
    found: list[str | None] = []
    for index in range(jax.process_count()):
        left = max(1, int((deadline - time.monotonic()) * 1000))
        try:
            raw = client.blocking_key_value_get(_START_KEY.format(index), left)
        except Exception as exc:  # noqa: BLE001 - the client's one error type for a deadline
            raise TimeoutError(f"worker {index} sent no configuration within {timeout} s") from exc
        found.append(json.loads(raw).get("record"))
    return found


def mark_stopped() -> None:
    """Tell the others this process stops before sending its configuration (they stop too)."""
    with contextlib.suppress(Exception):  # a coordinator already gone has nobody left to tell
        _client().key_value_set(_START_KEY.format(jax.process_index()), json.dumps({"record": None}))


def _client():
    # The coordination service's key-value store has no public accessor; the client
    # `jax.distributed.initialize` made is the one multihost_utils itself uses.
    from jax._src import distributed

    return distributed.global_state.client


def connect_collectives(sharding: jax.sharding.NamedSharding) -> None:
    """One all-reduce over every device of `sharding`, so the collectives' connections are made
    before the first step. Gloo announces each connection on stdout ("[Gloo] Rank 0 is connected to
    1 peer ranks"); the run's own log keeps stdout, so it is set aside meanwhile."""
    ones = jax.make_array_from_callback((len(sharding.device_set),), sharding,
                                        lambda index: np.ones(len(sharding.device_set), np.float32)[index])
    with _stdout_aside():
        total = float(jax.jit(lambda x: x.sum())(ones))
    if total != len(sharding.device_set):
        raise RuntimeError(f"an all-reduce over {len(sharding.device_set)} devices gave {total}")


@contextlib.contextmanager
def _stdout_aside() -> Iterator[None]:
    sys.stdout.flush()
    saved = os.dup(1)
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 1)
    try:
        yield
    finally:
        os.dup2(saved, 1)
        os.close(saved)
        os.close(null)


# What a collective raises when a process of the cluster is gone: gloo's broken connection, the
# coordination service's unavailable or timed-out peers.
_LOST = re.compile(r"Gloo|[Cc]onnection (closed|reset|refused)|heartbeat|UNAVAILABLE|DEADLINE_EXCEEDED|ABORTED"
                   r"|CANCELLED|Socket closed")


def lost_process(exc: BaseException) -> str | None:
    """The reason, in one line, when `exc` is a collective's failure because a process is gone, else None."""
    if not isinstance(exc, (RuntimeError, ValueError)):
        return None
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    if not _LOST.search(first):
        return None
    # "UNKNOWN: Gloo all-reduce failed: [external/gloo/.../pair.cc:547] Connection closed by peer [127.0.0.1]:4242"
    return re.sub(r"\[[^\]]*\.cc:\d+\] ", "", first)


def leave_now(code: int) -> None:
    """End this process at once with `code`, without JAX's shutdown, which waits for every process
    (up to the cluster timeout) and then aborts: the others' next collective then fails and names
    this process, instead of waiting for it."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
