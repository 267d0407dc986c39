"""`bert-datagen run --whole-word-mask --word-segmenter jieba`: recorded, packed, verified, refused clearly."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from bert_datagen.contract.fs import LOCAL_FS
from bert_datagen.contract.vocab_io import write_vocab
from bert_datagen.datagen.segmenters import segmenter_info
from bert_datagen.pipelines.cli import main
from bert_datagen.vocab.train import train_vocab
from tests.datagen.test_datagen_segmenters import PARAGRAPHS

pytest.importorskip("jieba")


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("zh")
    docs = ["\n".join(PARAGRAPHS[i % 5:] + PARAGRAPHS[:i % 5]) for i in range(30)]
    (root / "zh.txt").write_text("\n\n".join(docs) + "\n", encoding="utf-8")
    write_vocab(train_vocab(PARAGRAPHS, vocab_size=600, do_lower_case=True, min_frequency=1), str(root / "vocab.txt"),
                LOCAL_FS)
    return root


def run(corpus, out, *extra):
    return CliRunner().invoke(main, ["run", "--input", str(corpus / "zh.txt"), "--vocab", str(corpus / "vocab.txt"),
                                     "--output", str(corpus / out), "--max-seq-length", "64",
                                     "--max-predictions-per-seq", "10", "--dupe-factor", "2", *extra])


@pytest.mark.parametrize("extra", [["--whole-word-mask"], ["--masking-unit", "span", "--packing"]])
def test_segmented_runs_record_the_segmenter_and_verify(corpus, extra):
    out = "seg-" + "-".join(e.strip("-") for e in extra)
    result = run(corpus, out, *extra, "--word-segmenter", "jieba")
    assert result.exit_code == 0, result.output
    assert "word segmenter" in result.output and "sentences segmented" in result.output
    manifest = json.loads((corpus / out / "manifest.json").read_text())
    assert manifest["config"]["word_segmenter"] == segmenter_info("jieba")
    assert manifest["totals"]["segmented_sentences"] > 0
    verified = CliRunner().invoke(main, ["verify", str(corpus / out)])
    assert verified.exit_code == 0, verified.output


def test_bad_segmenter_options_are_usage_errors(corpus):
    for extra, message in ((["--word-segmenter", "jieba"], "needs --whole-word-mask"),
                           (["--whole-word-mask", "--word-segmenter", "nope"], "not one of jieba"),
                           (["--whole-word-mask", "--word-segmenter", "jieba", "--masking", "dynamic", "--dupe-factor", "1"],
                            "--masking dynamic is not supported")):
        result = run(corpus, "bad", *extra)
        assert result.exit_code == 2 and message in result.output and "Traceback" not in result.output
        assert not (corpus / "bad").exists()
