"""Train a WordPiece vocabulary with `tokenizers`, reproducibly, on the words our tokenizer produces.

The trainer never sees raw text: every text goes through the same basic tokenization
`BertTokenizer` applies (exact path included), so a vocabulary is learned from exactly the words
it will later be asked to cover.

Why not `tokenizers`' WordPieceTrainer as is: it numbers the "##x" continuation symbols in hash-map
order, and merge ties are broken by those numbers, so the same corpus gives different vocabularies
from run to run (measured: different token sets, not only orders). We count the words ourselves,
choose the alphabet ourselves (ties broken by code point), and give the BPE trainer words in which
every non-initial character is replaced by a stand-in character of its own ("continuation form",
taken from code points the corpus does not use). All symbols are then in the initial alphabet, whose
ids `tokenizers` assigns in code point order, so merge ties are broken by ids that no longer depend
on hash-map order; afterwards the stand-ins are turned back into "##" pieces. (Checked by tests and
the benchmark: same bytes with 1 and 2 threads and from run to run on real corpora.) Words that hold a character outside the kept alphabet
are not learned from (WordPiece makes them [UNK] anyway).

Layouts (the reserved tokens come first, then the learned pieces in the trainer's order):
- "google" (`num_unused` >= 99): [PAD] 0, [unused0..98] 1..99, [UNK] 100, [CLS] 101, [SEP] 102,
  [MASK] 103, [unused99..num_unused-1] 104.., then pieces. With the default 994 unused slots this
  is the layout of Google's released vocabularies (999 reserved ids).
- "compact": [PAD] 0, [UNK] 1, [CLS] 2, [SEP] 3, [MASK] 4, [unused0..num_unused-1], then pieces.
- "auto" (default): "google" when `num_unused` >= 99 and at least 1,000 ids are left for learned
  pieces; otherwise "compact" without unused slots (for small vocabularies, e.g. tests and demos).
- "google-chinese": the reserved ids of Google's Chinese release (`bert-base-chinese`): [PAD] 0,
  [unused1..99] 1..99, [UNK] 100, [CLS] 101, [SEP] 102, [MASK] 103, <S> 104, <T> 105; the vocabulary
  is character-level for CJK ideographs (every one seen `min_frequency` times, no alphabet limit),
  as that release is; words of other scripts still get learned pieces.

Scripts written without spaces (CJK ideographs, kana, Hangul, Thai, ...): each of their characters
is a unit of meaning, and a corpus in them has thousands of distinct characters, far past any
alphabet limit that suits spaced scripts (measured on the zhwiki sample: 938 of its 4,237 CJK
characters fitted under the default 1,000, so 11.4% of its Chinese characters became [UNK]). Their
characters seen at least `min_frequency` times are therefore kept beside the limited alphabet, not
in competition with it; a corpus without them gets exactly the vocabulary it always had. A CJK
ideograph is always a word of its own after basic tokenization, so one kept only this way has no
"##" form (it could never be used); the other unspaced scripts get both forms.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Iterator

from tokenizers import Tokenizer, models, pre_tokenizers, trainers

from bert_datagen.vocab.vocab_file import SPECIAL_TOKENS, Vocab, VocabError

LAYOUTS = ("auto", "google", "compact", "google-chinese")
GOOGLE_UNUSED_BEFORE_UNK = 99
MIN_LEARNED_FOR_GOOGLE = 1000
_BATCH = 1024
_REPEAT_CHUNK = 4096
GOOGLE_CHINESE_RESERVED = ["[PAD]", *(f"[unused{i}]" for i in range(1, 100)), "[UNK]", "[CLS]", "[SEP]", "[MASK]",
                           "<S>", "<T>"]
# Blocks of scripts written without spaces between words (beside the CJK ideographs of basic.py).
UNSPACED_RANGES = (
    (0x0E00, 0x0EFF),  # Thai, Lao
    (0x0F00, 0x0FFF),  # Tibetan
    (0x1000, 0x109F),  # Myanmar
    (0x1100, 0x11FF),  # Hangul Jamo
    (0x1780, 0x17FF),  # Khmer
    (0x3040, 0x30FF),  # Hiragana, Katakana
    (0x3100, 0x318F),  # Bopomofo, Hangul compatibility Jamo
    (0x31F0, 0x31FF),  # Katakana phonetic extensions
    (0xA000, 0xA4CF),  # Yi
    (0xAC00, 0xD7AF),  # Hangul syllables
)


def reserved_tokens(layout: str, num_unused: int) -> list[str]:
    """The reserved tokens, in id order, of a concrete layout ("google" or "compact")."""
    unused = [f"[unused{i}]" for i in range(num_unused)]
    if layout == "google":
        if num_unused < GOOGLE_UNUSED_BEFORE_UNK:
            raise VocabError(f"the google layout needs at least {GOOGLE_UNUSED_BEFORE_UNK} unused slots "
                             f"([UNK] is id 100), got {num_unused}")
        head = unused[:GOOGLE_UNUSED_BEFORE_UNK]
        return [SPECIAL_TOKENS[0], *head, *SPECIAL_TOKENS[1:], *unused[GOOGLE_UNUSED_BEFORE_UNK:]]
    if layout == "compact":
        return [*SPECIAL_TOKENS, *unused]
    if layout == "google-chinese":
        return list(GOOGLE_CHINESE_RESERVED)
    raise VocabError(f"unknown vocabulary layout {layout!r} (one of {', '.join(LAYOUTS)})")


def resolve_layout(layout: str, vocab_size: int, num_unused: int) -> tuple[str, int]:
    """The concrete (layout, num_unused) for the options (see the module doc for "auto")."""
    if num_unused < 0:
        raise VocabError(f"--num-unused {num_unused} must be >= 0")
    if layout == "google-chinese":
        num_unused = GOOGLE_UNUSED_BEFORE_UNK  # the release's fixed layout
        if vocab_size <= len(GOOGLE_CHINESE_RESERVED):
            raise VocabError(f"--vocab-size {vocab_size} leaves no room for learned pieces after the "
                             f"{len(GOOGLE_CHINESE_RESERVED)} reserved tokens of the google-chinese layout")
        return layout, num_unused
    if layout == "auto":
        fits = vocab_size >= 5 + num_unused + MIN_LEARNED_FOR_GOOGLE
        return ("google", num_unused) if num_unused >= GOOGLE_UNUSED_BEFORE_UNK and fits else ("compact", 0)
    reserved = len(SPECIAL_TOKENS) + num_unused
    if vocab_size <= reserved:  # before the reserved list is built: --num-unused may be any int64
        raise VocabError(f"--vocab-size {vocab_size} leaves no room for learned pieces after the {reserved:,} "
                         f"reserved tokens of the {layout} layout (--num-unused {num_unused} and 5 special ones)")
    reserved_tokens(layout, num_unused)  # validates the layout and its unused slots
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


def count_words(texts: Iterable[str], do_lower_case: bool) -> Counter[str]:
    """How often each word of BertTokenizer's basic tokenization occurs in the texts.

    Uses the exact Python path (the original's rules) on batches of texts joined by newlines: a
    word never spans whitespace, so the words are those of each text, and this is faster than one
    Rust call per text.
    """
    from bert_datagen.vocab.basic import basic_tokenize, tables

    surrogate = tables().surrogate
    counts: Counter[str] = Counter()
    for batch in _batches(texts, _BATCH):
        joined = "\n".join(batch)
        words = basic_tokenize(joined, do_lower_case)
        if not joined.isascii() and surrogate.search(joined):
            # A word holding a lone surrogate is [UNK] whatever the vocabulary: nothing to learn.
            words = [w for w in words if not surrogate.search(w)]
        counts.update(words)
    return counts


def choose_alphabet(words: Counter[str], limit: int) -> list[str]:
    """The `limit` most frequent characters (ties: lowest code point first), in code point order."""
    chars: Counter[str] = Counter()
    for word, n in words.items():
        for ch in word:
            chars[ch] += n
    ranked = sorted(chars.items(), key=lambda kv: (-kv[1], kv[0]))
    return sorted(ch for ch, _ in ranked[:limit])


def _in_ranges(ch: str, ranges) -> bool:
    cp = ord(ch)
    return any(lo <= cp <= hi for lo, hi in ranges)


def is_cjk_ideograph(ch: str) -> bool:
    """A character basic tokenization always makes a word of its own."""
    from bert_datagen.vocab.basic import CJK_RANGES

    return _in_ranges(ch, CJK_RANGES)


def is_unspaced_script(ch: str) -> bool:
    """A character of a script written without spaces between words."""
    return is_cjk_ideograph(ch) or _in_ranges(ch, UNSPACED_RANGES)


def script_characters(words: Counter[str], min_frequency: int, kept: Iterable[str]) -> list[str]:
    """Characters of unspaced scripts seen at least `min_frequency` times and not in `kept`, in
    code point order."""
    chars: Counter[str] = Counter()
    for word, n in words.items():
        for ch in word:
            if ord(ch) >= 0x0E00:  # below: spaced scripts only, skip the range tests
                chars[ch] += n
    have = set(kept)
    return sorted(ch for ch, n in chars.items() if n >= min_frequency and ch not in have and is_unspaced_script(ch))


def continuation_forms(alphabet: list[str]) -> dict[str, str]:
    """char -> stand-in character for its non-initial ("##") form: unused private-use code points."""
    used = set(alphabet)
    spare = (chr(cp) for lo, hi in ((0xF0000, 0xFFFFD), (0x100000, 0x10FFFD), (0xE000, 0xF8FF))
             for cp in range(lo, hi + 1) if chr(cp) not in used)
    forms = {}
    for ch in alphabet:
        stand_in = next(spare, None)
        if stand_in is None:
            raise VocabError(f"alphabet of {len(alphabet):,} characters is too large (lower --limit-alphabet)")
        forms[ch] = stand_in
    return forms


def _encoded_words(words: Counter[str], initial: set[str], forms: dict[str, str]) -> Iterator[str]:
    """Each learnable word, as often as it occurs, in the trainer's spelling, joined by spaces."""
    for word, n in sorted(words.items()):
        if word[0] not in initial or any(ch not in forms for ch in word[1:]):
            continue
        encoded = word[0] + "".join(forms[ch] for ch in word[1:])
        for start in range(0, n, _REPEAT_CHUNK):
            yield " ".join([encoded] * min(_REPEAT_CHUNK, n - start))


def _decode_piece(piece: str, plain: dict[str, str]) -> str:
    if piece[0] in plain:  # a continuation piece: every character is a stand-in
        return "##" + "".join(plain[ch] for ch in piece)
    return piece[0] + "".join(plain[ch] for ch in piece[1:])


def train_vocab(
    texts: Iterable[str],
    vocab_size: int,
    do_lower_case: bool,
    num_unused: int = 994,
    layout: str = "auto",
    min_frequency: int = 2,
    limit_alphabet: int = 1000,
) -> list[str]:
    """Learn a WordPiece vocabulary: the tokens in id order (reserved ones, single characters,
    "##" characters, then learned pieces).

    The result may be shorter than `vocab_size` when the corpus has fewer distinct pieces.
    The same texts and options give the same tokens, whatever the number of threads.
    """
    layout, num_unused = resolve_layout(layout, vocab_size, num_unused)
    reserved = reserved_tokens(layout, num_unused)
    words = count_words(texts, do_lower_case)
    if layout == "google-chinese":
        # Character-level for CJK: every ideograph seen often enough, alone; the limit for the rest.
        words_rest = Counter({w: n for w, n in words.items() if not is_cjk_ideograph(w[0])})
        alphabet = choose_alphabet(words_rest, limit_alphabet)
    else:
        alphabet = choose_alphabet(words, limit_alphabet)
    script = script_characters(words, min_frequency, alphabet)
    # Both forms of every kept character, as Google's vocabularies have: a character seen only
    # inside words here may start a word in other text. A CJK ideograph kept for its script is
    # always a word of its own, so it needs no "##" form.
    forms = continuation_forms(sorted([*alphabet, *(ch for ch in script if not is_cjk_ideograph(ch))]))
    initial = {*alphabet, *script}
    symbols = sorted([*initial, *forms.values()])
    if len(reserved) + len(symbols) > vocab_size:
        raise VocabError(f"--vocab-size {vocab_size} is smaller than the {len(reserved)} reserved tokens plus "
                         f"the {len(symbols)} single-character pieces (each character alone and, but for "
                         f"CJK ideographs beyond the alphabet limit, as '##' continuation; {len(script):,} of "
                         "them are characters of unspaced scripts seen at least --min-frequency times); "
                         "raise it, or lower --limit-alphabet, or raise --min-frequency")
    tokenizer = Tokenizer(models.BPE())
    # Words arrive joined by single spaces and hold no space themselves: split there and only there.
    tokenizer.pre_tokenizer = pre_tokenizers.Split(" ", behavior="removed")
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=reserved,
        limit_alphabet=len(symbols),
        initial_alphabet=symbols,
        show_progress=False,
    )
    tokenizer.train_from_iterator(_encoded_words(words, initial, forms), trainer=trainer)
    learned = tokenizer.get_vocab()
    if sorted(learned.values()) != list(range(len(learned))):
        raise VocabError("the trainer returned non-contiguous ids (unexpected tokenizers behaviour)")
    pieces = [token for token, _ in sorted(learned.items(), key=lambda kv: kv[1])]
    if pieces[: len(reserved)] != reserved:
        raise VocabError("the trainer did not keep the reserved tokens first (unexpected tokenizers behaviour)")
    plain = {v: k for k, v in forms.items()}
    tokens = reserved + [_decode_piece(p, plain) for p in pieces[len(reserved):]]
    Vocab.from_tokens(tokens)  # validates: no duplicates, required tokens present
    return tokens

