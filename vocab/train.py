"""Train a WordPiece vocabulary with `tokenizers`, on the words our tokenizer itself produces.

The trainer never sees raw text: every text goes through `words_batch` (the same basic
tokenization `BertTokenizer` applies, exact path included), and the trainer only splits the words
back apart on the single spaces that join them. So a vocabulary is learned from exactly the words
it will later be asked to cover.

Layouts (the reserved tokens come first, then the learned pieces in the trainer's order):
- "google" (`num_unused` >= 99): [PAD] 0, [unused0..98] 1..99, [UNK] 100, [CLS] 101, [SEP] 102,
  [MASK] 103, [unused99..num_unused-1] 104.., then pieces. With the default 994 unused slots this
  is the layout of Google's released vocabularies (999 reserved ids).
- "compact": [PAD] 0, [UNK] 1, [CLS] 2, [SEP] 3, [MASK] 4, [unused0..num_unused-1], then pieces.
- "auto" (default): "google" when `num_unused` >= 99 and at least 1,000 ids are left for learned
  pieces; otherwise "compact" without unused slots (for small vocabularies, e.g. tests and demos).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from tokenizers import Tokenizer, models, pre_tokenizers, trainers

from vocab.vocab_file import Vocab, VocabError

LAYOUTS = ("auto", "google", "compact")
GOOGLE_UNUSED_BEFORE_UNK = 99
MIN_LEARNED_FOR_GOOGLE = 1000
_BATCH = 1024


def reserved_tokens(layout: str, num_unused: int) -> list[str]:
    """The reserved tokens, in id order, of a concrete layout ("google" or "compact")."""
    unused = [f"[unused{i}]" for i in range(num_unused)]
    if layout == "google":
        if num_unused < GOOGLE_UNUSED_BEFORE_UNK:
            raise VocabError(f"the google layout needs at least {GOOGLE_UNUSED_BEFORE_UNK} unused slots "
                             f"([UNK] is id 100), got {num_unused}")
        head = unused[:GOOGLE_UNUSED_BEFORE_UNK]
        return ["[PAD]", *head, "[UNK]", "[CLS]", "[SEP]", "[MASK]", *unused[GOOGLE_UNUSED_BEFORE_UNK:]]
    if layout == "compact":
        return ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *unused]
    raise VocabError(f"unknown vocabulary layout {layout!r} (one of {', '.join(LAYOUTS)})")


def resolve_layout(layout: str, vocab_size: int, num_unused: int) -> tuple[str, int]:
    """The concrete (layout, num_unused) for the options (see the module doc for "auto")."""
    if num_unused < 0:
        raise VocabError(f"--num-unused {num_unused} must be >= 0")
    if layout == "auto":
        fits = vocab_size >= 5 + num_unused + MIN_LEARNED_FOR_GOOGLE
        return ("google", num_unused) if num_unused >= GOOGLE_UNUSED_BEFORE_UNK and fits else ("compact", 0)
    if layout not in LAYOUTS:
        raise VocabError(f"unknown vocabulary layout {layout!r} (one of {', '.join(LAYOUTS)})")
    return layout, num_unused


def _batches(texts: Iterable[str], size: int) -> Iterator[list[str]]:
    batch: list[str] = []
    for text in texts:
        batch.append(text)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch


def _joined_words(texts: Iterable[str], do_lower_case: bool) -> Iterator[str]:
    from vocab.basic import tables
    from vocab.tokenizer import BasicTokenizer

    basic = BasicTokenizer(do_lower_case)
    for batch in _batches(texts, _BATCH):
        for text, words in zip(batch, basic.words_batch(batch), strict=True):
            if not text.isascii() and basic.needs_exact_path(text):
                # A word holding a lone surrogate is [UNK] whatever the vocabulary: nothing to learn.
                words = [w for w in words if not tables().surrogate.search(w)]
            if words:
                yield " ".join(words)


def train_vocab(
    texts: Iterable[str],
    vocab_size: int,
    do_lower_case: bool,
    num_unused: int = 994,
    layout: str = "auto",
    min_frequency: int = 2,
    limit_alphabet: int = 1000,
) -> list[str]:
    """Learn a WordPiece vocabulary: the tokens in id order (reserved ones first).

    The result may be shorter than `vocab_size` when the corpus has fewer distinct pieces.
    The same texts and options give the same tokens whatever the number of threads.
    """
    layout, num_unused = resolve_layout(layout, vocab_size, num_unused)
    reserved = reserved_tokens(layout, num_unused)
    if vocab_size <= len(reserved):
        raise VocabError(f"--vocab-size {vocab_size} leaves no room for learned pieces after the "
                         f"{len(reserved)} reserved tokens of the {layout} layout")
    tokenizer = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    # Words arrive joined by single spaces and hold no space themselves: split there and only there.
    tokenizer.pre_tokenizer = pre_tokenizers.Split(" ", behavior="removed")
    trainer = trainers.WordPieceTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=reserved,
        limit_alphabet=limit_alphabet,
        continuing_subword_prefix="##",
        show_progress=False,
    )
    tokenizer.train_from_iterator(_joined_words(texts, do_lower_case), trainer=trainer)
    learned = tokenizer.get_vocab()
    tokens = [token for token, _ in sorted(learned.items(), key=lambda kv: kv[1])]
    if tokens[: len(reserved)] != reserved:
        raise VocabError("the trainer did not keep the reserved tokens first (unexpected tokenizers behaviour)")
    if sorted(learned.values()) != list(range(len(tokens))):
        raise VocabError("the trainer returned non-contiguous ids (unexpected tokenizers behaviour)")
    Vocab.from_tokens(tokens)  # validates: no duplicates, required tokens present
    return tokens


def write_vocab(tokens: list[str], path: str) -> Vocab:
    """Write a vocab.txt atomically; returns the Vocab (with the file's sha256)."""
    from pipelines import fsio

    vocab = Vocab(tuple(tokens), path)
    fsio.write_atomic(path, vocab.to_bytes())
    return vocab
