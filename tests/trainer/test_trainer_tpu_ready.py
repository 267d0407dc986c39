"""What of the TPU path can be checked on CPU (no TPU here): the pre-training train step compiles
with XLA (`--jit`, as a TPU compiles every step) from fully static shapes, traced once for the whole
run (every batch has the same shape: no remainder batch), and its data is read through tf.io.gfile
(a `ram://` path stands in for gs://: TensorFlow's in-memory filesystem). Fine-tuning's step gets
the same checks in its XLA test (tests/trainer/test_finetune_step.py), which pays for an XLA run
anyway."""

from __future__ import annotations

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

from bert_datagen.trainer.model.config import BertConfig  # noqa: E402
from bert_datagen.trainer.pretrain.config import TrainConfig  # noqa: E402
from bert_datagen.trainer.pretrain.train import PretrainRun  # noqa: E402
from bert_datagen.trainer.runtime import checkpoint as ckpt_lib  # noqa: E402
from tests.support.synthetic import write_synthetic_dataset  # noqa: E402
from tests.support.xla_checks import Recorded, assert_static_and_compiled, to_object_store  # noqa: E402


def test_pretraining_step_compiles_with_static_shapes_from_gfile_data(tmp_path):
    local = write_synthetic_dataset(str(tmp_path / "ds"), seq_len=32, max_pred=5, vocab_size=120,
                                    train_shards=2, records_per_shard=10, eval_records=8)
    data = to_object_store(local, f"ram://{tmp_path.name}-pretrain/ds")
    bert = BertConfig.from_name("tiny", 120).to_dict()  # dropout 0.1, the default
    # 20 records, batches of 8: each epoch leaves 4 over, which must not make a smaller batch.
    settings = dict(bert_config=bert, batch_size=8, steps=3, accumulation_steps=2, learning_rate=1e-3,
                    warmup_steps=1, seed=1, checkpoint_every=3, log_every=1, eval_batches=1)
    run = PretrainRun(TrainConfig(data=data, out=str(tmp_path / "run"), jit=True, **settings), log=lambda _: None)
    run.training.step_function = recorded = Recorded(run.training.step_function)
    result = run.pretrain()
    assert result["step"] == 3 and result["eval"]["examples"] == 8
    assert_static_and_compiled(recorded, micro_batch=4)
    # XLA draws the dropout masks of the graph step (the same Philox words, compared as integers).
    PretrainRun(TrainConfig(data=local, out=str(tmp_path / "graph"), **settings), log=lambda _: None).pretrain()
    a, b = (ckpt_lib.load_arrays(ckpt_lib.resolve_checkpoint(tmp_path / name), ckpt_lib.MODEL_FILE)
            for name in ("graph", "run"))
    worst = max(float(np.abs(a[k] - b[k]).max()) for k in a)
    print("MAX_ABS_WEIGHT_DIFF_JIT", worst)
    assert worst <= 1e-5
