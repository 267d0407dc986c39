"""`bert-datagen batches TARGET --mix OTHER --weights ...`: a mixture's global batch, each record
with the dataset it came from, exactly what the mixture reader gives; refusals as one line."""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner

from bert_datagen.contract.loading.mixture import MIXTURE_FEATURE, MixedBatches
from bert_datagen.contract.loading.source import open_source
from bert_datagen.datagen.record_layout import INSTANCE_KEY
from bert_datagen.pipelines.cli import main
from tests.support.synthetic import write_synthetic_dataset


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    def make(name: str, seed: int, **kw) -> str:
        return write_synthetic_dataset(str(tmp_path_factory.mktemp(name)), train_shards=2, records_per_shard=25,
                                       eval_records=0, masking="dynamic", seed=seed, **kw)

    return make("a", 1), make("b", 2), make("long", 3, seq_len=48)


def _run(*args):
    return CliRunner().invoke(main, ["batches", *[str(a) for a in args]])


def test_each_record_names_its_dataset_as_the_reader_reads_it(pair) -> None:
    a, b, _ = pair
    result = _run(a, "--mix", b, "--weights", "0.6,0.4", "--mix-window", 20, "--seed", 5, "--batch-size", 8,
                  "--step", 3, "--block-size", 2, "--world-size", 2, "--rank", 1, "--json")
    assert result.exit_code == 0, result.output
    rows = json.loads(result.output)["records"]
    mix = MixedBatches([open_source(a), open_source(b)], [0.6, 0.4], seed=5, batch_size=8, block_size=2,
                       world_size=2, rank=1, window=20)
    batch = mix.batch_at(3)
    assert [r["dataset"] for r in rows] == batch[MIXTURE_FEATURE].tolist()
    assert [r["dataset_path"] for r in rows] == [(a, b)[d] for d in batch[MIXTURE_FEATURE].tolist()]
    keys = (batch[INSTANCE_KEY][:, 0].astype(np.int64).view(np.uint64)).tolist()
    assert [r[INSTANCE_KEY] for r in rows] == keys
    text = _run(a, "--mix", b, "--weights", "3,2", "--mix-window", 20, "--seed", 5, "--batch-size", 8,
                "--step", 3, "--block-size", 2)
    assert text.exit_code == 0 and b in text.output


@pytest.mark.parametrize("extra, code, says", [
    (["--weights", "1,1"], 2, "--mix and --weights go together"),
    (["--mix", "B", "--weights", "1"], 2, "1 weights"),
    (["--mix", "LONG", "--weights", "1,1"], 1, "features differ"),
    # Issue #43 point 8: a window of a mixture that is not there was accepted and ignored.
    (["--mix-window", "20"], 2, "--mix-window does not apply here: only a mixture"),
])
def test_refusals(pair, extra, code, says) -> None:
    a, b, long = pair
    extra = [{"B": b, "LONG": long}.get(x, x) for x in extra]
    result = _run(a, *extra, "--seed", 5, "--batch-size", 8, "--step", 0)
    assert result.exit_code == code, result.output
    assert says in result.output and "Traceback" not in result.output
