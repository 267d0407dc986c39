"""SQuAD v1.1 / v2.0 JSON -> examples, as the original `read_squad_examples`.

A context is split into words on space, tab, CR, LF and U+202F only (not on every Unicode space),
each character mapped to the word it is in (or, for whitespace, the word before it). In training
mode an answer's words must contain its whitespace-normalised text, else the question is skipped
and counted (the original's "Could not find answer"). A training question with several answers
uses the first (the original raises).

Unspaced text (CMRC 2018 and other Chinese SQuAD-layout data): split on whitespace, a Chinese
paragraph would be one "word", and predictions would map back through it. A context with more
CJK ideographs than whitespace characters is therefore split as basic tokenization splits text
(each CJK ideograph and each punctuation character a word, runs of anything else, e.g. Latin
words and numbers, one word each, whitespace between words), and its examples carry the context
and where each word starts, so that predictions map back to its exact characters. Contexts of
spaced text keep the original's words (English SQuAD bytes unchanged; its 16 contexts that hold a
few CJK characters have far more spaces).

An answer whose `answer_start` does not point at its text (CMRC 2018's published files hold such
offsets: 5 of the trial's 1,002 answers, each 1 to 3 characters off) is re-anchored at the
nearest occurrence of its text within REANCHOR_CHARS characters and counted
(`reanchored_answers`); when there is none, a training question that needs it is skipped like the
original skips an answer it cannot find (`unanchored_skipped`), and an evaluated one keeps the
answer, scored by its text alone (`unanchored_answers`).
"""

from __future__ import annotations

import bisect
import json
import re
from dataclasses import dataclass

import numpy as np

from bert_datagen.datagen.tasks.config import TaskInputError

_WORD = re.compile("[^ \t\r\n\u202f]+")
REANCHOR_CHARS = 8
_SPACES = re.compile(r"\s")
_SPACE_CODES = np.array([0x20, 0x09, 0x0D, 0x0A, 0x202F], dtype=np.uint32)
_KIND_NAMES = {list: "a list", dict: "an object", str: "a string", int: "an integer", bool: "true or false",
               float: "a number", type(None): "null"}


@dataclass
class Paragraph:
    words: list[str]
    words_json: str  # the words as a JSON array (shared by the side data of all its questions)
    # Unspaced contexts only: the context and each word's start, for exact-character predictions.
    context: str | None = None
    starts_json: str = ""


@dataclass
class SquadExample:
    index: int
    qas_id: str
    question: str
    paragraph: Paragraph
    start_word: int = -1  # training mode: the answer's first and last word (-1: none)
    end_word: int = -1
    answer_text: str = ""  # training mode: the answer used for the labels
    answers: list[str] | None = None  # gold answer texts (None: unlabelled)
    is_impossible: bool = False


def is_unspaced(context: str) -> bool:
    """More CJK ideographs than whitespace characters: text written without spaces between words."""
    from bert_datagen.vocab.basic import tables

    cjk = tables().cjk
    if context.isascii() or not cjk.search(context):  # spaced text, the common case: one C-speed scan
        return False
    return len(cjk.findall(context)) > len(_SPACES.findall(context))


def character_words(context: str) -> tuple[list[str], list[int]]:
    """Words of an unspaced context: each CJK ideograph and punctuation character alone, runs of
    other non-space characters whole (as basic tokenization splits text, before lowercasing)."""
    from bert_datagen.vocab.basic import tables

    t = tables()
    pattern = _character_word_pattern(t.cjk.pattern, t.punct.pattern)
    found = [(m.group(), m.start()) for m in pattern.finditer(context)]
    return [w for w, _ in found], [s for _, s in found]


_PATTERNS: dict[tuple[str, str], re.Pattern] = {}


def _character_word_pattern(cjk: str, punct: str) -> re.Pattern:
    key = (cjk, punct)
    if key not in _PATTERNS:
        _PATTERNS[key] = re.compile(f"{cjk}|{punct}|(?:(?!{cjk}|{punct})\\S)+")
    return _PATTERNS[key]


def context_words(context: str) -> tuple[list[str], list[int]]:
    """The words of a context and the character offset where each starts."""
    if is_unspaced(context):
        return character_words(context)
    codes = np.frombuffer(context.encode("utf-32-le", "surrogatepass"), dtype=np.uint32)
    space = np.isin(codes, _SPACE_CODES)
    starts = np.flatnonzero(~space & np.concatenate(([True], space[:-1])))
    return _WORD.findall(context), starts.tolist()


