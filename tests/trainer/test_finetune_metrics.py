"""Task metrics against independent computations: scikit-learn / scipy (GLUE), seqeval and a hand
count (conlleval), and a transcription of the official SQuAD evaluate scripts written here."""

from __future__ import annotations

import collections
import re
import string

import numpy as np
import pytest

from bert_datagen.trainer.finetune import metrics, squad_eval

sklearn_metrics = pytest.importorskip("sklearn.metrics", reason="scikit-learn is a dev extra")
scipy_stats = pytest.importorskip("scipy.stats", reason="scipy is a dev extra")
seqeval_metrics = pytest.importorskip("seqeval.metrics", reason="seqeval is a dev extra")


# ------------------------------------------------------------------ GLUE


@pytest.mark.parametrize("seed", range(8))
def test_classification_metrics_match_sklearn_on_random_labels(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 300))
    classes = int(rng.integers(2, 5))
    y = rng.integers(0, classes, n)
    p = np.where(rng.random(n) < 0.6, y, rng.integers(0, classes, n))
    assert metrics.accuracy(y, p) == pytest.approx(sklearn_metrics.accuracy_score(y, p), abs=1e-12)
    assert metrics.matthews_corrcoef(y, p) == pytest.approx(sklearn_metrics.matthews_corrcoef(y, p), abs=1e-12)
    yb, pb = (y == 1).astype(int), (p == 1).astype(int)
    assert metrics.f1_positive(yb, pb) == pytest.approx(
        sklearn_metrics.f1_score(yb, pb, zero_division=0), abs=1e-12)


@pytest.mark.parametrize("y,p", [([0, 0, 0], [0, 0, 0]), ([1, 1, 0], [1, 1, 1]), ([0, 1], [1, 0]),
                                 ([1, 0, 1, 0], [1, 0, 1, 0])])
def test_classification_metrics_crafted_edge_cases(y, p):
    assert metrics.matthews_corrcoef(y, p) == pytest.approx(sklearn_metrics.matthews_corrcoef(y, p))
    assert metrics.f1_positive(y, p) == pytest.approx(sklearn_metrics.f1_score(y, p, zero_division=0))


def test_crafted_values_by_hand():
    # tp=2 fp=1 fn=1 tn=1: F1 = 4/6; MCC = (2*1 - 1*1)/sqrt(3*3*2*2) = 1/6.
    y, p = [1, 1, 1, 0, 0], [1, 1, 0, 1, 0]
    assert metrics.f1_positive(y, p) == pytest.approx(4 / 6)
    assert metrics.matthews_corrcoef(y, p) == pytest.approx(1 / 6)
    assert metrics.accuracy(y, p) == pytest.approx(3 / 5)


