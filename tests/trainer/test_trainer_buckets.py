"""`bert-train` reading its data from buckets (real servers on 127.0.0.1: moto's S3, a GCS emulator):
pre-training, its evaluation, fine-tuning and prediction take the same numbers from a bucket as from
the local copy of the same dataset. Run directories stay local."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

from bert_datagen.trainer.finetune.train import FinetuneConfig, finetune  # noqa: E402
from bert_datagen.trainer.pretrain.config import TrainConfig  # noqa: E402
from bert_datagen.trainer.pretrain.train import pretrain  # noqa: E402
from bert_datagen.trainer.runtime import checkpoint as ckpt_lib  # noqa: E402
from tests.support.servers import upload_tree  # noqa: E402
from tests.support.synthetic import write_synthetic_dataset  # noqa: E402
from tests.support.task_fixtures import classification_dataset, write_pretrain_run  # noqa: E402

pytestmark = pytest.mark.timeout(240)

SMALL_BERT = {"vocab_size": 40, "hidden_size": 16, "num_hidden_layers": 1, "num_attention_heads": 2,
              "intermediate_size": 32, "max_position_embeddings": 16}


def weights(run: Path) -> dict[str, np.ndarray]:
    return ckpt_lib.load_arrays(ckpt_lib.resolve_checkpoint(run), ckpt_lib.MODEL_FILE)


def test_pretraining_reads_a_dataset_in_a_bucket_as_it_reads_the_local_copy(bucket, tmp_path) -> None:
    local = write_synthetic_dataset(str(tmp_path / "ds"), seq_len=16, max_pred=3, vocab_size=40, train_shards=2,
                                    records_per_shard=16, eval_records=8, seed=0)
    remote = f"{bucket}/frozen/ds"
    upload_tree(Path(local), remote)  # a dataset copied into the bucket as a team shares one
    runs = {}
    for name, data in (("local", local), ("remote", remote)):
        config = TrainConfig(data=data, out=str(tmp_path / name), bert_config=SMALL_BERT, batch_size=8, steps=3,
                             learning_rate=1e-3, warmup_steps=1, seed=5, log_every=1, eval_batches=1,
                             checkpoint_every=3)
        runs[name] = pretrain(config, log=lambda _: None)
    a, b = weights(tmp_path / "local"), weights(tmp_path / "remote")
    assert a.keys() == b.keys() and all(a[k].tobytes() == b[k].tobytes() for k in a)
    assert runs["local"]["eval"] == runs["remote"]["eval"] and runs["remote"]["eval"]


@pytest.mark.parametrize("bucket", ["s3"], indirect=True)  # gs:// reads through the same code (pretraining's test)
def test_finetuning_and_prediction_read_a_task_dataset_in_a_bucket(bucket, tmp_path) -> None:
    init = write_pretrain_run(str(tmp_path / "pre"))
    local = classification_dataset(str(tmp_path / "task"), n_train=32, n_dev=16)
    remote = f"{bucket}/task"
    upload_tree(Path(local), remote)
    results = {}
    for name, data in (("local", local), ("remote", remote)):
        config = FinetuneConfig(data=data, out=str(tmp_path / name), init_from=init, epochs=1, learning_rate=1e-3,
                                batch_size=8, log_every=1000, seed=5)
        results[name] = finetune(config, log=lambda _: None)
    a, b = weights(tmp_path / "local"), weights(tmp_path / "remote")
    assert all(a[k].tobytes() == b[k].tobytes() for k in a)
    same = {k: v for k, v in results["local"].items() if k != "run_dir"}
    assert same == {k: v for k, v in results["remote"].items() if k != "run_dir"} and "best" in str(same)
    from click.testing import CliRunner

    from bert_datagen.trainer.cli import main

    outs = []
    for name, data in (("local", local), ("remote", remote)):
        result = CliRunner().invoke(main, ["predict", "--run", str(tmp_path / "local"), "--data", data, "--split", "test",
                                           "--out", str(tmp_path / f"pred-{name}")])
        assert result.exit_code == 0, result.output
        outs.append(sorted((p.name, p.read_bytes()) for p in (tmp_path / f"pred-{name}").iterdir()
                           if p.name != "predictions_record.json"))  # (names the data's path)
    assert outs[0] == outs[1] and outs[0]
