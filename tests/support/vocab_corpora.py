"""The real corpora the tokenizer parity tests and benchmarks read."""

from __future__ import annotations

# Text files by name per corpus (SOURCE.md sits beside them and is not a corpus).
CORPUS_FILES = {
    "bert_sample_text": ["sample_text.txt"],
    "enwiki_extract_2015": ["wiki_[0-9][0-9]"],
    "wikitext2_raw": ["wiki.*.raw"],
    "gutenberg_en": ["*.txt"],
    "gutenberg_fr": ["*.txt"],
    "zhwiki_sample": ["wiki_[0-9][0-9]"],
    "viwiki_sample": ["wiki_[0-9][0-9]"],
}


def corpus_texts(root, corpus: str, limit: int | None) -> list[str]:
    """Texts of a corpus as raw chunks of 4 lines (CR, markup and all), up to `limit` bytes."""
    files = sorted({p for pattern in CORPUS_FILES[corpus] for p in (root / corpus).glob(pattern)})
    assert files, f"no text files found for {corpus}"
    per_file = None if limit is None else max(limit // len(files), 4096)
    texts = []
    for path in files:
        data = path.read_bytes()
        if per_file is not None:
            data = data[:per_file]
        lines = data.decode("utf-8", errors="ignore").split("\n")
        texts += ["\n".join(lines[i:i + 4]) for i in range(0, len(lines), 4)]
    return texts
