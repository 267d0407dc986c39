"""The pre-training variants end to end: golden shard checksums for each new option, the features
their records carry, and byte-identical output whoever runs them (in memory, two worker processes,
other files in another order).

If a change alters a pin on purpose, update it in the same commit and say why.
"""

from __future__ import annotations

import dataclasses
import io

import pytest

from bert_datagen.datagen.config import DatagenConfig
from bert_datagen.datagen.example_exact import decode_example
from bert_datagen.datagen.record_layout import feature_spec
from bert_datagen.datagen.tfrecord import iter_tfrecords
from bert_datagen.pipelines.beam.runners import RunnerOptions
from bert_datagen.pipelines.pretraining.run import generate_dataset
from tests.support.pipeline_corpus import (
    make_documents,
    manifest_of,
    shard_digests,
    write_sentence_files,
    write_text_files,
    write_vocab,
)
from tests.support.pipeline_golden import CONFIG as GOLDEN_CONFIG

VARIANTS = {
    "span": dict(masking_unit="span"),
    "doc-sentences": dict(objective="doc-sentences"),
    "full-sentences": dict(objective="full-sentences", masking_unit="word"),
    "dynamic": dict(masking="dynamic", dupe_factor=1),
    "dynamic-full-sentences": dict(objective="full-sentences", masking="dynamic", dupe_factor=1),
}

GOLDEN = {
    "span": {
        "eval/part-00000-of-00001.tfrecord":
            "bac9b122166198b34d93630f85d6b8be2ba18769bb238fdd29c591e921bfa7fb",
        "train/part-00000-of-00002.tfrecord":
            "4a5c3994ae12b55ad06d210c63b92e48332a5bace1f1e43c14fbf2d90e68b1cf",
        "train/part-00001-of-00002.tfrecord":
            "d145b579c4c92568b2f912dae636be52830570c2d734c968643d3b83648d1242",
    },
    "doc-sentences": {
        "eval/part-00000-of-00001.tfrecord":
            "aa7ba19b2fc3170eb7b393f5ab2f0a208b08f7825e89b853cc165491f44a4990",
        "train/part-00000-of-00002.tfrecord":
            "7ae519a80bd22a66452136cc6568c0599148b6a2e6bf969dc655cc19a5cb432a",
        "train/part-00001-of-00002.tfrecord":
            "abf7c0828678e7c992ac259b46d6346d8cdb21ca4d60a89f555e877b90aed6c2",
    },
    "full-sentences": {
        "eval/part-00000-of-00001.tfrecord":
            "fed939495ffbd78d0f2c09ab766efbb2a3ad08a5bc06746fd1022bf1c7f5b725",
        "train/part-00000-of-00002.tfrecord":
            "ccd500d6de2d90c8886dcc083c6ffff31c8bb3297ce1e7f08c2cd43e5dad5b26",
        "train/part-00001-of-00002.tfrecord":
            "49c5109a0edcbe018399b289a857d266057ca0acbc780a8c2f17af16751f5ee0",
    },
    "dynamic": {
        "eval/part-00000-of-00001.tfrecord":
            "5d8d3b31432dab0e814605e49908a34cdd7a22e83927dfc28e3e246c6d34a5d0",
        "train/part-00000-of-00002.tfrecord":
            "5fe2ca26b7de84c8236bb70692826d3fe39391979440b7ee66e6dffc4ad78cd5",
        "train/part-00001-of-00002.tfrecord":
            "cfbd8ed7e3db708ac48a7d7b2de810e4c6c64636319c551d911cdb6a4345737f",
    },
    "dynamic-full-sentences": {
        "eval/part-00000-of-00001.tfrecord":
            "729ff551407902eb8f94a73a64844cd7691d6333eb1960de38b556bd408f3674",
        "train/part-00000-of-00002.tfrecord":
            "26be7fea1f40a152ffcab613be97a5e79a2dbfc43eea8e33d773ef76cda53419",
        "train/part-00001-of-00002.tfrecord":
            "b0cd3d6e77ea5ce1347a547abdd497f9a5566a98a601fa23cd58b989eb51ab24",
    },
}


@pytest.fixture(scope="module")
def golden_corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("variants-golden")
    write_sentence_files(root / "in", make_documents(30, seed=42, max_sentences=8), n_files=2)
    return root, str(write_vocab(root / "vocab.txt"))


