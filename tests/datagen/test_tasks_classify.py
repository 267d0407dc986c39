"""Sentence and pair task data: identical to the original run_classifier.py features, file errors named."""

from __future__ import annotations

import csv
import io

import numpy as np
import pytest

from bert_datagen.datagen.config import ConfigError
from bert_datagen.datagen.tasks.classify import classification_records, truncate_pair_lengths
from bert_datagen.datagen.tasks.config import CLASSIFICATION, REGRESSION, TaskConfig, TaskInputError
from bert_datagen.datagen.tasks.delimited import read_table
from tests.support.taskdata_fixtures import build_file, build_split, minilm_tokenizer, task_file
from tests.support.taskdata_reference import Tok, convert_single_example, read_tsv, truncate_seq_pair

FEATURES = ("input_ids", "input_mask", "segment_ids", "label_ids", "is_real_example")


def assert_rows_equal(records, expected: list[dict]) -> None:
    assert len(records) == len(expected)
    for name in FEATURES:
        got = records.columns[name]
        want = np.array([e[name] for e in expected], dtype=got.dtype)
        mismatch = np.flatnonzero((got != want).any(axis=1))
        assert mismatch.size == 0, f"{name}: first differing example {mismatch[:5]}"


def reference_rows(rows, text_a, text_b, label, labels, L, tok, regression=False):
    return [convert_single_example(r[text_a], r[text_b] if text_b is not None else None, r[label], labels, L, tok,
                                   regression) for r in rows]


@pytest.mark.parametrize("L", [128, 20])
def test_sst2_dev_every_example_as_the_original(L):
    path = task_file("sst2/dev.tsv")
    tok = minilm_tokenizer()
    records, labels = build_file(TaskConfig(kind="glue/sst2", max_seq_length=L), "dev", path, tok)
    assert labels == ["0", "1"]
    rows = read_tsv(str(path))[1:]  # the original's SST-2 processor skips the header
    assert_rows_equal(records, reference_rows(rows, 0, None, 1, labels, L, Tok(tok.vocab.tokens)))
    assert records.counts["examples"] == 872
    assert int(records.columns["label_ids"].sum()) == 444  # README: 444 positive


def test_cola_dev_every_example_as_the_original():
    path = task_file("cola/dev.tsv")  # no header, no newline after the last row
    tok = minilm_tokenizer()
    records, labels = build_file(TaskConfig(kind="glue/cola"), "dev", path, tok)
    rows = read_tsv(str(path))
    assert len(rows) == 1043
    assert_rows_equal(records, reference_rows(rows, 3, None, 1, labels, 128, Tok(tok.vocab.tokens)))


@pytest.mark.parametrize("L", [128, 24])
def test_rte_dev_every_pair_as_the_original(L):
    path = task_file("rte/dev.tsv")
    tok = minilm_tokenizer()
    records, labels = build_file(TaskConfig(kind="glue/rte", max_seq_length=L), "dev", path, tok)
    assert labels == ["entailment", "not_entailment"]
    rows = read_tsv(str(path))[1:]
    assert_rows_equal(records, reference_rows(rows, 1, 2, -1, labels, L, Tok(tok.vocab.tokens)))
    assert records.counts["truncated_examples"] > 0


def test_pair_truncation_closed_form_equals_the_pop_loop():
    la, lb, m = np.meshgrid(np.arange(0, 23), np.arange(0, 23), np.arange(2, 26), indexing="ij")
    la, lb, m = la.ravel(), lb.ravel(), m.ravel()
    for total in np.unique(m):
        sel = m == total
        got_a, got_b = truncate_pair_lengths(la[sel], lb[sel], int(total))
        for a, b, ga, gb in zip(la[sel], lb[sel], got_a, got_b, strict=True):
            ta, tb = list(range(a)), list(range(b))
            truncate_seq_pair(ta, tb, int(total))
            assert (len(ta), len(tb)) == (ga, gb), (a, b, total)


def test_b_that_tokenizes_to_nothing_is_no_b():
    tok = minilm_tokenizer()
    texts_a = ["a first text", "one more text here", "x " * 200]
    texts_b = ["\x00\x01", "", "y " * 200]  # nothing left after cleaning; empty; long pair
    records = classification_records(tok, texts_a, texts_b, [0, 1, 1], 16, CLASSIFICATION)
    ref = Tok(tok.vocab.tokens)
    expected = [convert_single_example(a, b, lab, ["0", "1"], 16, ref) for a, b, lab in
                zip(texts_a, texts_b, ["0", "1", "1"], strict=True)]
    assert_rows_equal(records, expected)
    assert records.counts["truncated_examples"] == 1
    assert records.columns["segment_ids"][0].sum() == 0  # single-text layout


