"""Sentence and pair task files: TSV (quoting off, as the original), CSV (RFC 4180 quoting), JSONL.

The original reads TSV with `csv.reader(delimiter="\\t", quotechar=None)`: a `"` is an ordinary
character, and a row ends at its line break. A UTF-8 byte-order mark is dropped (the original's
tokenizer deletes it too, so no feature changes). Every error names the file and the line.
"""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Sequence
from dataclasses import dataclass

from bert_datagen.datagen.readers import jsonl_objects
from bert_datagen.datagen.tasks.config import TaskInputError

Column = int | str


@dataclass(frozen=True)
class ColumnSpec:
    """Where the texts and the label are: 0-based indexes (negative: from the end) or header names."""

    text_a: Column
    text_b: Column | None = None
    label: Column | None = None
    header: bool = True

    def to_dict(self) -> dict:
        return {"text_a": self.text_a, "text_b": self.text_b, "label": self.label, "header": self.header}


@dataclass(frozen=True)
class TextExample:
    """One row: its line in the file, its texts and its label as written (None: unlabelled)."""

    line: int
    text_a: str
    text_b: str | None
    label: str | None


def parse_column(value: str | None) -> Column | None:
    """A CLI column: an integer (index, negative from the end) or a name."""
    if value is None:
        return None
    text = value.strip()
    try:
        return int(text)
    except ValueError:
        return text


