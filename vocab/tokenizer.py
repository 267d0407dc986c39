"""`BertTokenizer`: the original BERT tokenization, token for token, faster than plain `tokenizers`.

Three paths, chosen per text:
- plain: ASCII text without control characters (most of real English text): lowercased by
  Python when uncased, then Rust BertPreTokenizer + WordPiece with no normalizer at all, since
  every step of the normalizer but lowercasing is the identity on such text;
- fast: Rust `tokenizers` (BertNormalizer + BertPreTokenizer + WordPiece), configured like the
  original: 200-character word limit, and no special tokens registered, so "[SEP]" in the text is
  ordinary text (punctuation + word), as in the original;
- exact: Python basic tokenization (`basic.py`, Python's own Unicode rules) + Rust WordPiece on
  the resulting words, for texts holding a character the Rust normalizer treats differently
  (`divergence.py`: private-use characters, capital sigma when lowercasing, a few code points
  whose Unicode data differ). ASCII text never needs it; real text rarely does.
"""

from __future__ import annotations

import contextlib
import os
import re
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np
from tokenizers import Tokenizer, models, pre_tokenizers

from bert_datagen.vocab import basic, divergence
from bert_datagen.vocab.vocab_file import Vocab

MAX_INPUT_CHARS_PER_WORD = 200
UNK_TOKEN = "[UNK]"
_PARALLELISM_ENV = "TOKENIZERS_PARALLELISM"
# ASCII control characters the original deletes (tab, newline and carriage return are whitespace).
_ASCII_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")
_env_lock = threading.Lock()


@contextlib.contextmanager
def _one_rust_thread() -> Iterator[None]:
    """`tokenizers` spreads a batch over every core unless TOKENIZERS_PARALLELISM is false, an
    environment variable it reads on each call (there is no per-call switch). Set only for the
    call and restored after, so no other user of `tokenizers` in the process is affected."""
    with _env_lock:
        before = os.environ.get(_PARALLELISM_ENV)
        os.environ[_PARALLELISM_ENV] = "false"
        try:
            yield
        finally:
            if before is None:
                del os.environ[_PARALLELISM_ENV]
            else:
                os.environ[_PARALLELISM_ENV] = before


def _wordpiece(vocab: Vocab) -> models.WordPiece:
    return models.WordPiece(vocab.vocab_dict, unk_token=UNK_TOKEN,
                            max_input_chars_per_word=MAX_INPUT_CHARS_PER_WORD)


@dataclass
class EncodeBatch:
    """A batch between ``BertTokenizer.start_batch`` and ``finish_batch``: its size, and per Rust
    call the tokenizer, the texts' positions, its inputs and whether they are words already."""

    size: int
    calls: list[tuple[Tokenizer, list[int], list, bool]]


class BasicTokenizer:
    """Text -> words (the original's BasicTokenizer), through the fast or the exact path."""

    def __init__(self, do_lower_case: bool = True) -> None:
        self.do_lower_case = bool(do_lower_case)
        self._normalizer = divergence.rust_normalizer(self.do_lower_case)
        self._pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        self._divergent = divergence.divergent_mask(self.do_lower_case)

    def __reduce__(self):
        return (BasicTokenizer, (self.do_lower_case,))

    def needs_exact_path(self, text: str) -> bool:
        """True when the Rust normalizer would not reproduce the original on this text."""
        if text.isascii():
            return False
        codes = np.frombuffer(text.encode("utf-32-le", "surrogatepass"), dtype=np.uint32)
        return bool(self._divergent[codes].any())

    def exact_path_flags(self, texts: Sequence[str]) -> np.ndarray:
        """`needs_exact_path` for a batch, with one lookup for all its non-ASCII texts."""
        flags = np.zeros(len(texts), dtype=bool)
        wide = [i for i, text in enumerate(texts) if not text.isascii()]
        if not wide:
            return flags
        chunk = [texts[i] for i in wide]
        lengths = np.fromiter(map(len, chunk), dtype=np.int64, count=len(chunk))
        codes = np.frombuffer("".join(chunk).encode("utf-32-le", "surrogatepass"), dtype=np.uint32)
        hits = np.concatenate(([0], np.cumsum(self._divergent[codes], dtype=np.int64)))
        ends = np.cumsum(lengths)
        flags[wide] = hits[ends] > hits[ends - lengths]
        return flags

    def exact_words(self, text: str) -> list[str]:
        return basic.basic_tokenize(text, self.do_lower_case)

    def words(self, text: str) -> list[str]:
        if self.needs_exact_path(text):
            return self.exact_words(text)
        normalized = self._normalizer.normalize_str(text)
        return [w for w, _ in self._pre_tokenizer.pre_tokenize_str(normalized)]


