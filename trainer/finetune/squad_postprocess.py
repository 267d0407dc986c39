"""SQuAD post-processing: per-window start/end logits -> answer texts, as the original `run_squad.py`.

RECIPE.md section 10, step by step:
1. per window, the `n_best` (20) highest start and end positions;
2. keep (start, end) with both inside the window's document tokens, the start in its max context,
   end >= start, at most `max_answer_length` (30) tokens;
3. v2.0: the null score is the smallest start[0] + end[0] over the question's windows, and the null
   candidate joins the list;
4. sort a question's candidates by start + end logit (stable: ties keep window, start, end order);
5. map each to text: de-tokenize the WordPieces, align that with the original words ignoring
   spaces to recover casing and punctuation ("final text"), fall back to the original words (for
   unspaced text: the exact characters of the context those words cover, `original_span`);
   drop texts already seen; stop at `n_best`;
6. softmax over the kept candidates' scores; v1.1 answer = the best; v2.0 answer = "" when null
   score - best non-null score > `null_score_diff_threshold`, else the best non-null text.

Inputs are the task dataset's side files (contract: `examples.jsonl`, `windows.jsonl`) and the
logits the model produced, which `write_raw_logits` stores as `logits.npz`:
`unique_ids` int64 [N], `start_logits` float32 [N, L], `end_logits` float32 [N, L] (L = the
dataset's max_seq_length; position 0 is [CLS]). Runs can be ensembled by averaging these arrays.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from bert_datagen.vocab.basic import basic_tokenize

N_BEST = 20
MAX_ANSWER_LENGTH = 30
RAW_LOGITS_FILE = "logits.npz"


@dataclass(frozen=True)
class Candidate:
    window: int  # index among the question's windows
    start: int
    end: int
    start_logit: float
    end_logit: float


@dataclass
class SquadPredictions:
    predictions: dict[str, str]  # qas id -> answer text
    nbest: dict[str, list[dict]]  # qas id -> [{"text", "probability", "start_logit", "end_logit"}]
    null_odds: dict[str, float]  # v2.0 only: null score minus best non-null score


def best_indexes(logits: np.ndarray, n_best: int) -> list[int]:
    """Positions of the `n_best` largest logits, largest first; ties keep position order."""
    order = np.argsort(-np.asarray(logits, dtype=np.float64), kind="stable")
    return [int(i) for i in order[:n_best]]


def window_candidates(window: Mapping, window_index: int, start_logits: np.ndarray, end_logits: np.ndarray,
                      n_best: int = N_BEST, max_answer_length: int = MAX_ANSWER_LENGTH) -> list[Candidate]:
    """Steps 1 and 2 for one window (`window` is its windows.jsonl object)."""
    num_tokens = len(window["tokens"])
    to_word = window["token_to_word"]
    max_context = window["max_context"]
    out = []
    for start in best_indexes(start_logits, n_best):
        for end in best_indexes(end_logits, n_best):
            if start >= num_tokens or end >= num_tokens:
                continue
            if str(start) not in to_word or str(end) not in to_word:
                continue
            if not max_context.get(str(start), False):
                continue
            if end < start or end - start + 1 > max_answer_length:
                continue
            out.append(Candidate(window_index, start, end, float(start_logits[start]), float(end_logits[end])))
    return out


def detokenize(pieces: Sequence[str]) -> str:
    """WordPieces back to text: '##' continuations glued on, whitespace collapsed."""
    text = " ".join(pieces).replace(" ##", "").replace("##", "")
    return " ".join(text.strip().split())


def _without_spaces(text: str) -> tuple[str, dict[int, int]]:
    """`text` without spaces, and each kept character's index in `text`."""
    chars, index = [], {}
    for i, ch in enumerate(text):
        if ch == " ":
            continue
        index[len(chars)] = i
        chars.append(ch)
    return "".join(chars), index


def final_text(pred_text: str, orig_text: str, do_lower_case: bool) -> str:
    """The span of `orig_text` that `pred_text` (de-tokenized, maybe lowercased) came from.

    `orig_text` is basic-tokenized like the model's input; where `pred_text` sits in that, mapped
    through the space-free forms of both, gives the span of the original. Any failure (not found,
    lengths differ after lowercasing/accent stripping) returns `orig_text` unchanged.
    """
    tok_text = " ".join(basic_tokenize(orig_text, do_lower_case))
    start = tok_text.find(pred_text)
    if start == -1:
        return orig_text
    end = start + len(pred_text) - 1
    orig_ns, orig_ns_to_s = _without_spaces(orig_text)
    tok_ns, tok_ns_to_s = _without_spaces(tok_text)
    if len(orig_ns) != len(tok_ns):
        return orig_text
    tok_s_to_ns = {s: ns for ns, s in tok_ns_to_s.items()}
    if start not in tok_s_to_ns or end not in tok_s_to_ns:
        return orig_text
    orig_start = orig_ns_to_s.get(tok_s_to_ns[start])
    orig_end = orig_ns_to_s.get(tok_s_to_ns[end])
    if orig_start is None or orig_end is None:
        return orig_text
    return orig_text[orig_start:orig_end + 1]


def original_span(example: Mapping, first: int, last: int) -> str:
    """The text of words `first`..`last`: the exact characters of the context where the example
    carries it (unspaced text, whose words are single characters: joined by spaces they would not be
    the context's text), else the words joined by spaces as the original does."""
    words = example["words"]
    if "word_starts" in example:
        starts = example["word_starts"]
        return example["context"][starts[first]:starts[last] + len(words[last])]
    return " ".join(words[first:last + 1])


