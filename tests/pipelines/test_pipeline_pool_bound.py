"""A NotNext pool holds at most --notnext-pool-tokens tokens (issue #44 point 1): the staged pools of
a corpus of large documents stay within a small bound, NotNext partners are still other documents,
and the bytes are the same for one worker and two."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from bert_datagen.contract.fs import LOCAL_FS
from bert_datagen.contract.vocab_io import load_vocab
from bert_datagen.datagen.config import DatagenConfig
from bert_datagen.datagen.staging import pool_from_bytes
from bert_datagen.pipelines.beam.runners import RunnerOptions
from bert_datagen.pipelines.cli import main
from bert_datagen.pipelines.pretraining import run as R
from bert_datagen.pipelines.pretraining import transforms as T
from tests.support.pipeline_corpus import (
    make_documents,
    manifest_of,
    shard_digests,
    tree_snapshot,
    write_sentence_files,
    write_vocab,
)

BOUND = 3_000  # tokens; the corpus holds 11,088, a document at most 700 (under a quarter of it)
CONFIG = DatagenConfig(max_seq_length=64, max_predictions_per_seq=8, dupe_factor=2, num_shards=2,
                       eval_fraction=0.1, input_format="sentences", notnext_pool_tokens=BOUND)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("pool-bound")
    files = write_sentence_files(root / "in", make_documents(60, seed=44, max_sentences=40), n_files=3)
    return {"root": root, "files": files, "vocab": write_vocab(root / "vocab.txt")}


def _staged_pools(corpus: dict, config: DatagenConfig, tmp_path) -> dict[tuple[str, int], list]:
    """Every pool the second pipeline stages, through the transforms themselves (one process)."""
    staging = str(tmp_path / "work")
    reader = T.ReadFiles(config, load_vocab(str(corpus["vocab"]), LOCAL_FS), staging=staging)
    reader.setup()
    read = [e for f in corpus["files"] for e in reader.process((str(f), f.stat().st_size, 0, None))]
    summary = T.read_census((0, read), str(tmp_path / "read-summary.json"), config)
    summary = R.ReadSummary.load(summary, config)
    runs: dict = {}
    for spill in summary.spills:
        for key, run in T.AssignPools(config, summary.num_pools, summary.pool_cuts).process(spill):
            runs.setdefault(key, []).append(run)
    pools = {}
    for key, pool_runs in sorted(runs.items()):
        staged = T.stage_pool((key, pool_runs), staging)
        pools[key] = pool_from_bytes(Path(staged["path"]).read_bytes(), staged["path"])
    return pools


def test_every_staged_pool_holds_at_most_the_bound(corpus, tmp_path) -> None:
    pools = _staged_pools(corpus, CONFIG, tmp_path)
    sizes = {key: sum(len(d.tokens) for d in docs) for key, docs in pools.items()}
    assert len(pools) >= 5 and sum(sizes.values()) > 3 * BOUND
    assert max(len(d.tokens) for docs in pools.values() for d in docs) <= BOUND // 4
    assert max(sizes.values()) <= BOUND, sizes
    assert min(len(docs) for docs in pools.values()) >= 2
    ids = [d.doc_id for docs in pools.values() for d in docs]
    assert len(ids) == len(set(ids)) == 60  # each document in exactly one pool


def test_without_a_reached_bound_the_pools_are_the_count_of_documents(corpus, tmp_path) -> None:
    pools = _staged_pools(corpus, dataclasses.replace(CONFIG, notnext_pool_tokens=10**6), tmp_path)
    assert sorted(split for split, _ in pools) == ["eval", "train"]  # one pool a split, as before the bound


def _generate(corpus: dict, name: str, config: DatagenConfig, beam_args: tuple[str, ...] = ()) -> dict:
    out = corpus["root"] / name
    R.generate_dataset(config, inputs=[str(corpus["root"] / "in" / "*.txt")], vocab_path=str(corpus["vocab"]),
                       output_dir=str(out), runner=RunnerOptions(beam_args=beam_args))
    return {"shards": shard_digests(out), "totals": manifest_of(out)["totals"], "config": manifest_of(out)["config"]}


@pytest.mark.integration
def test_bounded_pools_give_the_same_bytes_for_one_worker_and_two(corpus) -> None:
    one = _generate(corpus, "one", CONFIG)
    two = _generate(corpus, "two", CONFIG, ("--direct_num_workers=2",))
    assert one["shards"] == two["shards"] and one["totals"] == two["totals"]
    totals = one["totals"]
    assert totals["notnext_pools"] >= 5 and totals["notnext_same_document"] == 0 and totals["documents"] == 60
    assert one["config"]["notnext_pool_tokens"] == BOUND
    whole = _generate(corpus, "whole", dataclasses.replace(CONFIG, notnext_pool_tokens=10**6))
    assert whole["totals"]["notnext_pools"] == 2  # train and eval
    assert whole["shards"] != one["shards"]  # the pools decide NotNext partners


def _notnext_partners_are_other_documents(pools: dict) -> None:
    from bert_datagen.datagen.instances import FlatPool, plan_pool_pass

    for docs in pools.values():
        flat = FlatPool.of(docs)
        for pass_index in range(CONFIG.dupe_factor):
            plan = plan_pool_pass(flat, pass_index, CONFIG)
            doc_of_token = np.searchsorted(flat.token_cumsum[flat.first_sentence], np.arange(flat.tokens.size),
                                           side="right") - 1
            notnext = plan.labels.astype(bool)
            assert notnext.any()
            a_doc, b_doc = doc_of_token[plan.a_lo[notnext]], doc_of_token[plan.b_lo[notnext]]
            assert (a_doc != b_doc).all()


def test_notnext_partners_of_bounded_pools_are_other_documents(corpus, tmp_path) -> None:
    _notnext_partners_are_other_documents(_staged_pools(corpus, CONFIG, tmp_path))


@pytest.mark.parametrize(("value", "message"), [
    ("999", "'--notnext-pool-tokens': 999 is not in"),
    (str(2**40 + 1), "'--notnext-pool-tokens'"),
    ("nan", "'--notnext-pool-tokens'"),
    ("12.5", "'--notnext-pool-tokens'"),
])
def test_the_option_is_refused_outside_its_range_before_any_work(corpus, value: str, message: str) -> None:
    root = corpus["root"] / "cli"
    root.mkdir(exist_ok=True)
    before = tree_snapshot(corpus["root"])
    result = CliRunner().invoke(main, ["run", "--input", str(corpus["files"][0]), "--vocab", str(corpus["vocab"]),
                                       "--output", str(root / "out"), "--input-format", "sentences", "--quiet",
                                       "--notnext-pool-tokens", value])
    assert result.exit_code == 2 and "Traceback" not in result.output, result.output
    lines = [line for line in result.output.splitlines() if line.startswith("Error")]
    assert len(lines) == 1 and message in lines[0], result.output
    assert tree_snapshot(corpus["root"]) == before
