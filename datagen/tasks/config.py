"""The task-data config: parsed by the CLI, validated before any work, written into the manifest."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from bert_datagen.datagen.config import (
    MAX_SEQ_LENGTH,
    MAX_SHARDS,
    SEED_RANGE,
    ConfigError,
    check_target_shard_mb,
)
from bert_datagen.datagen.readers import InputError

GLUE_TASKS = ("cola", "sst2", "mrpc", "stsb", "qqp", "mnli", "qnli", "rte", "wnli")
GENERIC_KINDS = ("tsv", "csv", "jsonl")
SPAN_KINDS = ("squad", "squad2")
TAGGING_KINDS = ("conll",)
KINDS = tuple(f"glue/{t}" for t in GLUE_TASKS) + ("xnli",) + GENERIC_KINDS + SPAN_KINDS + TAGGING_KINDS
SCHEMES = ("iob1", "iob2", "bioes")

# Task types (a manifest's task.type). SPAN is extractive QA's answer span (SQuAD); the "span" masking
# unit of pre-training data is another thing: bert_datagen.datagen.span_masking.
CLASSIFICATION, REGRESSION, SPAN, TAGGING = "classification", "regression", "span", "tagging"
TRAIN_SPLIT = "train"


class TaskInputError(InputError):
    """A task file that cannot be read as its task; the message names the file, the line and why."""


def split_is_training(name: str, train_splits: tuple[str, ...] = (TRAIN_SPLIT,)) -> bool:
    """A training split (`train`, or those of --train-splits) is written in training mode: shuffled,
    read with the train layout, SQuAD answer labels; every other split is kept in order to predict."""
    return name in train_splits


def split_may_be_unlabelled(name: str) -> bool:
    """GLUE test files carry no labels: a split whose name starts with `test` may lack them."""
    return name.startswith("test")


@dataclass(frozen=True)
class TaskConfig:
    """Everything that decides the bytes of a task dataset (runner options do not)."""

    kind: str
    max_seq_length: int | None = None  # None: 384 for span tasks, 128 otherwise
    do_lower_case: bool = True
    text_a: str | None = None
    text_b: str | None = None
    label: str | None = None
    header: bool | None = None  # None: the kind's default (GLUE: the official layout; tsv/csv: True)
    labels: tuple[str, ...] | None = None
    regression: bool = False
    doc_stride: int = 128
    max_query_length: int = 64
    token_column: int = 0
    tag_column: int = -1
    scheme: str = "iob2"
    random_seed: int = 12345
    num_shards: int | None = None  # None: derived from target_shard_mb
    target_shard_mb: float = 64.0
    train_splits: tuple[str, ...] = (TRAIN_SPLIT,)  # the splits written in training mode

    def __post_init__(self) -> None:
        if self.max_seq_length is None:
            object.__setattr__(self, "max_seq_length", 384 if self.kind in SPAN_KINDS else 128)
        if self.labels is not None:
            object.__setattr__(self, "labels", tuple(self.labels))
        object.__setattr__(self, "train_splits", tuple(self.train_splits))
        self.validate()

    def is_training(self, split: str) -> bool:
        return split_is_training(split, self.train_splits)

    @property
    def task_type(self) -> str:
        return self.type_of(self.kind, self.regression)

    @staticmethod
    def type_of(kind: str, regression: bool = False) -> str:
        if kind in SPAN_KINDS:
            return SPAN
        if kind in TAGGING_KINDS:
            return TAGGING
        if kind == "glue/stsb" or regression:
            return REGRESSION
        return CLASSIFICATION

    def validate(self) -> None:
        if self.kind not in KINDS:
            raise ConfigError(f"--task {self.kind!r} is not one of {', '.join(KINDS)}")
        seq = self.max_seq_length
        assert seq is not None
        if not 5 <= seq <= MAX_SEQ_LENGTH:
            raise ConfigError(f"--max-seq-length {seq} must be in [5, {MAX_SEQ_LENGTH}]")
        if not SEED_RANGE[0] <= self.random_seed <= SEED_RANGE[1]:
            raise ConfigError(f"--random-seed {self.random_seed} must fit in 64 signed bits")
        if self.kind in GENERIC_KINDS:
            if self.text_a is None:
                raise ConfigError(f"--task {self.kind} needs --text-a (a column name, 0-based index or field)")
            if self.label is None and self.labels is None and not self.regression:
                raise ConfigError(f"--task {self.kind} without --label needs --labels or --regression "
                                  "(the label list of an unlabelled dataset)")
        elif any(v is not None for v in (self.text_a, self.text_b, self.label, self.header)):
            raise ConfigError(f"--text-a/--text-b/--label/--header are for --task tsv, csv or jsonl; "
                              f"--task {self.kind} has a fixed layout")
        if self.kind == "jsonl" and self.header is not None:
            raise ConfigError("--header/--no-header do not apply to --task jsonl")
        if self.regression and self.kind not in GENERIC_KINDS:
            raise ConfigError("--regression is for --task tsv, csv or jsonl (glue/stsb is regression already)")
        if self.labels is not None:
            self._validate_labels()
        if self.kind in SPAN_KINDS:
            self._validate_answer_span()
        if self.kind in TAGGING_KINDS and self.scheme not in SCHEMES:
            raise ConfigError(f"--scheme {self.scheme!r} is not one of {', '.join(SCHEMES)}")
        if self.num_shards is not None and not 1 <= self.num_shards <= MAX_SHARDS:
            raise ConfigError(f"--num-shards {self.num_shards} must be in [1, {MAX_SHARDS:,}]: every shard is a file")
        check_target_shard_mb(self.target_shard_mb)
        if not self.train_splits or any(not s for s in self.train_splits) or \
                len(set(self.train_splits)) != len(self.train_splits):
            raise ConfigError(f"--train-splits {','.join(self.train_splits)!r} must name splits, each once")

    def check_split_names(self, names: Sequence[str]) -> None:
        """ConfigError unless each --split name is given once and each --train-splits name is one of
        them; the default (`train`) may be absent: a dataset of predict splits only."""
        twice = sorted({n for n in names if list(names).count(n) > 1})
        if twice:
            raise ConfigError(f"--split: split {twice[0]!r} is given twice")
        unknown = [n for n in self.train_splits if n not in names]
        if unknown and self.train_splits != (TRAIN_SPLIT,):
            raise ConfigError(f"--train-splits: {unknown[0]!r} is not one of the --split names ({', '.join(names)})")

    def _validate_labels(self) -> None:
        labels = self.labels or ()
        if self.kind.startswith("glue/") or self.kind == "xnli":
            raise ConfigError(f"--labels: --task {self.kind} uses its official label list")
        if self.task_type == REGRESSION:
            raise ConfigError("--labels does not apply to a regression task")
        if self.task_type == SPAN:
            raise ConfigError(f"--labels does not apply to --task {self.kind} (answers are spans, not labels)")
        if not labels or any(not lab for lab in labels):
            raise ConfigError(f"--labels {','.join(labels)!r} must be a non-empty list of non-empty labels")
        if len(set(labels)) != len(labels):
            raise ConfigError(f"--labels {','.join(labels)!r} lists a label twice")

    def _validate_answer_span(self) -> None:
        seq = self.max_seq_length
        assert seq is not None
        if self.max_query_length < 1:
            raise ConfigError(f"--max-query-length {self.max_query_length} must be >= 1")
        if seq - self.max_query_length - 3 < 1:
            raise ConfigError(f"--max-seq-length {seq} leaves no room for the document after a "
                              f"{self.max_query_length}-token question and [CLS] [SEP] [SEP]")
        if self.doc_stride < 1:
            raise ConfigError(f"--doc-stride {self.doc_stride} must be >= 1")

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        if self.labels is not None:
            d["labels"] = list(self.labels)
        # Written only when not the default, so the manifests of datasets made before it keep their bytes.
        if self.train_splits == (TRAIN_SPLIT,):
            del d["train_splits"]
        else:
            d["train_splits"] = list(self.train_splits)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TaskConfig:
        known = {f.name for f in dataclasses.fields(cls)}
        kwargs = {k: v for k, v in d.items() if k in known}
        if kwargs.get("labels") is not None:
            kwargs["labels"] = tuple(kwargs["labels"])
        if "train_splits" in kwargs:
            kwargs["train_splits"] = tuple(kwargs["train_splits"])
        return cls(**kwargs)
