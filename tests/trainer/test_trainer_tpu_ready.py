"""What of the TPU path can be checked on CPU (no TPU here): the pre-training train step compiles
with XLA (`--jit`, as a TPU compiles every step) from fully static shapes, traced once for the whole
run (every batch has the same shape: no remainder batch), and its data is read through tf.io.gfile
(a `ram://` path stands in for gs://: TensorFlow's in-memory filesystem). Fine-tuning's step gets
the same checks in its XLA test (tests/trainer/test_finetune_step.py), which pays for an XLA run
anyway."""

from __future__ import annotations

import os

import pytest

tf = pytest.importorskip("tensorflow")

from bert_datagen.trainer.pretrain.train import Run  # noqa: E402
from bert_datagen.trainer.run.config import BertConfig, TrainConfig  # noqa: E402
from tests.support.synthetic import write_synthetic_dataset  # noqa: E402


def to_object_store(local: str, url: str) -> str:
    """A copy of the dataset directory `local` under `url`, written through tf.io.gfile."""
    for top, _, files in os.walk(local):
        for name in files:
            source = os.path.join(top, name)
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


def test_pretraining_step_compiles_with_static_shapes_from_gfile_data(tmp_path):
    local = write_synthetic_dataset(str(tmp_path / "ds"), seq_len=32, max_pred=5, vocab_size=120,
                                    train_shards=2, records_per_shard=10, eval_records=8)
    data = to_object_store(local, f"ram://{tmp_path.name}-pretrain/ds")
    bert = BertConfig.from_name("tiny", 120).to_dict()
    # 20 records, batches of 8: each epoch leaves 4 over, which must not make a smaller batch.
    run = Run(TrainConfig(data=data, out=str(tmp_path / "run"), bert_config=bert, batch_size=8, steps=3,
                          accumulation_steps=2, learning_rate=1e-3, warmup_steps=1, seed=1, checkpoint_every=3,
                          log_every=1, eval_batches=1, shuffle_buffer=4, jit=True), log=lambda _: None)
    run.steps.train_step = recorded = Recorded(run.steps.train_step)
    result = run.pretrain()
    assert result["step"] == 3 and result["eval"]["examples"] == 8
    assert_static_and_compiled(recorded, micro_batch=4)
