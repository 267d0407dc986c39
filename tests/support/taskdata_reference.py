"""Plain transcriptions of the original fine-tuning conversions, step by step, for the task tests.

`run_classifier.py` (`_read_tsv`, `convert_single_example`, `_truncate_seq_pair`) and `run_squad.py`
(`read_squad_examples`, `convert_examples_to_features`, `_improve_answer_span`,
`_check_is_max_context`), one example at a time with Python lists, over the pure-Python reference
tokenizer of the vocab tests (tokens as strings, ids only at the end), plus a first-piece tagging
reference. Slow and obviously equal to the original; the vectorized code is checked against it.
"""

from __future__ import annotations

import csv
import json

from tests.support.vocab_reference import ReferenceTokenizer

FIRST_UNIQUE_ID = 1000000000


class Tok:
    """The reference tokenizer with the original FullTokenizer's interface."""

    def __init__(self, vocab_tokens, do_lower_case: bool = True) -> None:
        self.ref = ReferenceTokenizer(list(vocab_tokens), do_lower_case)

    def tokenize(self, text: str) -> list[str]:
        return self.ref.tokenize(text)

    def convert_tokens_to_ids(self, tokens: list[str]) -> list[int]:
        return [self.ref.vocab[t] for t in tokens]


# ---------------------------------------------------------------- run_classifier.py


def read_tsv(path: str) -> list[list[str]]:
    with open(path, encoding="utf-8") as f:
        return list(csv.reader(f, delimiter="\t", quotechar=None))


def truncate_seq_pair(tokens_a: list[str], tokens_b: list[str], max_length: int) -> None:
    while True:
        total_length = len(tokens_a) + len(tokens_b)
        if total_length <= max_length:
            break
        if len(tokens_a) > len(tokens_b):
            tokens_a.pop()
        else:
            tokens_b.pop()


def convert_single_example(text_a: str, text_b: str | None, label, label_list, max_seq_length: int, tokenizer,
                           regression: bool = False) -> dict[str, list]:
    label_map = {label: i for i, label in enumerate(label_list)}
    tokens_a = tokenizer.tokenize(text_a)
    tokens_b = None
    if text_b:
        tokens_b = tokenizer.tokenize(text_b)
    if tokens_b:
        truncate_seq_pair(tokens_a, tokens_b, max_seq_length - 3)
    else:
        if len(tokens_a) > max_seq_length - 2:
            tokens_a = tokens_a[0:(max_seq_length - 2)]
    tokens = []
    segment_ids = []
    tokens.append("[CLS]")
    segment_ids.append(0)
    for token in tokens_a:
        tokens.append(token)
        segment_ids.append(0)
    tokens.append("[SEP]")
    segment_ids.append(0)
    if tokens_b:
        for token in tokens_b:
            tokens.append(token)
            segment_ids.append(1)
        tokens.append("[SEP]")
        segment_ids.append(1)
    input_ids = tokenizer.convert_tokens_to_ids(tokens)
    input_mask = [1] * len(input_ids)
    while len(input_ids) < max_seq_length:
        input_ids.append(0)
        input_mask.append(0)
        segment_ids.append(0)
    label_id = float(label) if regression else label_map[label]
    return {"input_ids": input_ids, "input_mask": input_mask, "segment_ids": segment_ids,
            "label_ids": [label_id], "is_real_example": [1]}


# ---------------------------------------------------------------- run_squad.py


def whitespace_tokenize(text: str) -> list[str]:
    text = text.strip()
    if not text:
        return []
    return text.split()


def is_whitespace(c: str) -> bool:
    return c == " " or c == "\t" or c == "\r" or c == "\n" or ord(c) == 0x202F


