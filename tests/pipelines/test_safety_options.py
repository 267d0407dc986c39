"""Every option is validated before any work: NaN and infinities, ranges, options
neither we nor Beam define (with the closest spelling), Beam options with bad values: exit 2, and
nothing is created or changed."""

from __future__ import annotations

import math
import re

import pytest
from click.testing import CliRunner

from bert_datagen.datagen.config import ConfigError, DatagenConfig
from bert_datagen.pipelines.cli import main
from tests.support.pipeline_corpus import make_documents, tree_snapshot, write_text_files, write_vocab


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("opts")
    write_text_files(root / "in", make_documents(8, seed=3), n_files=1)
    return root, write_vocab(root / "vocab.txt")


def run(corpus, *extra: str) -> tuple[int, str]:
    root, vocab = corpus
    args = ["run", "--input", str(root / "in" / "*.txt"), "--vocab", str(vocab), "--output", str(root / "out"),
            "--dupe-factor", "1", "--max-seq-length", "32", "--quiet", *extra]
    before = tree_snapshot(root)
    result = CliRunner().invoke(main, args)
    if result.exit_code == 2:
        assert tree_snapshot(root) == before, "a rejected option must not change anything"
    return result.exit_code, result.output


FLOAT_OPTIONS = ["--masked-lm-prob", "--short-seq-prob", "--target-shard-mb", "--eval-fraction", "--read-chunk-mb"]


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "NaN"])
@pytest.mark.parametrize("option", FLOAT_OPTIONS)
def test_every_float_option_rejects_nan_and_infinities(corpus, option: str, value: str) -> None:
    code, output = run(corpus, option, value)
    assert code == 2 and option in output and "not a finite number" in output, output


def test_float_options_are_exactly_the_checked_ones() -> None:
    """A float option added later without the finite check would slip through: list them all."""
    from bert_datagen.cli.plumbing import FiniteFloat
    from bert_datagen.pipelines.pretraining.cli import run_command

    floats = sorted(o.opts[0] for o in run_command.params if isinstance(o.type, click_float_types()))
    assert floats == sorted(FLOAT_OPTIONS)
    assert all(isinstance(o.type, FiniteFloat) for o in run_command.params if o.opts[0] in FLOAT_OPTIONS)


def click_float_types():
    import click

    from bert_datagen.cli.plumbing import FiniteFloat

    return (click.types.FloatParamType, FiniteFloat)


def test_mask_ratios_reject_nan(corpus) -> None:
    code, output = run(corpus, "--mask-ratios", "nan,0.1,0.1")
    assert code == 2 and "--mask-ratios" in output


@pytest.mark.parametrize(("option", "value", "message"), [
    ("--read-chunk-mb", "0", "not in the range"),
    ("--target-shard-mb", "-1", "not in the range"),
    ("--dask-workers", "0", "--dask-workers"),
    ("--random-seed", str(2**64), "--random-seed"),
    ("--dupe-factor", "0", "--dupe-factor 0 must be >= 1"),
    ("--notnext-pool-size", "1", "--notnext-pool-size 1 must be >= 2"),
    ("--eval-fraction", "1", "--eval-fraction 1.0 must be in [0, 1)"),
    ("--short-seq-prob", "-0.5", "--short-seq-prob -0.5 must be in [0, 1]"),
    ("--text-layout", "novel", "--text-layout"),
    ("--num-shards", "5000000000", "--num-shards 5000000000 is more than 100,000"),
])
def test_number_ranges(corpus, option: str, value: str, message: str) -> None:
    code, output = run(corpus, option, value)
    assert code == 2 and message in output, output


def test_misspelled_option_names_the_closest_spelling(corpus) -> None:
    code, output = run(corpus, "--max-seq-lenght", "64")
    assert code == 2 and "no such option: --max-seq-lenght" in output
    assert "did you mean --max-seq-length?" in output


def test_misspelled_beam_option_names_the_closest_spelling(corpus) -> None:
    code, output = run(corpus, "--direct_num_worker=2")
    assert code == 2 and "--direct_num_worker" in output and "did you mean --direct_num_workers?" in output


@pytest.mark.parametrize("arg", ["--direct_num_workers=abc", "--direct_running_mode=warp_speed"])
def test_beam_option_with_a_bad_value_is_a_usage_error(corpus, arg: str) -> None:
    code, output = run(corpus, arg)
    assert code == 2 and arg.split("=")[0] in output and "Traceback" not in output, output