@pytest.mark.parametrize("seed", range(8))
def test_correlations_match_scipy_with_ties(seed):
    rng = np.random.default_rng(100 + seed)
    n = int(rng.integers(3, 200))
    x = rng.integers(0, 6, n).astype(float) / 5.0  # few distinct values: many ties
    y = x + rng.normal(0, 0.5, n)
    y[: n // 3] = np.round(y[: n // 3])
    assert metrics.pearson(x, y) == pytest.approx(scipy_stats.pearsonr(x, y)[0], abs=1e-10)
    assert metrics.spearman(x, y) == pytest.approx(scipy_stats.spearmanr(x, y)[0], abs=1e-10)
    assert np.array_equal(metrics.average_ranks(y), scipy_stats.rankdata(y))


def test_task_metric_table():
    assert metrics.task_metric_names("glue/cola", "classification") == (("mcc", "accuracy"), "mcc")
    assert metrics.task_metric_names("glue/mrpc", "classification")[1] == "f1"
    assert metrics.task_metric_names("glue/stsb", "regression") == (("pearson", "spearman"), "spearman")
    assert metrics.task_metric_names("tsv", "classification") == (("accuracy",), "accuracy")
    got = metrics.classification_metrics("glue/qqp", "classification", [1, 0, 1], [1, 1, 1])
    assert got == {"accuracy": pytest.approx(2 / 3), "f1": pytest.approx(0.8)}


# ------------------------------------------------------------------ conlleval


def test_conlleval_crafted_by_hand():
    gold = [["B-PER", "I-PER", "O", "B-LOC"], ["B-ORG", "I-ORG", "I-ORG", "O", "B-creative-work"]]
    pred = [["B-PER", "I-PER", "O", "I-LOC"],  # I- after O starts a chunk: LOC found, correct
            ["B-ORG", "I-ORG", "O", "O", "B-creative-work"]]  # ORG cut short: wrong
    r = metrics.conlleval(gold, pred)
    # gold chunks 4 (PER, LOC, ORG, creative-work); guessed 4; correct 3.
    assert (r.overall["correct"], r.overall["predicted"], r.overall["gold"]) == (3, 4, 4)
    assert r.overall["f1"] == pytest.approx(0.75)
    assert r.per_type["ORG"]["f1"] == 0.0
    assert r.per_type["creative-work"]["precision"] == 1.0
    assert r.per_type["LOC"]["recall"] == 1.0
    assert r.token_accuracy == pytest.approx(7 / 9)


def test_conlleval_type_change_inside_chunk_and_boundaries():
    # B-PER I-LOC: two chunks (type change ends one and starts another) in both conlleval and here.
    r = metrics.conlleval([["B-PER", "I-PER"]], [["B-PER", "I-LOC"]])
    assert (r.overall["correct"], r.overall["predicted"], r.overall["gold"]) == (0, 2, 1)
    # A chunk at the end of one sentence does not continue into the next.
    r = metrics.conlleval([["B-PER"], ["I-PER"]], [["B-PER"], ["I-PER"]])
    assert (r.overall["correct"], r.overall["predicted"], r.overall["gold"]) == (2, 2, 2)


TYPES = ("PER", "LOC", "creative-work")


def _random_tags(rng, n):
    out = []
    for _ in range(n):
        r = rng.random()
        out.append("O" if r < 0.4 else ("B-" if r < 0.7 else "I-") + TYPES[int(rng.integers(len(TYPES)))])
    return out


@pytest.mark.parametrize("seed", range(10))
def test_conlleval_matches_seqeval_default_mode_on_random_tags(seed):
    rng = np.random.default_rng(200 + seed)
    sentences = [int(rng.integers(1, 12)) for _ in range(int(rng.integers(1, 30)))]
    gold = [_random_tags(rng, n) for n in sentences]
    pred = [[t if rng.random() < 0.5 else _random_tags(rng, 1)[0] for t in g] for g in gold]
    r = metrics.conlleval(gold, pred)
    assert r.overall["precision"] == pytest.approx(seqeval_metrics.precision_score(gold, pred, zero_division=0))
    assert r.overall["recall"] == pytest.approx(seqeval_metrics.recall_score(gold, pred, zero_division=0))
    assert r.overall["f1"] == pytest.approx(seqeval_metrics.f1_score(gold, pred, zero_division=0))
    report = seqeval_metrics.classification_report(gold, pred, output_dict=True, zero_division=0)
    for entity_type, scores in r.per_type.items():
        if entity_type in report:
            assert scores["precision"] == pytest.approx(report[entity_type]["precision"])
            assert scores["recall"] == pytest.approx(report[entity_type]["recall"])
            assert scores["f1"] == pytest.approx(report[entity_type]["f1-score"])
            assert scores["gold"] == report[entity_type]["support"]


# ------------------------------------------------------------------ SQuAD: the official scripts, transcribed


def _official_normalize(s):
    def remove_articles(text):
        return re.sub(r"\b(a|an|the)\b", " ", text)

    def white_space_fix(text):
        return " ".join(text.split())

    def remove_punc(text):
        exclude = set(string.punctuation)
        return "".join(ch for ch in text if ch not in exclude)

    return white_space_fix(remove_articles(remove_punc(s.lower())))


def _official_f1_v1(prediction, ground_truth):
    prediction_tokens = _official_normalize(prediction).split()
    ground_truth_tokens = _official_normalize(ground_truth).split()
    common = collections.Counter(prediction_tokens) & collections.Counter(ground_truth_tokens)
    num_same = sum(common.values())
    if num_same == 0:
        return 0
    precision = 1.0 * num_same / len(prediction_tokens)
    recall = 1.0 * num_same / len(ground_truth_tokens)
    return (2 * precision * recall) / (precision + recall)


def _official_v1(dataset, predictions):
    f1 = exact = total = 0
    for article in dataset:
        for paragraph in article["paragraphs"]:
            for qa in paragraph["qas"]:
                total += 1
                if qa["id"] not in predictions:
                    continue
                truths = [x["text"] for x in qa["answers"]]
                pred = predictions[qa["id"]]
                exact += max(_official_normalize(pred) == _official_normalize(t) for t in truths)
                f1 += max(_official_f1_v1(pred, t) for t in truths)
    return {"exact_match": 100.0 * exact / total, "f1": 100.0 * f1 / total}


def _get_tokens(s):
    return _official_normalize(s).split() if s else []


def _official_f1_v2(a_gold, a_pred):
    gold_toks, pred_toks = _get_tokens(a_gold), _get_tokens(a_pred)
    common = collections.Counter(gold_toks) & collections.Counter(pred_toks)
    num_same = sum(common.values())
    if len(gold_toks) == 0 or len(pred_toks) == 0:
        return int(gold_toks == pred_toks)
    if num_same == 0:
        return 0
    precision = 1.0 * num_same / len(pred_toks)
    recall = 1.0 * num_same / len(gold_toks)
    return (2 * precision * recall) / (precision + recall)


def _official_v2(dataset, preds, na_probs, thresh=1.0):
    has_ans, exact_raw, f1_raw = {}, {}, {}
    for article in dataset:
        for p in article["paragraphs"]:
            for qa in p["qas"]:
                qid = qa["id"]
                has_ans[qid] = bool(qa["answers"])
                golds = [a["text"] for a in qa["answers"] if _official_normalize(a["text"])] or [""]
                exact_raw[qid] = max(int(_official_normalize(a) == _official_normalize(preds[qid])) for a in golds)
                f1_raw[qid] = max(_official_f1_v2(a, preds[qid]) for a in golds)

    def apply(scores):
        return {q: (float(not has_ans[q]) if na_probs[q] > thresh else s) for q, s in scores.items()}

    exact, f1 = apply(exact_raw), apply(f1_raw)
    out = {"exact": 100.0 * sum(exact.values()) / len(exact), "f1": 100.0 * sum(f1.values()) / len(f1),
           "total": len(exact)}
    for name, flag in (("HasAns", True), ("NoAns", False)):
        ids = [k for k, v in has_ans.items() if v == flag]
        if ids:
            out[name + "_exact"] = 100.0 * sum(exact[k] for k in ids) / len(ids)
            out[name + "_f1"] = 100.0 * sum(f1[k] for k in ids) / len(ids)
            out[name + "_total"] = len(ids)

    def best(scores):
        cur = best_score = sum(1 for k in has_ans if not has_ans[k])
        best_t = 0.0
        for qid in sorted(na_probs, key=lambda k: na_probs[k]):
            if qid not in scores:
                continue
            diff = scores[qid] if has_ans[qid] else (-1 if preds[qid] else 0)
            cur += diff
            if cur > best_score:
                best_score, best_t = cur, na_probs[qid]
        return 100.0 * best_score / len(scores), best_t

    out["best_exact"], out["best_exact_thresh"] = best(exact_raw)
    out["best_f1"], out["best_f1_thresh"] = best(f1_raw)
    return out


WORDS = ["the", "a", "An", "cat", "Cat.", "sat", "on", "mat", "mat,", "(1999)", "dog's", "", "New", "York"]


def _random_squad(rng, questions, v2):
    qas, preds, na = [], {}, {}
    for i in range(questions):
        golds = [] if v2 and rng.random() < 0.3 else [
            {"text": " ".join(rng.choice(WORDS, int(rng.integers(1, 4)))), "answer_start": 0}
            for _ in range(int(rng.integers(1, 4)))]
        qas.append({"id": f"q{i}", "question": "?", "answers": golds})
        choice = rng.random()
        if choice < 0.2:
            preds[f"q{i}"] = ""
        elif choice < 0.5 and golds:
            preds[f"q{i}"] = golds[0]["text"].upper() + " ."
        else:
            preds[f"q{i}"] = " ".join(rng.choice(WORDS, int(rng.integers(1, 4))))
        na[f"q{i}"] = float(np.round(rng.normal(0, 2), 1))  # rounded: ties in the threshold sweep
    return [{"title": "t", "paragraphs": [{"context": "c", "qas": qas}]}], preds, na


@pytest.mark.parametrize("seed", range(6))
def test_squad_v1_matches_official_transcription(seed):
    rng = np.random.default_rng(300 + seed)
    data, preds, _ = _random_squad(rng, int(rng.integers(1, 60)), v2=False)
    preds.pop("q0")  # a missing prediction scores 0 in v1.1
    got = squad_eval.evaluate_v1({"data": data}, preds)
    want = _official_v1(data, preds)
    assert got["exact_match"] == pytest.approx(want["exact_match"])
    assert got["f1"] == pytest.approx(want["f1"])
    assert got["missing"] == 1


@pytest.mark.parametrize("seed", range(6))
def test_squad_v2_matches_official_transcription(seed):
    rng = np.random.default_rng(400 + seed)
    data, preds, na = _random_squad(rng, int(rng.integers(2, 80)), v2=True)
    for thresh in (1.0, 0.0):
        got = squad_eval.evaluate_v2({"data": data}, preds, na, na_prob_thresh=thresh)
        want = _official_v2(data, preds, na, thresh)
        assert set(got) == set(want)
        for key, value in want.items():
            assert got[key] == pytest.approx(value), key


def test_squad_crafted_cases():
    data = [{"paragraphs": [{"qas": [
        {"id": "a", "answers": [{"text": "The Cat"}, {"text": "a black cat"}]},
        {"id": "b", "answers": []},
        {"id": "c", "answers": [{"text": "New York City"}]},
    ]}]}]
    preds = {"a": "cat!", "b": "", "c": "york"}
    answered = [{"paragraphs": [{"qas": [qa for qa in data[0]["paragraphs"][0]["qas"] if qa["answers"]]}]}]
    v1 = squad_eval.evaluate_v1(answered, {"a": "cat!", "c": "york"})
    assert v1["exact_match"] == pytest.approx(50.0)  # "a" exact, "c" not
    assert v1["f1"] == pytest.approx(100 * (1.0 + 0.5) / 2)  # "york" vs "new york city": F1 0.5
    v2 = squad_eval.evaluate_v2(data, preds, {"a": -1.0, "b": 2.0, "c": 0.5})
    assert v2["HasAns_total"] == 2 and v2["NoAns_total"] == 1
    assert v2["NoAns_exact"] == 100.0
    assert v2["exact"] == pytest.approx(200 / 3)
    assert squad_eval.normalize_answer("  The  (Big) cat's AN apple ") == "big cats apple"
    with pytest.raises(ValueError, match="no prediction"):
        squad_eval.evaluate_v2(data, {"a": "x"})