def _write(tmp_path, name: str, text: str | bytes):
    path = tmp_path / name
    path.write_bytes(text if isinstance(text, bytes) else text.encode("utf-8"))
    return path


def test_quotes_are_literal_in_tsv_as_the_original(tmp_path):
    text = 'sentence\tlabel\nhe said "stop\tnow" loudly\t1\n"quoted"\t0\n'
    path = _write(tmp_path, "q.tsv", text)
    rows = read_table(str(path), path.read_bytes(), "tsv")
    assert [fields for _, fields in rows] == list(csv.reader(io.StringIO(text), delimiter="\t", quotechar=None))
    tok = minilm_tokenizer()
    config = TaskConfig(kind="tsv", text_a="sentence", label="-1")
    records, labels = build_file(config, "train", path, tok)
    assert labels == ["0", "1"]
    first = tok.convert_ids_to_tokens(records.columns["input_ids"][1][1:4])
    assert first == ['"', "quoted", '"']  # the quotes are text
    with pytest.raises(TaskInputError, match=r"q\.tsv: line 2: label 'now\" loudly' is not one of"):
        build_file(TaskConfig(kind="tsv", text_a="0", label="1", labels=("0", "1")), "train", path, tok)


def test_bom_on_the_header_line_is_dropped(tmp_path):
    body = "sentence\tlabel\na fine film .\t1\na dull one .\t0\n"
    plain = _write(tmp_path, "plain.tsv", body)
    bom = _write(tmp_path, "bom.tsv", b"\xef\xbb\xbf" + body.encode())
    tok = minilm_tokenizer()
    config = TaskConfig(kind="tsv", text_a="sentence", label="label")
    a, _ = build_file(config, "train", plain, tok)
    b, _ = build_file(config, "train", bom, tok)
    for name in FEATURES:
        assert np.array_equal(a.columns[name], b.columns[name])
    # CoLA has no header: a BOM before its first row is not part of the first field either.
    cola = _write(tmp_path, "cola.tsv", b"\xef\xbb\xbfgj04\t1\t\tThe sailors rode .\n")
    rows = read_table(str(cola), cola.read_bytes(), "tsv")
    assert rows[0][1][0] == "gj04"


@pytest.mark.parametrize("text, config, message", [
    ("sentence\tlabel\nok text\t1\nno label column\n", TaskConfig(kind="glue/sst2"),
     r"bad\.tsv: line 3: 1 column\(s\), the layout needs at least 2"),
    ("sentence\tlabel\nok text\t1\nfine\t7\n", TaskConfig(kind="glue/sst2"),
     r"bad\.tsv: line 3: label '7' is not one of the task's labels \(0, 1\)"),
    ("sentence\tlabel\nok text\t1\n   \t0\n", TaskConfig(kind="glue/sst2"), r"bad\.tsv: line 3: empty text A"),
    ("index\tsentence1\tsentence2\tlabel\n0\ta\t\tentailment\n", TaskConfig(kind="glue/rte"),
     r"bad\.tsv: line 2: empty text B"),
    ("a\tb\tscore\nx\ty\tfive\n", TaskConfig(kind="tsv", text_a="a", text_b="b", label="score", regression=True),
     r"bad\.tsv: line 2: regression label 'five' is not a finite number"),
    ("a\tb\tscore\nx\ty\tnan\n", TaskConfig(kind="tsv", text_a="a", text_b="b", label="score", regression=True),
     r"bad\.tsv: line 2: regression label 'nan'"),
    ("a\tlabel\nx\tpos\n", TaskConfig(kind="tsv", text_a="text", label="label"),
     r"bad\.tsv: line 1: header has no column 'text' \(columns: a, label\)"),
    ("x\tpos\n", TaskConfig(kind="tsv", text_a="text", label="1", header=False),
     r"bad\.tsv: --text-a column 'text' is a name, but the file is read without a header"),
    ("x\tpos\nok\tneg\n", TaskConfig(kind="tsv", text_a="0", label="1", header=False, labels=("neg",)),
     r"bad\.tsv: line 1: label 'pos' is not one of the task's labels \(neg\)"),
])
def test_bad_rows_name_file_and_line(tmp_path, text, config, message):
    path = _write(tmp_path, "bad.tsv", text)
    with pytest.raises(TaskInputError, match=message):
        build_file(config, "train", path, minilm_tokenizer())