def test_bad_option_is_reported_before_an_existing_dataset(corpus) -> None:
    root, _ = corpus
    (root / "out").mkdir(exist_ok=True)
    (root / "out" / "manifest.json").write_text("{}")
    try:
        code, output = run(corpus, "--max-seq-lenght", "64")
        assert code == 2 and "--max-seq-lenght" in output
    finally:
        (root / "out" / "manifest.json").unlink()
        (root / "out").rmdir()


def test_valid_beam_options_still_pass(corpus) -> None:
    code, output = run(corpus, "--direct_num_workers=1", "--num-shards", "1")
    assert code == 0, output


@pytest.mark.parametrize("field", ["masked_lm_prob", "short_seq_prob", "target_shard_mb", "eval_fraction"])
def test_config_rejects_non_finite_floats(field: str) -> None:
    for value in (math.nan, math.inf):
        with pytest.raises(ConfigError, match="finite"):
            DatagenConfig(**{field: value})


# ---------------------------------------------------------------- issue #43 point 5: every option bounded


@pytest.mark.parametrize(("arg", "message"), [
    ("--direct_num_workers=9223372036854775808", "--direct_num_workers 9223372036854775808 is not in [0, "),
    ("--direct_num_workers=10000", "--direct_num_workers 10000 is not in [0, "),
    ("--direct_num_workers=-1", "--direct_num_workers -1 is not in [0, "),
    ("--num_workers=9223372036854775808", "--num_workers 9223372036854775808 is not in [1, 4000]"),
    ("--max_num_workers=0", "--max_num_workers 0 is not in [1, 4000]"),
    ("--dask_npartitions=0", "--dask_npartitions 0 is not in [1, 10000]"),
    ("--dask_npartitions=9223372036854775807", "--dask_npartitions 9223372036854775807 is not in [1, 10000]"),
    ("--dask_partition_size=-3", "--dask_partition_size -3 is not in [1, "),
    ("--sdk_worker_parallelism=100000", "--sdk_worker_parallelism 100000 is not in [0, "),
    ("--job_port=70000", "--job_port 70000 is not in [0, 65535]"),
    ("--disk_size_gb=0", "--disk_size_gb 0 is not in [1, 65536]"),
    ("--desired_num_unbounded_source_splits=9223372036854775807", "is not in [0, 2147483647]"),
    ("--dask_connection_timeout=soon", "--dask_connection_timeout 'soon' is not an integer"),
    ("--profile_sample_rate=inf", "--profile_sample_rate inf must be a finite number"),
])
def test_beam_options_out_of_their_real_range_are_usage_errors(corpus, arg: str, message: str) -> None:
    """Beam's integer options were passed on unchecked: --direct_num_workers=2**63 started worker
    processes without limit. Each is checked against its range before any work (the helper checks
    that nothing was created)."""
    code, output = run(corpus, arg)
    assert code == 2 and message in output and "Traceback" not in output, output
    assert output.strip().splitlines()[-1].startswith("Error: " + arg.split("=")[0]), output


def test_the_local_worker_bound_is_four_a_core_and_reaches_the_python_api(monkeypatch) -> None:
    from bert_datagen.pipelines.beam import runners
    from bert_datagen.pipelines.beam.runners import RunnerError, RunnerOptions

    monkeypatch.setattr(runners.os, "cpu_count", lambda: 3)
    assert runners.local_worker_limit() == 12
    RunnerOptions(beam_args=("--direct_num_workers", "12"))
    RunnerOptions(runner="DaskRunner", dask_workers=12)
    with pytest.raises(RunnerError, match=r"--direct_num_workers 13 is not in \[0, 12\]: .*4 a core of its 3"):
        RunnerOptions(beam_args=("--direct_num_workers", "13"))
    with pytest.raises(RunnerError, match=r"--dask-workers 13 must be in \[1, 12\]"):
        RunnerOptions(runner="DaskRunner", dask_workers=13)
    # The last of several values is the one Beam takes, and the one checked.
    with pytest.raises(RunnerError, match="--direct_num_workers 99"):
        RunnerOptions(beam_args=("--direct_num_workers=2", "--direct_num_workers=99"))