def decode_file(path: str, data: bytes) -> str:
    """Strict UTF-8 without a BOM, with CRLF read as LF; an invalid byte names its line."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        line = data[: err.start].count(b"\n") + 1
        raise TaskInputError(f"{path}: line {line}: not valid UTF-8 (byte 0x{data[err.start]:02x} at file "
                             f"offset {err.start})") from None
    if text.startswith("\ufeff"):
        text = text[1:]
    return text.replace("\r\n", "\n")


def _tsv_rows(text: str) -> list[tuple[int, list[str]]]:
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()  # the file's final line break (CoLA's dev.tsv has none: both read the same)
    return [(i, line.split("\t")) for i, line in enumerate(lines, start=1)]


def _csv_rows(path: str, text: str) -> list[tuple[int, list[str]]]:
    reader = csv.reader(io.StringIO(text, newline=""), strict=True)
    rows = []
    start = 1
    try:
        for fields in reader:
            rows.append((start, fields))
            start = reader.line_num + 1
    except csv.Error as err:
        raise TaskInputError(f"{path}: line {start}: not valid CSV ({err})") from None
    return rows


def read_table(path: str, data: bytes, fmt: str) -> list[tuple[int, list[str]]]:
    """(line number, fields) of every row of a TSV or CSV file, header included."""
    text = decode_file(path, data)
    return _tsv_rows(text) if fmt == "tsv" else _csv_rows(path, text)


def read_jsonl(path: str, data: bytes) -> list[tuple[int, dict]]:
    """(line number, object) of every non-blank line of a JSONL file."""
    return list(jsonl_objects(path, decode_file(path, data), error=TaskInputError))


def _resolve(path: str, column: Column | None, header: list[str] | None, what: str) -> int | None:
    if column is None or isinstance(column, int):
        return column
    if header is None:
        raise TaskInputError(f"{path}: {what} column {column!r} is a name, but the file is read without a "
                             "header (--no-header): give a 0-based index")
    if column not in header:
        raise TaskInputError(f"{path}: line 1: header has no column {column!r} (columns: {', '.join(header)})")
    return header.index(column)


def table_examples(path: str, rows: Sequence[tuple[int, list[str]]], spec: ColumnSpec,
                   labelled: bool, fmt: str = "tsv") -> list[TextExample]:
    """The examples of a TSV/CSV table; `labelled` False reads no label column."""
    header = None
    body = rows
    if spec.header:
        if not rows:
            raise TaskInputError(f"{path}: empty file: expected a header line")
        header = [h.strip() for h in rows[0][1]]
        body = rows[1:]
    a = _resolve(path, spec.text_a, header, "--text-a")
    b = _resolve(path, spec.text_b, header, "--text-b")
    lab = _resolve(path, spec.label, header, "--label") if labelled else None
    used = [c for c in (a, b, lab) if c is not None]
    # A column counted from the end must lie after every column counted from the start: a short
    # row must not read a text as its label.
    need = max([c + 1 for c in used if c >= 0], default=0) + max([-c for c in used if c < 0], default=0)
    out = []
    for lineno, fields in body:
        if len(fields) < need:
            how = "tab separated, quotes are literal" if fmt == "tsv" else "comma separated"
            raise TaskInputError(f"{path}: line {lineno}: {len(fields)} column(s), the layout needs at least "
                                 f"{need} (text column(s) {_cols(a, b)}{_lab(lab)}; {how})")
        out.append(_example(path, lineno, fields[a], fields[b] if b is not None else None,
                            fields[lab] if lab is not None else None))
    return out


def _cols(a: int | None, b: int | None) -> str:
    return ", ".join(str(c) for c in (a, b) if c is not None)


def _lab(lab: int | None) -> str:
    return f", label column {lab}" if lab is not None else ""


def jsonl_examples(path: str, rows: Sequence[tuple[int, dict]], spec: ColumnSpec, labelled: bool,
                   label_forms: dict | None = None) -> list[TextExample]:
    """The examples of a JSONL file: `--text-a`, `--text-b`, `--label` name fields.

    ``label_forms`` (shared by a split's files; classification only): class labels must be written
    one way, or `1`, `1.0` and `true` would silently become three classes (`check_label_form`)."""
    fields = [("--text-a", spec.text_a), ("--text-b", spec.text_b), ("--label", spec.label if labelled else None)]
    out = []
    for lineno, obj in rows:
        values = []
        for option, name in fields:
            if name is None:
                values.append(None)
                continue
            key = str(name)
            if key not in obj:
                raise TaskInputError(f"{path}: line {lineno}: no field {key!r} ({option}; fields: "
                                     f"{', '.join(sorted(obj)) or 'none'})")
            values.append(_json_value(path, lineno, key, obj[key], option == "--label"))
            if option == "--label" and label_forms is not None:
                check_label_form(label_forms, path, lineno, obj[key], values[-1])
        out.append(_example(path, lineno, *values))
    return out


_JSON_TYPES = {bool: "a boolean", int: "a number", float: "a number", str: "a string"}


def check_label_form(forms: dict, path: str, lineno: int, value: object, text: str) -> None:
    """Refuse a class label whose JSON type differs from the first label's (``"1"``, ``1``, ``true``),
    or a number written another way than before (``1`` and ``1.0``): which of them is meant cannot
    be guessed, and every form would be a class of its own. ``forms``: what was seen, and where."""
    kind = _JSON_TYPES.get(type(value), "")
    first = forms.setdefault("type", (kind, path, lineno, text))
    if first[0] != kind:
        raise TaskInputError(f"{path}: line {lineno}: label {text!r} is {kind}, but the label on line {first[2]} "
                             f"of {first[1]} ({first[3]!r}) is {first[0]}; write every label of a task the "
                             "same way (all strings, all numbers or all booleans)")
    if kind == "a number":
        number = float(value)  # type: ignore[arg-type]
        seen = forms.setdefault(("number", number), (text, path, lineno))
        if seen[0] != text:
            raise TaskInputError(f"{path}: line {lineno}: label {text} is the number written {seen[0]} on line "
                                 f"{seen[2]} of {seen[1]}; write each label one way (it names one class)")


def _json_value(path: str, lineno: int, key: str, value: object, is_label: bool) -> str:
    if isinstance(value, str):
        return value
    if is_label and isinstance(value, int | float) and not isinstance(value, bool):
        return str(value)
    if is_label and isinstance(value, bool):
        return "true" if value else "false"
    raise TaskInputError(f"{path}: line {lineno}: field {key!r} is {type(value).__name__}, not a string")


def _example(path: str, lineno: int, a: str | None, b: str | None, label: str | None) -> TextExample:
    assert a is not None
    for name, text in (("text A", a), ("text B", b)):
        if text is not None and not text.strip():
            raise TaskInputError(f"{path}: line {lineno}: empty {name}")
    if label is not None:
        label = label.strip()
        if not label:
            raise TaskInputError(f"{path}: line {lineno}: empty label")
    return TextExample(lineno, a, b, label)


def label_ids(path: str, examples: Sequence[TextExample], labels: Sequence[str]) -> list[int]:
    """Index of each example's label in the fixed label list; a label outside it names its line."""
    index = {lab: i for i, lab in enumerate(labels)}
    out = []
    for ex in examples:
        if ex.label is None:
            out.append(0)
            continue
        i = index.get(ex.label)
        if i is None:
            raise TaskInputError(f"{path}: line {ex.line}: label {ex.label!r} is not one of the task's labels "
                                 f"({', '.join(labels)})")
        out.append(i)
    return out


def regression_values(path: str, examples: Sequence[TextExample]) -> list[float]:
    """Each example's label as a finite float (0.0 when unlabelled)."""
    out = []
    for ex in examples:
        if ex.label is None:
            out.append(0.0)
            continue
        try:
            value = float(ex.label)
        except ValueError:
            value = math.nan
        if not math.isfinite(value):
            raise TaskInputError(f"{path}: line {ex.line}: regression label {ex.label!r} is not a finite number")
        out.append(value)
    return out
