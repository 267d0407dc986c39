"""Task metrics in plain NumPy/Python: GLUE's classification and regression scores and CoNLL's
entity-level precision/recall/F1 (conlleval). SQuAD's official scores live in `bert_datagen.trainer.finetune.squad_eval`.

Everything here is a pure function of predictions and gold labels, so the fine-tuning loop, the
`predict` command and the benchmarks share one implementation, and tests can check each against an
independent one (scikit-learn, scipy, seqeval). GLUE figures are fractions in [0, 1] (Matthews and
correlations in [-1, 1]); conlleval figures are fractions too (conlleval prints them x100).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

# ------------------------------------------------------------------ classification / regression


def accuracy(labels: Sequence[int] | np.ndarray, predictions: Sequence[int] | np.ndarray) -> float:
    y, p = _pair(labels, predictions)
    return float(np.mean(y == p)) if y.size else 0.0


def f1_positive(labels: Sequence[int] | np.ndarray, predictions: Sequence[int] | np.ndarray,
                positive: int = 1) -> float:
    """Binary F1 of class `positive` (GLUE's MRPC/QQP F1); 0 when there is no positive anywhere."""
    y, p = _pair(labels, predictions)
    tp = int(np.sum((p == positive) & (y == positive)))
    fp = int(np.sum((p == positive) & (y != positive)))
    fn = int(np.sum((p != positive) & (y == positive)))
    denominator = 2 * tp + fp + fn
    return 2.0 * tp / denominator if denominator else 0.0


def matthews_corrcoef(labels: Sequence[int] | np.ndarray, predictions: Sequence[int] | np.ndarray) -> float:
    """Matthews correlation (multi-class form, Gorodkin's R_K); 0 when either side is constant."""
    y, p = _pair(labels, predictions)
    classes, encoded = np.unique(np.concatenate([y, p]), return_inverse=True)
    k = classes.size
    yi, pi = encoded[: y.size], encoded[y.size:]
    confusion = np.zeros((k, k), dtype=np.float64)
    np.add.at(confusion, (yi, pi), 1.0)
    t_sum, p_sum = confusion.sum(axis=1), confusion.sum(axis=0)
    n = confusion.sum()
    correct = np.trace(confusion)
    cov_yp = correct * n - t_sum @ p_sum
    cov_pp = n * n - p_sum @ p_sum
    cov_yy = n * n - t_sum @ t_sum
    if cov_pp * cov_yy == 0:
        return 0.0
    return float(cov_yp / np.sqrt(cov_yy * cov_pp))


def pearson(x: Sequence[float] | np.ndarray, y: Sequence[float] | np.ndarray) -> float:
    """Pearson correlation; NaN when either side is constant (as scipy)."""
    a, b = _pair(x, y, dtype=np.float64)
    if a.size < 2:
        return float("nan")
    a, b = a - a.mean(), b - b.mean()
    denominator = np.sqrt((a @ a) * (b @ b))
    if denominator == 0:
        return float("nan")
    return float(np.clip((a @ b) / denominator, -1.0, 1.0))


def average_ranks(x: Sequence[float] | np.ndarray) -> np.ndarray:
    """1-based ranks, ties sharing the mean of the ranks they span."""
    values = np.asarray(x, dtype=np.float64)
    order = np.argsort(values, kind="mergesort")
    sorted_values = values[order]
    # Start index of each run of equal values in sorted order.
    starts = np.flatnonzero(np.concatenate([[True], sorted_values[1:] != sorted_values[:-1]]))
    ends = np.concatenate([starts[1:], [values.size]])
    run_rank = (starts + ends + 1) / 2.0  # mean of ranks starts+1 .. ends
    ranks = np.empty(values.size, dtype=np.float64)
    ranks[order] = np.repeat(run_rank, ends - starts)
    return ranks


def spearman(x: Sequence[float] | np.ndarray, y: Sequence[float] | np.ndarray) -> float:
    """Spearman's rho: Pearson of the average ranks (ties handled)."""
    a, b = _pair(x, y, dtype=np.float64)
    return pearson(average_ranks(a), average_ranks(b))


def _pair(a, b, dtype=None) -> tuple[np.ndarray, np.ndarray]:
    x, y = np.asarray(a, dtype=dtype).ravel(), np.asarray(b, dtype=dtype).ravel()
    if x.shape != y.shape:
        raise ValueError(f"{x.size} labels but {y.size} predictions")
    return x, y


# ------------------------------------------------------------------ GLUE task table

# Every metric a task reports, and the one that names it (best epoch, seed tables): as GLUE.
GLUE_METRICS: dict[str, tuple[tuple[str, ...], str]] = {
    "cola": (("mcc", "accuracy"), "mcc"),
    "sst2": (("accuracy",), "accuracy"),
    "mrpc": (("accuracy", "f1"), "f1"),
    "qqp": (("accuracy", "f1"), "f1"),
    "stsb": (("pearson", "spearman"), "spearman"),
    "mnli": (("accuracy",), "accuracy"),
    "mnli_mismatched": (("accuracy",), "accuracy"),
    "qnli": (("accuracy",), "accuracy"),
    "rte": (("accuracy",), "accuracy"),
    "wnli": (("accuracy",), "accuracy"),
    "ax": (("mcc",), "mcc"),
}

_METRIC_FUNCTIONS = {"accuracy": accuracy, "f1": f1_positive, "mcc": matthews_corrcoef,
                     "pearson": pearson, "spearman": spearman}


def task_metric_names(task_kind: str, task_type: str) -> tuple[tuple[str, ...], str]:
    """(metrics reported, primary metric) for a manifest's task kind ("glue/mrpc", "tsv", ...)."""
    name = task_kind.split("/", 1)[1] if task_kind.startswith("glue/") else None
    if name in GLUE_METRICS:
        return GLUE_METRICS[name]
    if task_type == "regression":
        return ("pearson", "spearman"), "spearman"
    return ("accuracy",), "accuracy"


def classification_metrics(task_kind: str, task_type: str, labels, predictions) -> dict[str, float]:
    """The task's metrics; `predictions` are class indices (or values for regression)."""
    names, _ = task_metric_names(task_kind, task_type)
    return {name: _METRIC_FUNCTIONS[name](labels, predictions) for name in names}


# ------------------------------------------------------------------ CoNLL conlleval


@dataclass
class ChunkCounts:
    correct: int = 0  # chunks with matching type and both boundaries
    guessed: int = 0  # chunks in the predictions
    found: int = 0  # chunks in the gold tags

    def scores(self) -> dict[str, float]:
        precision = self.correct / self.guessed if self.guessed else 0.0
        recall = self.correct / self.found if self.found else 0.0
        f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
        return {"precision": precision, "recall": recall, "f1": f1,
                "correct": self.correct, "predicted": self.guessed, "gold": self.found}


@dataclass
class ConllevalResult:
    overall: dict[str, float]
    per_type: dict[str, dict[str, float]]
    token_accuracy: float
    tokens: int
    counts: dict[str, ChunkCounts] = field(default_factory=dict, repr=False)

    def to_dict(self) -> dict:
        return {"overall": self.overall, "per_type": self.per_type,
                "token_accuracy": self.token_accuracy, "tokens": self.tokens}


def _split_tag(tag: str, outside: str = "O") -> tuple[str, str]:
    # conlleval splits at the FIRST hyphen, so types may contain hyphens ("B-creative-work").
    if tag == outside:
        return "O", ""
    head, sep, rest = tag.partition("-")
    return (head, rest) if sep else (tag, "")


def _chunk_end(prev_tag: str, tag: str, prev_type: str, type_: str) -> bool:
    """conlleval's endOfChunk: did a chunk end between the previous and the current token?"""
    if prev_tag in ("B", "I") and tag in ("B", "O"):
        return True
    if prev_tag == "E" and tag in ("E", "I", "O"):
        return True
    if prev_tag not in ("O", ".") and prev_type != type_:
        return True
    return prev_tag in ("]", "[")


def _chunk_start(prev_tag: str, tag: str, prev_type: str, type_: str) -> bool:
    """conlleval's startOfChunk. Note an I- after O (or after another type) STARTS a chunk."""
    if prev_tag in ("B", "I", "O") and tag == "B":
        return True
    if prev_tag in ("O", "E") and tag in ("I", "E"):
        return True
    if tag not in ("O", ".") and prev_type != type_:
        return True
    return tag in ("[", "]")


def conlleval(gold: Sequence[Sequence[str]], predicted: Sequence[Sequence[str]]) -> ConllevalResult:
    """Entity-level scores exactly as CoNLL's conlleval script counts them.

    `gold` and `predicted` are sentences of tags. Between sentences conlleval sees a boundary line
    (tags O), which ends every open chunk; the same happens here.
    """
    if len(gold) != len(predicted):
        raise ValueError(f"{len(gold)} gold sentences but {len(predicted)} predicted")
    counts: dict[str, ChunkCounts] = {}
    total = ChunkCounts()
    stream: list[tuple[str, str, bool]] = []  # (gold, predicted, is a token rather than a boundary)
    for index, (g_sentence, p_sentence) in enumerate(zip(gold, predicted, strict=True)):
        if len(g_sentence) != len(p_sentence):
            raise ValueError(f"sentence {index}: {len(g_sentence)} gold tags but {len(p_sentence)} predicted")
        stream.extend((g, p, True) for g, p in zip(g_sentence, p_sentence, strict=True))
        stream.append(("O", "O", False))
    tokens = sum(1 for *_, real in stream if real)
    correct_tags = _count_chunks(stream, counts, total)
    per_type = {t: counts[t].scores() for t in sorted(counts)}
    return ConllevalResult(overall=total.scores(), per_type=per_type,
                           token_accuracy=correct_tags / tokens if tokens else 0.0, tokens=tokens,
                           counts=counts)


def _count_chunks(stream: list[tuple[str, str, bool]], counts: dict[str, ChunkCounts],
                  total: ChunkCounts) -> int:
    """conlleval's main loop over tokens and boundary lines; returns the correctly tagged tokens."""
    last_gold, last_guess, last_gold_type, last_guess_type = "O", "O", "", ""
    in_correct = False
    correct_tags = 0
    for g_tag, p_tag, real in stream:
        g, g_type = _split_tag(g_tag)
        p, p_type = _split_tag(p_tag)
        gold_end = _chunk_end(last_gold, g, last_gold_type, g_type)
        guess_end = _chunk_end(last_guess, p, last_guess_type, p_type)
        if in_correct:
            if gold_end and guess_end and last_guess_type == last_gold_type:
                in_correct = False
                total.correct += 1
                counts.setdefault(last_gold_type, ChunkCounts()).correct += 1
            elif gold_end != guess_end or g_type != p_type:
                in_correct = False
        gold_start = _chunk_start(last_gold, g, last_gold_type, g_type)
        guess_start = _chunk_start(last_guess, p, last_guess_type, p_type)
        if gold_start and guess_start and g_type == p_type:
            in_correct = True
        if gold_start:
            total.found += 1
            counts.setdefault(g_type, ChunkCounts()).found += 1
        if guess_start:
            total.guessed += 1
            counts.setdefault(p_type, ChunkCounts()).guessed += 1
        if real and g == p and g_type == p_type:
            correct_tags += 1
        last_gold, last_guess, last_gold_type, last_guess_type = g, p, g_type, p_type
    if in_correct:  # a chunk still open at the end of the input
        total.correct += 1
        counts.setdefault(last_gold_type, ChunkCounts()).correct += 1
    return correct_tags