@pytest.mark.parametrize(("option", "value"), [
    ("--target-shard-mb", "1e-5"), ("--target-shard-mb", "1e-9"), ("--target-shard-mb", "1e308"),
    ("--target-shard-mb", "5e-324"), ("--read-chunk-mb", "1e-9"), ("--read-chunk-mb", "1e308"),
])
def test_sizes_in_mib_are_bounded(corpus, option: str, value: str) -> None:
    """A tiny --target-shard-mb planned 163,056 shards (round the 100,000 cap) and a huge one ended in
    OverflowError; --read-chunk-mb the same: both refused before any work."""
    code, output = run(corpus, option, value)
    assert code == 2 and option in output and "not in the range" in output and "Traceback" not in output, output


def test_config_bounds_the_target_and_the_shards_it_makes() -> None:
    from bert_datagen.datagen.config import MAX_SHARDS
    from bert_datagen.datagen.placement import shard_counts

    for value in (1e-5, 1e-9, 1e308, 65536.5):
        with pytest.raises(ConfigError, match=re.escape(f"--target-shard-mb {value} must be in [0.01, 65536]")):
            DatagenConfig(target_shard_mb=value)
    # The smallest target on much data: more shards than the cap is an error naming the option
    # (at the census, before any shard is written), never a plan of more files.
    config = DatagenConfig(target_shard_mb=0.01, eval_fraction=0.1)
    small = int(0.01 * 2**20)
    assert shard_counts(config, {"train": MAX_SHARDS * small, "eval": small})["train"] == MAX_SHARDS
    with pytest.raises(ConfigError, match="--target-shard-mb 0.01: the train split would be 100,001 shards"):
        shard_counts(config, {"train": MAX_SHARDS * small + 1, "eval": small})


# ---------------------------------------------------------------- issue #43 point 8: optional packages first

BLOCKED = """
import sys
for name in sys.argv[1].split(","):
    sys.modules[name] = None  # as if the extra were not installed: importing it raises ImportError
from bert_datagen.pipelines.cli import main
main(sys.argv[2:], prog_name="bert-datagen")
"""


@pytest.mark.parametrize(("blocked", "extra", "message"), [
    ("jieba", ["--whole-word-mask", "--word-segmenter", "jieba"],
     "--word-segmenter jieba needs the jieba package: pip install 'bert-datagen[zh]'"),
    ("distributed", ["--runner", "DaskRunner"], "--runner DaskRunner needs distributed: pip install 'bert-datagen[dask]'"),
])
def test_a_missing_optional_package_is_found_before_any_work(corpus, blocked, extra, message) -> None:
    """A missing jieba was a `SegmenterError ... (unexpected)` after the pipeline had started; now the
    option is refused before anything is created (exit 2, one Error line, no traceback)."""
    import subprocess
    import sys

    root, vocab = corpus
    before = tree_snapshot(root)
    done = subprocess.run([sys.executable, "-c", BLOCKED, blocked, "run", "--input", str(root / "in" / "*.txt"),
                           "--vocab", str(vocab), "--output", str(root / "blocked"), "--dupe-factor", "1", *extra],
                          capture_output=True, text=True, timeout=120)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and lines[-1] == f"Error: {message}", done.stderr
    assert "Traceback" not in done.stderr and "unexpected" not in done.stderr
    assert tree_snapshot(root) == before


def test_the_library_checks_the_segmenter_before_any_work(corpus, monkeypatch) -> None:
    import sys

    from bert_datagen.datagen import segmenters
    from bert_datagen.pipelines.beam.errors import DatagenError
    from bert_datagen.pipelines.pretraining.run import generate_dataset

    root, vocab = corpus
    monkeypatch.setitem(sys.modules, "jieba", None)
    segmenters.segmenter_info.cache_clear()
    before = tree_snapshot(root)
    config = DatagenConfig(whole_word_mask=True, masking_unit="word", word_segmenter="jieba", dupe_factor=1)
    with pytest.raises(DatagenError, match="needs the jieba package"):
        generate_dataset(config, inputs=[str(root / "in" / "*.txt")], vocab_path=str(vocab),
                         output_dir=str(root / "lib"))
    assert tree_snapshot(root) == before
    segmenters.segmenter_info.cache_clear()
