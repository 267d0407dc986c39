"""Checkpoint helpers the interop tests share: a vocabulary, bitwise equality, a TF1 v1-saver writer."""

from __future__ import annotations

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")


VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "cat", "sat", "on", "mat", "##s", "a", "dog", "ran"]


def assert_bitwise_equal(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> None:
    assert sorted(a) == sorted(b)
    for name in a:
        assert a[name].dtype == b[name].dtype == np.float32, name
        assert a[name].shape == b[name].shape, name
        assert a[name].tobytes() == b[name].tobytes(), name


def write_with_v1_saver(prefix, arrays: dict[str, np.ndarray], extra: dict[str, np.ndarray]) -> None:
    """How Google's run_pretraining.py checkpoints look: a graph-mode Saver over named variables."""
    graph = tf.Graph()
    with graph.as_default():
        variables = [tf.compat.v1.Variable(value, name=name) for name, value in {**arrays, **extra}.items()]
        saver = tf.compat.v1.train.Saver(variables)
        with tf.compat.v1.Session(graph=graph) as session:
            session.run(tf.compat.v1.global_variables_initializer())
            saver.save(session, str(prefix))
