"""The pipeline's pure pieces: placement, pools, splits, shard sorting, errors, runner options."""

from __future__ import annotations

import dataclasses
import json
import re
from dataclasses import dataclass

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bert_datagen.datagen import framed as F
from bert_datagen.datagen import placement as P
from bert_datagen.datagen import staging as S
from bert_datagen.datagen.config import DatagenConfig
from bert_datagen.datagen.documents import unique_documents
from bert_datagen.pipelines.beam import fsio, runners
from bert_datagen.pipelines.beam.errors import extract_input_error, input_error
from bert_datagen.pipelines.pretraining import run as R
from bert_datagen.pipelines.pretraining import transforms as T


@given(st.lists(st.integers(0, 2**64 - 1), min_size=1, max_size=50), st.integers(1, 2**32 - 1))
@settings(max_examples=200, deadline=None)
def test_shard_of_keys_is_exact_128_bit_arithmetic(keys: list[int], n: int) -> None:
    got = P.shard_of_keys(np.asarray(keys, dtype=np.uint64), n).tolist()
    assert got == [(k * n) >> 64 for k in keys]


def test_shards_are_contiguous_ranges_of_the_hash_space() -> None:
    keys = np.sort(np.random.default_rng(0).integers(0, 2**64 - 1, 1000, dtype=np.uint64))
    shards = P.shard_of_keys(keys, 7)
    assert (np.diff(shards) >= 0).all() and shards.min() == 0 and shards.max() == 6


def test_pool_and_split_depend_on_identity_and_seed_only() -> None:
    cfg = DatagenConfig(eval_fraction=0.25, random_seed=7)
    ids = [int(x) for x in np.random.default_rng(1).integers(0, 2**63, 4000, dtype=np.uint64)]
    splits = [P.split_of(i, cfg) for i in ids]
    frac = splits.count("eval") / len(ids)
    assert 0.2 < frac < 0.3
    assert splits == [P.split_of(i, DatagenConfig(eval_fraction=0.25, random_seed=7)) for i in ids]
    assert splits != [P.split_of(i, DatagenConfig(eval_fraction=0.25, random_seed=8)) for i in ids]
    pools = [P.pool_of(i, 5, cfg) for i in ids]
    assert set(pools) == set(range(5))
    assert all(P.split_of(i, DatagenConfig()) == "train" for i in ids[:50])


def test_num_pools_from_global_count() -> None:
    cfg = DatagenConfig(notnext_pool_size=100)
    assert [P.num_pools_for(n, cfg) for n in (0, 1, 99, 100, 199, 200, 1000)] == [1, 1, 1, 1, 1, 2, 10]


@dataclass
class Doc:
    doc_id: int
    tokens: np.ndarray
    sentence_ends: np.ndarray


def test_dedupe_sorted_collapses_equal_identities_whatever_the_order() -> None:
    docs = [Doc(i, np.arange(i % 5 + 1, dtype=np.int32), np.array([1])) for i in (9, 3, 9, 1, 3, 3)]
    unique, dupes = unique_documents(docs)
    assert [d.doc_id for d in unique] == [1, 3, 9] and dupes == 3
    unique2, _ = unique_documents(list(reversed(docs)))
    assert [d.doc_id for d in unique2] == [1, 3, 9]


def _records(keys: list[int]) -> F.EncodedRecords:
    blobs = [f"rec{k}".encode() for k in keys]
    return F.EncodedRecords(np.asarray(keys, np.uint64), np.asarray([len(b) for b in blobs], np.int64),
                            b"".join(blobs))


def test_sorted_shard_orders_by_key_across_parts() -> None:
    shard = F.sorted_shard([_records([5, 1]), F.EncodedRecords.empty(), _records([3, 2**63])], "x")
    assert shard.keys.tolist() == [1, 3, 5, 2**63]
    assert shard.blob == b"rec1rec3rec5" + f"rec{2**63}".encode()


