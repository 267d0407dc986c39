"""CMRC 2018's official metric (trainer/finetune/cmrc_eval.py), against cases computed by hand."""

from __future__ import annotations

import pytest

from bert_datagen.trainer.finetune.cmrc_eval import evaluate, exact_match, f1_score, segments


def test_segments_keep_english_words_whole_and_chinese_characters_apart():
    assert segments("Mark Zbikowski出生于1982年。") == ["mark", "zbikowski", "出", "生", "于", "1982", "年", "。"]
    assert segments("Mark Zbikowski出生于1982年。", drop_punctuation=True)[-1] == "年"
    assert segments(" 《红楼梦》，3.14 ") == ["《", "红", "楼", "梦", "》", "，", "3.14"]


@pytest.mark.parametrize("prediction, gold, want", [
    ("微软公司的元老", "微软公司", 8 / 11),  # run 4: precision 4/7, recall 1
    ("甲乙丙丁", "甲丙丁", 4 / 7),  # contiguous run 2 (丙丁), not the subsequence 3: P 2/4, R 2/3
    ("Java API", "Java API for XML", 2 / 3),  # English words are segments: P 1, R 2/4
    ("《红楼梦》", "红楼梦", 1.0),  # punctuation dropped
    ("北京", "上海", 0.0),
    ("。", "北京", 0.0),  # nothing left after punctuation
])
def test_f1_by_hand(prediction, gold, want):
    assert f1_score(prediction, gold) == pytest.approx(want)


@pytest.mark.parametrize("prediction, gold, want", [
    ("《红楼梦》", "红楼梦", 1),
    ("Mark Zbikowski", " mark zbikowski", 1),  # lowercased and stripped
    ("红楼 梦", "红楼梦", 0),  # inner spaces are kept
    ("1982.", "1982", 0),  # "." is not in the official punctuation list
    ("1982：", "1982", 1),
])
def test_exact_match_by_hand(prediction, gold, want):
    assert exact_match(prediction, gold) == want


def test_evaluate_takes_the_best_gold_answer_and_counts_missing_questions_as_zero():
    questions = [{"id": "a", "answers": [{"text": "上海"}, {"text": "北京市"}]},
                 {"id": "b", "answers": [{"text": "微软公司"}]},
                 {"id": "c", "answers": [{"text": "x"}]}]
    scores = evaluate(questions, {"a": "北京", "b": "微软公司"})
    # a: EM 0, F1 max(0, 2 * 1 * 2/3 / (1 + 2/3) = 0.8); b: 1, 1; c: missing, 0.
    assert scores["exact_match"] == pytest.approx(100 / 3)
    assert scores["f1"] == pytest.approx(100 * 1.8 / 3)
    assert scores["average"] == pytest.approx((100 / 3 + 60) / 2)
    assert (scores["total"], scores["missing"]) == (3, 1)
