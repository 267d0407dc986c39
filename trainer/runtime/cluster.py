"""`--strategy multi-worker`: the cluster from TF_CONFIG, joined before anything else touches the backend.

TensorFlow refuses to configure collective ops once its devices are initialised ("Collective ops
must be configured at program startup"), and a run touches them early (reading the data's first
records, op determinism, listing devices). So the command builds the strategy first (`join`), and
`devices.make_strategy` hands that one out later. Joining waits for every worker; a worker that
cannot reach the others is stopped after `timeout` seconds with one line (`_connect_watchdog`).

On JAX the same TF_CONFIG joins the processes with `jax.distributed` (`join_jax`): worker 0's
address is the coordinator's, and joining must come before JAX initialises its devices. The start
records travel through the coordinator's key-value store (`agree_to_start`), and a process that stops
on an error after them leaves at once, so the others' next collective fails and names it
(`backends/jax_cluster.py`).

One writer: the chief (worker 0) writes the run directory; every other worker computes the same
steps (all of them take part in every collective) and writes nothing (`is_chief`).
"""

from __future__ import annotations

import atexit
import errno
import faulthandler
import json
import os
import socket
import subprocess
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from bert_datagen.cli.plumbing import unfiltered_stderr
from bert_datagen.contract.fs import is_remote
from bert_datagen.trainer.errors import TrainConfigError, TrainingError

if TYPE_CHECKING:
    import tensorflow as tf

DEFAULT_TIMEOUT = 300
_joined: dict[str, object] = {}


@dataclass(frozen=True)
class ClusterTask:
    workers: list[str]
    index: int

    @property
    def is_chief(self) -> bool:
        return self.index == 0


def cluster_task(environ: dict[str, str] | None = None) -> ClusterTask:
    """This process's place in the cluster TF_CONFIG describes; TrainConfigError (one line) when it is
    missing or malformed. Only `worker` tasks (worker 0 is the chief), as in TF Model Garden."""
    raw = (os.environ if environ is None else environ).get("TF_CONFIG", "")
    if not raw.strip():
        raise TrainConfigError("--strategy multi-worker needs TF_CONFIG (see docs/training.md: one command per host)")
    try:
        config = json.loads(raw)
        workers = config["cluster"]["worker"]
        task = config["task"]
        kind, index = task["type"], task["index"]
    except (ValueError, KeyError, TypeError) as exc:
        raise TrainConfigError(f"TF_CONFIG is malformed ({type(exc).__name__}: {exc}); expected "
                               '{"cluster": {"worker": ["host:port", ...]}, "task": {"type": "worker", "index": N}}') from exc
    if set(config["cluster"]) - {"worker"}:
        raise TrainConfigError(f"TF_CONFIG: only a 'worker' job is supported (worker 0 is the chief), not "
                               f"{sorted(set(config['cluster']) - {'worker'})}")
    if (not isinstance(workers, list) or not workers
            or not all(isinstance(w, str) and w.rpartition(":")[2].isdigit() for w in workers)):
        raise TrainConfigError(f"TF_CONFIG: cluster.worker must be a list of host:port, not {workers!r}")
    if kind != "worker" or not isinstance(index, int) or not 0 <= index < len(workers):
        raise TrainConfigError(f"TF_CONFIG: task must be a worker with an index in 0..{len(workers) - 1}, not {task!r}")
    return ClusterTask(workers=workers, index=index)


def is_chief() -> bool:
    """Whether this process writes the run (always, unless it joined a cluster as a non-chief)."""
    task = _joined.get("task")
    return task is None or task.is_chief  # type: ignore[union-attr]


def worker_share() -> tuple[int, int]:
    """(workers, this worker's index): the world a worker reads its share of each global batch in;
    (1, 0) outside a cluster."""
    task = _joined.get("task")
    if task is None:
        return 1, 0
    return len(task.workers), task.index  # type: ignore[union-attr]


def joined_strategy():
    """The strategy `join` built, or None."""
    return _joined.get("strategy")


def joined_backend() -> str | None:
    """The backend of the cluster this process joined, or None."""
    return _joined.get("backend")  # type: ignore[return-value]