def test_sorted_shard_fails_loudly_on_duplicate_keys() -> None:
    with pytest.raises(RuntimeError, match="share the key"):
        F.sorted_shard([_records([5, 1]), _records([5])], "train/part-00000-of-00001.tfrecord")


def test_fingerprint_ignores_order_and_duplicates() -> None:
    a = P.fingerprint([np.array([3, 1], np.uint64), np.array([2], np.uint64)])
    b = P.fingerprint([np.array([2, 3, 3], np.uint64), np.array([1], np.uint64)])
    assert a == b
    assert a != P.fingerprint([np.array([1, 2], np.uint64)])


def test_record_bytes_estimate_is_close_for_the_original_format() -> None:
    cfg = DatagenConfig(dupe_factor=10)
    # 764 bytes a record measured for 128/20 records (MEASUREMENTS.md); the estimate is within 15%.
    per_record = P.estimated_record_bytes(1, 125, cfg) / 10
    assert 764 <= per_record <= 1.15 * 764
    assert P.estimated_record_bytes(0, 0, cfg) == 0
    assert P.estimated_record_bytes(100, 10, cfg) == 10 * 100 * (4 * 128 + 8 * 20 + 180)


def test_shard_counts_from_size_target_or_fixed() -> None:
    cfg = DatagenConfig(target_shard_mb=1.0, eval_fraction=0.1)
    assert P.shard_counts(cfg, {"train": 5 * 2**20 + 1, "eval": 10}) == {"train": 6, "eval": 1}
    cfg = DatagenConfig(num_shards=3)
    assert P.shard_counts(cfg, {"train": 0}) == {"train": 3}
    assert P.shard_name("train", 2, 10) == "train/part-00002-of-00010.tfrecord"


def test_input_errors_survive_runner_wrapping() -> None:
    inner = input_error("/data/x.txt: looks like a binary file")
    wrapped = RuntimeError(f"Traceback ...\n  {inner} [while running 'ReadFiles']\n more")
    assert extract_input_error(wrapped) == "/data/x.txt: looks like a binary file"
    try:
        raise ValueError("outer") from inner
    except ValueError as e:
        assert extract_input_error(e) == "/data/x.txt: looks like a binary file"
    assert extract_input_error(RuntimeError("something else")) is None


def test_summarize_combines_results_deterministically(tmp_path) -> None:
    items = [
        {"kind": "shard", "split": "train", "index": 1, "shard": {"path": "b"}, "stats": {"instances": 4}},
        {"kind": "pool", "documents": 2},
        {"kind": "shard", "split": "train", "index": 0, "shard": {"path": "a"}, "stats": {"instances": 1}},
        {"kind": "read", "decode_errors": 3, "documents/train": 0},
        {"kind": "census", "fingerprint": "f" * 64},
        {"kind": "pool", "documents": 1},
    ]
    out = tmp_path / "s.json"
    T.summarize((0, items), str(out))
    first = out.read_bytes()
    T.summarize((0, list(reversed(items))), str(out))
    assert out.read_bytes() == first
    summary = json.loads(first)
    assert [s["path"] for s in summary["shards"]["train"]] == ["a", "b"]
    assert summary["totals"]["documents"] == 3 and summary["totals"]["decode_errors"] == 3
    assert summary["totals"]["instances"] == 5 and summary["fingerprint"] == "f" * 64


def test_identity_census_counts_distinct_documents_per_split() -> None:
    # rows: identities, token counts (a duplicate identity has the same content, so the same count)
    parts = [{"train": np.array([[5, 1, 5], [50, 10, 50]], np.uint64)},
             {"train": np.array([[1, 9], [10, 90]], np.uint64), "eval": np.array([[4], [40]], np.uint64)}]
    census = P.identity_census((0, parts))
    assert census["distinct_docs/train"] == 3 and census["distinct_docs/eval"] == 1
    assert census["distinct_tokens/train"] == 150 and census["distinct_tokens/eval"] == 40
    assert census["fingerprint"] == P.fingerprint([np.array([1, 4, 5, 9], np.uint64)])
    assert P.identity_census((0, list(reversed(parts)))) == census
    cfg = DatagenConfig(target_shard_mb=1.0)
    assert P.shard_counts_of(census, cfg) == P.shard_counts(cfg, {"train": P.estimated_record_bytes(3, 150, cfg)})


