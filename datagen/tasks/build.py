"""One split of a task: its files read as the task's examples, its label list, its records.

`read_split` parses (and checks) every file of a split; `split_labels` fixes the label list (the
official one, `--labels`, or the sorted labels of the first split); `split_records` builds the
records in example order. The pipeline decides the example order (train: seeded) in between.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from bert_datagen.datagen import rng
from bert_datagen.datagen.tasks import conll, delimited, glue, squad_read
from bert_datagen.datagen.tasks.classify import classification_records
from bert_datagen.datagen.tasks.config import (
    CLASSIFICATION,
    REGRESSION,
    SPAN,
    TAGGING,
    TaskConfig,
    TaskInputError,
    split_may_be_unlabelled,
)
from bert_datagen.datagen.tasks.delimited import ColumnSpec, parse_column
from bert_datagen.datagen.tasks.features import TaskRecords, combine
from bert_datagen.datagen.tasks.squad import squad_records
from bert_datagen.datagen.tasks.tagging import tagging_records


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
        return glue.layout_for_split(config.kind, split, config.is_training(split))
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
    question_ids: dict[str, str] = {}  # across the split's files
    label_forms: dict | None = {} if config.task_type == CLASSIFICATION else None
    for path, data in files:
        if config.task_type == SPAN:
            examples, counts = squad_read.read_squad(path, data, kind == "squad2", config.is_training(split),
                                                     question_ids)
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
            if kind == "jsonl":
                rows = delimited.read_jsonl(path, data)
                labelled = spec.label is not None and not (may_lack and rows and str(spec.label) not in rows[0][1])
                examples = delimited.jsonl_examples(path, rows, spec, labelled, label_forms)
            else:
                fmt = "csv" if kind == "csv" else "tsv"
                table = delimited.read_table(path, data, fmt)
                labelled = spec.label is not None and not (
                    may_lack and spec.header and isinstance(spec.label, str) and table
                    and spec.label not in [h.strip() for h in table[0][1]])
                examples = delimited.table_examples(path, table, spec, labelled, fmt)
            aliases = glue.TASKS[kind].label_aliases if kind in glue.TASKS else {}
            if aliases:
                examples = [ex if ex.label not in aliases else
                            delimited.TextExample(ex.line, ex.text_a, ex.text_b, aliases[ex.label]) for ex in examples]
        if not labelled and not may_lack and not (config.task_type == SPAN and not config.is_training(split)):
            raise TaskInputError(f"{path}: split {split!r} has no labels; only a split named test* may be "
                                 "unlabelled")
        if out.files and labelled != out.labelled:
            raise TaskInputError(f"{path}: split {split!r} mixes labelled and unlabelled files")
        out.labelled = labelled
        out.files.append((path, examples))
    return out


def fixed_labels(config: TaskConfig) -> list[str] | None:
    """The label list when the config alone fixes it; None when it comes from the first split."""
    if config.task_type in (REGRESSION, SPAN):
        return []
    if config.kind in glue.TASKS:
        return list(glue.TASKS[config.kind].labels)
    if config.labels is not None:
        return list(config.labels)
    return None


def split_labels(config: TaskConfig, first: SplitInput) -> list[str]:
    """The task's label list, in id order ([] for regression and span tasks)."""
    fixed = fixed_labels(config)
    if fixed is not None:
        return fixed
    if not first.labelled:
        raise TaskInputError(f"split {first.name!r} is unlabelled: give the label list with --labels")
    if config.task_type == TAGGING:
        seen = {t for _, sentences in first.files for s in sentences for t in (s.tags or [])}
    else:
        seen = {ex.label for _, exs in first.files for ex in exs}
    if not seen:
        raise TaskInputError(f"split {first.name!r} has no examples to take the label list from: give --labels")
    return sorted(seen)


@dataclass
class Prepared:
    """A split's examples ready for feature building: labels resolved to ids (checked against the
    label list, so a message names the file and line), in the order records are to be written."""

    name: str
    labelled: bool
    examples: list
    values: list | None  # label id / regression value / tag ids per example; None for span tasks
    counts: dict[str, int] = field(default_factory=dict)  # reading's counts (on the first part only)

    def __len__(self) -> int:
        return len(self.examples)

    def reordered(self, order: Sequence[int]) -> Prepared:
        values = None if self.values is None else [self.values[i] for i in order]
        return Prepared(self.name, self.labelled, [self.examples[i] for i in order], values, self.counts)

    def parts(self, size: int) -> list[Prepared]:
        """Consecutive parts of at most `size` examples (at least one part, maybe empty)."""
        cuts = range(0, max(len(self.examples), 1), size)
        return [Prepared(self.name, self.labelled, self.examples[lo:lo + size],
                         None if self.values is None else self.values[lo:lo + size],
                         self.counts if k == 0 else {}) for k, lo in enumerate(cuts)]


def prepare_split(config: TaskConfig, split: SplitInput, labels: Sequence[str]) -> Prepared:
    """The split's examples in file order with their label values."""
    values: list | None
    if config.task_type == SPAN:
        values = None
    elif config.task_type == TAGGING:
        values = [t for path, sentences in split.files for t in conll.tag_ids(path, sentences, labels)]
    elif config.task_type == CLASSIFICATION:
        values = [v for path, exs in split.files for v in delimited.label_ids(path, exs, labels)]
    else:
        values = [v for path, exs in split.files for v in delimited.regression_values(path, exs)]
    return Prepared(split.name, split.labelled, split.examples, values, dict(split.counts))


def train_order(num_examples: int, seed: int) -> np.ndarray:
    """The seeded order of a training split: examples sorted by a key drawn for their position in
    file order, so any worker computes the same order from the seed alone."""
    keys = rng.u64_for_keys(np.uint64(rng.derive_key(seed, "task-train-order")),
                            np.arange(num_examples, dtype=np.uint64))
    return np.argsort(keys, kind="stable")


def part_records(config: TaskConfig, part: Prepared, tokenizer) -> TaskRecords:
    """The records of one part of a split (numbered within the part; `combine` numbers the split)."""
    L = config.max_seq_length
    assert L is not None
    if config.task_type == SPAN:
        records = squad_records(tokenizer, part.examples, L, config.doc_stride, config.max_query_length,
                                config.is_training(part.name), config.kind == "squad2", part.labelled)
    elif config.task_type == TAGGING:
        records = tagging_records(tokenizer, part.examples, part.values or [], L, part.labelled)
    else:
        records = classification_records(tokenizer, [ex.text_a for ex in part.examples],
                                         [ex.text_b for ex in part.examples], part.values or [], L, config.task_type)
    records.counts.update(part.counts)
    return records


def split_records(config: TaskConfig, split: SplitInput, labels: Sequence[str], tokenizer,
                  order: Sequence[int] | None = None, part_size: int = 1 << 30) -> TaskRecords:
    """The records of a whole split, its examples in `order` (None: file order), built in parts."""
    prepared = prepare_split(config, split, labels)
    if order is not None:
        prepared = prepared.reordered(order)
    return combine([part_records(config, part, tokenizer) for part in prepared.parts(part_size)])
