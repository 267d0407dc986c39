"""CoNLL token-per-line files -> tagged sentences.

One token per line, columns separated by whitespace; a blank or whitespace-only line ends a
sentence; `-DOCSTART-` lines are dropped. Every token line has the column count of the file's
first token line. Tag schemes:
- iob2: `O`, `B-X`, `I-X`, where `I-X` continues a `B-X` or `I-X`. An `I-X` after `O` or after
  another type is refused (not repaired: a file with such tags is IOB1 or broken, and guessing
  would silently change entity boundaries); the message says to use `--scheme iob1` for IOB1 files.
- iob1: `I-X` may begin an entity; converted to iob2 (such an `I-X` becomes `B-X`), and the
  number of changed tags is reported.
- bioes: `B-X (I-X)* E-X`, `S-X` or `O`; invalid sequences are refused.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from bert_datagen.datagen.tasks.config import TaskInputError
from bert_datagen.datagen.tasks.delimited import decode_file

DOCSTART = "-DOCSTART-"
_TAG = {"iob1": re.compile(r"^(O|[BI]-\S+)$"), "iob2": re.compile(r"^(O|[BI]-\S+)$"),
        "bioes": re.compile(r"^(O|[BIES]-\S+)$")}


@dataclass
class Sentence:
    lines: list[int]  # the file line of each word
    words: list[str]
    tags: list[str] | None  # None: unlabelled


def _columns(path: str, line: int, ncols: int, token_column: int, tag_column: int,
             may_be_unlabelled: bool) -> tuple[int, int | None]:
    def norm(c: int, option: str) -> int:
        if not -ncols <= c < ncols:
            raise TaskInputError(f"{path}: line {line}: {option} {c} is outside the line's {ncols} column(s)")
        return c % ncols

    token = norm(token_column, "--token-column")
    if ncols == 1 and may_be_unlabelled:
        return token, None
    tag = norm(tag_column, "--tag-column")
    if tag == token:
        raise TaskInputError(f"{path}: line {line}: --tag-column {tag_column} is the token column: the file has no "
                             f"tag column ({ncols} column(s))")
    return token, tag


def read_conll(path: str, data: bytes, token_column: int, tag_column: int,
               may_be_unlabelled: bool) -> list[Sentence]:
    """The sentences of a CoNLL file in file order (tags as written, not yet checked)."""
    sentences: list[Sentence] = []
    lines: list[int] = []
    words: list[str] = []
    tags: list[str] = []
    layout: tuple[int, int, int | None] | None = None  # (columns, token column, tag column)
    first_line = 0

    def close() -> None:
        if words:
            sentences.append(Sentence(lines[:], words[:], tags[:] if layout and layout[2] is not None else None))
            lines.clear()
            words.clear()
            tags.clear()

    for lineno, line in enumerate(decode_file(path, data).split("\n"), start=1):
        fields = line.split()
        if not fields:
            close()
            continue
        if fields[0] == DOCSTART:
            close()
            continue
        if layout is None:
            layout = (len(fields), *_columns(path, lineno, len(fields), token_column, tag_column, may_be_unlabelled))
            first_line = lineno
        if len(fields) != layout[0]:
            raise TaskInputError(f"{path}: line {lineno}: {len(fields)} column(s), but the file's first token line "
                                 f"(line {first_line}) has {layout[0]}")
        lines.append(lineno)
        words.append(fields[layout[1]])
        if layout[2] is not None:
            tags.append(fields[layout[2]])
    close()
    return sentences


def check_tags(path: str, sentences: Sequence[Sentence], scheme: str) -> int:
    """Validate every tag under the scheme; iob1 tags are converted to iob2 in place.

    Returns the number of tags changed by the conversion."""
    pattern = _TAG[scheme]
    changed = 0
    for s in sentences:
        if s.tags is None:
            continue
        for line, tag in zip(s.lines, s.tags, strict=True):
            if not pattern.match(tag):
                allowed = "O, B-X, I-X" if scheme != "bioes" else "O, B-X, I-X, E-X, S-X"
                raise TaskInputError(f"{path}: line {line}: tag {tag!r} is not a {scheme} tag ({allowed})")
        if scheme == "iob1":
            changed += _iob1_to_iob2(s.tags)
        elif scheme == "iob2":
            _check_iob2(path, s)
        else:
            _check_bioes(path, s)
    return changed


def _iob1_to_iob2(tags: list[str]) -> int:
    changed = 0
    prev = "O"
    for i, tag in enumerate(tags):
        if tag.startswith("I-") and prev[2:] != tag[2:]:
            tags[i] = "B-" + tag[2:]
            changed += 1
        prev = tags[i]
    return changed


def _check_iob2(path: str, s: Sentence) -> None:
    prev = "O"
    for line, tag in zip(s.lines, s.tags or [], strict=True):
        if tag.startswith("I-") and prev[2:] != tag[2:]:
            after = "O" if prev == "O" else prev
            raise TaskInputError(f"{path}: line {line}: {tag} after {after} is not valid IOB2 (an entity starts with "
                                 "B-); if the file is IOB1, use --scheme iob1")
        prev = tag


def _check_bioes(path: str, s: Sentence) -> None:
    tags = s.tags or []
    for k, (line, tag) in enumerate(zip(s.lines, tags, strict=True)):
        prev = tags[k - 1] if k else "O"
        nxt = tags[k + 1] if k + 1 < len(tags) else "O"
        inside = tag[:1] in ("I", "E")
        if inside and not (prev[:1] in ("B", "I") and prev[2:] == tag[2:]):
            raise TaskInputError(f"{path}: line {line}: {tag} after {prev} is not valid BIOES")
        if tag[:1] in ("B", "I") and not (nxt[:1] in ("I", "E") and nxt[2:] == tag[2:]):
            raise TaskInputError(f"{path}: line {line}: {tag} followed by {nxt} is not valid BIOES (an entity "
                                 "ends with E- or is a single S-)")


def tag_ids(path: str, sentences: Sequence[Sentence], labels: Sequence[str]) -> list[list[int] | None]:
    index = {lab: i for i, lab in enumerate(labels)}
    out: list[list[int] | None] = []
    for s in sentences:
        if s.tags is None:
            out.append(None)
            continue
        ids = []
        for line, tag in zip(s.lines, s.tags, strict=True):
            if tag not in index:
                raise TaskInputError(f"{path}: line {line}: tag {tag!r} is not one of the task's labels "
                                     f"({', '.join(labels)})")
            ids.append(index[tag])
        out.append(ids)
    return out
