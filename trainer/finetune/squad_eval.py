"""The official SQuAD v1.1 and v2.0 evaluations, as functions (no TensorFlow, no files).

v1.1: every question counts; a missing prediction scores 0. EM and F1 are the maxima over the gold
answers after normalisation (lowercase, punctuation and the articles a/an/the removed, whitespace
collapsed), averaged over questions, x100.

v2.0: a question without answers has the single gold answer "" (so only an empty prediction scores
1). With `na_probs` (our null_odds.json: null score minus best non-null score per question) a
prediction is replaced by "no answer" when its na_prob exceeds `na_prob_thresh` (the official
script's default 1.0), and the best threshold for EM and for F1 is searched over the na_probs, with
the score at it. Figures are reported under the official script's names.
"""

from __future__ import annotations

import re
import string
from collections import Counter
from collections.abc import Iterable, Mapping

_ARTICLES = re.compile(r"\b(a|an|the)\b", re.UNICODE)
_PUNCTUATION = frozenset(string.punctuation)


def normalize_answer(text: str) -> str:
    """Lowercase, drop punctuation, drop articles, collapse whitespace (official order)."""
    text = text.lower()
    text = "".join(ch for ch in text if ch not in _PUNCTUATION)
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


def exact_match(prediction: str, gold: str) -> int:
    return int(normalize_answer(prediction) == normalize_answer(gold))


def f1_v1(prediction: str, gold: str) -> float:
    """v1.1 token F1 (two empty answers score 0 here, as in the v1.1 script)."""
    pred_tokens = normalize_answer(prediction).split()
    gold_tokens = normalize_answer(gold).split()
    return _overlap_f1(pred_tokens, gold_tokens)


def f1_v2(prediction: str, gold: str) -> float:
    """v2.0 token F1: when either side is empty, 1 only if both are."""
    pred_tokens = normalize_answer(prediction).split() if prediction else []
    gold_tokens = normalize_answer(gold).split() if gold else []
    if not pred_tokens or not gold_tokens:
        return float(pred_tokens == gold_tokens)
    return _overlap_f1(pred_tokens, gold_tokens)


def _overlap_f1(pred_tokens: list[str], gold_tokens: list[str]) -> float:
    same = sum((Counter(pred_tokens) & Counter(gold_tokens)).values())
    if same == 0:
        return 0.0
    precision = same / len(pred_tokens)
    recall = same / len(gold_tokens)
    return 2 * precision * recall / (precision + recall)


def iter_questions(dataset: Mapping | list) -> Iterable[dict]:
    """The qas of an official SQuAD JSON (the whole file or its "data" list)."""
    articles = dataset["data"] if isinstance(dataset, Mapping) else dataset
    for article in articles:
        for paragraph in article["paragraphs"]:
            yield from paragraph["qas"]


def evaluate_v1(dataset: Mapping | list, predictions: Mapping[str, str]) -> dict[str, float]:
    """The official v1.1 figures {"exact_match", "f1"} (x100) plus counts."""
    total = em = 0
    f1 = 0.0
    missing = 0
    for qa in iter_questions(dataset):
        total += 1
        if qa["id"] not in predictions:
            missing += 1
            continue
        golds = [answer["text"] for answer in qa["answers"]]
        prediction = predictions[qa["id"]]
        em += max(exact_match(prediction, g) for g in golds)
        f1 += max(f1_v1(prediction, g) for g in golds)
    if not total:
        raise ValueError("the dataset has no questions")
    return {"exact_match": 100.0 * em / total, "f1": 100.0 * f1 / total, "total": total, "missing": missing}


def raw_scores_v2(dataset: Mapping | list, predictions: Mapping[str, str]) -> tuple[dict, dict, dict]:
    """(exact per question, f1 per question, has-answer per question)."""
    exact, f1, has_answer = {}, {}, {}
    missing = []
    for qa in iter_questions(dataset):
        qid = qa["id"]
        has_answer[qid] = bool(qa["answers"])
        golds = [a["text"] for a in qa["answers"] if normalize_answer(a["text"])] or [""]
        if qid not in predictions:
            missing.append(qid)
            continue
        prediction = predictions[qid]
        exact[qid] = max(exact_match(prediction, g) for g in golds)
        f1[qid] = max(f1_v2(prediction, g) for g in golds)
    if missing:
        # The official script would crash later on them (HasAns / NoAns sums); say which.
        shown = ", ".join(missing[:5]) + (" ..." if len(missing) > 5 else "")
        raise ValueError(f"{len(missing)} questions have no prediction: {shown}")
    return exact, f1, has_answer


def _apply_threshold(scores: Mapping[str, float], na_probs: Mapping[str, float],
                     has_answer: Mapping[str, bool], threshold: float) -> dict[str, float]:
    return {qid: float(not has_answer[qid]) if na_probs[qid] > threshold else score
            for qid, score in scores.items()}


def _mean(scores: Mapping[str, float], qids: list[str]) -> float:
    return 100.0 * sum(scores[q] for q in qids) / len(qids)


def best_threshold(predictions: Mapping[str, str], scores: Mapping[str, float], na_probs: Mapping[str, float],
                   has_answer: Mapping[str, bool]) -> tuple[float, float]:
    """(best score x100, the na_prob threshold reaching it): the official sweep over sorted na_probs."""
    score = best = sum(1 for q in has_answer if not has_answer[q])
    thresh = 0.0
    for qid in sorted(na_probs, key=lambda q: na_probs[q]):
        if qid not in scores:
            continue
        if has_answer[qid]:
            diff = scores[qid]
        else:
            diff = -1 if predictions[qid] else 0
        score += diff
        if score > best:
            best, thresh = score, na_probs[qid]
    return 100.0 * best / len(scores), thresh


def evaluate_v2(dataset: Mapping | list, predictions: Mapping[str, str],
                na_probs: Mapping[str, float] | None = None, na_prob_thresh: float = 1.0) -> dict[str, float]:
    """The official v2.0 figures: exact, f1, total; HasAns_* and NoAns_*; with `na_probs` also
    best_exact, best_exact_thresh, best_f1, best_f1_thresh."""
    exact_raw, f1_raw, has_answer = raw_scores_v2(dataset, predictions)
    if not exact_raw:
        raise ValueError("the dataset has no questions")
    probs = dict(na_probs) if na_probs is not None else {q: 0.0 for q in predictions}
    lacking = [q for q in exact_raw if q not in probs]
    if lacking:
        raise ValueError(f"{len(lacking)} questions have no null odds, e.g. {lacking[0]}")
    exact = _apply_threshold(exact_raw, probs, has_answer, na_prob_thresh)
    f1 = _apply_threshold(f1_raw, probs, has_answer, na_prob_thresh)
    qids = list(exact)
    out: dict[str, float] = {"exact": _mean(exact, qids), "f1": _mean(f1, qids), "total": len(qids)}
    for name, wanted in (("HasAns", True), ("NoAns", False)):
        subset = [q for q in qids if has_answer[q] == wanted]
        if subset:
            out[f"{name}_exact"] = _mean(exact, subset)
            out[f"{name}_f1"] = _mean(f1, subset)
            out[f"{name}_total"] = len(subset)
    if na_probs is not None:
        out["best_exact"], out["best_exact_thresh"] = best_threshold(predictions, exact_raw, probs, has_answer)
        out["best_f1"], out["best_f1_thresh"] = best_threshold(predictions, f1_raw, probs, has_answer)
    return out
