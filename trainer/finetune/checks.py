"""What fine-tuning, `predict` and `eval` check before any work: that the task dataset fits the
model (vocab size, lengths, labels), was built with the vocab the model was trained with, and is
the task the model was fine-tuned for."""

from __future__ import annotations

from bert_datagen.trainer.errors import DataError
from bert_datagen.trainer.finetune.data import TaskDataset
from bert_datagen.trainer.finetune.init import init_vocab, same_vocab
from bert_datagen.trainer.model.config import BertConfig
from bert_datagen.trainer.model.heads import head_class


def check_data_fits(dataset: TaskDataset, bert: BertConfig, what: str) -> None:
    problems = []
    if dataset.vocab_size != bert.vocab_size:
        problems.append(f"the dataset's vocab has {dataset.vocab_size} tokens but {what} has vocab_size "
                        f"{bert.vocab_size} (build the task dataset with the checkpoint's vocab.txt)")
    if dataset.max_seq_length > bert.max_position_embeddings:
        problems.append(f"sequences of {dataset.max_seq_length} tokens exceed max_position_embeddings "
                        f"{bert.max_position_embeddings}")
    if head_class(dataset.task_type).per_label and dataset.num_labels < 2:
        problems.append(f"a {dataset.task_type} task needs at least 2 labels, the manifest lists {dataset.num_labels}")
    if problems:
        raise DataError(f"{dataset.source}: data and model do not fit: " + "; ".join(problems))


def check_vocab(dataset: TaskDataset, init_from: str | None, init_checkpoint: str | None,
                allow_vocab_mismatch: bool = False) -> str | None:
    """Refuse a task dataset made with another vocab than the init checkpoint's, even of the same
    size (any two 30,522-token vocabs fit each other's embeddings, and fine-tuning would silently
    read other words). Returns a line for the log when there is nothing to compare, or when
    --allow-vocab-mismatch let a mismatch through."""
    model = init_from or init_checkpoint
    ref = init_vocab(init_from, init_checkpoint)
    if ref is None:
        return (f"note: {model} records no vocab (no vocab.txt beside it, no dataset record), so the "
                f"task dataset's vocab {dataset.vocab_path} cannot be compared with the checkpoint's")
    if same_vocab(ref, dataset.vocab_sha256, dataset.vocab_path):
        return None
    mismatch = (f"{dataset.vocab_path}: the task dataset's vocab (sha256 {dataset.vocab_sha256[:16]}) is not "
                f"{ref.described} (sha256 {ref.sha256[:16]})")
    if allow_vocab_mismatch:
        return f"warning: {mismatch}; fine-tuning anyway (--allow-vocab-mismatch)"
    raise DataError(f"{mismatch}: build the task dataset with the checkpoint's vocab, or pass "
                    "--allow-vocab-mismatch if the ids mean the same words")


def check_same_task(dataset: TaskDataset, task: dict, model: str, allow_other_task: bool = False,
                    allow_vocab_mismatch: bool = False) -> None:
    """Refuse to predict or score `dataset` with a head fine-tuned for another task. Another head
    shape cannot run at all; another task of the same shape (SST-2's head on MRPC: both two labels
    "0"/"1") runs and prints figures that mean nothing, so it needs `allow_other_task`."""
    mine = f"{dataset.task_kind} ({dataset.task_type}, labels {dataset.labels})"
    theirs = f"{task.get('kind')} ({task.get('type')}, labels {task.get('labels')})"
    if dataset.task_type != task.get("type") or dataset.num_labels != len(task.get("labels") or []):
        raise DataError(f"{dataset.source}: task {mine}, but {model} was fine-tuned for task {theirs}: "
                        "its head does not fit this task")
    if not allow_other_task and (dataset.task_kind != task.get("kind") or dataset.labels != task.get("labels")):
        raise DataError(f"{dataset.source}: task {mine}, but {model} was fine-tuned for task {theirs}; "
                        "pass --allow-other-task to run it on this task's data anyway")
    # Runs fine-tuned before the vocab was recorded have nothing to compare.
    recorded = task.get("vocab_sha256")
    if recorded and recorded != dataset.vocab_sha256 and not allow_vocab_mismatch:
        raise DataError(f"{dataset.vocab_path}: the dataset's vocab (sha256 {dataset.vocab_sha256[:16]}) is not the "
                        f"one {model} was fine-tuned with (sha256 {recorded[:16]}): its ids would be read as "
                        "other words; build the dataset with the run's vocab, or pass --allow-vocab-mismatch "
                        "if the ids mean the same words")


def task_summary(data: TaskDataset) -> str:
    """E.g. `glue/sst2 (classification, 2 labels)`; regression and span heads have no label set to count."""
    labels = f", {data.num_labels} labels" if head_class(data.task_type).per_label else ""
    return f"{data.task_kind} ({data.task_type}{labels})"


def threshold_unused(dataset: TaskDataset, evaluated: bool = True) -> str | None:
    """Why --null-score-diff-threshold would not be read, or None: only SQuAD v2.0 predictions choose
    between an answer and none, and only when a split is predicted."""
    from bert_datagen.trainer.finetune.evaluate import is_squad_v2

    if not is_squad_v2(dataset):
        return f"task {dataset.task_kind} has no unanswerable questions (only SQuAD v2.0 predictions read it)"
    if not evaluated:
        return "--eval-split none: nothing is predicted"
    return None
