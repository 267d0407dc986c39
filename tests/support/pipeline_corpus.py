"""A small synthetic corpus, its vocab and run helpers for the pipeline tests (no real text needed).

The text comes from a fixed word list and a fixed LCG, so it is the same on every machine and
Python version (the golden test pins checksums of data made from it).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

WORDS = (
    "the a cat dog sat on mat ran far away over under house tree river stone light dark "
    "small large old new quick slow red blue green yellow bird fish walked jumped swam flew "
    "morning evening city village road bridge mountain valley winter summer played sang wrote "
    "read book letter friend teacher market garden window door table chair bread water"
).split()
SPECIAL = ["[PAD]", *[f"[unused{i}]" for i in range(5)], "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
LETTERS = "abcdefghijklmnopqrstuvwxyz"


class Lcg:
    """64-bit LCG (Knuth's MMIX constants): a fixed generator for fixed test text."""

    def __init__(self, seed: int) -> None:
        self.state = seed & (2**64 - 1)

    def next(self, n: int) -> int:
        self.state = (self.state * 6364136223846793005 + 1442695040888963407) & (2**64 - 1)
        return (self.state >> 33) % n


def make_documents(n_docs: int, seed: int = 1, max_sentences: int = 12) -> list[list[str]]:
    """Documents as lists of paragraphs; each paragraph holds 1-3 sentences ending in '.'."""
    g = Lcg(seed)
    docs = []
    for _ in range(n_docs):
        n_sent = 1 + g.next(max_sentences)
        sentences = []
        for _ in range(n_sent):
            words = [WORDS[g.next(len(WORDS))] for _ in range(3 + g.next(14))]
            sentences.append(" ".join(words).capitalize() + ".")
        paragraphs, i = [], 0
        while i < len(sentences):
            k = 1 + g.next(3)
            paragraphs.append(" ".join(sentences[i:i + k]))
            i += k
        docs.append(paragraphs)
    return docs


def document_text(doc: list[str]) -> str:
    return "\n".join(doc) + "\n"


def write_text_files(directory: Path, docs: list[list[str]], n_files: int, stem: str = "part") -> list[Path]:
    """The documents in `text` format (blank line between documents), split into n_files files."""
    directory.mkdir(parents=True, exist_ok=True)
    per_file = -(-len(docs) // n_files)
    paths = []
    for f in range(n_files):
        chunk = docs[f * per_file:(f + 1) * per_file]
        path = directory / f"{stem}-{f:03d}.txt"
        path.write_text("\n".join(document_text(d) for d in chunk), encoding="utf-8")
        paths.append(path)
    return paths


def write_vocab(path: Path) -> Path:
    words = sorted(set(WORDS) - set(LETTERS_AND_PUNCT))
    tokens = SPECIAL + LETTERS_AND_PUNCT + words + [f"##{c}" for c in LETTERS]
    path.write_text("\n".join(tokens) + "\n", encoding="utf-8")
    return path


LETTERS_AND_PUNCT = list(LETTERS) + list(".,;:!?'\"()-")


def shard_digests(output_dir: Path) -> dict[str, str]:
    """Relative shard path -> sha256 of the bytes on disk (not the manifest's claim)."""
    out = {}
    for path in sorted(Path(output_dir).glob("*/part-*.tfrecord")):
        out[path.relative_to(output_dir).as_posix()] = hashlib.sha256(path.read_bytes()).hexdigest()
    return out


def manifest_of(output_dir: Path) -> dict:
    return json.loads((Path(output_dir) / "manifest.json").read_text())


def write_sentence_files(directory: Path, docs: list[list[str]], n_files: int) -> list[Path]:
    """The original tool's format: one sentence per line, a blank line between documents."""
    directory.mkdir(parents=True, exist_ok=True)
    per_file = -(-len(docs) // n_files)
    paths = []
    for f in range(n_files):
        lines = []
        for doc in docs[f * per_file:(f + 1) * per_file]:
            for paragraph in doc:
                lines.extend(s.strip() + "." for s in paragraph.split(".") if s.strip())
            lines.append("")
        path = directory / f"sent-{f:03d}.txt"
        path.write_text("\n".join(lines), encoding="utf-8")
        paths.append(path)
    return paths


def tree_snapshot(root: Path) -> dict[str, str]:
    """Every file under ``root`` (relative path -> sha256; directories as ``DIR/``): what a command
    must leave unchanged outside its own outputs."""
    root = Path(root)
    out: dict[str, str] = {}
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root).as_posix()
        out[rel + "/" if path.is_dir() else rel] = "" if path.is_dir() else hashlib.sha256(path.read_bytes()).hexdigest()
    return out


def write_dynamic_dataset(root: Path, documents: int, masking_unit: str) -> str:
    """A dynamic-masking dataset without NSP (`doc-sentences`) of ``documents`` seeded documents,
    written by the real pipeline into ``root / "data"``: masks are then drawn per epoch by its reader."""
    from bert_datagen.datagen.config import DatagenConfig
    from bert_datagen.pipelines.pretraining.run import generate_dataset

    write_sentence_files(root / "in", make_documents(documents, seed=42, max_sentences=8), n_files=2)
    config = DatagenConfig(max_seq_length=32, max_predictions_per_seq=5, dupe_factor=1, masking="dynamic",
                           objective="doc-sentences", masking_unit=masking_unit, num_shards=2, eval_fraction=0.2,
                           notnext_pool_size=10, input_format="sentences")
    generate_dataset(config, inputs=[str(root / "in" / "*.txt")], vocab_path=str(write_vocab(root / "vocab.txt")),
                     output_dir=str(root / "data"))
    return str(root / "data")