def join_for(out: str, kind: str, timeout: int = DEFAULT_TIMEOUT, backend: str = "tensorflow"):
    """`join` (or `join_jax`), after checking TF_CONFIG and that `out` can take a run of `kind`
    (every worker checks it here, before the chief can start writing in it)."""
    from bert_datagen.trainer.runtime import rundir

    cluster_task()
    rundir.check_out_dir(out, kind)
    if backend == "jax":
        return join_jax(timeout)
    return join(timeout)


def join_jax(timeout: int = DEFAULT_TIMEOUT) -> None:
    """Join the processes TF_CONFIG lists with `jax.distributed` (worker 0 the coordinator, on its
    TF_CONFIG port); call it before anything runs on JAX. A worker that cannot join within `timeout`
    seconds stops with one line; a process silent for as long is lost to the others."""
    task = cluster_task()
    if "task" in _joined:
        return
    if task.is_chief:  # the coordinator listens on its address; the others' ports are not used
        check_port_free(task)
    from bert_datagen.trainer.backends import jax_cluster

    try:
        with _connect_watchdog(task, timeout):
            jax_cluster.join(task.workers[0], len(task.workers), task.index, timeout)
    except RuntimeError as exc:  # JAX's own refusal (its devices already in use), or the service's bind
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise TrainConfigError(f"worker {task.index} cannot join the cluster with coordinator {task.workers[0]} "
                               f"(TF_CONFIG's worker 0): {reason}") from exc
    _joined.update(task=task, backend="jax", timeout=timeout)
    atexit.register(_leave_jax)


def join(timeout: int = DEFAULT_TIMEOUT):
    """Build the MultiWorkerMirroredStrategy of TF_CONFIG; call it before any other TensorFlow call.
    Collectives time out after `timeout` seconds too, so a lost worker stops the others."""
    task = cluster_task()
    if "strategy" in _joined:
        return _joined["strategy"]
    import tensorflow as tf

    check_port_free(task)
    options = tf.distribute.experimental.CommunicationOptions(timeout_seconds=timeout)
    try:
        with _connect_watchdog(task, timeout):
            strategy = tf.distribute.MultiWorkerMirroredStrategy(communication_options=options)
    except tf.errors.OpError as exc:  # taken between our check and TensorFlow's own bind
        raise TrainConfigError(f"worker {task.index} cannot start its server on {task.workers[task.index]} (its "
                               f"TF_CONFIG address): {exc.message.strip().splitlines()[0]}") from exc
    _joined.update(task=task, strategy=strategy, backend="tensorflow")
    return strategy


def check_port_free(task: ClusterTask) -> None:
    """TrainConfigError naming host:port when this worker's TF_CONFIG port cannot be listened on (in use,
    or not an address of this host); TensorFlow's own error names neither."""
    address = task.workers[task.index]
    port = int(address.rpartition(":")[2])
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # a port in TIME_WAIT is free to TF too
        try:
            probe.bind(("", port))  # where TensorFlow's server listens (all interfaces)
        except OSError as exc:
            why = "the port is in use" if exc.errno == errno.EADDRINUSE else (exc.strerror or str(exc))
            raise TrainConfigError(f"worker {task.index} cannot listen on {address} (its TF_CONFIG address): {why}; "
                                   "free the port or give this worker another one in every worker's TF_CONFIG") from exc


class _connect_watchdog:
    """Stop the process with one line when the cluster is not joined in `timeout` seconds.

    TensorFlow waits for the other workers inside a call that holds the GIL, so no Python timer can
    fire; faulthandler's timer is a C thread. Its traceback goes into a pipe read by a small
    process of ours, which prints the line instead (and prints nothing when the pipe just closes).
    """

    def __init__(self, task: ClusterTask, timeout: int):
        self.task, self.timeout = task, timeout

    def __enter__(self) -> None:
        others = ", ".join(w for i, w in enumerate(self.task.workers) if i != self.task.index) or "none"
        line = (f"Error: worker {self.task.index} could not join the cluster within {self.timeout} s "
                f"(--cluster-timeout); are the other workers ({others}) started and reachable?\n")
        read, self.write = os.pipe()
        script = "import os,sys\nif os.read(0, 1):\n    sys.stderr.write(sys.argv[1]); sys.stderr.flush()\n"
        # The line must bypass the command's stderr filter: it runs in this process, which may be stuck.
        self.watcher = subprocess.Popen([sys.executable, "-c", script, line], stdin=read,
                                        stderr=unfiltered_stderr(), close_fds=True)
        os.close(read)
        self.pipe = os.fdopen(self.write, "w")
        faulthandler.dump_traceback_later(self.timeout, exit=True, file=self.pipe)

    def __exit__(self, *exc) -> None:
        faulthandler.cancel_dump_traceback_later()
        self.pipe.close()
        self.watcher.wait()