# ---------------------------------------------------------------- runner options


def test_direct_runner_defaults_and_multi_processing() -> None:
    with runners.runner_setup(runners.RunnerOptions("direct")) as setup:
        assert setup.runner == "DirectRunner" and setup.workers == 1
        assert "--direct_running_mode=multi_processing" not in setup.args
    with runners.runner_setup(runners.RunnerOptions("DirectRunner", ["--direct_num_workers=2"])) as setup:
        assert setup.workers == 2 and "--direct_running_mode=multi_processing" in setup.args
        opts = setup.options.get_all_options()
        assert opts["direct_num_workers"] == 2 and opts["direct_running_mode"] == "multi_processing"


def test_unknown_runner_and_runner_as_beam_flag_are_rejected() -> None:
    with pytest.raises(runners.RunnerError, match="not one of"):
        runners.canonical_runner("SparkRunner")
    with pytest.raises(runners.RunnerError, match="--runner NAME"):
        with runners.runner_setup(runners.RunnerOptions("direct", ["--runner=DaskRunner"])):
            pass


def test_dask_runner_with_scheduler_address_starts_no_cluster() -> None:
    with runners.runner_setup(runners.RunnerOptions("DaskRunner", dask_scheduler="tcp://127.0.0.1:8786")) as s:
        opts = s.options.get_all_options()
        assert opts["runner"] == runners.DASK_RUNNER_PATH
        assert s.options.get_all_options(retain_unknown_options=True)
        assert "--dask_client_address=tcp://127.0.0.1:8786" in s.args
        assert "--dask_npartitions=8" in s.args and not s.local


def test_portable_runner_needs_a_job_endpoint() -> None:
    with pytest.raises(runners.RunnerError, match="--job_endpoint"):
        with runners.runner_setup(runners.RunnerOptions("PortableRunner", ["--environment_type=EXTERNAL"])):
            pass
    with runners.runner_setup(runners.RunnerOptions("portable", ["--job_endpoint=embed"])) as setup:
        assert setup.runner == "PortableRunner" and not setup.local
        assert setup.options.get_all_options()["job_endpoint"] == "embed"


def test_dataflow_needs_project_and_ships_the_package(tmp_path) -> None:
    with pytest.raises(runners.RunnerError, match="--project"):
        runners.dataflow_args(["--region=us-central1"], str(tmp_path))
    base = ["--project=p", "--region=r", "--temp_location=gs://b/tmp"]
    built = []
    args = runners.dataflow_args(base, str(tmp_path), wheel_builder=lambda d: built.append(d) or f"{d}/x.whl")
    assert args[-1] == f"--extra_package={tmp_path}/x.whl" and built == [str(tmp_path)]
    own = runners.dataflow_args([*base, "--setup_file=./setup.py"], str(tmp_path),
                                wheel_builder=lambda d: pytest.fail("must not build"))
    assert own == [*base, "--setup_file=./setup.py"]


# ---------------------------------------------------------------- portability


def _plan(tmp_path) -> R.PipelinePlan:
    from bert_datagen.contract.fs import LOCAL_FS
    from bert_datagen.contract.vocab_io import load_vocab

    vocab_path = tmp_path / "vocab.txt"
    vocab_path.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "cat"]) + "\n")
    cfg = DatagenConfig(eval_fraction=0.1)
    return R.PipelinePlan(config=cfg, vocab=load_vocab(str(vocab_path), LOCAL_FS), files=[("/x/a.txt", 3, 0, None)],
                          output_dir=str(tmp_path / "out"), summary_path=str(tmp_path / "s.json"),
                          staging_dir=str(tmp_path / "out" / ".staging-x"))


READ = R.ReadSummary(spills=[("train", "/x/spill.bin")], num_pools={"train": 1, "eval": 1},
                     num_shards={"train": 2, "eval": 1}, totals={}, fingerprint="0" * 64)


