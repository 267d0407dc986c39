"""Reading and writing vocab.txt files through a filesystem (vocab/ itself works on bytes only)."""

from __future__ import annotations

from bert_datagen.contract.fs import FileSystem
from bert_datagen.vocab.vocab_file import Vocab, VocabError, parse_vocab


def load_vocab(path: str, fs: FileSystem) -> Vocab:
    """Read and validate a vocab.txt (.gz/.bz2 by name); VocabError names the file and the reason."""
    try:
        data = fs.read_bytes(path)
    except Exception as e:  # OSError, a decompression ValueError, or a filesystem's own error type
        raise VocabError(f"{path}: cannot read the vocabulary file: {e}") from e
    return parse_vocab(data, path)


def write_vocab(tokens: list[str], path: str, fs: FileSystem) -> Vocab:
    """Write a vocab.txt atomically; returns the Vocab (with the file's sha256)."""
    vocab = Vocab(tuple(tokens), path)
    fs.write_atomic(path, vocab.to_bytes())
    return vocab