def char_to_word(starts: list[int], position: int) -> int:
    """The original's char_to_word_offset[position]: the last word starting at or before it."""
    return bisect.bisect_right(starts, position) - 1


class _Reader:
    def __init__(self, path: str, raw: str, version2: bool, training: bool, seen_ids: dict[str, str]) -> None:
        self.path, self.raw, self.version2, self.training = path, raw, version2, training
        self.seen_ids = seen_ids
        self.skipped = 0
        self.first_of_several = 0
        self.counts: dict[str, int] = {}  # reported only when not zero: spaced data keeps its manifest

    def bump(self, key: str) -> None:
        self.counts[key] = self.counts.get(key, 0) + 1

    def fail(self, where: str, why: str, qas_id: str | None = None) -> TaskInputError:
        line = ""
        if qas_id is not None:
            at = self.raw.find(json.dumps(qas_id, ensure_ascii=False))
            if at >= 0:
                line = f"line {self.raw.count(chr(10), 0, at) + 1}: "
        name = f"question {qas_id!r} ({where})" if qas_id is not None else where
        return TaskInputError(f"{self.path}: {line}{name}: {why}")

    def expect(self, value, kind: type, where: str, what: str, qas_id: str | None = None):
        if not isinstance(value, kind) or isinstance(value, bool) and kind is not bool:
            raise self.fail(where, f"not SQuAD JSON: {what} should be {_KIND_NAMES[kind]}, got "
                            f"{_KIND_NAMES.get(type(value), type(value).__name__)}", qas_id)
        return value

    def field(self, obj: dict, key: str, kind, where: str, qas_id: str | None = None):
        if key not in obj:
            raise self.fail(where, f"not SQuAD JSON: no {key!r} field", qas_id)
        return self.expect(obj[key], kind, where, f"{key!r}", qas_id)


def read_squad(path: str, data: bytes, version2: bool, training: bool,
               seen_ids: dict[str, str] | None = None) -> tuple[list[SquadExample], dict[str, int]]:
    """The examples of a SQuAD file in file order, and counts (skipped answers, ...).

    ``seen_ids`` (id -> where), shared by the files of a split, refuses a question id used twice:
    predictions and metrics are keyed by id, so a second question would silently go missing."""
    try:
        raw = data.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        raise TaskInputError(f"{path}: not valid UTF-8 at byte {err.start}") from None
    try:
        top = json.loads(raw)
    except json.JSONDecodeError as err:
        raise TaskInputError(f"{path}: line {err.lineno} column {err.colno}: not valid JSON ({err.msg}); "
                             "expected SQuAD JSON") from None
    r = _Reader(path, raw, version2, training, {} if seen_ids is None else seen_ids)
    if not isinstance(top, dict) or "data" not in top:
        raise r.fail("top level", "not SQuAD JSON: expected an object with a \"data\" list of articles")
    examples: list[SquadExample] = []
    for i, entry in enumerate(r.expect(top["data"], list, "data", "\"data\"")):
        where = f"data[{i}]"
        r.expect(entry, dict, where, "an article")
        for j, para in enumerate(r.field(entry, "paragraphs", list, where)):
            pwhere = f"{where}.paragraphs[{j}]"
            r.expect(para, dict, pwhere, "a paragraph")
            context = r.field(para, "context", str, pwhere)
            words, starts = context_words(context)
            paragraph = Paragraph(words, json.dumps(words, ensure_ascii=False, separators=(",", ":")))
            if is_unspaced(context):
                r.bump("character_word_contexts")
                paragraph.context = context
                paragraph.starts_json = json.dumps(starts, separators=(",", ":"))
            for k, qa in enumerate(r.field(para, "qas", list, pwhere)):
                example = _example(r, qa, f"{pwhere}.qas[{k}]", context, paragraph, starts, len(examples))
                if example is not None:
                    examples.append(example)
    _check_labelled(r, examples)
    counts = {"skipped_answers": r.skipped, "first_of_several_answers": r.first_of_several, **r.counts}
    return examples, counts