def softmax(scores: Sequence[float]) -> list[float]:
    if not scores:
        return []
    top = max(scores)
    exp = [math.exp(s - top) for s in scores]
    total = sum(exp)
    return [e / total for e in exp]


def predict_question(example: Mapping, windows: Sequence[Mapping], logits: Sequence[tuple[np.ndarray, np.ndarray]],
                     version_2: bool, do_lower_case: bool, n_best: int = N_BEST,
                     max_answer_length: int = MAX_ANSWER_LENGTH,
                     null_score_diff_threshold: float = 0.0) -> tuple[str, list[dict], float | None]:
    """(answer, n-best list, null odds or None) for one question from its windows' logits."""
    candidates: list[Candidate] = []
    null_score, null_window, null_start, null_end = math.inf, 0, 0.0, 0.0
    for w, (window, (start_logits, end_logits)) in enumerate(zip(windows, logits, strict=True)):
        if version_2:
            score = float(start_logits[0]) + float(end_logits[0])
            if score < null_score:
                null_score, null_window = score, w
                null_start, null_end = float(start_logits[0]), float(end_logits[0])
        candidates.extend(window_candidates(window, w, start_logits, end_logits, n_best, max_answer_length))
    if version_2:
        candidates.append(Candidate(null_window, 0, 0, null_start, null_end))
    candidates.sort(key=lambda c: c.start_logit + c.end_logit, reverse=True)

    seen: set[str] = set()
    kept: list[tuple[str, float, float]] = []
    for c in candidates:
        if len(kept) >= n_best:
            break
        if c.start > 0:
            window = windows[c.window]
            to_word = window["token_to_word"]
            first, last = to_word[str(c.start)], to_word[str(c.end)]
            orig = original_span(example, first, last)
            text = final_text(detokenize(window["tokens"][c.start:c.end + 1]), orig, do_lower_case)
            if text in seen:
                continue
        else:
            text = ""
        seen.add(text)
        kept.append((text, c.start_logit, c.end_logit))
    if version_2 and "" not in seen:
        kept.append(("", null_start, null_end))
    if not kept:  # no valid span anywhere (the original's nonce answer)
        kept.append(("empty", 0.0, 0.0))

    probabilities = softmax([s + e for _, s, e in kept])
    nbest = [{"text": t, "probability": p, "start_logit": s, "end_logit": e}
             for (t, s, e), p in zip(kept, probabilities, strict=True)]
    if not version_2:
        return nbest[0]["text"], nbest, None
    best_non_null = next((entry for entry in nbest if entry["text"]), None)
    if best_non_null is None:  # only the null answer survived (the original would crash here)
        return "", nbest, None
    diff = null_score - best_non_null["start_logit"] - best_non_null["end_logit"]
    return ("" if diff > null_score_diff_threshold else best_non_null["text"]), nbest, diff


def postprocess(examples: Sequence[Mapping], windows: Sequence[Mapping], unique_ids: np.ndarray,
                start_logits: np.ndarray, end_logits: np.ndarray, version_2: bool, do_lower_case: bool,
                n_best: int = N_BEST, max_answer_length: int = MAX_ANSWER_LENGTH,
                null_score_diff_threshold: float = 0.0) -> SquadPredictions:
    """All questions of a split. `windows` in record order; logits rows matched by unique id."""
    row_of = {int(u): i for i, u in enumerate(np.asarray(unique_ids).ravel())}
    by_example: dict[int, list[Mapping]] = {}
    for window in windows:
        by_example.setdefault(int(window["example_index"]), []).append(window)
    missing = [w["unique_id"] for ws in by_example.values() for w in ws if int(w["unique_id"]) not in row_of]
    if missing:
        raise ValueError(f"no logits for {len(missing)} windows (first unique_id {missing[0]})")
    out = SquadPredictions({}, {}, {})
    for example in examples:
        qid = example["id"]
        ws = by_example.get(int(example["index"]), [])
        rows = [row_of[int(w["unique_id"])] for w in ws]
        logits = [(start_logits[r], end_logits[r]) for r in rows]
        answer, nbest, odds = predict_question(example, ws, logits, version_2, do_lower_case, n_best,
                                               max_answer_length, null_score_diff_threshold)
        out.predictions[qid] = answer
        out.nbest[qid] = nbest
        if odds is not None:
            out.null_odds[qid] = odds
    return out


def _write_json(path: Path, value) -> None:
    from bert_datagen.trainer.runtime.rundir import write_atomic

    write_atomic(path, json.dumps(value, indent=4) + "\n")


def write_predictions(out_dir: str | Path, result: SquadPredictions, version_2: bool) -> list[Path]:
    """predictions.json, nbest_predictions.json and (v2.0) null_odds.json, each atomically."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / "predictions.json", out / "nbest_predictions.json"]
    _write_json(paths[0], result.predictions)
    _write_json(paths[1], result.nbest)
    if version_2:
        paths.append(out / "null_odds.json")
        _write_json(paths[2], result.null_odds)
    return paths


def write_raw_logits(out_dir: str | Path, unique_ids: np.ndarray, start_logits: np.ndarray,
                     end_logits: np.ndarray) -> Path:
    """logits.npz (see the module docstring), atomically."""
    from bert_datagen.trainer.runtime.rundir import replacing

    path = Path(out_dir) / RAW_LOGITS_FILE
    with replacing(path) as tmp:  # the temp name ends in .npz too, so numpy keeps it
        np.savez(tmp, unique_ids=np.asarray(unique_ids, np.int64),
                 start_logits=np.asarray(start_logits, np.float32), end_logits=np.asarray(end_logits, np.float32))
    return path


def read_jsonl(path: str | Path) -> list[dict]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]