AGREEMENT_BYTES = 1 << 16  # room for a run's whole record (a few kB) in the one gather


def start_record(options: dict[str, object], run_dir: str, fingerprint: str, model: dict[str, object],
                 strategy: tf.distribute.Strategy | int) -> dict[str, object]:
    """What the workers of one run must agree on (`agree`): every option under its flag name, the
    run directory as an absolute path, the data's fingerprint, the resolved model, the checkpoint
    this worker would resume from, its number of replicas and the cluster its TF_CONFIG lists.
    `strategy`: the run's tf.distribute strategy, or its number of replicas in all (JAX)."""
    from bert_datagen.trainer.runtime import checkpoint as ckpt_lib

    record: dict[str, object] = {"--" + name.replace("_", "-"): _resolved(value) if name in _PATH_OPTIONS else value
                                 for name, value in options.items()}
    record["--out"] = os.path.abspath(run_dir)
    found = ckpt_lib.list_checkpoints(run_dir) if os.path.isdir(run_dir) else []
    record["the checkpoint it resumes from"] = str(found[-1][1].name) if found else "none (a new run)"
    record["the data's fingerprint"] = fingerprint
    record["the model"] = model
    replicas = getattr(strategy, "num_replicas_in_sync", strategy)
    record["replicas per worker"] = replicas // worker_share()[0]
    task = _joined.get("task")
    record["TF_CONFIG's cluster"] = task.workers if task is not None else []  # type: ignore[union-attr]
    return record


# Options that name files or directories: each worker records them resolved against its own working
# directory (symlinks too), so `--data data/c128` on one and `--data /home/me/data/c128` on another
# agree when they are one dataset, and two datasets never do.
_PATH_OPTIONS = frozenset({"data", "eval_data", "mix", "init_from", "init_checkpoint"})


def _resolved(value: object) -> object:
    """A path option's value with every local path absolute and its symlinks resolved; an object
    store's path without a trailing slash; anything else as it is."""
    if isinstance(value, list):
        return [_resolved(v) for v in value]
    if not isinstance(value, str) or not value:
        return value
    return value.rstrip("/") if is_remote(value) else os.path.realpath(value)


def agree(strategy: tf.distribute.Strategy, record: dict[str, object]) -> None:
    """Stop every worker, with the same one line, unless all of them hold the same `record` (the
    whole training configuration, the data fingerprint, the run directory and the checkpoint each
    would resume from). One all-gather of the records' JSON, so all workers see every record and
    decide alike; outside a cluster it does nothing. Call it before anything is written: until then
    a difference (one worker's --batch-size 16 in a cluster of 8s) would train on a batch no worker
    asked for, or desynchronise the collectives."""
    task = _joined.get("task")
    if task is None or strategy.num_replicas_in_sync == 1:
        return
    import numpy as np
    import tensorflow as tf

    blob = json.dumps(record, sort_keys=True, default=str).encode()
    if len(blob) > AGREEMENT_BYTES:
        raise TrainConfigError(f"the run's configuration is {len(blob)} bytes of JSON, more than the {AGREEMENT_BYTES} "
                               "that workers compare at start-up")
    padded = np.frombuffer(blob.ljust(AGREEMENT_BYTES, b"\0"), dtype=np.int32)[None, :]
    values = strategy.experimental_distribute_values_from_function(lambda _ctx: tf.constant(padded))
    rows = strategy.gather(values, axis=0).numpy()
    per_worker = strategy.num_replicas_in_sync // len(task.workers)  # type: ignore[union-attr]
    records = [json.loads(rows[w * per_worker].tobytes().rstrip(b"\0")) for w in range(len(task.workers))]  # type: ignore[union-attr]
    check_same_records(records)