class BertTokenizer:
    """Text -> WordPiece ids exactly as the original BERT tokenizer (no [CLS]/[SEP] added)."""

    def __init__(self, vocab: Vocab, do_lower_case: bool = True, single_thread: bool = False) -> None:
        self.vocab = vocab
        self.do_lower_case = bool(do_lower_case)
        # One Rust thread per tokenizer: for a process that is one of several workers on a
        # machine, where a thread pool per worker would only oversubscribe the cores.
        self.single_thread = bool(single_thread)
        self._full = Tokenizer(_wordpiece(vocab))
        self._full.normalizer = divergence.rust_normalizer(self.do_lower_case)
        self._full.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        # ASCII text without control characters needs none of the normalizer's work but lowercasing
        # (accents, CJK spacing and cleaning are identity on it): Python lowercases it, and a
        # tokenizer without a normalizer runs about 40% faster than the full one on it.
        self._plain = Tokenizer(_wordpiece(vocab))
        self._plain.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        # WordPiece alone, fed words that the exact Python path produced.
        self._words = Tokenizer(_wordpiece(vocab))
        self.basic = BasicTokenizer(self.do_lower_case)

    # Beam pickles the tokenizer into every worker: ship the token list, rebuild the Rust side.
    def __reduce__(self):
        return (BertTokenizer, (self.vocab, self.do_lower_case, self.single_thread))

    def __repr__(self) -> str:
        return (f"BertTokenizer(vocab={self.vocab.path!r}, size={self.vocab.size}, "
                f"do_lower_case={self.do_lower_case})")

    def needs_exact_path(self, text: str) -> bool:
        return self.basic.needs_exact_path(text)

    def basic_tokenize(self, text: str) -> list[str]:
        """The original's words (before WordPiece) for one text."""
        return self.basic.words(text)

    def _exact_words(self, text: str) -> list[str]:
        words = self.basic.exact_words(text)
        surrogate = basic.tables().surrogate
        # No vocabulary token can hold a lone surrogate, so such a word is [UNK] in the original;
        # the literal word "[UNK]" makes WordPiece say so (and Rust cannot take surrogates at all).
        return [UNK_TOKEN if surrogate.search(w) else w for w in words]

    def encode_batch_ids(self, texts: Sequence[str]) -> list[np.ndarray]:
        """WordPiece ids (int32) of each text."""
        batch = self.start_batch(texts)
        return self.finish_batch(batch, self.run_batch(batch))

    # A batch in three steps, for a caller that runs the middle one in a thread of its own: only it
    # runs without the GIL (Rust), so the Python steps before and after stay on the caller's thread
    # and the two threads do not take the GIL from each other.
    def start_batch(self, texts: Sequence[str]) -> EncodeBatch:
        """Each text's path and the inputs of each path's Rust call (Python work)."""
        texts = list(texts)
        plain = np.fromiter((t.isascii() and _ASCII_CONTROL.search(t) is None for t in texts), dtype=bool,
                            count=len(texts))
        exact = self.basic.exact_path_flags(texts)  # never true for ASCII text
        lower = str.lower if self.do_lower_case else str
        calls = []
        for tokenizer, idx, inputs, pretokenized in (
                (self._plain, np.flatnonzero(plain), lambda i: lower(texts[i]), False),
                (self._full, np.flatnonzero(~plain & ~exact), lambda i: texts[i], False),
                (self._words, np.flatnonzero(exact), lambda i: self._exact_words(texts[i]), True)):
            idx_list = idx.tolist()
            if idx_list:
                calls.append((tokenizer, idx_list, [inputs(i) for i in idx_list], pretokenized))
        return EncodeBatch(len(texts), calls)

    def run_batch(self, batch: EncodeBatch) -> list[list]:
        """The Rust calls of a started batch: their encodings (the GIL is released while they run)."""
        with _one_rust_thread() if self.single_thread else contextlib.nullcontext():
            return [tokenizer.encode_batch_fast(inputs, add_special_tokens=False, is_pretokenized=pretokenized)
                    for tokenizer, _, inputs, pretokenized in batch.calls]

    def finish_batch(self, batch: EncodeBatch, encodings: list[list]) -> list[np.ndarray]:
        """Each text's ids, in the order of the texts (Python work)."""
        out: list[np.ndarray | None] = [None] * batch.size
        for (_, idx_list, _, _), encoded in zip(batch.calls, encodings, strict=True):
            for i, enc in zip(idx_list, encoded, strict=True):
                out[i] = np.array(enc.ids, dtype=np.int32)
        return out  # type: ignore[return-value]

    def encode_ids(self, text: str) -> np.ndarray:
        return self.encode_batch_ids([text])[0]

    def tokenize(self, text: str) -> list[str]:
        """The word pieces of one text (strings)."""
        tokens = self.vocab.tokens
        return [tokens[i] for i in self.encode_ids(text)]

    def convert_ids_to_tokens(self, ids: Sequence[int]) -> list[str]:
        tokens = self.vocab.tokens
        return [tokens[int(i)] for i in ids]

    def convert_tokens_to_ids(self, pieces: Sequence[str]) -> list[int]:
        return [self.vocab.token_to_id(p) for p in pieces]
