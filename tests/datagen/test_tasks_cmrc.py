"""SQuAD-layout data in unspaced text (CMRC 2018): character words, exact-character predictions,
misaligned answer offsets re-anchored or skipped and counted."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bert_datagen.datagen.tasks.config import TaskConfig
from bert_datagen.datagen.tasks.squad_read import context_words, read_squad, reanchor
from bert_datagen.vocab.tokenizer import BertTokenizer
from bert_datagen.vocab.train import train_vocab
from bert_datagen.vocab.vocab_file import Vocab
from tests.support.span_roundtrip import gold_roundtrip
from tests.support.taskdata_fixtures import build_file

TRIAL = Path(__file__).resolve().parents[2] / ".." / "shared" / "tasks" / "cmrc2018" / "trial.json"
CONTEXT = "马克·茨柏克沃斯基（Mark Zbikowski）出生于1982年，是微软公司的元老之一。"


def _file(tmp_path, qas, context=CONTEXT):
    path = tmp_path / "c.json"
    path.write_text(json.dumps({"data": [{"paragraphs": [{"context": context, "qas": qas}]}]}, ensure_ascii=False),
                    encoding="utf-8")
    return path


def test_unspaced_contexts_get_character_words_and_mixed_latin_stays_whole():
    words, starts = context_words(CONTEXT)
    assert words[:12] == ["马", "克", "·", "茨", "柏", "克", "沃", "斯", "基", "（", "Mark", "Zbikowski"]
    assert words[12:18] == ["）", "出", "生", "于", "1982", "年"]
    assert all(CONTEXT.startswith(w, s) for w, s in zip(words, starts, strict=True))
    # Spaced text keeps the original's whitespace words, a few CJK characters or not.
    english = "Beijing (北京) is the capital of China, a city of 21 million people."
    assert context_words(english)[0] == english.split()


def test_misaligned_offsets_are_reanchored_or_skipped_and_counted(tmp_path):
    at = CONTEXT.index("微软公司")
    assert reanchor(CONTEXT, "微软公司", at + 3) == at and reanchor(CONTEXT, "微软公司", at + 30) == -1
    qas = [{"id": "ok", "question": "谁？", "answers": [{"text": "微软公司", "answer_start": at}]},
           {"id": "near", "question": "何时？", "answers": [{"text": "1982年", "answer_start": CONTEXT.index("1982") - 2}]},
           {"id": "far", "question": "哪里？", "answers": [{"text": "马克", "answer_start": 30}]}]
    path = _file(tmp_path, qas)
    examples, counts = read_squad(str(path), path.read_bytes(), False, True)
    assert [e.qas_id for e in examples] == ["ok", "near"]
    assert counts["reanchored_answers"] == 1 and counts["unanchored_skipped"] == 1
    assert counts["character_word_contexts"] == 1
    near = examples[1]
    assert near.paragraph.words[near.start_word:near.end_word + 1] == ["1982", "年"]
    # Evaluated questions keep every answer: scored by its text, the far one counted.
    examples, counts = read_squad(str(path), path.read_bytes(), False, False)
    assert len(examples) == 3 and examples[2].answers == ["马克"] and counts["unanchored_answers"] == 1


def test_side_data_maps_spans_back_to_the_exact_characters(tmp_path):
    at = CONTEXT.index("Mark Zbikowski")
    qas = [{"id": "a", "question": "英文名？", "answers": [{"text": "Mark Zbikowski", "answer_start": at}]},
           {"id": "b", "question": "谁？", "answers": [{"text": "微软公司的元老", "answer_start": CONTEXT.index("微软")}]}]
    tok = BertTokenizer(Vocab.from_tokens(train_vocab([CONTEXT] * 3, vocab_size=300, do_lower_case=True,
                                                      min_frequency=1)))
    records, _ = build_file(TaskConfig(kind="squad"), "train", _file(tmp_path, qas), tok)
    example = json.loads(records.example_lines[0])
    assert example["context"] == CONTEXT and len(example["word_starts"]) == len(example["words"])
    got = gold_roundtrip(records, tok)
    assert (got["examples"], got["recoverable"], got["exact"]) == (2, 2, 2), got["misses"]


def test_cmrc_trial_reads_whole_and_its_gold_answers_come_back(shared_corpora):
    if not TRIAL.is_file():
        pytest.skip(f"CMRC 2018 trial not found at {TRIAL}")
    data = json.loads(TRIAL.read_text(encoding="utf-8"))
    contexts = [p["context"] for a in data["data"] for p in a["paragraphs"]]
    tok = BertTokenizer(Vocab.from_tokens(train_vocab(contexts, vocab_size=8000, do_lower_case=True)))
    records, _ = build_file(TaskConfig(kind="squad"), "train", TRIAL, tok)
    counts = records.counts
    # The published trial file: 5 of 1,002 answers are 1 to 3 characters off their text.
    assert counts["examples"] == 1002 and counts["reanchored_answers"] == 5 and counts["skipped_answers"] == 0
    assert counts["character_word_contexts"] == 256
    got = gold_roundtrip(records, tok)
    assert got["examples"] >= 995
    # Exact but for the gold answers' own leading/trailing spaces; the one exception starts inside a
    # Latin word ("AXR" of "JAXR"), which word-level spans cannot represent.
    unexplained = [m for m in got["misses"] if m["predicted"] != m["answer"].strip() and m["id"] != "TRIAL_749_QUERY_0"]
    assert not unexplained
    assert got["recoverable"] >= got["examples"] - 2
