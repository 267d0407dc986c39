"""TensorBoard output of a run: the writers of RUN/tensorboard/ and its scalars."""

from __future__ import annotations

from pathlib import Path

import tensorflow as tf


def tensorboard_writers(run_dir: Path, chief: bool = True) -> tuple[tf.summary.SummaryWriter, tf.summary.SummaryWriter]:
    """The (train, eval) writers of RUN/tensorboard/; writers that write nothing on a non-chief worker."""
    if not chief:
        return tf.summary.create_noop_writer(), tf.summary.create_noop_writer()
    return (tf.summary.create_file_writer(str(run_dir / "tensorboard" / "train")),
            tf.summary.create_file_writer(str(run_dir / "tensorboard" / "eval")))


def write_scalar(name: str, value: float) -> None:
    """A TensorBoard scalar event without needing the tensorboard package (tf.summary.scalar does):
    the low-level summary op with the metadata of TensorBoard's scalars plugin."""
    from tensorflow.core.framework import summary_pb2

    metadata = summary_pb2.SummaryMetadata(plugin_data=summary_pb2.SummaryMetadata.PluginData(plugin_name="scalars"))
    tf.summary.write(name, tf.constant(value, tf.float32), metadata=metadata)
