"""Small synthetic task files (pair TSV, SQuAD JSON, CoNLL) from the fixed test corpus, same everywhere."""

from __future__ import annotations

import json
from pathlib import Path

from tests.support.pipeline_corpus import WORDS, Lcg, make_documents

LABELS = ("entailment", "neutral", "contradiction")


def write_pair_tsv(path: Path, n: int, seed: int, labelled: bool = True) -> Path:
    g = Lcg(seed)
    docs = make_documents(n, seed=seed, max_sentences=3)
    lines = ["index\tsentence1\tsentence2\tlabel" if labelled else "index\tsentence1\tsentence2"]
    for i, doc in enumerate(docs):
        a, b = doc[0], doc[-1] if len(doc) > 1 else WORDS[g.next(len(WORDS))] + " ."
        lines.append(f"{i}\t{a}\t{b}" + (f"\t{LABELS[g.next(3)]}" if labelled else ""))
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def write_squad(path: Path, n_paragraphs: int, seed: int) -> Path:
    g = Lcg(seed)
    paragraphs = []
    for p, doc in enumerate(make_documents(n_paragraphs, seed=seed, max_sentences=14)):
        context = " ".join(doc)
        words = context.split(" ")
        qas = []
        for q in range(1 + g.next(3)):
            first = g.next(len(words))
            length = 1 + g.next(min(4, len(words) - first))
            text = " ".join(words[first:first + length])
            start = len(" ".join(words[:first])) + (1 if first else 0)
            question = " ".join(WORDS[g.next(len(WORDS))] for _ in range(3 + g.next(8))) + " ?"
            qas.append({"id": f"q{p}-{q}", "question": question, "answers": [{"text": text, "answer_start": start}]})
        paragraphs.append({"context": context, "qas": qas})
    path.write_text(json.dumps({"version": "1.1", "data": [{"title": "t", "paragraphs": paragraphs}]}),
                    encoding="utf-8")
    return path


def write_conll(path: Path, n: int, seed: int) -> Path:
    g = Lcg(seed)
    lines = []
    for doc in make_documents(n, seed=seed, max_sentences=2):
        prev = "O"
        for word in doc[0].replace(".", " .").split():
            r = g.next(6)
            tag = "O" if r < 3 else ("I-" + prev[2:] if r == 3 and prev != "O" else "B-" + ("LOC", "PER")[r % 2])
            lines.append(f"{word}\t{tag}")
            prev = tag
        lines.append("")
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path
