"""One split of a task: its files read as the task's examples, its label list, its records.

`read_split` parses (and checks) every file of a split; `split_labels` fixes the label list (the
official one, `--labels`, or the sorted labels of the first split); `split_records` builds the
records in example order. The pipeline decides the example order (train: seeded) in between.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from datagen.tasks import conll, delimited, glue, squad_read
from datagen.tasks.classify import classification_records
from datagen.tasks.config import (
    CLASSIFICATION,
    REGRESSION,
    SPAN,
    TAGGING,
    TaskConfig,
    TaskInputError,
    split_is_training,
    split_may_be_unlabelled,
)
from datagen.tasks.delimited import ColumnSpec, parse_column
from datagen.tasks.features import TaskRecords
from datagen.tasks.squad import squad_records
from datagen.tasks.tagging import tagging_records


@dataclass
class SplitInput:
    """The examples of one split: per file, (path, examples) in file order."""

    name: str
    files: list[tuple[str, list]] = field(default_factory=list)
    labelled: bool = True
    counts: dict[str, int] = field(default_factory=dict)

    @property
    def examples(self) -> list:
        return [ex for _, exs in self.files for ex in exs]


def column_spec(config: TaskConfig, split: str) -> ColumnSpec:
    """The columns a split of a sentence/pair task is read with."""
    if config.kind in glue.TASKS:
        return glue.layout_for_split(config.kind, split)
    return ColumnSpec(text_a=parse_column(config.text_a), text_b=parse_column(config.text_b),  # type: ignore[arg-type]
                      label=parse_column(config.label), header=config.header is not False)


def columns_description(config: TaskConfig) -> dict:
    """The column spec written into the manifest."""
    if config.task_type == SPAN:
        return {"format": "squad-json"}
    if config.task_type == TAGGING:
        return {"token_column": config.token_column, "tag_column": config.tag_column}
    if config.kind in glue.TASKS:
        return {role: glue.layout_for_split(config.kind, split).to_dict()
                for role, split in (("train", "train"), ("dev", "dev"), ("test", "test"))}
    return column_spec(config, "train").to_dict()


def read_split(config: TaskConfig, split: str, files: Sequence[tuple[str, bytes]]) -> SplitInput:
    """Parse every file of a split (in the given order) as the task's examples."""
    out = SplitInput(split)
    kind = config.kind
    may_lack = split_may_be_unlabelled(split)
    for path, data in files:
        if config.task_type == SPAN:
            examples, counts = squad_read.read_squad(path, data, kind == "squad2", split_is_training(split))
            for key, value in counts.items():
                out.counts[key] = out.counts.get(key, 0) + value
            labelled = all(ex.answers is not None for ex in examples)
        elif config.task_type == TAGGING:
            examples = conll.read_conll(path, data, config.token_column, config.tag_column, may_lack)
            changed = conll.check_tags(path, examples, config.scheme)
            if config.scheme == "iob1":
                out.counts["iob1_tags_converted"] = out.counts.get("iob1_tags_converted", 0) + changed
            labelled = all(s.tags is not None for s in examples)
        else:
            spec = column_spec(config, split)
            labelled = spec.label is not None
            if kind == "jsonl":
                examples = delimited.jsonl_examples(path, delimited.read_jsonl(path, data), spec, labelled)
            else:
                fmt = "csv" if kind == "csv" else "tsv"
                examples = delimited.table_examples(path, delimited.read_table(path, data, fmt), spec, labelled, fmt)
            aliases = glue.TASKS[kind].label_aliases if kind in glue.TASKS else {}
            if aliases:
                examples = [ex if ex.label not in aliases else
                            delimited.TextExample(ex.line, ex.text_a, ex.text_b, aliases[ex.label]) for ex in examples]
        if not labelled and not may_lack and not (config.task_type == SPAN and not split_is_training(split)):
            raise TaskInputError(f"{path}: split {split!r} has no labels; only a split named test* may be "
                                 "unlabelled")
        if out.files and labelled != out.labelled:
            raise TaskInputError(f"{path}: split {split!r} mixes labelled and unlabelled files")
        out.labelled = labelled
        out.files.append((path, examples))
    return out


def split_labels(config: TaskConfig, first: SplitInput) -> list[str]:
    """The task's label list, in id order ([] for regression and span tasks)."""
    if config.task_type in (REGRESSION, SPAN):
        return []
    if config.kind in glue.TASKS:
        return list(glue.TASKS[config.kind].labels)
    if config.labels is not None:
        return list(config.labels)
    if not first.labelled:
        raise TaskInputError(f"split {first.name!r} is unlabelled: give the label list with --labels")
    if config.task_type == TAGGING:
        seen = {t for _, sentences in first.files for s in sentences for t in (s.tags or [])}
    else:
        seen = {ex.label for _, exs in first.files for ex in exs}
    if not seen:
        raise TaskInputError(f"split {first.name!r} has no examples to take the label list from: give --labels")
    return sorted(seen)


def split_records(config: TaskConfig, split: SplitInput, labels: Sequence[str], tokenizer,
                  order: Sequence[int] | None = None) -> TaskRecords:
    """The records of a split: its examples in `order` (indexes into file order; None: file order).

    Labels are checked against the label list first, in file order, so a message names the line."""
    L = config.max_seq_length
    assert L is not None
    training = split_is_training(split.name)
    examples = split.examples

    def ordered(values: list) -> list:
        return values if order is None else [values[i] for i in order]

    if config.task_type == SPAN:
        records = squad_records(tokenizer, ordered(examples), L, config.doc_stride, config.max_query_length,
                                training, config.kind == "squad2", split.labelled)
    elif config.task_type == TAGGING:
        tags = [t for path, sentences in split.files for t in conll.tag_ids(path, sentences, labels)]
        records = tagging_records(tokenizer, ordered(examples), ordered(tags), L, split.labelled)
    else:
        if config.task_type == CLASSIFICATION:
            values: list = [v for path, exs in split.files for v in delimited.label_ids(path, exs, labels)]
        else:
            values = [v for path, exs in split.files for v in delimited.regression_values(path, exs)]
        examples, values = ordered(examples), ordered(values)
        records = classification_records(tokenizer, [ex.text_a for ex in examples], [ex.text_b for ex in examples],
                                         values, L, config.task_type)
    records.counts.update(split.counts)
    return records
