"""`bert-datagen run --whole-word-mask --word-segmenter jieba`: recorded, packed, verified, refused clearly;
with dynamic masking, the loaders' masks take whole words."""

from __future__ import annotations

import itertools
import json

import numpy as np
import pytest
from click.testing import CliRunner

from bert_datagen.contract.fs import LOCAL_FS
from bert_datagen.contract.loading.batches import NumpyBatches
from bert_datagen.contract.loading.source import open_source
from bert_datagen.contract.vocab_io import load_vocab, write_vocab
from bert_datagen.datagen.config import DatagenConfig
from bert_datagen.datagen.record_layout import INSTANCE_KEY, WORD_BITS
from bert_datagen.datagen.segmenters import segmenter_info
from bert_datagen.pipelines.cli import main
from bert_datagen.vocab.train import train_vocab
from tests.datagen.test_datagen_segmenters import PARAGRAPHS
from tests.support.wwm import DocumentWords, document_word_counts, write_zh_corpus

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
                           (["--whole-word-mask", "--word-segmenter", "jieba", "--masking", "dynamic", "--dupe-factor", "1",
                             "--packing"], "--packing with --masking dynamic is not supported")):
        result = run(corpus, "bad", *extra)
        assert result.exit_code == 2 and message in result.output and "Traceback" not in result.output
        assert not (corpus / "bad").exists()


@pytest.fixture(scope="module")
def zh_dynamic(shared_corpora, tmp_path_factory):
    """A few zhwiki articles through `run --masking dynamic --word-segmenter jieba`: (input, vocab, output)."""
    root = tmp_path_factory.mktemp("zh-dynamic")
    path, vocab_path = write_zh_corpus(shared_corpora, root, 4)
    out = root / "dyn"
    result = CliRunner().invoke(main, ["run", "--input", path, "--input-format", "wikiextractor", "--vocab", vocab_path,
                                       "--output", str(out), "--max-seq-length", "64", "--max-predictions-per-seq",
                                       "10", "--masking", "dynamic", "--dupe-factor", "1", "--whole-word-mask",
                                       "--word-segmenter", "jieba"])
    assert result.exit_code == 0, result.output
    return path, vocab_path, out


def test_dynamic_masks_of_segmented_data_take_whole_jieba_words(zh_dynamic):
    """`--masking dynamic` with a segmenter: the records carry the words, and the loaders' masks of
    every epoch take whole jieba words (the words of the documents, segmented here anew)."""
    path, vocab_path, out = zh_dynamic
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["features"][WORD_BITS] == ["int64", 3]  # 64 positions, 28 a value
    verified = CliRunner().invoke(main, ["verify", str(out)])
    assert verified.exit_code == 0, verified.output

    source = open_source(str(out))
    reader = NumpyBatches(source, seed=3, batch_size=8)
    total = reader.order.total
    seen: dict[tuple[int, int], np.ndarray] = {}
    batches = []
    for step in range(2 * total // 8):
        batch = reader.batch_at(step)
        epochs = reader.order.batch_positions(step, 1, 0) // total
        batches.append(batch)
        for key, epoch, row in zip(batch[INSTANCE_KEY][:, 0].tolist(), epochs.tolist(), batch["masked_lm_positions"],
                                   strict=True):
            seen[(key, epoch)] = row
    joined = {k: np.concatenate([b[k] for b in batches]) for k in batches[0]}
    original = joined["input_ids"].copy()
    rows, slots = np.nonzero(joined["masked_lm_weights"] > 0)
    original[rows, joined["masked_lm_positions"][rows, slots]] = joined["masked_lm_ids"][rows, slots]
    vocab = load_vocab(vocab_path, LOCAL_FS)
    config = DatagenConfig(input_format="wikiextractor", whole_word_mask=True, word_segmenter="jieba")
    counts = document_word_counts(DocumentWords(path, vocab, config), original, joined["input_mask"].sum(axis=1),
                                  joined["segment_ids"], joined["masked_lm_positions"], joined["masked_lm_weights"],
                                  vocab, joined[WORD_BITS])
    assert counts["records"] >= total and counts["wrong_word_bits"] == 0  # the records carry generation's words
    assert counts["masked_cjk"] > 1000 and counts["in_multi_char_words"] > 0.5 * counts["masked_cjk"]
    assert counts["whole_word"] >= 0.95 * counts["masked_cjk"], counts  # the rest: words cut by truncation
    assert joined["masked_lm_weights"].sum(axis=1).max() <= 10
    both = [key for key, epoch in seen if epoch == 0 and (key, 1) in seen]
    assert len(both) > total // 2
    assert np.mean([not np.array_equal(seen[(k, 0)], seen[(k, 1)]) for k in both]) > 0.8  # a new mask each epoch


def test_the_pytorch_adapter_masks_segmented_data_as_the_numpy_reader(zh_dynamic):
    pytest.importorskip("torch")
    from bert_datagen.contract.loading.torch_adapter import torch_batches

    source = open_source(str(zh_dynamic[2]))
    reader = NumpyBatches(source, seed=3, batch_size=8)
    steps = reader.order.total // 8 + 2  # into the second epoch
    for workers in (0, 1):
        got = list(itertools.islice(torch_batches(source, seed=3, batch_size=8).loader(num_workers=workers), steps))
        for step, batch in enumerate(got):
            want = reader.batch_at(step)
            assert sorted(batch) == sorted(want) and WORD_BITS in batch
            assert all(np.array_equal(batch[k].numpy(), want[k]) for k in want), step
