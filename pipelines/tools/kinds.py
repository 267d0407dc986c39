"""What verify / inspect / stats / diff / the card do for each kind of dataset: one table.

A dataset's kind is the contract's (`Dataset.kind`, from the manifest's "kind"; TFRecords without a
manifest are pre-training data). The commands look their implementation up here once, so a new kind
is one new row, not a branch in every command.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

from bert_datagen.contract.dataset import Dataset, DatasetError, ShardRef
from bert_datagen.contract.features import PRETRAINING, TASK
from bert_datagen.contract.manifest import Manifest
from bert_datagen.datagen.config import DatagenConfig
from bert_datagen.datagen.example_codec import decode_batch
from bert_datagen.datagen.tasks.config import TaskConfig
from bert_datagen.pipelines.tools import inspection, stats, task_datasets, verify
from bert_datagen.pipelines.tools.card_sections import render_pretraining_card
from bert_datagen.pipelines.tools.task_card import render_task_card

View = tuple[dict | None, list[tuple[int, str]]]  # one record as plain data (None: unreadable), its problems


@dataclass(frozen=True)
class KindTools:
    """One kind's implementations, all with the same signatures across kinds."""

    # (ds, *, workers, max_problems, check_records) -> VerifyReport
    verify: Callable[..., verify.VerifyReport]
    # (ds, *, split, shard, index, count) -> (shard, record views, problems)
    inspect: Callable[..., tuple[ShardRef, list[dict], list[str]]]
    format_record: Callable[[dict, str, bool], str]  # (view, shard name, words)
    stats: Callable[..., dict]  # (ds, *, split, workers, top)
    format_stats: Callable[[dict], str]
    plot_stats: Callable[[dict, str], str]  # (figures, PNG path) -> path
    record_view: Callable[[Dataset, str, int, bytes], View]  # (ds, split, index in its shard, payload)
    config_defaults: Callable[[], dict]  # a config field added after a dataset was made: its value there
    card: Callable[[str, Manifest], str]  # (dataset dir, manifest) -> the card's Markdown


def _pretraining_view(ds: Dataset, split: str, index: int, payload: bytes) -> View:
    batch, problems = decode_batch([payload], [index], ds.shape)
    return (inspection.record_view(batch, 0, ds.vocab, ds.shape) if len(batch) else None), problems  # type: ignore[arg-type]


def _pretraining_defaults() -> dict:
    return {k: v for k, v in DatagenConfig().to_dict().items() if k != "extra"}


def _task_inspect(ds: Dataset, *, split: str | None, shard: int, index: int, count: int
                  ) -> tuple[ShardRef, list[dict], list[str]]:
    ref, views = task_datasets.inspect_task(ds, split=split, shard=shard, index=index, count=count)
    return ref, views, []  # a record that does not parse is a RecordError, not a listed problem


def _task_format_record(view: dict, shard_name: str, words: bool) -> str:
    return task_datasets.format_task_record(view, f"{shard_name} record {view['index']}")


def _task_stats(ds: Dataset, *, split: str | None, workers: int | None, top: int) -> dict:
    return task_datasets.task_stats(ds, split)  # one process: a split is read as one column batch


def _task_view(ds: Dataset, split: str, index: int, payload: bytes) -> View:
    try:
        f = task_datasets.decode_record(ds, split, payload)
    except ValueError as e:
        return None, [(0, str(e))]
    return task_datasets.record_view(ds, split, f, 0), []


def _task_defaults() -> dict:
    # None defaults are resolved per task kind when a config is built (max_seq_length, header):
    # a manifest always holds the resolved value, so there is no default to fill in.
    return {f.name: f.default for f in dataclasses.fields(TaskConfig)
            if f.default is not dataclasses.MISSING and f.default is not None}


TOOLS: dict[str, KindTools] = {
    PRETRAINING: KindTools(
        verify=verify.verify, inspect=inspection.inspect_records,
        format_record=lambda view, name, words: inspection.format_record(view, name, words=words),
        stats=stats.compute_stats, format_stats=stats.format_stats, plot_stats=stats.plot_stats,
        record_view=_pretraining_view, config_defaults=_pretraining_defaults, card=render_pretraining_card),
    TASK: KindTools(
        verify=task_datasets.verify_task, inspect=_task_inspect, format_record=_task_format_record,
        stats=_task_stats, format_stats=task_datasets.format_task_stats, plot_stats=task_datasets.plot_task_stats,
        record_view=_task_view, config_defaults=_task_defaults, card=render_task_card),
}


def tools_for(kind: str) -> KindTools:
    """The implementations for datasets of `kind`; DatasetError for a kind no tool knows."""
    try:
        return TOOLS[kind]
    except KeyError:
        raise DatasetError(f"dataset kind {kind!r}: no tools for it (known: {', '.join(sorted(TOOLS))})") from None
