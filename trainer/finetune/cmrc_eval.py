"""The official CMRC 2018 evaluation (Cui et al. 2019), as functions: written from its definition.

Both scores are the maximum over a question's gold answers, averaged over questions, x100; a
question without a prediction scores 0 (it still counts).

- Segments of a text (`segments`): lowercased and stripped; every Chinese character (U+4E00 to
  U+9FA5) and every character of the metric's punctuation list is a segment of its own; the text
  between them (Latin words, numbers, spaces) is cut into words, so an English word is one
  segment, never its letters. The official script cuts that text with NLTK's word tokenizer; we
  cut it at whitespace and split every other non-word character off (`_LATIN`), which agrees on
  ordinary words and numbers; NLTK's contractions ("don't" -> "do", "n't") and quote rules
  differ, and are rare in CMRC answers.
- F1: the punctuation segments are dropped, then the longest common *contiguous* run of
  segments (the official `find_lcs` is a longest common substring, not subsequence) of the
  prediction and the answer gives precision = run / prediction segments, recall = run / answer
  segments, F1 their harmonic mean (0 when no segment is shared).
- EM: the prediction equals the answer after lowercasing, stripping and removing the punctuation
  characters (spaces are kept).

The punctuation list is the official one, ASCII `- : _ * ^ / \\ ~ \\` + =` and the Chinese marks
below; other ASCII punctuation (`.`, `,`, `(`...) is not removed, as in the official script.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

PUNCTUATION = frozenset("-:_*^/\\~`+=，。：？！“”；’《》·、「」（）－～『』")
_CHINESE = re.compile("[\u4e00-\u9fa5]")
_LATIN = re.compile(r"\w+(?:[.,']\w+)*|[^\w\s]")


def segments(text: str, drop_punctuation: bool = False) -> list[str]:
    """The metric's segments of `text` (see the module doc)."""
    out: list[str] = []
    pending: list[str] = []

    def flush() -> None:
        if pending:
            out.extend(_LATIN.findall("".join(pending)))
            pending.clear()

    for ch in text.lower().strip():
        if ch in PUNCTUATION:
            if drop_punctuation:
                continue
            flush()
            out.append(ch)
        elif _CHINESE.match(ch):
            flush()
            out.append(ch)
        else:
            pending.append(ch)
    flush()
    return out


def without_punctuation(text: str) -> str:
    return "".join(ch for ch in text.lower().strip() if ch not in PUNCTUATION)


def longest_common_run(a: list[str], b: list[str]) -> int:
    """Length of the longest contiguous run of segments in both lists."""
    best = 0
    previous = [0] * (len(b) + 1)
    for x in a:
        current = [0] * (len(b) + 1)
        for j, y in enumerate(b):
            if x == y:
                current[j + 1] = previous[j] + 1
                best = max(best, current[j + 1])
        previous = current
    return best


def f1_score(prediction: str, gold: str) -> float:
    pred, ans = segments(prediction, True), segments(gold, True)
    common = longest_common_run(ans, pred)
    if common == 0:
        return 0.0
    precision, recall = common / len(pred), common / len(ans)
    return 2 * precision * recall / (precision + recall)


def exact_match(prediction: str, gold: str) -> int:
    return int(without_punctuation(prediction) == without_punctuation(gold))


def evaluate(questions: Iterable[Mapping], predictions: Mapping[str, str]) -> dict[str, float]:
    """{"exact_match", "f1", "average"} (x100; average = the official AVERAGE of the two) plus
    counts, over questions {"id", "answers": [{"text"}, ...]}."""
    total = missing = em = 0
    f1 = 0.0
    for qa in questions:
        total += 1
        if qa["id"] not in predictions:
            missing += 1
            continue
        golds = [a["text"] for a in qa["answers"]]
        prediction = predictions[qa["id"]]
        em += max(exact_match(prediction, g) for g in golds)
        f1 += max(f1_score(prediction, g) for g in golds)
    if not total:
        raise ValueError("the dataset has no questions")
    exact, f1_avg = 100.0 * em / total, 100.0 * f1 / total
    return {"exact_match": exact, "f1": f1_avg, "average": (exact + f1_avg) / 2, "total": total, "missing": missing}
