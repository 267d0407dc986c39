"""SQuAD post-processing on crafted logits against a step-by-step transcription of the original
`run_squad.py` (write_predictions, get_final_text, _get_best_indexes, _compute_softmax) written
here, with transformers' BasicTokenizer in get_final_text as the independent tokenizer."""

from __future__ import annotations

import collections
import json
import math

import numpy as np
import pytest

from bert_datagen.trainer.finetune import squad_postprocess as sp

bert_tokenization = pytest.importorskip("transformers.models.bert.tokenization_bert_legacy",
                                        reason="transformers is a test extra")

# Words of a document and their WordPieces (what the task writer produces: basic tokenization,
# lowercasing, then WordPiece per word).
DOC = [("The", ["the"]), ("Eiffel", ["e", "##iff", "##el"]), ("Tower", ["tower"]), ("opened", ["opened"]),
       ("in", ["in"]), ("Paris", ["paris"]), ("(1889),", ["(", "1889", ")", ","]), ("designed", ["designed"]),
       ("by", ["by"]), ("Gustave", ["gus", "##tave"]), ("Eiffel's", ["e", "##iff", "##el", "'", "s"]),
       ("company.", ["company", "."]), ("It", ["it"]), ("is", ["is"]), ("330", ["330"]), ("m", ["m"]),
       ("tall.", ["tall", "."])]
QUESTION = ["who", "built", "it", "?"]


def _max_context(spans, span_index, position):
    """The original _check_is_max_context."""
    best_score, best_index = None, None
    for index, (start, length) in enumerate(spans):
        end = start + length - 1
        if position < start or position > end:
            continue
        score = min(position - start, end - position) + 0.01 * length
        if best_score is None or score > best_score:
            best_score, best_index = score, index
    return span_index == best_index


def build_windows(doc, question, max_seq_length, doc_stride, example_index, first_unique_id):
    pieces, piece_to_word = [], []
    for w, (_, ps) in enumerate(doc):
        pieces.extend(ps)
        piece_to_word.extend([w] * len(ps))
    max_tokens = max_seq_length - len(question) - 3
    spans, start = [], 0
    while start < len(pieces):
        length = min(len(pieces) - start, max_tokens)
        spans.append((start, length))
        if start + length == len(pieces):
            break
        start += min(length, doc_stride)
    windows = []
    for i, (s, n) in enumerate(spans):
        tokens = ["[CLS]", *question, "[SEP]"]
        to_word, ctx = {}, {}
        for j in range(n):
            to_word[str(len(tokens))] = piece_to_word[s + j]
            ctx[str(len(tokens))] = _max_context(spans, i, s + j)
            tokens.append(pieces[s + j])
        tokens.append("[SEP]")
        windows.append({"unique_id": first_unique_id + i, "example_index": example_index, "window_index": i,
                        "tokens": tokens, "token_to_word": to_word, "max_context": ctx})
    return windows


# ------------------------------------------------------------------ the original, transcribed


def _get_best_indexes(logits, n_best_size):
    index_and_score = sorted(enumerate(logits), key=lambda x: x[1], reverse=True)
    return [index_and_score[i][0] for i in range(min(n_best_size, len(index_and_score)))]


def _compute_softmax(scores):
    max_score = max(scores)
    exp_scores = [math.exp(s - max_score) for s in scores]
    total = sum(exp_scores)
    return [x / total for x in exp_scores]


def _get_final_text(pred_text, orig_text, do_lower_case):
    def _strip_spaces(text):
        ns_chars, ns_to_s_map = [], collections.OrderedDict()
        for i, c in enumerate(text):
            if c == " ":
                continue
            ns_to_s_map[len(ns_chars)] = i
            ns_chars.append(c)
        return "".join(ns_chars), ns_to_s_map

    tokenizer = bert_tokenization.BasicTokenizer(do_lower_case=do_lower_case)
    tok_text = " ".join(tokenizer.tokenize(orig_text))
    start_position = tok_text.find(pred_text)
    if start_position == -1:
        return orig_text
    end_position = start_position + len(pred_text) - 1
    orig_ns_text, orig_ns_to_s_map = _strip_spaces(orig_text)
    tok_ns_text, tok_ns_to_s_map = _strip_spaces(tok_text)
    if len(orig_ns_text) != len(tok_ns_text):
        return orig_text
    tok_s_to_ns_map = {tok_index: i for i, tok_index in tok_ns_to_s_map.items()}
    orig_start_position = None
    if start_position in tok_s_to_ns_map:
        ns_start_position = tok_s_to_ns_map[start_position]
        if ns_start_position in orig_ns_to_s_map:
            orig_start_position = orig_ns_to_s_map[ns_start_position]
    if orig_start_position is None:
        return orig_text
    orig_end_position = None
    if end_position in tok_s_to_ns_map:
        ns_end_position = tok_s_to_ns_map[end_position]
        if ns_end_position in orig_ns_to_s_map:
            orig_end_position = orig_ns_to_s_map[ns_end_position]
    if orig_end_position is None:
        return orig_text
    return orig_text[orig_start_position:(orig_end_position + 1)]


