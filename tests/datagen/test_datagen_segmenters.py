"""Word segmenters (datagen/segmenters.py) and whole-word masking over segmented words."""

from __future__ import annotations

import dataclasses
import subprocess
import sys

import numpy as np
import pytest

from bert_datagen.datagen.config import ConfigError, DatagenConfig
from bert_datagen.datagen.documents import WORD_CONTINUES, split_marks, tokenize_documents
from bert_datagen.datagen.dynamic import dynamic_mask_keys, mask_records
from bert_datagen.datagen.example_codec import Batch
from bert_datagen.datagen.instances import masked_rows, plan_pool_pass
from bert_datagen.datagen.masking import mask_batch
from bert_datagen.datagen.readers import RawDocument
from bert_datagen.datagen.record_layout import WORD_BITS, feature_spec, pack_word_bits, unpack_word_bits
from bert_datagen.datagen.record_rules import RecordShape, check_batch
from bert_datagen.datagen.segmenters import SegmenterError, get_segmenter, segmenter_info
from bert_datagen.vocab.tokenizer import BertTokenizer
from bert_datagen.vocab.train import train_vocab
from bert_datagen.vocab.vocab_file import Vocab
from tests.support.wwm import whole_word_counts

pytest.importorskip("jieba")

PARAGRAPHS = [
    "数学是利用符号语言研究数量、结构、变化以及空间等概念的一门学科。从某种角度看属于形式科学的一种。",
    "数学透过抽象化和逻辑推理的使用，由计数、计算、量度和对物体形状及运动的观察而产生。",
    "基础数学的知识与运用总是个人与团体生活中不可或缺的一环。到了16世纪，算术、初等代数以及三角学等初等数学已大体完备。",
    "17世纪变量概念的产生使人们开始研究变化中的量与量的互相关系和图形间的互相变换。Isaac Newton 和 Leibniz 发明了微积分。哥德尔（Kurt Gödel）一词源自 mathematikós。",
    "在应用数学内，又被分成两大领域，并且变成了它们自身的学科：统计学和计算机科学。",
]


@pytest.fixture(scope="module")
def vocab() -> Vocab:
    return Vocab.from_tokens(train_vocab(PARAGRAPHS * 3, vocab_size=600, do_lower_case=True, min_frequency=1))


def raws(n: int = 12) -> list[RawDocument]:
    # Documents of several paragraphs each, rotated so that they differ.
    return [RawDocument("mem", i, paragraphs=PARAGRAPHS[i % 5:] + PARAGRAPHS[:i % 5]) for i in range(n)]


def test_jieba_words_are_the_text_and_the_same_in_another_process():
    segment = get_segmenter("jieba")
    words = [segment(p) for p in PARAGRAPHS]
    assert all("".join(w) == p for w, p in zip(words, PARAGRAPHS, strict=True))
    assert ["数学", "是", "利用"] == words[0][:3]
    code = ("import json; from bert_datagen.datagen.segmenters import get_segmenter; import sys; "
            "print(json.dumps([get_segmenter('jieba')(p) for p in json.loads(sys.argv[1])]))")
    import json
    out = subprocess.run([sys.executable, "-c", code, json.dumps(PARAGRAPHS)], capture_output=True, text=True,
                         check=True, timeout=120)
    assert json.loads(out.stdout) == words
    info = segmenter_info("jieba")
    assert info["name"] == "jieba" and info["version"].startswith("0.42") and len(info["dictionary_sha256"]) == 64
    with pytest.raises(SegmenterError, match="unknown word segmenter 'nope'"):
        get_segmenter("nope")


def test_marks_leave_the_token_ids_unchanged(vocab):
    tok = BertTokenizer(vocab)
    plain = tokenize_documents(raws(), tok, DatagenConfig(), {})
    stats: dict[str, int] = {}
    config = DatagenConfig(whole_word_mask=True, word_segmenter="jieba")
    marked = tokenize_documents(raws(), tok, config, stats)
    for a, b in zip(plain, marked, strict=True):
        ids, continues = split_marks(b.tokens)
        assert np.array_equal(ids, a.tokens) and a.doc_id == b.doc_id
        assert continues.any() and not (a.tokens & WORD_CONTINUES).any()
    # "数学是利用" -> 数学 | 是 | 利用: the second character of each two-character word continues it.
    assert split_marks(marked[0].tokens[:5])[1].tolist() == [False, True, False, False, True]
    # jieba cuts "Gödel" into G | ö | del, inside what WordPiece sees as one word: joined back.
    assert get_segmenter("jieba")("Kurt Gödel")[-3:] == ["G", "ö", "del"]
    assert stats["segmented_sentences"] == stats["sentences"] and "segmenter_unaligned_sentences" not in stats