def test_invalid_utf8_names_its_line(tmp_path):
    path = _write(tmp_path, "bad.tsv", b"sentence\tlabel\nfine\t1\nbad \xff byte\t0\n")
    with pytest.raises(TaskInputError, match=r"bad\.tsv: line 3: not valid UTF-8"):
        build_file(TaskConfig(kind="glue/sst2"), "train", path, minilm_tokenizer())


def test_csv_quoting_and_line_numbers(tmp_path):
    text = 'text,label\n"a, quoted\ntext",yes\nplain,no\n"broken,yes\n'
    path = _write(tmp_path, "t.csv", text)
    tok = minilm_tokenizer()
    config = TaskConfig(kind="csv", text_a="text", label="label")
    with pytest.raises(TaskInputError, match=r"t\.csv: line 5: not valid CSV"):
        build_file(config, "train", path, tok)
    path.write_text('text,label\n"a, quoted\ntext",yes\nplain,no\n,no\n')
    with pytest.raises(TaskInputError, match=r"t\.csv: line 5: empty text A"):
        build_file(config, "train", path, tok)
    path.write_text('text,label\n"a, quoted\ntext",yes\nplain,no\n')
    records, labels = build_file(config, "train", path, tok)
    assert labels == ["no", "yes"] and records.columns["label_ids"][:, 0].tolist() == [1, 0]
    ref = Tok(tok.vocab.tokens)
    assert_rows_equal(records, [convert_single_example("a, quoted\ntext", None, "yes", labels, 128, ref),
                                convert_single_example("plain", None, "no", labels, 128, ref)])


def test_jsonl_fields_and_errors(tmp_path):
    path = _write(tmp_path, "t.jsonl", '{"q": "is it?", "p": "it is.", "y": 1}\n\n{"q": "no?", "p": "no.", "y": 0}\n')
    tok = minilm_tokenizer()
    config = TaskConfig(kind="jsonl", text_a="q", text_b="p", label="y")
    records, labels = build_file(config, "train", path, tok)
    ref = Tok(tok.vocab.tokens)
    assert_rows_equal(records, [convert_single_example("is it?", "it is.", "1", labels, 128, ref),
                                convert_single_example("no?", "no.", "0", labels, 128, ref)])
    path.write_text('{"q": "is it?", "p": "it is.", "y": 1}\n{"q": "no?", "y": 0}\n')
    with pytest.raises(TaskInputError, match=r"t\.jsonl: line 2: no field 'p' \(--text-b"):
        build_file(config, "train", path, tok)
    path.write_text('{"q": "is it?", "p": 3, "y": 1}\n')
    with pytest.raises(TaskInputError, match=r"t\.jsonl: line 1: field 'p' is int, not a string"):
        build_file(config, "train", path, tok)
    # Lines that are not JSON objects: the same messages as pre-training jsonl input (bert_datagen.datagen.readers).
    for text, message in (('{"q": "a", "p": "b", "y": 1}\n{"q": "a",\n', r"t\.jsonl: line 2: not valid JSON \("),
                          ('\n[1, 2]\n', r"t\.jsonl: line 2: expected a JSON object, got list")):
        path.write_text(text)
        with pytest.raises(TaskInputError, match=message):
            build_file(config, "train", path, tok)


def test_regression_labels_are_float32(tmp_path):
    header = "index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\tsentence2\tscore\n"
    row = "0\tmain\tf\t2012\t1\tnone\tnone\tA plane is taking off.\tAn air plane is taking off.\t5.000\n"
    row2 = "1\tmain\tf\t2012\t4\tnone\tnone\tA man plays.\tA woman cuts.\t0.5\n"
    path = _write(tmp_path, "stsb.tsv", header + row + row2)
    tok = minilm_tokenizer()
    records, labels = build_file(TaskConfig(kind="glue/stsb"), "dev", path, tok)
    assert labels == []
    assert records.columns["label_ids"].dtype == np.float32
    assert records.columns["label_ids"][:, 0].tolist() == [5.0, 0.5]
    ref = Tok(tok.vocab.tokens)
    rows = [line.split("\t") for line in (row.rstrip("\n"), row2.rstrip("\n"))]
    assert_rows_equal(records, reference_rows(rows, 7, 8, -1, [], 128, ref, regression=True))
    assert TaskConfig(kind="tsv", text_a="a", label="b", regression=True).task_type == REGRESSION


