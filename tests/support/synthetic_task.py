"""Small task datasets in the layout of docs/tasks.md, for tests, benchmarks and the demo.

What `bert-datagen task` writes, without task files to read: the same files
(manifest.json with "kind": "task", vocab.txt, <split>/part-*.tfrecord, side .jsonl files listed in
the manifest with checksums), written from arrays the caller built. `encode_texts` follows
RECIPE.md section 10 for sentence and pair tasks, so real GLUE data (SST-2) can be fine-tuned.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Sequence

import numpy as np
import tensorflow as tf

from bert_datagen.contract.fs import LOCAL_FS


def _int_feature(values: np.ndarray) -> tf.train.Feature:
    return tf.train.Feature(int64_list=tf.train.Int64List(value=[int(v) for v in values]))


def _float_feature(values: np.ndarray) -> tf.train.Feature:
    return tf.train.Feature(float_list=tf.train.FloatList(value=[float(v) for v in values]))


def _write_file(directory: str, rel: str, data: bytes) -> dict:
    path = os.path.join(directory, rel)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(data)
    return {"path": rel, "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}


def _shard_bytes(arrays: dict[str, np.ndarray], float_features: Sequence[str]) -> bytes:
    import tempfile

    n = len(next(iter(arrays.values())))
    with tempfile.NamedTemporaryFile(suffix=".tfrecord", delete=False) as tmp:
        name = tmp.name
    try:
        with tf.io.TFRecordWriter(name) as writer:
            for i in range(n):
                feats = {k: (_float_feature if k in float_features else _int_feature)(np.ravel(v[i]))
                         for k, v in arrays.items()}
                # Deterministic: protobuf's map order may change between processes, and the loaders'
                # order is keyed by the dataset's fingerprint (the shards' sha256).
                writer.write(tf.train.Example(features=tf.train.Features(feature=feats)).SerializeToString(deterministic=True))
        with open(name, "rb") as f:
            return f.read()
    finally:
        os.remove(name)


def write_task_dataset(directory: str, task: dict, vocab_tokens: Sequence[str], splits: dict[str, dict],
                       do_lower_case: bool = True) -> str:
    """`splits[name]` = {"features": {feature: [N, length] array}, "labelled": bool, "mode": str,
    "side": {"examples.jsonl": [rows], "windows.jsonl": [rows]} (optional)}. Manifest written last."""
    vocab_bytes = "".join(t + "\n" for t in vocab_tokens).encode("utf-8")
    vocab_entry = _write_file(directory, "vocab.txt", vocab_bytes)
    manifest_splits = {}
    for name, split in splits.items():
        arrays = {k: np.asarray(v) for k, v in split["features"].items()}
        floats = [k for k, v in arrays.items() if v.dtype.kind == "f"]
        shard = _write_file(directory, f"{name}/part-00000-of-00001.tfrecord", _shard_bytes(arrays, floats))
        n = len(next(iter(arrays.values())))
        shard["records"] = n
        side = []
        for file_name, rows in split.get("side", {}).items():
            text = "".join(json.dumps(r, ensure_ascii=False, sort_keys=True) + "\n" for r in rows)
            side.append(_write_file(directory, f"{name}/{file_name}", text.encode("utf-8")))
        manifest_splits[name] = {
            "shards": [shard], "records": n, "bytes": shard["bytes"], "labelled": bool(split.get("labelled", True)),
            "mode": split.get("mode", "train" if name == "train" else "predict"),
            "features": {k: ["float32" if k in floats else "int64", int(np.asarray(v[0]).size)]
                         for k, v in arrays.items()},
            "counts": {"examples": n, "features": n}, "side": side,
        }
    common = None
    for info in manifest_splits.values():
        feats = {k: tuple(v) for k, v in info["features"].items()}
        common = feats if common is None else {k: v for k, v in common.items() if feats.get(k) == v}
    manifest = {
        "schema": "bert-datagen/manifest", "schema_version": 1, "kind": "task",
        "tool": {"name": "tests.support.synthetic_task"}, "config": {"do_lower_case": do_lower_case},
        "seed": 0, "vocab": {**vocab_entry, "size": len(vocab_tokens), "do_lower_case": do_lower_case},
        "input": {"patterns": [], "files": 0, "bytes": 0, "fingerprint": "synthetic"},
        "task": task, "features": {k: list(v) for k, v in (common or {}).items()},
        "splits": manifest_splits, "totals": {"records": sum(s["records"] for s in manifest_splits.values())},
    }
    LOCAL_FS.write_atomic(os.path.join(directory, "manifest.json"),
                          (json.dumps(manifest, indent=2, sort_keys=True) + "\n").encode("utf-8"))
    return directory


def encode_texts(tokenize, vocab: dict[str, int], texts_a: Sequence[str], texts_b: Sequence[str] | None,
                 max_seq_length: int) -> dict[str, np.ndarray]:
    """input_ids / input_mask / segment_ids for single texts or pairs (RECIPE.md section 10):
    pairs lose the last token of the longer side (B when equal) until they fit in L - 3."""
    n = len(texts_a)
    ids = np.zeros((n, max_seq_length), np.int64)
    mask = np.zeros_like(ids)
    segments = np.zeros_like(ids)
    cls, sep = vocab["[CLS]"], vocab["[SEP]"]
    for i in range(n):
        a = [vocab.get(t, vocab["[UNK]"]) for t in tokenize(texts_a[i])]
        b = [vocab.get(t, vocab["[UNK]"]) for t in tokenize(texts_b[i])] if texts_b is not None and texts_b[i] else []
        if b:
            while len(a) + len(b) > max_seq_length - 3:
                (a if len(a) > len(b) else b).pop()
        else:
            a = a[: max_seq_length - 2]
        row = [cls, *a, sep] + ([*b, sep] if b else [])
        ids[i, :len(row)] = row
        mask[i, :len(row)] = 1
        segments[i, len(a) + 2:len(row)] = 1
    return {"input_ids": ids, "input_mask": mask, "segment_ids": segments}


def classification_split(encoded: dict[str, np.ndarray], label_ids: Sequence[int] | None,
                         regression: bool = False) -> dict:
    n = len(encoded["input_ids"])
    labelled = label_ids is not None
    labels = np.asarray(label_ids if labelled else np.zeros(n), np.float32 if regression else np.int64)
    features = {**encoded, "label_ids": labels.reshape(n, 1), "is_real_example": np.ones((n, 1), np.int64)}
    return {"features": features, "labelled": labelled}


def read_glue_tsv(path: str, text_column: int, label_column: int, header: bool = True,
                  limit: int | None = None) -> tuple[list[str], list[str]]:
    """Texts and label strings of a GLUE TSV (tab separated, quoting off)."""
    texts, labels = [], []
    with open(path, encoding="utf-8") as f:
        for i, line in enumerate(f):
            if header and i == 0:
                continue
            cols = line.rstrip("\n").split("\t")
            texts.append(cols[text_column])
            labels.append(cols[label_column])
            if limit is not None and len(texts) >= limit:
                break
    return texts, labels


def glue_single_sentence_task(directory: str, vocab_path: str, train_tsv: str, dev_tsv: str, task_kind: str,
                              labels: Sequence[str], max_seq_length: int = 64, train_limit: int | None = None,
                              text_column: int = 0, label_column: int = 1, do_lower_case: bool = True) -> str:
    """A single-sentence GLUE task (e.g. SST-2) tokenized with `vocab_path`; splits train and dev."""
    import hashlib as _hashlib

    from bert_datagen.vocab.tokenizer import BertTokenizer
    from bert_datagen.vocab.vocab_file import Vocab, parse_vocab_bytes

    data = open(vocab_path, "rb").read()
    vocab = Vocab(parse_vocab_bytes(data, vocab_path), vocab_path, _hashlib.sha256(data).hexdigest())
    tokenizer = BertTokenizer(vocab, do_lower_case)
    ids = {t: i for i, t in enumerate(vocab.tokens)}
    splits = {}
    for name, path, limit in (("train", train_tsv, train_limit), ("dev", dev_tsv, None)):
        texts, label_strings = read_glue_tsv(path, text_column, label_column, limit=limit)
        encoded = encode_texts(tokenizer.tokenize, ids, texts, None, max_seq_length)
        split = classification_split(encoded, [list(labels).index(s) for s in label_strings])
        split["mode"] = "train" if name == "train" else "predict"
        splits[name] = split
    task = {"kind": task_kind, "type": "classification", "labels": list(labels),
            "columns": {"text_a": text_column, "label": label_column}, "max_seq_length": max_seq_length}
    return write_task_dataset(directory, task, vocab.tokens, splits, do_lower_case)