def read_squad_examples(input_file: str, is_training: bool, version_2_with_negative: bool = False,
                        first_answer: bool = True) -> list[dict]:
    with open(input_file, encoding="utf-8") as reader:
        input_data = json.load(reader)["data"]
    examples = []
    for entry in input_data:
        for paragraph in entry["paragraphs"]:
            paragraph_text = paragraph["context"]
            doc_tokens = []
            char_to_word_offset = []
            prev_is_whitespace = True
            for c in paragraph_text:
                if is_whitespace(c):
                    prev_is_whitespace = True
                else:
                    if prev_is_whitespace:
                        doc_tokens.append(c)
                    else:
                        doc_tokens[-1] += c
                    prev_is_whitespace = False
                char_to_word_offset.append(len(doc_tokens) - 1)
            for qa in paragraph["qas"]:
                qas_id = qa["id"]
                question_text = qa["question"]
                start_position = None
                end_position = None
                orig_answer_text = None
                is_impossible = False
                if is_training:
                    if version_2_with_negative:
                        is_impossible = qa["is_impossible"]
                    # Deliberate difference: the first answer of several (the original raises).
                    if (len(qa["answers"]) != 1) and (not is_impossible) and not first_answer:
                        raise ValueError("For training, each question should have exactly 1 answer.")
                    if not is_impossible:
                        answer = qa["answers"][0]
                        orig_answer_text = answer["text"]
                        answer_offset = answer["answer_start"]
                        answer_length = len(orig_answer_text)
                        start_position = char_to_word_offset[answer_offset]
                        end_position = char_to_word_offset[answer_offset + answer_length - 1]
                        actual_text = " ".join(doc_tokens[start_position:(end_position + 1)])
                        cleaned_answer_text = " ".join(whitespace_tokenize(orig_answer_text))
                        if actual_text.find(cleaned_answer_text) == -1:
                            continue
                    else:
                        start_position = -1
                        end_position = -1
                        orig_answer_text = ""
                examples.append({"qas_id": qas_id, "question_text": question_text, "doc_tokens": doc_tokens,
                                 "orig_answer_text": orig_answer_text, "start_position": start_position,
                                 "end_position": end_position, "is_impossible": is_impossible})
    return examples


def improve_answer_span(doc_tokens, input_start, input_end, tokenizer, orig_answer_text):
    tok_answer_text = " ".join(tokenizer.tokenize(orig_answer_text))
    for new_start in range(input_start, input_end + 1):
        for new_end in range(input_end, new_start - 1, -1):
            text_span = " ".join(doc_tokens[new_start:(new_end + 1)])
            if text_span == tok_answer_text:
                return (new_start, new_end)
    return (input_start, input_end)


def check_is_max_context(doc_spans, cur_span_index, position):
    best_score = None
    best_span_index = None
    for (span_index, doc_span) in enumerate(doc_spans):
        start, length = doc_span
        end = start + length - 1
        if position < start:
            continue
        if position > end:
            continue
        num_left_context = position - start
        num_right_context = end - position
        score = min(num_left_context, num_right_context) + 0.01 * length
        if best_score is None or score > best_score:
            best_score = score
            best_span_index = span_index
    return cur_span_index == best_span_index


