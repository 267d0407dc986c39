"""Tiny task datasets of each type (the layout of docs/tasks.md) and a tiny pre-training run to start from."""

from __future__ import annotations

import numpy as np

from bert_datagen.trainer.model.config import BertConfig
from bert_datagen.trainer.runtime import checkpoint as ckpt_lib
from tests.support.synthetic_task import write_task_dataset

SPECIAL = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
WORDS = [f"w{i}" for i in range(35)]
VOCAB = SPECIAL + WORDS  # 40 tokens
L = 16


def tiny_bert(vocab_size: int = len(VOCAB), act: str = "gelu_new") -> BertConfig:
    return BertConfig(vocab_size=vocab_size, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                      intermediate_size=32, max_position_embeddings=32, hidden_act=act)


def write_pretrain_run(run_dir: str, bert: BertConfig | None = None, seed: int = 3) -> str:
    """A run directory with one checkpoint of a freshly initialised BertPretrainer (MLM/NSP heads included)."""
    from bert_datagen.trainer.model.bert import build_model, tf1_variable_map

    bert = bert or tiny_bert()
    model = build_model(bert, seed=seed)
    arrays = {n: v.numpy() for n, v in tf1_variable_map(model).items()}
    ckpt_lib.save_checkpoint(run_dir, 10, arrays, {}, {"step": 10, "bert_config": bert.to_dict(), "metrics": {}})
    return run_dir


def _rows(rng, n):
    ids = np.zeros((n, L), np.int64)
    mask = np.zeros_like(ids)
    lengths = rng.integers(4, L + 1, n)
    for i, length in enumerate(lengths):
        ids[i, :length] = rng.integers(5, len(VOCAB), length)
        ids[i, 0], ids[i, length - 1] = 2, 3
        mask[i, :length] = 1
    return ids, mask


def classification_dataset(directory: str, n_train: int = 96, n_dev: int = 40, seed: int = 0,
                           regression: bool = False, unlabelled_test: bool = True) -> str:
    """Label 1 when token id 7 occurs in the text: learnable in a few hundred steps."""
    rng = np.random.default_rng(seed)
    splits = {}
    for name, n in (("train", n_train), ("dev", n_dev), ("test", 12)):
        ids, mask = _rows(rng, n)
        present = (ids == 7).any(axis=1)
        put = rng.random(n) < 0.5
        for i in np.flatnonzero(put & ~present):
            ids[i, 1] = 7
        label = (ids == 7).any(axis=1).astype(np.int64)
        labelled = not (name == "test" and unlabelled_test)
        values = label.astype(np.float32) * 2.5 if regression else label
        labels = values if labelled else np.zeros_like(values)
        splits[name] = {"features": {"input_ids": ids, "input_mask": mask, "segment_ids": np.zeros_like(ids),
                                     "label_ids": labels.reshape(n, 1),
                                     "is_real_example": np.ones((n, 1), np.int64)},
                        "labelled": labelled, "mode": "train" if name == "train" else "predict"}
    task = {"kind": "glue/stsb" if regression else "tsv", "type": "regression" if regression else "classification",
            "labels": [] if regression else ["neg", "pos"], "columns": {}, "max_seq_length": L}
    return write_task_dataset(directory, task, VOCAB, splits)


