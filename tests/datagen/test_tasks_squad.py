"""SQuAD task data: the original run_squad.py windows, labels and post-processing maps, every question."""

from __future__ import annotations

import json

import numpy as np
import pytest

from bert_datagen.datagen.tasks.config import TaskConfig, TaskInputError
from bert_datagen.datagen.tasks.squad import doc_windows, improve_answer_span, max_context_window
from tests.support.taskdata_fixtures import build_file, minilm_tokenizer, squad_slice, task_file
from tests.support.taskdata_reference import Tok, convert_examples_to_features, read_squad_examples

SEQ = ("unique_ids", "input_ids", "input_mask", "segment_ids")
TRAIN = ("start_positions", "end_positions", "is_impossible")


def compare(records, reference: list[dict], training: bool) -> None:
    assert len(records) == len(reference)
    for name in SEQ + (TRAIN if training else ()):
        got = records.columns[name]
        want = np.array([f[name] for f in reference], dtype=np.int64)
        bad = np.flatnonzero((got != want).any(axis=1))
        assert bad.size == 0, f"{name}: windows {bad[:5]} differ"
    assert set(records.columns) == set(SEQ + (TRAIN if training else ()))
    for line, f in zip(records.window_lines, reference, strict=True):
        w = json.loads(line)
        assert w["unique_id"] == f["unique_ids"][0]
        assert (w["example_index"], w["window_index"]) == (f["example_index"], f["doc_span_index"])
        assert w["tokens"] == f["tokens"]
        assert w["token_to_word"] == {str(k): v for k, v in f["token_to_orig_map"].items()}
        assert w["max_context"] == {str(k): v for k, v in f["token_is_max_context"].items()}


def _examples_json(records) -> list[dict]:
    return [json.loads(line) for line in records.example_lines]


@pytest.mark.parametrize("L, stride, q", [pytest.param(384, 128, 64, marks=pytest.mark.integration), (96, 32, 16)])
def test_part_a_prediction_mode_every_window_as_the_original(L, stride, q):
    path = task_file("squad11/dev-v1.1-part-a.json")
    tok = minilm_tokenizer()
    config = TaskConfig(kind="squad", max_seq_length=L, doc_stride=stride, max_query_length=q)
    if L < 384:  # the small windows: a slice keeps the quadratic max-context reference quick
        path = squad_slice(path, 300)
    records, labels = build_file(config, "dev", path, tok)
    assert labels == []
    examples = read_squad_examples(str(path), is_training=False)
    reference = convert_examples_to_features(examples, Tok(tok.vocab.tokens), L, stride, q, is_training=False)
    compare(records, reference, training=False)
    side = _examples_json(records)
    assert [e["id"] for e in side] == [ex["qas_id"] for ex in examples]
    assert all(e["words"] == ex["doc_tokens"] for e, ex in zip(side, examples, strict=True))
    assert all(len(e["answers"]) >= 1 for e in side)  # dev: gold answers kept for evaluation
    assert records.counts["examples"] == len(examples)
    if L < 384:
        assert records.counts["multi_window_examples"] > 50


def test_part_a_training_mode_labels_as_the_original():
    path = task_file("squad11/dev-v1.1-part-a.json")
    tok = minilm_tokenizer()
    config = TaskConfig(kind="squad", max_seq_length=128, doc_stride=48, max_query_length=24)
    small = squad_slice(path, 800)
    records, _ = build_file(config, "train", small, tok)
    examples = read_squad_examples(str(small), is_training=True)
    reference = convert_examples_to_features(examples, Tok(tok.vocab.tokens), 128, 48, 24, is_training=True)
    compare(records, reference, training=True)
    starts = records.columns["start_positions"][:, 0]
    assert (starts > 0).sum() > 500 and (starts == 0).sum() > 50  # answers inside and outside windows
    # Dev questions carry several answers: the first is used, and that is counted.
    assert records.counts["first_of_several_answers"] > 0


def _squad(tmp_path, paragraphs, version="1.1", name="s.json"):
    path = tmp_path / name
    path.write_text(json.dumps({"version": version, "data": [{"title": "t", "paragraphs": paragraphs}]}),
                    encoding="utf-8")
    return path


def test_answer_span_narrowing_and_narrow_space(tmp_path):
    context = "The painter (1895\u202f1943) lived in Paris\u202fFrance for years ."
    qas = [{"id": "q1", "question": "When was he born?", "answers": [{"text": "1895", "answer_start": 13}]},
           {"id": "q2", "question": "Where?", "answers": [{"text": "France", "answer_start": context.index("France")}]}]
    path = _squad(tmp_path, [{"context": context, "qas": qas}])
    tok = minilm_tokenizer()
    records, _ = build_file(TaskConfig(kind="squad"), "train", path, tok)
    reference = convert_examples_to_features(read_squad_examples(str(path), True), Tok(tok.vocab.tokens),
                                             384, 128, 64, True)
    compare(records, reference, training=True)
    ids = records.columns["input_ids"][0]
    s, e = records.columns["start_positions"][0, 0], records.columns["end_positions"][0, 0]
    assert tok.convert_ids_to_tokens(ids[s:e + 1]) == ["1895"]  # narrowed from the word "(1895"
    assert _examples_json(records)[0]["words"][2] == "(1895"  # U+202F splits words


