"""Token tagging data: first-piece labels, whole-word windows, CoNLL reading and tag schemes."""

from __future__ import annotations

import json

import numpy as np
import pytest

from bert_datagen.datagen.tasks.config import TaskConfig, TaskInputError
from tests.support.taskdata_fixtures import build_file, build_split, minilm_tokenizer, task_file
from tests.support.taskdata_reference import Tok, read_conll_reference, tagging_features

FEATURES = ("input_ids", "input_mask", "segment_ids", "label_ids")


def compare(records, sentences, labels, tok, L):
    index = {t: i for i, t in enumerate(labels)}
    ref = Tok(tok.vocab.tokens)
    expected = []
    for i, (words, tags) in enumerate(sentences):
        for f in tagging_features(words, [index[t] for t in tags], ref, L):
            expected.append((i, f))
    assert len(records) == len(expected)
    for name in FEATURES:
        want = np.array([f[name] for _, f in expected], dtype=np.int64)
        bad = np.flatnonzero((records.columns[name] != want).any(axis=1))
        assert bad.size == 0, f"{name}: windows {bad[:5]} differ"
    for line, (i, f) in zip(records.window_lines, expected, strict=True):
        w = json.loads(line)
        assert (w["example_index"], w["window_index"], w["word_ids"]) == (i, f["window_index"], f["word_ids"])
    side = [json.loads(line) for line in records.example_lines]
    assert [(e["words"], e["tags"]) for e in side] == [(w, t) for w, t in sentences]


@pytest.mark.parametrize("L", [128, 12])
def test_wnut17_dev_every_sentence(L):
    path = task_file("wnut17/dev.conll")
    tok = minilm_tokenizer()
    records, labels = build_file(TaskConfig(kind="conll", max_seq_length=L), "dev", path, tok)
    assert len(labels) == 13 and "O" in labels and labels == sorted(labels)
    sentences = read_conll_reference(str(path))
    assert len(sentences) == 1009
    compare(records, sentences, labels, tok, L)
    if L == 12:
        assert records.counts["multi_window_examples"] > 100
        # Every word is owned by exactly one window.
        owned = sum(int((records.columns["label_ids"][r] >= 0).sum()) for r in range(len(records)))
        assert owned == sum(len(w) for w, _ in sentences)


def _conll(tmp_path, text: str, name: str = "t.conll"):
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def test_blank_whitespace_lines_docstart_and_columns(tmp_path):
    text = ("-DOCSTART- -X- O O\n\nEU NNP B-ORG\nrejects VBZ O\n \t \nPeter NNP B-PER\n"
            "Blackburn NNP I-PER\n\n\n")
    path = _conll(tmp_path, text)
    tok = minilm_tokenizer()
    records, labels = build_file(TaskConfig(kind="conll"), "train", path, tok)
    assert labels == ["B-ORG", "B-PER", "I-PER", "O"]
    compare(records, [(["EU", "rejects"], ["B-ORG", "O"]), (["Peter", "Blackburn"], ["B-PER", "I-PER"])],
            labels, tok, 128)
    with pytest.raises(TaskInputError, match=r"t\.conll: line 3: tag 'NNP' is not a iob2 tag"):
        build_file(TaskConfig(kind="conll", tag_column=1), "train", path, tok)  # the POS column


def test_wrong_column_count_names_the_line(tmp_path):
    path = _conll(tmp_path, "a\tO\nb\tO\n\nc\tB-PER\textra\n")
    with pytest.raises(TaskInputError, match=r"t\.conll: line 4: 3 column\(s\), but the file's first token line "
                                             r"\(line 1\) has 2"):
        build_file(TaskConfig(kind="conll"), "train", path, minilm_tokenizer())


@pytest.mark.parametrize("text, scheme, message", [
    ("a\tO\nb\tI-PER\n", "iob2", r"line 2: I-PER after O is not valid IOB2 .*use --scheme iob1"),
    ("a\tB-LOC\nb\tI-PER\n", "iob2", r"line 2: I-PER after B-LOC is not valid IOB2"),
    ("a\tO\nb\tPER\n", "iob2", r"line 2: tag 'PER' is not a iob2 tag"),
    ("a\tO\nb\tE-PER\n", "iob2", r"line 2: tag 'E-PER' is not a iob2 tag"),
    ("a\tB-PER\nb\tO\n", "bioes", r"line 1: B-PER followed by O is not valid BIOES"),
    ("a\tO\nb\tE-PER\n", "bioes", r"line 2: E-PER after O is not valid BIOES"),
])
def test_bad_tags_are_refused_with_file_and_line(tmp_path, text, scheme, message):
    path = _conll(tmp_path, text)
    with pytest.raises(TaskInputError, match=r"t\.conll: " + message):
        build_file(TaskConfig(kind="conll", scheme=scheme), "train", path, minilm_tokenizer())


def test_iob1_is_converted_to_iob2(tmp_path):
    path = _conll(tmp_path, "a\tI-PER\nb\tI-PER\nc\tB-PER\nd\tO\ne\tI-LOC\nf\tI-ORG\n")
    tok = minilm_tokenizer()
    records, labels = build_file(TaskConfig(kind="conll", scheme="iob1"), "train", path, tok)
    side = json.loads(records.example_lines[0])
    assert side["tags"] == ["B-PER", "I-PER", "B-PER", "O", "B-LOC", "B-ORG"]
    assert records.counts["iob1_tags_converted"] == 3
    bioes, labels = build_file(TaskConfig(kind="conll", scheme="bioes"), "train",
                               _conll(tmp_path, "a\tB-PER\nb\tE-PER\nc\tS-LOC\nd\tO\n", "b.conll"), tok)
    assert labels == ["B-PER", "E-PER", "O", "S-LOC"]


def test_labels_option_and_unlabelled_test_split(tmp_path):
    tok = minilm_tokenizer()
    path = _conll(tmp_path, "a\tO\nb\tB-PER\n")
    with pytest.raises(TaskInputError, match=r"t\.conll: line 2: tag 'B-PER' is not one of the task's labels \(O\)"):
        build_file(TaskConfig(kind="conll", labels=("O",)), "train", path, tok)
    test = _conll(tmp_path, "Peter\nlikes\nstrawberries\n", "test.conll")
    records, _ = build_split(TaskConfig(kind="conll"), "test", [(str(test), test.read_bytes())], tok,
                             labels=["B-PER", "O"])
    first = records.columns["label_ids"][0]
    assert (first[first >= 0] == 0).all() and (first >= 0).sum() == 3
    assert "tags" not in json.loads(records.example_lines[0])
    with pytest.raises(TaskInputError, match=r"test\.conll: line 1: --tag-column -1 is the token column"):
        build_file(TaskConfig(kind="conll"), "train", test, tok)


def test_words_without_pieces_and_overlong_words(tmp_path):
    tok = minilm_tokenizer()
    path = _conll(tmp_path, "ok\tO\n\u200b\tB-PER\n" + "x" * 60 + "y" * 60 + "\tO\n")
    records, labels = build_file(TaskConfig(kind="conll", max_seq_length=8), "train", path, tok)
    compare(records, [(["ok", "\u200b", "x" * 60 + "y" * 60], ["O", "B-PER", "O"])], labels, tok, 8)
    assert tok.vocab.unk_id in records.columns["input_ids"][0].tolist()
    assert records.counts["truncated_words"] == 1 and records.counts["truncated_examples"] == 1