def span_dataset(directory: str, n_train: int = 48, n_dev: int = 12, seed: int = 0, v2: bool = False) -> str:
    """Question [CLS] q [SEP] doc [SEP]; the answer is the word after token w0 in the doc."""
    rng = np.random.default_rng(seed)
    splits = {}
    uid = 1000000000
    for name, n in (("train", n_train), ("dev", n_dev)):
        ids = np.zeros((n, L), np.int64)
        mask = np.zeros_like(ids)
        segments = np.zeros_like(ids)
        starts = np.zeros((n, 1), np.int64)
        ends = np.zeros((n, 1), np.int64)
        impossible = np.zeros((n, 1), np.int64)
        examples, windows = [], []
        for i in range(n):
            words = [f"w{int(x)}" for x in rng.integers(6, 35, 9)]
            answerable = not (v2 and rng.random() < 0.3)
            cue = int(rng.integers(0, 7))
            if answerable:
                words[cue] = "w0"
            question = ["w1", "w2"]
            tokens = ["[CLS]", *question, "[SEP]", *words, "[SEP]"]
            row = [VOCAB.index(t) for t in tokens]
            ids[i, :len(row)], mask[i, :len(row)] = row, 1
            segments[i, 4:len(row)] = 1
            if answerable:
                starts[i], ends[i] = 4 + cue + 1, 4 + cue + 2
            else:
                impossible[i] = 1
            examples.append({"index": i, "id": f"{name}-{i}", "question": "w1 w2", "words": words,
                             "answers": [" ".join(words[cue + 1:cue + 3])] if answerable else [],
                             "is_impossible": not answerable})
            windows.append({"unique_id": uid, "example_index": i, "window_index": 0, "tokens": tokens,
                            "token_to_word": {str(4 + w): w for w in range(len(words))},
                            "max_context": {str(4 + w): True for w in range(len(words))}})
            uid += 1
        features = {"unique_ids": np.arange(uid - n, uid, dtype=np.int64).reshape(n, 1), "input_ids": ids,
                    "input_mask": mask, "segment_ids": segments}
        if name == "train":
            features.update(start_positions=starts, end_positions=ends, is_impossible=impossible)
        splits[name] = {"features": features, "labelled": True, "mode": "train" if name == "train" else "predict",
                        "side": {"examples.jsonl": examples, "windows.jsonl": windows}}
    task = {"kind": "squad2" if v2 else "squad", "type": "span", "labels": [], "columns": {}, "max_seq_length": L,
            "doc_stride": 128, "max_query_length": 64}
    return write_task_dataset(directory, task, VOCAB, splits)


TAGS = ["O", "B-X", "I-X", "B-Y"]


def tagging_dataset(directory: str, n_train: int = 48, n_dev: int = 12, seed: int = 0) -> str:
    """Word w5 is B-X and the word after it I-X; w6 is B-Y; words of 2 pieces (w + ##) exist."""
    rng = np.random.default_rng(seed)
    splits = {}
    for name, n in (("train", n_train), ("dev", n_dev)):
        ids = np.zeros((n, L), np.int64)
        mask = np.zeros_like(ids)
        labels = np.full((n, L), -1, np.int64)
        examples, windows = [], []
        for i in range(n):
            count = int(rng.integers(3, 7))
            words = [f"w{int(x)}" for x in rng.integers(5, 12, count)]
            tags = []
            for w, word in enumerate(words):
                if word == "w5":
                    tags.append("B-X")
                elif word == "w6":
                    tags.append("B-Y")
                elif w > 0 and words[w - 1] == "w5":
                    tags.append("I-X")
                else:
                    tags.append("O")
            tokens, word_ids = ["[CLS]"], [-1]
            for w, word in enumerate(words):
                tokens.append(word)
                word_ids.append(w)
                if word in ("w8", "w9"):  # a second piece that carries no label
                    tokens.append("w30")
                    word_ids.append(-1)
            tokens.append("[SEP]")
            word_ids.append(-1)
            row = [VOCAB.index(t) for t in tokens]
            ids[i, :len(row)], mask[i, :len(row)] = row, 1
            for pos, w in enumerate(word_ids):
                if w >= 0:
                    labels[i, pos] = TAGS.index(tags[w])
            examples.append({"index": i, "words": words, "tags": tags})
            windows.append({"example_index": i, "window_index": 0, "word_ids": word_ids + [-1] * (L - len(word_ids))})
        splits[name] = {"features": {"input_ids": ids, "input_mask": mask, "segment_ids": np.zeros_like(ids),
                                     "label_ids": labels},
                        "labelled": True, "mode": "train" if name == "train" else "predict",
                        "side": {"examples.jsonl": examples, "windows.jsonl": windows}}
    task = {"kind": "conll", "type": "tagging", "labels": TAGS, "columns": {}, "max_seq_length": L,
            "scheme": "IOB2"}
    return write_task_dataset(directory, task, VOCAB, splits)