@pytest.mark.parametrize("unit", ["word", "span"])
def test_masking_takes_whole_segmented_words(vocab, unit):
    tok = BertTokenizer(vocab)
    counts = {}
    for segmenter in (None, "jieba"):
        config = DatagenConfig(max_seq_length=64, max_predictions_per_seq=10, masking_unit=unit,
                               word_segmenter=segmenter)
        docs = sorted(tokenize_documents(raws(40), tok, config, {}), key=lambda d: d.doc_id)
        total = dict.fromkeys(("masked_cjk", "whole_word", "in_multi_char_words", "whole_multi_char_words"), 0)
        for pass_index in range(3):
            plan = plan_pool_pass(docs, pass_index, config)
            rows = np.arange(len(plan))
            batch = masked_rows(plan, rows, config, vocab)
            marked, lengths, _ = plan.layout(rows, config.max_seq_length, vocab)
            if segmenter is None:  # measure against jieba's words all the same
                seg_docs = sorted(tokenize_documents(raws(40), tok, dataclasses.replace(
                    config, word_segmenter="jieba"), {}), key=lambda d: d.doc_id)
                marked, lengths, _ = plan_pool_pass(seg_docs, pass_index, config).layout(rows, 64, vocab)
            assert not (batch.input_ids & WORD_CONTINUES).any()
            assert batch.masked_lm_weights.sum(axis=1).max() <= 10
            for k, v in whole_word_counts(marked, lengths, batch.masked_lm_positions, batch.masked_lm_weights,
                                          vocab).items():
                total[k] += v
        counts[segmenter] = total
    seg = counts["jieba"]
    assert seg["masked_cjk"] > 500 and seg["whole_word"] == seg["masked_cjk"]
    assert seg["in_multi_char_words"] > 0.5 * seg["masked_cjk"]
    # Without the segmenter a word's characters are masked apart: most of the time one by one, and
    # spans of characters often cut a word at one end.
    char = counts[None]
    limit = 0.5 if unit == "word" else 0.9
    assert char["whole_multi_char_words"] < limit * char["in_multi_char_words"]


def test_config_records_the_segmenter_and_refuses_what_it_cannot_do():
    assert "word_segmenter" not in DatagenConfig().to_dict()
    config = DatagenConfig(whole_word_mask=True, word_segmenter="jieba")
    recorded = config.to_dict()["word_segmenter"]
    assert recorded == segmenter_info("jieba")
    assert DatagenConfig.from_recorded(config.to_dict()) == config
    with pytest.raises(ConfigError, match="needs --whole-word-mask"):
        DatagenConfig(word_segmenter="jieba")
    with pytest.raises(ConfigError, match="not one of jieba"):
        DatagenConfig(whole_word_mask=True, word_segmenter="nope")
    dynamic = DatagenConfig(whole_word_mask=True, word_segmenter="jieba", masking="dynamic", dupe_factor=1)
    assert DatagenConfig.from_recorded(dynamic.to_dict()) == dynamic
    with pytest.raises(ConfigError, match="--packing with --masking dynamic is not supported"):
        dataclasses.replace(dynamic, packing=True)


def test_word_bits_hold_each_position_once():
    continues = np.random.default_rng(1).random((50, 65)) < 0.4
    bits = pack_word_bits(continues)
    assert bits.shape == (50, 3) and bits.min() >= 0 and bits.max() < 1 << 28
    assert np.array_equal(unpack_word_bits(bits, 65), continues)
    assert np.array_equal(unpack_word_bits(bits.astype(np.int32), 65), continues)  # as the loaders narrow them
    assert pack_word_bits(np.eye(1, 65, 29, dtype=bool)).tolist() == [[0, 2, 0]]
    assert feature_spec(64, 10, masking="dynamic", word_bits=True)[WORD_BITS] == ("int64", 3)
    for masking, packed in (("static", 0), ("static", 3)):  # static masks are made before the words are dropped
        assert WORD_BITS not in feature_spec(64, 10, masking=masking, max_sequences_per_row=packed, word_bits=True)
    assert WORD_BITS not in feature_spec(64, 10, masking="dynamic")


