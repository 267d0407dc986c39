"""Where a TensorFlow run computes: the tf.distribute strategy (checked against the run's batch) and a
global batch cut into replica slices."""

from __future__ import annotations

import tensorflow as tf

from bert_datagen.trainer.errors import TrainConfigError
from bert_datagen.trainer.runtime import cluster


def make_strategy(name: str, tpu: str | None = None) -> tf.distribute.Strategy:
    """`auto`: all GPUs mirrored if more than one, else one device (GPU if any, else CPU).
    `multi-worker`: the strategy the command built at its start (`cluster.join`)."""
    if name == "multi-worker":
        joined = cluster.joined_strategy()
        if joined is None:
            raise TrainConfigError("--strategy multi-worker: the cluster must be joined before anything else "
                                   "runs on TensorFlow (bert_datagen.trainer.runtime.cluster.join)")
        return joined
    gpus = tf.config.list_logical_devices("GPU")
    cpus = tf.config.list_logical_devices("CPU")
    if name == "auto":
        name = "mirrored" if len(gpus) > 1 else "one-device"
    if name == "one-device":
        return tf.distribute.OneDeviceStrategy(gpus[0].name if gpus else cpus[0].name)
    if name == "mirrored":
        if gpus:
            return tf.distribute.MirroredStrategy([d.name for d in gpus])
        # Without GPUs, mirror over the logical CPU devices (tests split the CPU in two). TF's
        # default there, collective ops, keys its collectives per process, so a second mirrored
        # run of another model shape in the same process failed with "Shape mismatch in the
        # collective instance"; reducing on one device has no such state.
        return tf.distribute.MirroredStrategy([d.name for d in cpus],
                                              cross_device_ops=tf.distribute.ReductionToOneDevice())
    if name == "tpu":
        resolver = tf.distribute.cluster_resolver.TPUClusterResolver(tpu=tpu or "")
        tf.config.experimental_connect_to_cluster(resolver)
        tf.tpu.experimental.initialize_tpu_system(resolver)
        return tf.distribute.TPUStrategy(resolver)
    raise TrainConfigError(f"unknown strategy {name!r}")


def make_run_strategy(name: str, tpu: str | None, batch_size: int, accumulation_steps: int) -> tf.distribute.Strategy:
    """The strategy called `name`, refused (before any work) when the global batch does not split
    evenly over its replicas and their micro-batches."""
    strategy = make_strategy(name, tpu)
    replicas = strategy.num_replicas_in_sync
    if batch_size % (replicas * accumulation_steps):
        raise TrainConfigError(f"batch size {batch_size} is not a multiple of replicas ({replicas}) x "
                               f"accumulation steps ({accumulation_steps})")
    return strategy


def replica_slices(strategy: tf.distribute.Strategy, batch: dict[str, tf.Tensor],
                   batch_size: int, workers: int = 1) -> dict[str, tf.Tensor]:
    """``batch`` cut into consecutive per-replica slices of ``batch_size / replicas`` rows: the global
    batch (``workers`` 1), or this worker's share of it when each of ``workers`` workers reads its own
    (`ordered_input`). A tf.distribute iterator is not used: its position cannot be checkpointed."""
    replicas = strategy.num_replicas_in_sync
    if replicas == 1:
        return batch
    local = batch_size // replicas
    per_worker = replicas // workers

    def replica_slice(ctx):
        start = ctx.replica_id_in_sync_group % per_worker * local
        return {name: value[start:start + local] for name, value in batch.items()}

    return strategy.experimental_distribute_values_from_function(replica_slice)
