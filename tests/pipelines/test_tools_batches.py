"""`bert-datagen batches`: the records of a global batch of the loaders' order, or a rank's share."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
from click.testing import CliRunner

from bert_datagen.contract.loading.batches import NumpyBatches
from bert_datagen.contract.loading.source import open_source
from bert_datagen.datagen.record_layout import INSTANCE_KEY
from bert_datagen.pipelines.cli import main
from tests.support.synthetic import write_synthetic_dataset


@pytest.fixture(scope="module")
def ds(tmp_path_factory):
    d = str(tmp_path_factory.mktemp("dyn"))
    return write_synthetic_dataset(d, train_shards=2, records_per_shard=30, eval_records=0, masking="dynamic")


def _run(*args):
    return CliRunner().invoke(main, ["batches", *[str(a) for a in args]])


def _records(ds, *extra):
    result = _run(ds, "--seed", 5, "--batch-size", 8, "--step", 4, "--block-size", 2, "--json", *extra)
    assert result.exit_code == 0, result.output
    return json.loads(result.output)["records"]


def test_rank_shares_union_to_the_global_batch_with_instance_keys(ds):
    whole = _records(ds)
    assert len(whole) == 8
    for world in (2, 4):
        shares = [_records(ds, "--world-size", world, "--rank", r) for r in range(world)]
        assert [row for s in shares for row in s] == whole
    # The same records, with the same identities, as the NumPy iterator's batch 4 holds.
    batch = NumpyBatches(open_source(ds), seed=5, batch_size=8, block_size=2).batch_at(4)
    keys = batch[INSTANCE_KEY][:, 0].view(np.uint64).tolist()
    assert [row[INSTANCE_KEY] for row in whole] == keys
    text = _run(ds, "--seed", 5, "--batch-size", 8, "--step", 4, "--block-size", 2)
    assert text.exit_code == 0 and f"{keys[0]:016x}" in text.output


def test_bad_world_is_a_usage_error_and_missing_shard_one_line(ds, tmp_path):
    assert _run(ds, "--seed", 1, "--batch-size", 6, "--step", 0, "--world-size", 4).exit_code == 2
    assert _run(ds, "--seed", 1, "--batch-size", 8, "--step", 0, "--world-size", 2, "--rank", 2).exit_code == 2
    import shutil

    d = tmp_path / "ds"
    shutil.copytree(ds, d)
    os.remove(d / "train" / "part-00000-of-00002.tfrecord")
    result = _run(d, "--seed", 1, "--batch-size", 8, "--step", 0)
    assert result.exit_code == 1
    assert "part-00000-of-00002.tfrecord: shard listed in the manifest is missing" in result.output


def test_a_non_dataset_is_one_line_that_advises_no_option_batches_or_diff_lacks(ds, tmp_path):
    """`batches` has no --max-seq-length / --max-predictions-per-seq / --vocab (the loaders read only
    datasets with a manifest): its refusal of anything else must not tell the user to pass them."""
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "a.txt").write_text("mine\n")
    targets = {tmp_path / "notes": "no manifest", tmp_path / "notes" / "a.txt": "not a directory",
               tmp_path / "nothing": "no such directory", f"{ds}/train/*.tfrecord": "no such directory",
               f"{ds}/train": "no manifest"}
    for target, why in targets.items():
        result = _run(target, "--seed", 1, "--batch-size", 8, "--step", 0)
        lines = result.output.splitlines()
        assert result.exit_code == 1 and len(lines) == 1 and lines[0].startswith(f"Error: {target}"), result.output
        assert why in lines[0] and "--" not in lines[0].split(": ", 2)[-1], result.output
        # `diff` has none of those options either (it compares two manifests).
        result = CliRunner().invoke(main, ["diff", str(target), str(target)])
        assert result.exit_code == 1 and why in result.output and "pass --" not in result.output, result.output
