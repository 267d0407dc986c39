"""One small dataset of every kind the CLIs write, built by the real generators (`bert-datagen run`
and `bert-datagen task`): unpacked static, dynamic masking and packed pre-training rows, and task
datasets of the four types. For the loaders' tests (every kind in one reader)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from bert_datagen.datagen.tasks.config import TaskConfig
from bert_datagen.pipelines.pretraining.run import generate_dataset
from bert_datagen.pipelines.tasks.run import generate_task_dataset
from tests.support.pipeline_corpus import make_documents, write_sentence_files, write_vocab
from tests.support.pipeline_golden import CONFIG
from tests.support.taskdata_corpus import write_conll, write_pair_tsv, write_squad

PRETRAINING_KINDS = ("static", "dynamic", "packed")
TASK_KINDS = ("classification", "regression", "span", "tagging")
KINDS = PRETRAINING_KINDS + TASK_KINDS


def _regression_tsv(path: Path, pairs: Path) -> Path:
    lines = pairs.read_text(encoding="utf-8").splitlines()
    out = ["sentence1\tsentence2\tscore"]
    for i, line in enumerate(lines[1:]):
        _, a, b, _ = line.split("\t")
        out.append(f"{a}\t{b}\t{(i * 7 % 50) / 10}")
    path.write_text("\n".join(out) + "\n", encoding="utf-8")
    return path


def build_kind(root: Path, kind: str) -> str:
    """The dataset of ``kind`` (one of KINDS) under ``root``, built once (its path)."""
    out = root / kind
    if (out / "manifest.json").exists():
        return str(out)
    root.mkdir(parents=True, exist_ok=True)
    vocab = root / "vocab.txt"
    if not vocab.exists():
        write_vocab(vocab)
    if kind in PRETRAINING_KINDS:
        corpus = root / "corpus"
        if not corpus.exists():
            write_sentence_files(corpus, make_documents(40, seed=42, max_sentences=8), n_files=2)
        options = {"static": {}, "dynamic": {"masking": "dynamic", "dupe_factor": 1},
                   "packed": {"packing": True}}[kind]
        generate_dataset(dataclasses.replace(CONFIG, **options), inputs=[str(corpus / "*.txt")],
                         vocab_path=str(vocab), output_dir=str(out))
        return str(out)
    small = {"num_shards": 3, "max_seq_length": 32}
    if kind == "classification":
        config = TaskConfig(kind="tsv", text_a="sentence1", text_b="sentence2", label="label", **small)
        split = write_pair_tsv(root / "pairs.tsv", 90, 3)
    elif kind == "regression":
        config = TaskConfig(kind="tsv", text_a="sentence1", text_b="sentence2", label="score", regression=True,
                            **small)
        split = _regression_tsv(root / "scores.tsv", write_pair_tsv(root / "pairs-r.tsv", 90, 4))
    elif kind == "span":
        config = TaskConfig(kind="squad", max_seq_length=48, doc_stride=16, max_query_length=12, num_shards=3)
        split = write_squad(root / "squad.json", 30, 6)
    else:
        config = TaskConfig(kind="conll", **small)
        split = write_conll(root / "ner.conll", 90, 8)
    generate_task_dataset(config, splits=[f"train={split}"], vocab_path=str(vocab), output_dir=str(out))
    return str(out)