def original_write_predictions(examples, features, results, n_best_size, max_answer_length, v2, threshold):
    prelim_t = collections.namedtuple("P", ["feature_index", "start_index", "end_index", "start_logit", "end_logit"])
    nbest_t = collections.namedtuple("N", ["text", "start_logit", "end_logit"])
    by_example = collections.defaultdict(list)
    for f in features:
        by_example[f["example_index"]].append(f)
    all_predictions, all_nbest, scores_diff = {}, {}, {}
    for example_index, example in enumerate(examples):
        feats = by_example[example_index]
        prelim = []
        score_null, min_null_feature_index, null_start_logit, null_end_logit = 1000000, 0, 0, 0
        for feature_index, feature in enumerate(feats):
            start_logits, end_logits = results[feature["unique_id"]]
            token_to_orig_map = {int(k): v for k, v in feature["token_to_word"].items()}
            token_is_max_context = {int(k): v for k, v in feature["max_context"].items()}
            if v2:
                feature_null_score = start_logits[0] + end_logits[0]
                if feature_null_score < score_null:
                    score_null, min_null_feature_index = feature_null_score, feature_index
                    null_start_logit, null_end_logit = start_logits[0], end_logits[0]
            for start_index in _get_best_indexes(start_logits, n_best_size):
                for end_index in _get_best_indexes(end_logits, n_best_size):
                    if start_index >= len(feature["tokens"]) or end_index >= len(feature["tokens"]):
                        continue
                    if start_index not in token_to_orig_map or end_index not in token_to_orig_map:
                        continue
                    if not token_is_max_context.get(start_index, False):
                        continue
                    if end_index < start_index or end_index - start_index + 1 > max_answer_length:
                        continue
                    prelim.append(prelim_t(feature_index, start_index, end_index, start_logits[start_index],
                                           end_logits[end_index]))
        if v2:
            prelim.append(prelim_t(min_null_feature_index, 0, 0, null_start_logit, null_end_logit))
        prelim = sorted(prelim, key=lambda x: (x.start_logit + x.end_logit), reverse=True)
        seen, nbest = {}, []
        for pred in prelim:
            if len(nbest) >= n_best_size:
                break
            feature = feats[pred.feature_index]
            if pred.start_index > 0:
                tok_tokens = feature["tokens"][pred.start_index:(pred.end_index + 1)]
                orig_doc_start = feature["token_to_word"][str(pred.start_index)]
                orig_doc_end = feature["token_to_word"][str(pred.end_index)]
                orig_tokens = example["words"][orig_doc_start:(orig_doc_end + 1)]
                tok_text = " ".join(tok_tokens).replace(" ##", "").replace("##", "").strip()
                tok_text = " ".join(tok_text.split())
                final_text = _get_final_text(tok_text, " ".join(orig_tokens), True)
                if final_text in seen:
                    continue
                seen[final_text] = True
            else:
                final_text = ""
                seen[final_text] = True
            nbest.append(nbest_t(final_text, pred.start_logit, pred.end_logit))
        if v2 and "" not in seen:
            nbest.append(nbest_t("", null_start_logit, null_end_logit))
        if not nbest:
            nbest.append(nbest_t("empty", 0.0, 0.0))
        total_scores, best_non_null_entry = [], None
        for entry in nbest:
            total_scores.append(entry.start_logit + entry.end_logit)
            if not best_non_null_entry and entry.text:
                best_non_null_entry = entry
        probs = _compute_softmax(total_scores)
        all_nbest[example["id"]] = [{"text": e.text, "probability": probs[i], "start_logit": e.start_logit,
                                     "end_logit": e.end_logit} for i, e in enumerate(nbest)]
        if not v2:
            all_predictions[example["id"]] = nbest[0].text
        else:
            score_diff = score_null - best_non_null_entry.start_logit - best_non_null_entry.end_logit
            scores_diff[example["id"]] = score_diff
            all_predictions[example["id"]] = "" if score_diff > threshold else best_non_null_entry.text
    return all_predictions, all_nbest, scores_diff


# ------------------------------------------------------------------ the tests