def _both_pipelines(p, plan: R.PipelinePlan) -> None:
    """Both graphs of a run in one pipeline object (to inspect them together)."""
    import apache_beam as beam

    R.build_read_pipeline(p, plan)
    R.build_pipeline(beam.pvalue.PBegin(p), plan, READ)


def test_pipeline_translates_to_a_portable_proto_whose_dofns_unpickle(tmp_path) -> None:
    import apache_beam as beam
    from apache_beam.internal import pickler
    from apache_beam.portability import common_urns
    from apache_beam.portability.api import beam_runner_api_pb2

    p = beam.Pipeline()
    _both_pipelines(p, _plan(tmp_path))
    proto = p.to_runner_api()
    names = {t.unique_name for t in proto.components.transforms.values()}
    for label in ("ReadFiles", "AssignPools", "StagePools", "BuildInstances", "GroupShards", "WriteShards",
                  "Summarize"):
        assert label in names
    pardo_urn = common_urns.primitives.PAR_DO.urn
    seen = 0
    for transform in proto.components.transforms.values():
        if transform.spec.urn != pardo_urn:
            continue
        payload = beam_runner_api_pb2.ParDoPayload.FromString(transform.spec.payload)
        fn = pickler.loads(payload.do_fn.payload)[0]
        assert fn is not None
        seen += 1
    assert seen >= 10
    # A runner rebuilds the pipeline from the proto (what a portable job server does).
    again = beam.Pipeline.from_runner_api(proto, p.runner, p._options)
    assert again.to_runner_api().components.transforms.keys() == proto.components.transforms.keys()


def test_no_transform_waits_on_a_side_input(tmp_path) -> None:
    """Beam's DaskRunner recomputes the whole graph behind a side input in every task that reads it
    (the input was read five times), and a local runner buffers the main input in memory until the
    side input is ready: the census ends the first pipeline instead."""
    import apache_beam as beam

    p = beam.Pipeline()
    _both_pipelines(p, _plan(tmp_path))

    class SideInputs(beam.pipeline.PipelineVisitor):
        def __init__(self) -> None:
            self.found: list[str] = []

        def visit_transform(self, node) -> None:
            if node.side_inputs:
                self.found.append(node.full_label)

    visitor = SideInputs()
    p.visit(visitor)
    assert visitor.found == []


def test_the_runner_carries_identities_not_tokens(tmp_path) -> None:
    """What ReadFiles hands the runner is 16 bytes a document (identity, token count) and a path:
    the tokens go to a spill file, read back a pool at a time."""
    import pickle

    from tests.support.pipeline_corpus import make_documents, write_sentence_files

    plan = _plan(tmp_path)
    plan = dataclasses.replace(plan, config=DatagenConfig(input_format="sentences", eval_fraction=0.1))
    (path,) = write_sentence_files(tmp_path / "in", make_documents(300, seed=4), 1)
    vocab_words = {w for line in path.read_text().split() for w in [line.strip(".,").lower()]}
    vocab_file = tmp_path / "v.txt"
    vocab_file.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *sorted(vocab_words)]) + "\n")
    from bert_datagen.contract.fs import LOCAL_FS
    from bert_datagen.contract.vocab_io import load_vocab

    fn = T.ReadFiles(plan.config, load_vocab(str(vocab_file), LOCAL_FS), staging=str(tmp_path / "work"))
    fn.setup()
    (element,) = list(fn.process((str(path), path.stat().st_size, 0, None)))
    docs = sum(spill["identities"].shape[1] for spill in element["spills"].values())
    tokens = sum(int(spill["identities"][1].sum()) for spill in element["spills"].values())
    assert docs == 300 and tokens > 20 * docs
    assert len(pickle.dumps(element)) < 16 * docs + 2000
    read = R.ReadSummary(spills=[(split, s["path"]) for split, s in sorted(element["spills"].items())],
                         num_pools={"train": 3, "eval": 1}, num_shards={"train": 1, "eval": 1}, totals={},
                         fingerprint="")
    pools: dict = {}
    for spill in read.spills:
        for key, run in T.AssignPools(plan.config, read.num_pools).process(spill):
            pools.setdefault(key, []).append(run)
    built = [T.build_pool((key, runs)) for key, runs in sorted(pools.items())]
    assert sum(len(docs) for _, docs, _ in built) == 300
    for (split, pool), docs, _ in built:
        assert all(P.pool_of(d.doc_id, read.num_pools[split], plan.config) == pool for d in docs)
        assert all(P.split_of(d.doc_id, plan.config) == split for d in docs)