@pytest.mark.parametrize("unit", ["word", "span"])
def test_dynamic_masks_group_segmented_words_as_static_masking_does(vocab, unit):
    """Unmasked records keep their segmented words; each epoch's mask is static masking's rule over
    them (with the record's key of that epoch), so every masked word is masked whole."""
    tok = BertTokenizer(vocab)
    dynamic = DatagenConfig(max_seq_length=64, max_predictions_per_seq=10, masking_unit=unit, word_segmenter="jieba",
                            masking="dynamic", dupe_factor=1)
    static = dataclasses.replace(dynamic, masking="static", dupe_factor=10)
    docs = sorted(tokenize_documents(raws(40), tok, dynamic, {}), key=lambda d: d.doc_id)
    plan = plan_pool_pass(docs, 0, dynamic)
    rows = np.arange(len(plan))
    batch = masked_rows(plan, rows, dynamic, vocab)
    marked, lengths, _ = plan.layout(rows, 64, vocab)
    ids, continues = split_marks(marked)
    assert np.array_equal(batch.input_ids, ids) and np.array_equal(unpack_word_bits(batch.word_continues_bits, 64),
                                                                   continues)
    positions = {}
    for epoch in (0, 1):
        got = mask_records(batch.input_ids, batch.input_mask, batch.instance_key, epoch, 5, dynamic, vocab,
                           batch.word_continues_bits)
        want = mask_batch(ids, lengths, dynamic_mask_keys(5, batch.instance_key, epoch), static, vocab, continues)
        for name in ("input_ids", "masked_lm_positions", "masked_lm_ids", "masked_lm_weights"):
            assert np.array_equal(getattr(got, name), getattr(want, name)), name
        counts = whole_word_counts(marked, lengths, got.masked_lm_positions, got.masked_lm_weights, vocab)
        assert counts["masked_cjk"] > 200 and counts["whole_word"] == counts["masked_cjk"]
        assert counts["in_multi_char_words"] > 0.5 * counts["masked_cjk"]
        assert got.masked_lm_weights.sum(axis=1).max() <= 10
        positions[epoch] = got.masked_lm_positions
    assert (positions[0] != positions[1]).any(axis=1).mean() > 0.8
    with pytest.raises(ValueError, match="pass their word_continues_bits"):
        mask_records(batch.input_ids, batch.input_mask, batch.instance_key, 0, 5, dynamic, vocab)


def test_record_rules_check_the_word_bits(vocab):
    config = DatagenConfig(max_seq_length=64, max_predictions_per_seq=10, whole_word_mask=True, word_segmenter="jieba",
                           masking="dynamic", dupe_factor=1)
    docs = sorted(tokenize_documents(raws(5), BertTokenizer(vocab), config, {}), key=lambda d: d.doc_id)  # unique
    plan = plan_pool_pass(docs, 0, config)
    batch = masked_rows(plan, np.argsort(plan.keys), config, vocab)  # in key order, as shards hold them
    shape = RecordShape(64, 10, len(vocab), vocab.cls_id, vocab.sep_id, vocab.mask_id, vocab.pad_id, vocab.unk_id,
                        masking="dynamic", word_bits=True)
    features = {k: np.asarray(getattr(batch, k)).reshape(len(batch), -1) for k in batch.feature_names}
    assert check_batch(Batch(np.arange(len(batch)), features), shape) == ([], 0)
    features[WORD_BITS][1, 0] |= 1  # position 0: [CLS]
    features[WORD_BITS][2, 2] |= 1 << 8  # position 64: past the row
    problems, total = check_batch(Batch(np.arange(len(batch)), features), shape)
    assert total == 2
    assert "continues a word at position 0, which is not a text token" in problems[1][1]
    assert problems[0][0] == 2 and "word_continues_bits[2]=" in problems[0][1] and "holds bits of no position" in \
        problems[0][1]