def _split(seed, max_seq_length, doc_stride, questions=3):
    rng = np.random.default_rng(seed)
    examples, windows = [], []
    for q in range(questions):
        words = DOC[: int(rng.integers(5, len(DOC) + 1))]
        examples.append({"index": q, "id": f"q{q}", "question": " ".join(QUESTION), "words": [w for w, _ in words]})
        windows.extend(build_windows(words, QUESTION, max_seq_length, doc_stride, q, 1000000000 + len(windows)))
    n = len(windows)
    # Rounded logits: ties in the top-20 selection and in the candidate sort.
    start = np.round(rng.normal(0, 2, (n, max_seq_length)), 1).astype(np.float32)
    end = np.round(rng.normal(0, 2, (n, max_seq_length)), 1).astype(np.float32)
    ids = np.array([w["unique_id"] for w in windows], np.int64)
    return examples, windows, ids, start, end


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("v2", [False, True])
def test_postprocess_matches_original_on_random_logits(seed, v2):
    max_seq_length, stride = (24, 6) if seed % 2 else (40, 128)  # several windows, or one
    examples, windows, ids, start, end = _split(seed, max_seq_length, stride)
    n_best, max_len = (20, 30) if seed < 3 else (5, 3)
    got = sp.postprocess(examples, windows, ids, start, end, version_2=v2, do_lower_case=True,
                         n_best=n_best, max_answer_length=max_len, null_score_diff_threshold=0.5 * (seed - 2))
    results = {int(u): ([float(x) for x in s], [float(x) for x in e]) for u, s, e in zip(ids, start, end, strict=True)}
    preds, nbest, odds = original_write_predictions(examples, windows, results, n_best, max_len, v2,
                                                    0.5 * (seed - 2))
    assert got.predictions == preds
    assert got.nbest == nbest
    assert got.null_odds == odds


def _logits_for(windows, length, spans, null=None):
    start = np.full((len(windows), length), -5.0, np.float32)
    end = np.full((len(windows), length), -5.0, np.float32)
    for w, (s, e, value) in spans.items():
        start[w, s], end[w, e] = value, value
    if null is not None:
        start[:, 0], end[:, 0] = null, null
    return start, end


def test_final_text_recovers_case_and_punctuation():
    windows = build_windows(DOC, QUESTION, 64, 128, 0, 1000000000)
    tokens = windows[0]["tokens"]
    s = tokens.index("(")  # "( 1889 )" inside the word "(1889),"
    e = s + 2
    start, end = _logits_for(windows, 64, {0: (s, e, 5.0)})
    example = {"index": 0, "id": "x", "words": [w for w, _ in DOC]}
    got = sp.postprocess([example], windows, np.array([1000000000]), start, end, False, True)
    assert got.predictions["x"] == "(1889)"
    s = tokens.index("e")  # "e ##iff ##el tower" -> "Eiffel Tower"
    start, end = _logits_for(windows, 64, {0: (s, s + 3, 5.0)})
    assert sp.postprocess([example], windows, np.array([1000000000]), start, end, False, True
                          ).predictions["x"] == "Eiffel Tower"
    # Alignment failure falls back to the original words.
    assert sp.final_text("zzz", "Gustave Eiffel's", True) == "Gustave Eiffel's"
    assert sp.final_text("eiffel ' s", "Gustave Eiffel's", True) == "Eiffel's"


def test_v2_null_answer_threshold_and_files(tmp_path):
    windows = build_windows(DOC, QUESTION, 24, 6, 0, 1000000000)
    assert len(windows) > 2
    example = {"index": 0, "id": "x", "words": [w for w, _ in DOC]}
    pos = min(int(k) for k, best in windows[1]["max_context"].items() if best)
    spans = {1: (pos, pos + 1, 2.0)}
    start, end = _logits_for(windows, 24, spans, null=1.5)
    start[2, 0] = 0.5  # the smallest null score is in window 2: 0.5 + 1.5
    ids = np.array([w["unique_id"] for w in windows])
    got = sp.postprocess([example], windows, ids, start, end, True, True)
    assert got.null_odds["x"] == pytest.approx(2.0 - 4.0)
    assert got.predictions["x"] != ""
    strict = sp.postprocess([example], windows, ids, start, end, True, True, null_score_diff_threshold=-3.0)
    assert strict.predictions["x"] == ""
    assert sum(e["probability"] for e in got.nbest["x"]) == pytest.approx(1.0)
    paths = sp.write_predictions(tmp_path, got, version_2=True)
    assert [p.name for p in paths] == ["predictions.json", "nbest_predictions.json", "null_odds.json"]
    assert json.loads(paths[0].read_text()) == got.predictions
    raw = sp.write_raw_logits(tmp_path, ids, start, end)
    with np.load(raw, allow_pickle=False) as data:
        back = data["unique_ids"], data["start_logits"], data["end_logits"]
    assert np.array_equal(back[0], ids) and np.array_equal(back[1], start) and np.array_equal(back[2], end)


def test_missing_logits_is_an_error():
    windows = build_windows(DOC, QUESTION, 24, 6, 0, 1000000000)
    example = {"index": 0, "id": "x", "words": [w for w, _ in DOC]}
    start, end = _logits_for(windows, 24, {})
    with pytest.raises(ValueError, match="no logits"):
        sp.postprocess([example], windows, np.array([1000000000]), start[:1], end[:1], False, True)