@pytest.mark.parametrize("name", list(VARIANTS))
def test_golden_variant(golden_corpus, name):
    root, vocab = golden_corpus
    config = dataclasses.replace(GOLDEN_CONFIG, **VARIANTS[name])
    out = root / name
    generate_dataset(config, inputs=[str(root / "in" / "*.txt")], vocab_path=vocab, output_dir=str(out))
    manifest = manifest_of(out)
    assert shard_digests(out) == GOLDEN[name]
    assert manifest["config"]["objective"] == config.objective and manifest["config"]["masking"] == config.masking
    spec = feature_spec(config.max_seq_length, config.max_predictions_per_seq, config.objective, config.masking)
    assert {k: tuple(v) for k, v in manifest["features"].items()} == spec
    shard = out / manifest["splits"]["train"]["shards"][0]["path"]
    first = next(iter_tfrecords(io.BytesIO(shard.read_bytes()), str(shard)))
    assert set(decode_example(first)) == set(spec)
    if config.masking == "dynamic":
        assert manifest["totals"]["masked_tokens"] == 0
    if config.objective != "nsp":
        crossing = manifest["totals"]["cross_document_instances"]
        assert (crossing > 0) == (config.objective == "full-sentences")
        assert manifest["totals"]["notnext_fraction"] == 0.0


# ---------------------------------------------------------------- reproducibility across runners


REPRO_CONFIG = DatagenConfig(max_seq_length=48, max_predictions_per_seq=7, dupe_factor=2, num_shards=3,
                             eval_fraction=0.15, notnext_pool_size=25)


@pytest.fixture(scope="module")
def repro_corpus(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("variants-repro")
    docs = make_documents(90, seed=21)
    write_text_files(root / "a", docs, n_files=4)
    write_text_files(root / "b", docs[45:] + docs[:45], n_files=7, stem="zz")  # other files, other order
    return {"root": root, "vocab": str(write_vocab(root / "vocab.txt"))}


@pytest.mark.integration
@pytest.mark.parametrize("name", list(VARIANTS))
def test_variant_is_byte_identical_across_runners_and_file_layouts(repro_corpus, name):
    config = dataclasses.replace(REPRO_CONFIG, **VARIANTS[name])
    root = repro_corpus["root"]
    digests = {}
    for run, inputs, args in (("memory", "a/*.txt", []), ("two-workers", "a/*.txt", ["--direct_num_workers=2"]),
                              ("resplit", "b/zz-*.txt", [])):
        out = root / f"{name}-{run}"
        generate_dataset(config, inputs=[str(root / inputs)], vocab_path=repro_corpus["vocab"],
                         output_dir=str(out), runner=RunnerOptions(beam_args=args))
        digests[run] = shard_digests(out)
    assert digests["memory"] == digests["two-workers"] == digests["resplit"]
    assert len(digests["memory"]) == 4


# ---------------------------------------------------------------- the CLI


def test_cli_options_reach_the_manifest_and_are_checked(golden_corpus):
    from click.testing import CliRunner

    from bert_datagen.pipelines.cli import main

    root, vocab = golden_corpus
    base = ["run", "--input", str(root / "in" / "*.txt"), "--input-format", "sentences", "--vocab", vocab,
            "--max-seq-length", "32", "--max-predictions-per-seq", "5", "--quiet"]
    out = root / "cli-variant"
    result = CliRunner().invoke(main, [*base, "--output", str(out), "--objective", "full-sentences",
                                       "--masking", "dynamic", "--masking-unit", "span"])
    assert result.exit_code == 0, result.output
    config = manifest_of(out)["config"]
    assert (config["objective"], config["masking"], config["masking_unit"], config["dupe_factor"]) == (
        "full-sentences", "dynamic", "span", 1)
    for extra, message in ((["--masking", "dynamic", "--dupe-factor", "2"], "--dupe-factor"),
                           (["--whole-word-mask", "--masking-unit", "span"], "--whole-word-mask"),
                           (["--objective", "pairs"], "--objective"),
                           (["--masking-unit", "phrase"], "--masking-unit")):
        result = CliRunner().invoke(main, [*base, "--output", str(root / "cli-bad"), *extra])
        assert result.exit_code == 2 and message in result.output, (extra, result.output)
        assert not (root / "cli-bad" / "manifest.json").exists()