def _example(r: _Reader, qa, where: str, context: str, paragraph: Paragraph, starts: list[int],
             index: int) -> SquadExample | None:
    r.expect(qa, dict, where, "a question")
    qas_id = qa.get("id")
    if type(qas_id) is not str:
        qas_id = r.field(qa, "id", str, where)
    if qas_id in r.seen_ids:
        raise TaskInputError(f"{r.path}: question id {qas_id!r} at {where} is used twice (first at "
                             f"{r.seen_ids[qas_id]}): predictions and metrics are keyed by id, so give every "
                             "question its own")
    r.seen_ids[qas_id] = f"{r.path} {where}"
    if not r.version2 and qa.get("is_impossible") is True:
        raise r.fail(where, "is marked \"is_impossible\": this is SQuAD 2.0 data; use --task squad2", qas_id)
    question = qa.get("question")
    if type(question) is not str:
        question = r.field(qa, "question", str, where, qas_id)
    impossible = False
    if r.version2 and "is_impossible" in qa:
        impossible = r.expect(qa["is_impossible"], bool, where, "'is_impossible'", qas_id)
    answers = None
    if "answers" in qa:
        # The common, valid answer is checked inline; anything else gets the full check and message.
        answers = [_quick_answer(a, context) or _answer(r, a, f"{where}.answers[{n}]", context, qas_id)
                   for n, a in enumerate(r.expect(qa["answers"], list, where, "'answers'", qas_id))]
        if not r.training:
            for _, start in answers:
                if start < 0:
                    r.bump("unanchored_answers")
    if not paragraph.words:
        raise r.fail(where, "the context has no words", qas_id)
    example = SquadExample(index, qas_id, question, paragraph, is_impossible=impossible,
                           answers=[a[0] for a in answers] if answers is not None else None)
    if not r.training or impossible:
        return example
    if not answers:
        raise r.fail(where, "a training question needs an answer (or \"is_impossible\": true in SQuAD 2.0)", qas_id)
    if len(answers) > 1:
        r.first_of_several += 1
    text, start = answers[0]
    if start < 0:  # its text is nowhere near its offset: no labels to train on
        r.bump("unanchored_skipped")
        return None
    example.start_word = char_to_word(starts, start)
    example.end_word = char_to_word(starts, start + len(text) - 1)
    if paragraph.context is None:
        actual = " ".join(paragraph.words[example.start_word:example.end_word + 1])
    else:  # single-character words: their text is the context's, not the words joined by spaces
        last = paragraph.words[example.end_word]
        actual = " ".join(context[starts[example.start_word]:starts[example.end_word] + len(last)].split())
    if actual.find(" ".join(text.split())) == -1:
        r.skipped += 1
        return None
    example.answer_text = text
    return example


def _quick_answer(answer, context: str) -> tuple[str, int] | None:
    """(text, answer_start) of a well-formed answer that points at its text; None otherwise."""
    if type(answer) is dict:
        text, start = answer.get("text"), answer.get("answer_start")
        if type(text) is str and type(start) is int and text and start >= 0 and context.startswith(text, start):
            return text, start
    return None


def _answer(r: _Reader, answer, where: str, context: str, qas_id: str) -> tuple[str, int]:
    """(text, answer_start) of an answer: re-anchored when its offset is a little off, -1 when its
    text is not within REANCHOR_CHARS of it."""
    r.expect(answer, dict, where, "an answer", qas_id)
    text = r.field(answer, "text", str, where, qas_id)
    start = r.field(answer, "answer_start", int, where, qas_id)
    if not text:
        raise r.fail(where, "empty answer text", qas_id)
    if 0 <= start <= len(context) - len(text) and context[start:start + len(text)] == text:
        return text, start
    anchored = reanchor(context, text, start)
    if anchored >= 0:
        r.bump("reanchored_answers")
    return text, anchored


def reanchor(context: str, text: str, start: int, within: int = REANCHOR_CHARS) -> int:
    """The start of the occurrence of `text` nearest `start` (the earlier on a tie), at most
    `within` characters away, or -1."""
    for distance in range(1, within + 1):
        for candidate in (start - distance, start + distance):
            if 0 <= candidate <= len(context) - len(text) and context.startswith(text, candidate):
                return candidate
    return -1


def _check_labelled(r: _Reader, examples: list[SquadExample]) -> None:
    """A split's questions are all labelled (answers, or impossible) or none is."""
    labelled = [ex.answers is not None for ex in examples]
    if any(labelled) and not all(labelled):
        ex = examples[labelled.index(False)]
        raise r.fail(f"question index {ex.index}", "has no 'answers' while other questions of the file do",
                     ex.qas_id)