def test_squad2_impossible_questions(tmp_path):
    context = "Tom likes green apples ."
    qas = [{"id": "a", "question": "What does Tom like?", "is_impossible": False,
            "answers": [{"text": "green apples", "answer_start": 10}]},
           {"id": "b", "question": "What does Ann like?", "is_impossible": True, "answers": []}]
    path = _squad(tmp_path, [{"context": context, "qas": qas}], version="v2.0")
    tok = minilm_tokenizer()
    records, _ = build_file(TaskConfig(kind="squad2"), "train", path, tok)
    reference = convert_examples_to_features(read_squad_examples(str(path), True, version_2_with_negative=True),
                                             Tok(tok.vocab.tokens), 384, 128, 64, True)
    compare(records, reference, training=True)
    assert records.columns["is_impossible"][:, 0].tolist() == [0, 1]
    assert records.columns["start_positions"][1, 0] == 0 and records.columns["end_positions"][1, 0] == 0
    pred, _ = build_file(TaskConfig(kind="squad2"), "dev", path, tok)
    assert [e["is_impossible"] for e in _examples_json(pred)] == [False, True]
    assert set(pred.columns) == set(SEQ)


def test_training_answer_not_in_its_words_is_skipped_and_counted(tmp_path):
    # A no-break space is not a word break in the original, but the answer's whitespace
    # normalisation splits at it: the text cannot be recovered from the words.
    context = "The score was 3\u00a02 at the end ."
    qas = [{"id": "a", "question": "Score?", "answers": [{"text": "3\u00a02", "answer_start": 14}]},
           {"id": "b", "question": "When?", "answers": [{"text": "the end", "answer_start": context.index("the end")}]}]
    path = _squad(tmp_path, [{"context": context, "qas": qas}])
    tok = minilm_tokenizer()
    records, _ = build_file(TaskConfig(kind="squad"), "train", path, tok)
    assert records.counts["skipped_answers"] == 1 and records.counts["examples"] == 1
    assert len(read_squad_examples(str(path), True)) == 1
    pred, _ = build_file(TaskConfig(kind="squad"), "dev", path, tok)
    assert pred.counts["examples"] == 2  # prediction mode keeps every question


@pytest.mark.parametrize("doc, split, message", [
    ({"data": [{"paragraphs": [{"context": "A b c.", "qas": [
        {"id": "x1", "question": "q?", "answers": [{"text": "", "answer_start": 0}]}]}]}]}, "dev",
     r"s\.json: line 1: question 'x1' \(data\[0\]\.paragraphs\[0\]\.qas\[0\]\.answers\[0\]\): empty answer text"),
    ([1, 2], "dev", r"s\.json: top level: not SQuAD JSON"),
    ({"data": [{"paragraphs": [{"qas": []}]}]}, "dev", r"s\.json: data\[0\]\.paragraphs\[0\]: not SQuAD JSON: no 'context'"),
    ({"data": [{"paragraphs": [{"context": "A b.", "qas": [{"id": "x3", "question": 5}]}]}]}, "dev",
     r"question 'x3' .*'question' should be a string, got an integer"),
    ({"data": [{"paragraphs": [{"context": "A b.", "qas": [{"id": "x4", "question": "q?", "answers": []}]}]}]},
     "train", r"question 'x4' .*a training question needs an answer"),
])
def test_bad_squad_files_name_file_and_question(tmp_path, doc, split, message):
    path = tmp_path / "s.json"
    path.write_text(json.dumps(doc), encoding="utf-8")
    with pytest.raises(TaskInputError, match=message):
        build_file(TaskConfig(kind="squad"), split, path, minilm_tokenizer())


def test_invalid_json_names_line_and_column(tmp_path):
    path = tmp_path / "s.json"
    path.write_text('{"data": [\n  {"paragraphs": [}\n]}', encoding="utf-8")
    with pytest.raises(TaskInputError, match=r"s\.json: line 2 column 19: not valid JSON .*expected SQuAD JSON"):
        build_file(TaskConfig(kind="squad"), "dev", path, minilm_tokenizer())


def test_window_helpers_match_the_original_loops():
    from tests.support.taskdata_reference import check_is_max_context

    for n in (1, 5, 37, 129):
        for max_doc in (1, 7, 40):
            for stride in (1, 3, 64):
                spans = doc_windows(n, max_doc, stride)
                assert spans[0][0] == 0 and sum(spans[-1]) == n
                best = max_context_window(spans, n)
                for pos in range(n):
                    for w in range(len(spans)):
                        assert (best[pos] == w) == check_is_max_context(spans, w, pos)
    doc = np.array([5, 6, 7, 8, 6, 7], dtype=np.int64)
    assert improve_answer_span(doc, 0, 5, np.array([6, 7])) == (1, 2)
    assert improve_answer_span(doc, 2, 5, np.array([6, 7])) == (4, 5)
    assert improve_answer_span(doc, 0, 5, np.array([9])) == (0, 5)
    assert improve_answer_span(doc, 0, 5, np.array([], dtype=np.int64)) == (0, 5)