def test_glue_test_split_is_unlabelled_and_other_splits_must_have_labels(tmp_path):
    test = _write(tmp_path, "test.tsv", "index\tsentence\n0\ta film .\n1\tanother film .\n")
    tok = minilm_tokenizer()
    records, _ = build_split(TaskConfig(kind="glue/sst2"), "test", [(str(test), test.read_bytes())], tok)
    assert records.columns["label_ids"][:, 0].tolist() == [0, 0]
    ref = Tok(tok.vocab.tokens)
    assert_rows_equal(records, [convert_single_example("a film .", None, "0", ["0", "1"], 128, ref),
                                convert_single_example("another film .", None, "0", ["0", "1"], 128, ref)])
    generic = TaskConfig(kind="tsv", text_a="sentence", label="label", labels=("0", "1"))
    with pytest.raises(TaskInputError, match=r"test\.tsv: line 1: header has no column 'label'"):
        build_split(generic, "dev", [(str(test), test.read_bytes())], tok)
    records, _ = build_split(generic, "test", [(str(test), test.read_bytes())], tok)  # no label column: unlabelled
    assert records.columns["label_ids"][:, 0].tolist() == [0, 0]


def test_xnli_train_label_alias_and_dev_layout(tmp_path):
    train = _write(tmp_path, "multinli.train.de.tsv", "premise\thypo\tlabel\nEin Satz.\tNoch einer.\tcontradictory\n")
    dev_header = "language\tgold_label\ts1b\ts2b\ts1p\ts2p\tsentence1\tsentence2\tpromptID\tpairID\n"
    dev = _write(tmp_path, "xnli.dev.tsv", dev_header + "de\tneutral\t-\t-\t-\t-\tEin Satz.\tNoch einer.\t1\t2\n")
    tok = minilm_tokenizer(do_lower_case=True)
    config = TaskConfig(kind="xnli")
    tr, labels = build_file(config, "train", train, tok)
    dv, _ = build_file(config, "dev", dev, tok)
    assert labels == ["contradiction", "entailment", "neutral"]
    assert tr.columns["label_ids"][0, 0] == 0 and dv.columns["label_ids"][0, 0] == 2
    assert np.array_equal(tr.columns["input_ids"], dv.columns["input_ids"])


def test_label_order_defaults_to_sorted_and_labels_option_fixes_it(tmp_path):
    path = _write(tmp_path, "t.tsv", "t\tl\nx\tpos\ny\tneg\nz\tmid\n")
    tok = minilm_tokenizer()
    records, labels = build_file(TaskConfig(kind="tsv", text_a="t", label="l"), "train", path, tok)
    assert labels == ["mid", "neg", "pos"] and records.columns["label_ids"][:, 0].tolist() == [2, 1, 0]
    records, labels = build_file(TaskConfig(kind="tsv", text_a="t", label="l", labels=("pos", "neg", "mid")),
                                 "train", path, tok)
    assert labels == ["pos", "neg", "mid"] and records.columns["label_ids"][:, 0].tolist() == [0, 1, 2]


@pytest.mark.parametrize("kwargs, message", [
    ({"kind": "glue/foo"}, "--task 'glue/foo' is not one of"),
    ({"kind": "tsv"}, "needs --text-a"),
    ({"kind": "glue/sst2", "text_a": "0"}, "fixed layout"),
    ({"kind": "glue/sst2", "labels": ("a",)}, "official label list"),
    ({"kind": "tsv", "text_a": "0", "label": "1", "labels": ("a", "a")}, "lists a label twice"),
    ({"kind": "glue/sst2", "max_seq_length": 4}, "--max-seq-length 4"),
    ({"kind": "squad", "max_seq_length": 60}, "leaves no room"),
    ({"kind": "squad", "doc_stride": 0}, "--doc-stride 0"),
    ({"kind": "conll", "scheme": "bio"}, "--scheme 'bio'"),
])
def test_config_errors(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        TaskConfig(**kwargs)
