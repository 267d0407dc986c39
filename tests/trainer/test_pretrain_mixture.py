"""`bert-train pretrain --data A --mix B --weights 0.7,0.3`: the Keras trainer's batch k is the
mixture reader's, byte for byte, on any number of workers; the mixture is recorded in the run and
its checkpoints, and a resume on another mixture is refused."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

from click.testing import CliRunner  # noqa: E402

from bert_datagen.contract.loading.mixture import MIXTURE_FEATURE, MixedBatches  # noqa: E402
from bert_datagen.contract.loading.source import open_source  # noqa: E402
from bert_datagen.trainer.cli import main  # noqa: E402
from bert_datagen.trainer.pretrain import train as train_mod  # noqa: E402
from bert_datagen.trainer.pretrain.config import TrainConfig  # noqa: E402
from bert_datagen.trainer.pretrain.train import PretrainRun  # noqa: E402
from bert_datagen.trainer.runtime import cluster  # noqa: E402
from tests.support.synthetic import write_synthetic_dataset  # noqa: E402

B = 8


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    def make(name: str, seed: int) -> str:
        return write_synthetic_dataset(str(tmp_path_factory.mktemp(name) / "ds"), seq_len=32, max_pred=5,
                                       vocab_size=120, train_shards=2, records_per_shard=30, eval_records=16, seed=seed)

    return make("a", 1), make("b", 2), make("c", 4)


def config(a: str, b: str, out: Path, weights=(0.7, 0.3), **kw) -> TrainConfig:
    base = dict(data=a, out=str(out), model="tiny", batch_size=B, steps=2, learning_rate=2e-3, warmup_steps=1,
                seed=3, checkpoint_every=2, log_every=1, eval_batches=1, mix=[b], mix_weights=list(weights),
                mix_window=40)
    base.update(kw)
    return TrainConfig(**base)


def test_trainer_batches_are_the_mixtures_on_any_worker_count(pair, tmp_path, monkeypatch) -> None:
    a, b, _ = pair
    reference = MixedBatches([open_source(a), open_source(b)], [0.7, 0.3], seed=3, batch_size=B, window=40)
    for world in (1, 2):
        monkeypatch.setattr(cluster, "worker_share", lambda w=world: (w, w - 1))  # the last rank's share
        run = PretrainRun(config(a, b, tmp_path / f"r{world}"), log=lambda _: None)
        for step in (0, 5, 13):
            want = reference.batch_at(step)
            want.pop(MIXTURE_FEATURE)
            share = slice((world - 1) * B // world, B)
            got = {k: np.asarray(v) for k, v in train_mod.with_sequence_weights(run._batch_for_step(step)).items()}
            assert set(got) >= set(want)
            for k in want:
                assert got[k].tobytes() == want[k][share].tobytes(), (world, step, k)


def _pretrain(a: str, b: str, weights: str, out: Path, steps: int = 2):  # noqa: ANN202
    return CliRunner().invoke(main, ["pretrain", "--data", a, "--mix", b, "--weights", weights, "--out", str(out),
                                     "--steps", str(steps), "--batch-size", str(B), "--warmup-steps", "1",
                                     "--checkpoint-every", "2", "--eval-batches", "1", "--seed", "3"])


def test_recorded_and_resume_on_another_mixture_refused(pair, tmp_path) -> None:
    a, b, c = pair
    out = tmp_path / "run"
    result = _pretrain(a, b, "0.7,0.3", out)
    assert result.exit_code == 0, result.output
    recorded = json.loads((out / "train_config.json").read_text())
    assert recorded["mix"] == [b] and recorded["mix_weights"] == [0.7, 0.3]
    states = sorted(out.rglob("state.json"))
    mixture = json.loads(states[-1].read_text())["input"]["mixture"]
    assert [d["path"] for d in mixture["datasets"]] == [a, b] and [d["per_window"] for d in mixture["datasets"]] == [
        2867, 1229]
    again = _pretrain(a, b, "0.5,0.5", out)
    assert again.exit_code == 1 and "mix_weights" in again.output, again.output
    other = _pretrain(a, c, "0.7,0.3", out)  # the same options, another dataset mixed in
    assert other.exit_code == 1 and "not the mixture" in other.output and "Traceback" not in other.output, other.output
    usage = CliRunner().invoke(main, ["pretrain", "--data", a, "--mix", b, "--out", str(tmp_path / "u"),
                                      "--steps", "2"])
    assert usage.exit_code == 2 and "--mix and --weights go together" in usage.output