def agree_to_start(training: Any, options: dict[str, object], run_dir: str, fingerprint: str,
                   model: dict[str, object]) -> None:
    """`agree` on the start record of `training` (a TfTraining or JaxTraining) on either backend;
    outside a cluster it does nothing. Call it before anything is written."""
    if _joined.get("task") is None:
        return
    if _joined.get("backend") != "jax":
        agree(training.strategy, start_record(options, run_dir, fingerprint, model, training.strategy))
        return
    _agree_on_jax(start_record(options, run_dir, fingerprint, model, training.replicas))
    from bert_datagen.trainer.backends import jax_cluster

    try:
        jax_cluster.connect_collectives(training.sharding)
    except (RuntimeError, ValueError) as exc:
        reason = jax_cluster.lost_process(exc)
        if reason is None:
            raise
        raise lost_worker_error("before step 1", run_dir, reason) from exc


def _agree_on_jax(record: dict[str, object]) -> None:
    """`agree` through the coordinator's key-value store: every worker reads every record and
    decides alike. A worker that stopped before sending its own (its error line says why) stops the
    others here too, all before step 1."""
    from bert_datagen.trainer.backends import jax_cluster

    timeout = int(_joined["timeout"])  # type: ignore[call-overload]
    blob = json.dumps(record, sort_keys=True, default=str)
    try:
        raw = jax_cluster.exchange(blob, timeout)
    except TimeoutError as exc:
        raise TrainConfigError(f"{exc} (--cluster-timeout); every worker must run the same command") from exc
    stopped = [index for index, one in enumerate(raw) if one is None]
    if stopped:
        raise TrainConfigError(f"worker {stopped[0]} stopped before step 1 (its own error says why); every worker's "
                               "command must start again")
    check_same_records([json.loads(one) for one in raw])  # type: ignore[arg-type]
    _joined["agreed"] = True


def lost_worker_error(when: str, run_dir: str, reason: str) -> TrainingError:
    """One line for a JAX step of a cluster (`when`: "training step 3") whose collective failed because
    a process is gone: which one (with two workers, the other; JAX's collectives do not name it),
    why, and the checkpoint the relaunched workers resume from."""
    from bert_datagen.trainer.runtime import checkpoint as ckpt_lib

    workers, index = worker_share()
    who = f"worker {1 - index}" if workers == 2 else "a worker"
    kept = ckpt_lib.list_checkpoints(run_dir) if os.path.isdir(run_dir) else []
    where = f"from {kept[-1][1]}" if kept else "from the start (no checkpoint yet)"
    return TrainingError(f"{when}: lost {who} of the cluster ({reason}); the run can be resumed {where}: start "
                         "every worker's command again")


def run_ended() -> None:
    """The run's work is done without error: at exit, JAX's shutdown waits for every worker."""
    _joined["ended"] = True


def _leave_jax() -> None:
    """At exit (before JAX's own shutdown, registered earlier): a worker that stops on an error after
    the start records leaves at once (the others' next collective fails and names it; JAX's
    shutdown would wait for them, then abort); one that stops before sending its record tells the
    others, which stop too and meet it in JAX's shutdown."""
    if _joined.get("ended"):
        return
    from bert_datagen.trainer.backends import jax_cluster

    if not _joined.get("agreed"):
        jax_cluster.mark_stopped()
        return
    jax_cluster.leave_now(1)


def check_same_records(records: list[dict[str, object]]) -> None:
    """TrainConfigError naming the first entry (in name order) where a worker's record differs from the
    chief's, with both values; every worker calls it on the same records and raises the same line."""
    for index, other in enumerate(records[1:], start=1):
        for name in sorted(set(records[0]) | set(other)):
            if records[0].get(name) != other.get(name):
                raise TrainConfigError(f"the workers disagree on {name}: worker 0 has {_shown(records[0].get(name))}, "
                                       f"worker {index} has {_shown(other.get(name))}; every worker must run the "
                                       "same command (only TF_CONFIG's task index differs)")


def _shown(value: object) -> str:
    text = json.dumps(value, sort_keys=True)
    return text if len(text) <= 200 else text[:197] + "..."