def test_every_dofn_round_trips_through_beam_pickler_and_cloudpickle(tmp_path) -> None:
    import apache_beam as beam
    import cloudpickle
    from apache_beam.internal import pickler

    plan = _plan(tmp_path)
    fns = [T.ReadFiles(plan.config, plan.vocab, True), T.AssignPools(plan.config, READ.num_pools),
           T.BuildInstances(plan.config, plan.vocab, plan.staging_dir, READ.num_shards),
           T.WriteShard(plan.output_dir, READ.num_shards)]
    for fn in fns:
        for dumps, loads in ((pickler.dumps, pickler.loads), (cloudpickle.dumps, cloudpickle.loads)):
            back = loads(dumps(fn))
            assert type(back) is type(fn) and vars(back).keys() == vars(fn).keys()
    p = beam.Pipeline()
    _both_pipelines(p, plan)

    class Collect(beam.pipeline.PipelineVisitor):
        def __init__(self) -> None:
            self.fns = []

        def visit_transform(self, node) -> None:
            if isinstance(node.transform, beam.ParDo):
                self.fns.append(node.transform.fn)

    visitor = Collect()
    p.visit(visitor)
    assert len(visitor.fns) >= 10
    for fn in visitor.fns:
        assert type(pickler.loads(pickler.dumps(fn))) is type(fn)
        assert type(cloudpickle.loads(cloudpickle.dumps(fn))) is type(fn)


def test_beam_options_with_values_pass_and_stray_words_do_not() -> None:
    from bert_datagen.pipelines.beam.options import stray_arguments

    assert stray_arguments(["--project", "p", "--region=r", "--streaming", "--temp_location", "gs://t"]) == []
    assert stray_arguments(["--region=r", "oops"]) == ["oops"]
    assert stray_arguments(["oops", "--x"]) == ["oops"]


def pool_from_file(path: str) -> list:
    """A staged pool read back as the build stage reads it (through the Beam filesystem)."""
    return S.pool_from_bytes(fsio.read_bytes(path), path)


def test_staging_files_round_trip(tmp_path) -> None:
    docs = [Doc(7, np.arange(5, dtype=np.int32), np.array([2, 5], np.int32)),
            Doc(2**63 + 1, np.arange(3, dtype=np.int32), np.array([3], np.int32))]
    path = str(tmp_path / "pool.npz")
    (tmp_path / "pool.npz").write_bytes(S.pool_to_bytes(docs))
    back = pool_from_file(path)
    assert [d.doc_id for d in back] == [7, 2**63 + 1]
    assert [d.tokens.tolist() for d in back] == [[0, 1, 2, 3, 4], [0, 1, 2]]
    assert [d.sentence_ends.tolist() for d in back] == [[2, 5], [3]]
    (tmp_path / "empty.npz").write_bytes(S.pool_to_bytes([]))
    assert pool_from_file(str(tmp_path / "empty.npz")) == []
    records = _records([5, 1, 9])
    (tmp_path / "r.npz").write_bytes(S.records_to_bytes(records))
    again = T.records_from_file(str(tmp_path / "r.npz"))
    assert again.keys.tolist() == [5, 1, 9] and bytes(again.blob) == records.blob
    assert again.lengths.tolist() == records.lengths.tolist()


