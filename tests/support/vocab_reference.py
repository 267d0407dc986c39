"""The reference BERT tokenizer written from the recipe, shared by the vocab tests and benchmarks."""

from __future__ import annotations

import unicodedata

MAX_WORD_CHARS = 200


def is_whitespace(ch: str) -> bool:
    # Tab, newline and carriage return are whitespace here although Unicode calls them controls.
    return ch in (" ", "\t", "\n", "\r") or unicodedata.category(ch) == "Zs"


def is_control(ch: str) -> bool:
    if ch in ("\t", "\n", "\r"):
        return False
    return unicodedata.category(ch) in ("Cc", "Cf")


def is_punctuation(ch: str) -> bool:
    cp = ord(ch)
    # Every printable non-alphanumeric ASCII character counts, e.g. "$", "^", "`", "+".
    if 33 <= cp <= 47 or 58 <= cp <= 64 or 91 <= cp <= 96 or 123 <= cp <= 126:
        return True
    return unicodedata.category(ch).startswith("P")


def is_cjk_ideograph(cp: int) -> bool:
    blocks = [
        (0x4E00, 0x9FFF), (0x3400, 0x4DBF), (0x20000, 0x2A6DF), (0x2A700, 0x2B73F),
        (0x2B740, 0x2B81F), (0x2B820, 0x2CEAF), (0xF900, 0xFAFF), (0x2F800, 0x2FA1F),
    ]
    for lo, hi in blocks:
        if lo <= cp <= hi:
            return True
    return False


def clean_char(ch: str) -> str:
    cp = ord(ch)
    if cp == 0 or cp == 0xFFFD or is_control(ch):
        return ""
    if is_whitespace(ch):
        return " "
    if is_cjk_ideograph(cp):
        return " " + ch + " "
    return ch
_CHAR_MEMO: dict[str, str] = {}


def clean_and_space_cjk(text: str) -> str:
    """Drop NUL, U+FFFD and controls, whitespace to " ", spaces around CJK ideographs.

    (The original does this in two passes; a removed or whitespace character is never a CJK
    ideograph, so one pass per character gives the same text.)"""
    out = []
    for ch in text:
        done = _CHAR_MEMO.get(ch)
        if done is None:
            done = _CHAR_MEMO[ch] = clean_char(ch)
        out.append(done)
    return "".join(out)


def strip_accents(word: str) -> str:
    out = []
    for ch in unicodedata.normalize("NFD", word):
        if unicodedata.category(ch) == "Mn":
            continue
        out.append(ch)
    return "".join(out)


def split_punctuation(word: str) -> list[str]:
    pieces: list[list[str]] = []
    new_piece = True
    for ch in word:
        if is_punctuation(ch):
            pieces.append([ch])
            new_piece = True
        else:
            if new_piece:
                pieces.append([])
                new_piece = False
            pieces[-1].append(ch)
    return ["".join(p) for p in pieces]


def process_token(token: str, do_lower_case: bool) -> list[str]:
    if do_lower_case:
        token = token.lower()  # whole word at once: Greek final sigma depends on the neighbours
        token = strip_accents(token)
    return split_punctuation(token)


def basic_words(text: str, do_lower_case: bool, memo: dict | None = None) -> list[str]:
    text = clean_and_space_cjk(text)
    words = []
    for token in text.strip().split():
        if memo is None:
            words.extend(process_token(token, do_lower_case))
        else:  # same result, remembered: real text repeats its words
            if token not in memo:
                memo[token] = process_token(token, do_lower_case)
            words.extend(memo[token])
    return " ".join(words).split()


def wordpiece(word: str, vocab: dict[str, int], unk: str = "[UNK]") -> list[str]:
    chars = list(word)
    if len(chars) > MAX_WORD_CHARS:
        return [unk]
    pieces = []
    start = 0
    while start < len(chars):
        end = len(chars)
        found = None
        while start < end:
            candidate = "".join(chars[start:end])
            if start > 0:
                candidate = "##" + candidate
            if candidate in vocab:
                found = candidate
                break
            end -= 1
        if found is None:
            return [unk]  # one uncoverable part makes the whole word unknown
        pieces.append(found)
        start = end
    return pieces


class ReferenceTokenizer:
    def __init__(self, tokens: list[str] | tuple[str, ...], do_lower_case: bool) -> None:
        self.vocab = {t: i for i, t in enumerate(tokens)}
        self.do_lower_case = do_lower_case
        self._token_memo: dict[str, list[str]] = {}
        self._piece_memo: dict[str, list[str]] = {}

    def tokenize(self, text: str) -> list[str]:
        out = []
        for word in basic_words(text, self.do_lower_case, self._token_memo):
            if word not in self._piece_memo:
                self._piece_memo[word] = wordpiece(word, self.vocab)
            out.extend(self._piece_memo[word])
        return out

    def encode(self, text: str) -> list[int]:
        return [self.vocab[t] for t in self.tokenize(text)]


def google_reserved(num_unused: int = 994) -> list[str]:
    unused = [f"[unused{i}]" for i in range(num_unused)]
    return ["[PAD]", *unused[:99], "[UNK]", "[CLS]", "[SEP]", "[MASK]", *unused[99:]]


def build_vocab(texts, do_lower_case: bool, n_words: int = 3000, char_share: float = 0.97) -> list[str]:
    """A realistic-shaped vocab for `texts`: Google's reserved ids, most characters (alone and as
    "##" pieces; the rarest are left out so that some words become [UNK]), frequent words, and
    their prefixes and "##" suffixes, so WordPiece has real longest-match choices to make."""
    from collections import Counter

    words: Counter[str] = Counter()
    for text in texts:
        words.update(basic_words(text, do_lower_case))
    chars: Counter[str] = Counter()
    for word, count in words.items():
        for ch in word:
            chars[ch] += count
    ranked_chars = [c for c, _ in sorted(chars.items(), key=lambda kv: (-kv[1], kv[0]))]
    kept_chars = ranked_chars[: max(1, int(len(ranked_chars) * char_share))]
    top_words = [w for w, _ in sorted(words.items(), key=lambda kv: (-kv[1], kv[0]))[:n_words]]
    tokens = google_reserved() + kept_chars + ["##" + c for c in kept_chars] + top_words
    for w in top_words[: n_words // 2]:
        for k in (2, 3, 4):
            if len(w) > k:
                tokens += [w[:k], "##" + w[k:], "##" + w[-k:]]
    seen, out = set(), []
    for t in tokens:
        if t not in seen and t.strip() == t and t and not any(0xD800 <= ord(c) <= 0xDFFF for c in t):
            seen.add(t)
            out.append(t)
    return out
