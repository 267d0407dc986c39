"""What of the TPU path can be checked on CPU, for the pre-training and fine-tuning XLA tests: a dataset
copied to an object-store path read through tf.io.gfile, a step that records its last call, and the
check that the step was traced once from fully static shapes with an XLA-compiled part."""

from __future__ import annotations

import os

import tensorflow as tf


def to_object_store(local: str, url: str) -> str:
    """A copy of the dataset directory `local` under `url`, written through tf.io.gfile. In path order:
    TensorFlow's ram:// filesystem leaves a file empty when a file whose name it prefixes was written
    before it (a shard after its index's block digests)."""
    sources = sorted(os.path.join(top, name) for top, _, files in os.walk(local) for name in files)
    for source in sources:
        target = f"{url}/{os.path.relpath(source, local)}"
        tf.io.gfile.makedirs(os.path.dirname(target))
        tf.io.gfile.copy(source, target, overwrite=True)
    return url


class Recorded:
    """Wraps a tf.function step and keeps the arguments of its last call."""

    def __init__(self, step):
        self.step, self.args = step, None

    def __call__(self, *args):
        self.args = args
        return self.step(*args)


def assert_static_and_compiled(recorded: Recorded, micro_batch: int) -> None:
    step = recorded.step
    assert step.experimental_get_tracing_count() == 1  # the same shapes at every step
    traced = step.get_concrete_function(*recorded.args)
    assert step.experimental_get_tracing_count() == 1
    assert traced.inputs and all(t.shape.is_fully_defined() for t in traced.inputs), \
        [t for t in traced.inputs if not t.shape.is_fully_defined()]
    compiled = [op for op in traced.graph.get_operations()
                if "_XlaMustCompile" in op.node_def.attr and op.get_attr("_XlaMustCompile")]
    assert compiled, "no XLA-compiled part in the train step"
    for op in compiled:
        assert all(t.shape.is_fully_defined() for t in op.inputs), op.name
        # The micro-batch's features ([batch, ...]; the rest are a dropout seed and scalars).
        assert {t.shape[0] for t in op.inputs if t.shape.rank >= 2} == {micro_batch}, op.name