def convert_examples_to_features(examples, tokenizer, max_seq_length, doc_stride, max_query_length, is_training):
    unique_id = FIRST_UNIQUE_ID
    features = []
    for (example_index, example) in enumerate(examples):
        query_tokens = tokenizer.tokenize(example["question_text"])
        if len(query_tokens) > max_query_length:
            query_tokens = query_tokens[0:max_query_length]
        tok_to_orig_index = []
        orig_to_tok_index = []
        all_doc_tokens = []
        for (i, token) in enumerate(example["doc_tokens"]):
            orig_to_tok_index.append(len(all_doc_tokens))
            sub_tokens = tokenizer.tokenize(token)
            for sub_token in sub_tokens:
                tok_to_orig_index.append(i)
                all_doc_tokens.append(sub_token)
        tok_start_position = None
        tok_end_position = None
        if is_training and example["is_impossible"]:
            tok_start_position = -1
            tok_end_position = -1
        if is_training and not example["is_impossible"]:
            tok_start_position = orig_to_tok_index[example["start_position"]]
            if example["end_position"] < len(example["doc_tokens"]) - 1:
                tok_end_position = orig_to_tok_index[example["end_position"] + 1] - 1
            else:
                tok_end_position = len(all_doc_tokens) - 1
            (tok_start_position, tok_end_position) = improve_answer_span(
                all_doc_tokens, tok_start_position, tok_end_position, tokenizer, example["orig_answer_text"])
        max_tokens_for_doc = max_seq_length - len(query_tokens) - 3
        doc_spans = []
        start_offset = 0
        while start_offset < len(all_doc_tokens):
            length = len(all_doc_tokens) - start_offset
            if length > max_tokens_for_doc:
                length = max_tokens_for_doc
            doc_spans.append((start_offset, length))
            if start_offset + length == len(all_doc_tokens):
                break
            start_offset += min(length, doc_stride)
        for (doc_span_index, doc_span) in enumerate(doc_spans):
            span_start, span_length = doc_span
            tokens = []
            token_to_orig_map = {}
            token_is_max_context = {}
            segment_ids = []
            tokens.append("[CLS]")
            segment_ids.append(0)
            for token in query_tokens:
                tokens.append(token)
                segment_ids.append(0)
            tokens.append("[SEP]")
            segment_ids.append(0)
            for i in range(span_length):
                split_token_index = span_start + i
                token_to_orig_map[len(tokens)] = tok_to_orig_index[split_token_index]
                is_max_context = check_is_max_context(doc_spans, doc_span_index, split_token_index)
                token_is_max_context[len(tokens)] = is_max_context
                tokens.append(all_doc_tokens[split_token_index])
                segment_ids.append(1)
            tokens.append("[SEP]")
            segment_ids.append(1)
            input_ids = tokenizer.convert_tokens_to_ids(tokens)
            input_mask = [1] * len(input_ids)
            while len(input_ids) < max_seq_length:
                input_ids.append(0)
                input_mask.append(0)
                segment_ids.append(0)
            start_position = None
            end_position = None
            if is_training and not example["is_impossible"]:
                doc_start = span_start
                doc_end = span_start + span_length - 1
                out_of_span = False
                if not (tok_start_position >= doc_start and tok_end_position <= doc_end):
                    out_of_span = True
                if out_of_span:
                    start_position = 0
                    end_position = 0
                else:
                    doc_offset = len(query_tokens) + 2
                    start_position = tok_start_position - doc_start + doc_offset
                    end_position = tok_end_position - doc_start + doc_offset
            if is_training and example["is_impossible"]:
                start_position = 0
                end_position = 0
            feature = {"unique_ids": [unique_id], "input_ids": input_ids, "input_mask": input_mask,
                       "segment_ids": segment_ids, "example_index": example_index,
                       "doc_span_index": doc_span_index, "tokens": tokens,
                       "token_to_orig_map": token_to_orig_map, "token_is_max_context": token_is_max_context}
            if is_training:
                feature.update(start_positions=[start_position], end_positions=[end_position],
                               is_impossible=[1 if example["is_impossible"] else 0])
            features.append(feature)
            unique_id += 1
    return features


# ---------------------------------------------------------------- tagging (first piece of each word)


def tagging_features(words: list[str], tag_ids: list[int], tokenizer, max_seq_length: int) -> list[dict]:
    """One sentence: words packed greedily into windows of at most L - 2 pieces, tag on first pieces."""
    pieces = []
    for word in words:
        p = tokenizer.tokenize(word) or ["[UNK]"]
        pieces.append(p[: max_seq_length - 2])
    windows, current, used = [], [], 0
    for w, p in enumerate(pieces):
        if current and used + len(p) > max_seq_length - 2:
            windows.append(current)
            current, used = [], 0
        current.append(w)
        used += len(p)
    windows.append(current)
    out = []
    for k, owned in enumerate(windows):
        tokens, labels, word_ids = ["[CLS]"], [-1], [-1]
        for w in owned:
            for j, piece in enumerate(pieces[w]):
                tokens.append(piece)
                labels.append(tag_ids[w] if j == 0 else -1)
                word_ids.append(w if j == 0 else -1)
        tokens.append("[SEP]")
        labels.append(-1)
        word_ids.append(-1)
        input_ids = tokenizer.convert_tokens_to_ids(tokens)
        input_mask = [1] * len(input_ids)
        pad = max_seq_length - len(input_ids)
        out.append({"input_ids": input_ids + [0] * pad, "input_mask": input_mask + [0] * pad,
                    "segment_ids": [0] * max_seq_length, "label_ids": labels + [-1] * pad,
                    "word_ids": word_ids + [-1] * pad, "window_index": k})
    return out


def read_conll_reference(path: str, token_column: int = 0, tag_column: int = -1) -> list[tuple[list[str], list[str]]]:
    sentences, words, tags = [], [], []
    for line in open(path, encoding="utf-8"):
        fields = line.split()
        if not fields or fields[0] == "-DOCSTART-":
            if words:
                sentences.append((words, tags))
            words, tags = [], []
            continue
        words.append(fields[token_column])
        tags.append(fields[tag_column])
    if words:
        sentences.append((words, tags))
    return sentences
