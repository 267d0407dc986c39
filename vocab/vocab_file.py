"""BERT `vocab.txt` files: one token per line, id = line number (0-based).

Loading validates the file the way a user needs when a run goes wrong: every problem names the
file and the 1-based line number. The original tool strips surrounding whitespace from each line,
so we do too (ids stay the same as the original's for every valid file).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

# The five special tokens every BERT vocabulary holds, in the order of the compact layout.
SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
REQUIRED_TOKENS = SPECIAL_TOKENS
CONTINUATION_PREFIX = "##"
_BOM = "\ufeff"


class VocabError(ValueError):
    """A vocabulary file that cannot be used: the message names the file and the line."""


@dataclass(frozen=True)
class Vocab:
    """An immutable WordPiece vocabulary.

    `sha256` is of the file's bytes (for in-memory vocabularies: of the bytes `to_bytes()` gives),
    so a manifest can pin exactly which vocabulary produced a dataset.
    """

    tokens: tuple[str, ...]
    path: str = "<memory>"
    sha256: str = field(default="")

    def __post_init__(self) -> None:
        if not isinstance(self.tokens, tuple):
            object.__setattr__(self, "tokens", tuple(self.tokens))
        _validate_tokens(self.tokens, self.path, line_offset=1)
        if not self.sha256:
            object.__setattr__(self, "sha256", hashlib.sha256(self.to_bytes()).hexdigest())

    # Pickle only the tokens: the cached lookup tables are rebuilt on demand where it lands. The
    # tokens were checked when this object was made, so unpickling does not check them again (a
    # pipeline unpickles its vocab once per DoFn; each check of 30k tokens took 0.1-0.3 s).
    def __reduce__(self):
        return (_unpickled_vocab, (self.tokens, self.path, self.sha256))

    @classmethod
    def from_tokens(cls, tokens: Iterable[str], path: str = "<memory>") -> Vocab:
        return cls(tuple(tokens), path)

    def to_bytes(self) -> bytes:
        """The vocab.txt bytes for these tokens (one per line, UTF-8, trailing newline)."""
        return ("\n".join(self.tokens) + "\n").encode("utf-8")

    @property
    def size(self) -> int:
        return len(self.tokens)

    def __len__(self) -> int:
        return len(self.tokens)

    @cached_property
    def _ids(self) -> dict[str, int]:
        return {token: i for i, token in enumerate(self.tokens)}

    @property
    def vocab_dict(self) -> dict[str, int]:
        """token -> id (a fresh copy, safe to hand to other libraries)."""
        return dict(self._ids)

    def token_to_id(self, token: str) -> int:
        """The id of `token`; raises KeyError when it is not in the vocabulary."""
        try:
            return self._ids[token]
        except KeyError:
            raise KeyError(f"{token!r} is not in the vocabulary {self.path}") from None

    def get_id(self, token: str, default: int | None = None) -> int | None:
        """The id of `token`, or `default` when it is not in the vocabulary."""
        return self._ids.get(token, default)

    def __contains__(self, token: object) -> bool:
        return token in self._ids

    def display_token(self, token_id: int) -> str:
        """The token for a report: ``<id N>`` for an id outside the vocabulary (corrupt data)."""
        return self.tokens[token_id] if 0 <= token_id < len(self.tokens) else f"<id {token_id}>"

    @property
    def pad_id(self) -> int:
        return self._ids["[PAD]"]

    @property
    def unk_id(self) -> int:
        return self._ids["[UNK]"]

    @property
    def cls_id(self) -> int:
        return self._ids["[CLS]"]

    @property
    def sep_id(self) -> int:
        return self._ids["[SEP]"]

    @property
    def mask_id(self) -> int:
        return self._ids["[MASK]"]

    @cached_property
    def is_continuation(self) -> np.ndarray:
        """Boolean mask over ids: True where the token is a `##` continuation piece."""
        return np.fromiter((t.startswith(CONTINUATION_PREFIX) for t in self.tokens), dtype=bool,
                           count=len(self.tokens))

    @cached_property
    def special_ids(self) -> np.ndarray:
        """Ids of the bracketed reserved tokens ([PAD], [UNK], [CLS], [SEP], [MASK], [unused*])."""
        return np.array([i for i, t in enumerate(self.tokens) if _is_reserved(t)], dtype=np.int32)

    def summary(self) -> dict[str, object]:
        """What a manifest records about the vocabulary."""
        return {"path": self.path, "size": self.size, "sha256": self.sha256}


def _unpickled_vocab(tokens: tuple[str, ...], path: str, sha256: str) -> Vocab:
    vocab = object.__new__(Vocab)
    for name, value in (("tokens", tuple(tokens)), ("path", path), ("sha256", sha256)):
        object.__setattr__(vocab, name, value)
    return vocab


def _is_reserved(token: str) -> bool:
    return token in REQUIRED_TOKENS or (token.startswith("[unused") and token.endswith("]"))


def _validate_tokens(tokens: tuple[str, ...], path: str, line_offset: int) -> None:
    seen: dict[str, int] = {}
    for i, token in enumerate(tokens):
        line = i + line_offset
        if not isinstance(token, str):
            raise VocabError(f"{path}: line {line}: token {token!r} is not a string")
        if not token or token != token.strip():
            what = "is empty" if not token.strip() else f"{token!r} has surrounding whitespace"
            raise VocabError(f"{path}: line {line}: token {what}")
        if "\n" in token:
            raise VocabError(f"{path}: line {line}: token {token!r} contains a newline")
        if not token.isascii():
            try:
                token.encode("utf-8")
            except UnicodeEncodeError:
                raise VocabError(f"{path}: line {line}: token {token!r} is not valid Unicode "
                                 "(lone surrogate)") from None
        if token in seen:
            raise VocabError(
                f"{path}: line {line}: duplicate token {token!r} (first on line {seen[token] + line_offset})"
            )
        seen[token] = i
    missing = [t for t in REQUIRED_TOKENS if t not in seen]
    if missing:
        raise VocabError(f"{path}: required token(s) {', '.join(missing)} missing from the vocabulary")


def parse_vocab_bytes(data: bytes, path: str) -> tuple[str, ...]:
    """Tokens of a vocab.txt, one per line; errors name the file and the line.

    Lines are split on "\\n" only (like the original's readline), a final newline is optional,
    "\\r\\n" endings and a leading UTF-8 byte-order mark are accepted.
    """
    if not data:
        raise VocabError(f"{path}: the vocabulary file is empty")
    lines = data.split(b"\n")
    if lines[-1] == b"":
        lines.pop()
    tokens = []
    for number, raw in enumerate(lines, start=1):
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise VocabError(
                f"{path}: line {number}: not valid UTF-8 (byte {e.start}: {raw[e.start:e.start + 4]!r})"
            ) from None
        if number == 1 and text.startswith(_BOM):
            text = text[1:]
        token = text.strip()
        if not token:
            raise VocabError(f"{path}: line {number}: empty line (every line must hold one token)")
        tokens.append(token)
    return tuple(tokens)


def parse_vocab(data: bytes, source: str) -> Vocab:
    """The validated Vocab of a vocab.txt's bytes; ``source`` (the path) names it in errors and the
    manifest. Reading the file is the caller's (bert_datagen.contract.vocab_io.load_vocab)."""
    tokens = parse_vocab_bytes(data, source)
    return Vocab(tokens, source, hashlib.sha256(data).hexdigest())