def test_read_tasks_cut_big_splittable_files_only(tmp_path) -> None:
    mb = 2**20
    files = [("/c/big.jsonl", 5 * mb), ("/c/small.jsonl", mb), ("/c/big.jsonl.gz", 5 * mb)]
    tasks = R.read_tasks(files, "jsonl", 2.0)
    assert tasks[:3] == [("/c/big.jsonl", 5 * mb, 0, 2 * mb), ("/c/big.jsonl", 5 * mb, 2 * mb, 4 * mb),
                         ("/c/big.jsonl", 5 * mb, 4 * mb, 5 * mb)]
    assert tasks[3:] == [("/c/small.jsonl", mb, 0, None), ("/c/big.jsonl.gz", 5 * mb, 0, None)]
    assert all(end is None for *_, end in R.read_tasks(files, "text", 2.0))  # layouts are per file
    with pytest.raises(R.DatagenError, match="--read-chunk-mb"):
        R.generate_dataset(DatagenConfig(), inputs=[str(tmp_path / "x")], vocab_path="v", output_dir=str(tmp_path),
                           read_chunk_mb=0)


def test_bench_two_worker_bound_is_serial_part_plus_half_the_task_cpu() -> None:
    from benchmarks.bench_datagen import two_worker_ceiling

    runs = {"1": {"wall_s": 15.0}, "1-core": {"wall_s": 18.0, "outside_tasks_s": 3.0,
                                              "task_cpu_s": {"read": 8.0, "build": 5.0, "write": 2.0}}}
    assert two_worker_ceiling(runs) == {"two_worker_bound_s": 10.5, "ceiling_2_vs_1": 1.43, "ceiling_2_vs_1-core": 1.71}


def test_text_layout_option_reaches_the_config_and_keeps_the_manifest_form(monkeypatch, tmp_path) -> None:
    from click.testing import CliRunner

    from bert_datagen.pipelines.pretraining.cli import run_command

    seen = []

    def fake_generate(config, **kwargs):
        seen.append(config)
        raise R.DatagenError("stop here")

    monkeypatch.setattr(R, "generate_dataset", fake_generate)
    base = ["--input", "x", "--vocab", "v", "--output", str(tmp_path)]
    for extra in ([], ["--text-layout", "book"]):
        result = CliRunner().invoke(run_command, [*base, *extra])
        assert result.exit_code == 1 and "stop here" in result.output
    assert [c.text_layout for c in seen] == ["auto", "book"]
    # Manifests have always recorded the layout as config.extra; the default as an empty dict.
    assert seen[0].to_dict()["extra"] == {} and "text_layout" not in seen[0].to_dict()
    assert seen[1].to_dict()["extra"] == {"text_layout": "book"}
    assert CliRunner().invoke(run_command, [*base, "--text-layout", "novel"]).exit_code == 2


def test_progress_lines_of_a_process_time_from_one_start_and_say_each_count_once(monkeypatch) -> None:
    import io

    from bert_datagen.pipelines.beam import progress

    now = [100.0]
    monkeypatch.setattr(progress, "PROCESS_START", 100.0)
    monkeypatch.setattr(progress.time, "monotonic", lambda: now[0])
    buf = io.StringIO()

    class Stage(T._ReportingDoFn):
        show_progress = True

    read, write = Stage(), Stage()
    read.setup()
    read._progress.stream = buf
    now[0] = 101.2
    read._progress.add(files=1, documents=22)
    now[0] = 101.4
    write.setup()  # a later stage's DoFn, set up once the first has work done
    write._progress.stream = buf
    now[0] = 101.6
    write._progress.add(records_written=5)
    read.teardown()  # nothing since its last line: no second "1 files, 22 documents"
    write._progress.add(records_written=5)  # within the interval: no line until teardown
    now[0] = 103.0
    write.teardown()
    lines = buf.getvalue().splitlines()
    assert [re.search(r", (\d+)s\]: (.*?)( \(|$)", line).group(1, 2) for line in lines] == [
        ("1", "1 files, 22 documents"), ("2", "5 records written"), ("3", "10 records written")]
