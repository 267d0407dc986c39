"""Every option is validated before any work: NaN and infinities, ranges, options
neither we nor Beam define (with the closest spelling), Beam options with bad values: exit 2, and
nothing is created or changed."""

from __future__ import annotations

import math

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
