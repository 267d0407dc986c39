"""The GLUE tasks and XNLI: the column layout of their official files and their official label lists.

The original `run_classifier.py` has processors for MRPC, CoLA, MNLI and XNLI; the other GLUE tasks
follow the layout of GLUE's own files (as GLUE's baseline and later ports read them). A layout
depends on the split's role: `train`, the dev splits (any other name) and `test*` (GLUE test
files have no label column, and a different one for some tasks).

Indexes are 0-based; -1 is the last column (MNLI's `gold_label`, whatever the number of
annotator columns before it).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from bert_datagen.datagen.tasks.config import split_is_training, split_may_be_unlabelled
from bert_datagen.datagen.tasks.delimited import ColumnSpec

BINARY = ("0", "1")
NLI3 = ("contradiction", "entailment", "neutral")
ENTAIL2 = ("entailment", "not_entailment")


@dataclass(frozen=True)
class GlueTask:
    name: str
    labels: tuple[str, ...]  # () for regression
    train: ColumnSpec
    test: ColumnSpec  # the layout of the official test file (no label column unless it has one)
    dev: ColumnSpec | None = None  # None: as train
    # Label spellings of some files mapped to the official list (XNLI's translated MNLI train files).
    label_aliases: dict[str, str] = field(default_factory=dict)

    @property
    def regression(self) -> bool:
        return not self.labels


def _pair(a: int, b: int, label: int | None, header: bool = True) -> ColumnSpec:
    return ColumnSpec(text_a=a, text_b=b, label=label, header=header)


def _single(a: int, label: int | None, header: bool = True) -> ColumnSpec:
    return ColumnSpec(text_a=a, text_b=None, label=label, header=header)


TASKS: dict[str, GlueTask] = {
    # No header in train/dev: source, label, original mark, sentence. Test: index, sentence.
    "glue/cola": GlueTask("cola", BINARY, train=_single(3, 1, header=False), test=_single(1, None)),
    "glue/sst2": GlueTask("sst2", BINARY, train=_single(0, 1), test=_single(1, None)),
    # Quality, #1 ID, #2 ID, #1 String, #2 String; test: index, #1 ID, #2 ID, #1 String, #2 String.
    "glue/mrpc": GlueTask("mrpc", BINARY, train=_pair(3, 4, 0), test=_pair(3, 4, None)),
    # index genre filename year old_index source1 source2 sentence1 sentence2 score.
    "glue/stsb": GlueTask("stsb", (), train=_pair(7, 8, -1), test=_pair(7, 8, None)),
    # id qid1 qid2 question1 question2 is_duplicate; test: id question1 question2.
    "glue/qqp": GlueTask("qqp", BINARY, train=_pair(3, 4, 5), test=_pair(1, 2, None)),
    # index promptID pairID genre 4 parses sentence1 sentence2 [label1..label5] gold_label.
    "glue/mnli": GlueTask("mnli", NLI3, train=_pair(8, 9, -1), test=_pair(8, 9, None)),
    # index question sentence label.
    "glue/qnli": GlueTask("qnli", ENTAIL2, train=_pair(1, 2, -1), test=_pair(1, 2, None)),
    "glue/rte": GlueTask("rte", ENTAIL2, train=_pair(1, 2, -1), test=_pair(1, 2, None)),
    "glue/wnli": GlueTask("wnli", BINARY, train=_pair(1, 2, -1), test=_pair(1, 2, None)),
    # Train: XNLI-MT multinli.train.LANG.tsv (premise hypo label, "contradictory" for contradiction);
    # dev/test: xnli.dev.tsv / xnli.test.tsv (language gold_label ... sentence1 sentence2 ...), which
    # carry labels. All languages are kept (the original keeps only "zh"); filter files beforehand.
    "xnli": GlueTask("xnli", NLI3, train=_pair(0, 1, 2), dev=_pair(6, 7, 1), test=_pair(6, 7, 1),
                     label_aliases={"contradictory": "contradiction"}),
}


def layout_for_split(kind: str, split: str, training: bool | None = None) -> ColumnSpec:
    """The column layout a GLUE/XNLI split is read with (``training`` None: by the split's name)."""
    task = TASKS[kind]
    if split_is_training(split) if training is None else training:
        return task.train
    if split_may_be_unlabelled(split):
        return task.test
    return task.dev or task.train
