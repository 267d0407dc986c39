"""Checks on a freshly generated dataset, made before it replaces anything: an empty train split is
an error; what a user would want to know (a small eval split, many unknown tokens, more shards than
records) becomes a warning in the run summary."""

from __future__ import annotations

from typing import Any

from bert_datagen.contract.manifest import Manifest
from bert_datagen.datagen.config import DatagenConfig

# Below this many records, eval metrics move by whole points from one record to the next.
MIN_EVAL_RECORDS = 300
MAX_UNK_RATE = 0.01


def empty_split_error(manifest: Manifest, config: DatagenConfig) -> str | None:
    """Why this dataset cannot be trained on, or None."""
    if manifest.split_records("train") > 0:
        return None
    documents = manifest.totals["documents"]
    eval_records = manifest.split_records("eval")
    if config.eval_fraction > 0:
        return (f"--eval-fraction {config.eval_fraction} put every one of the {documents:,} document(s) in the "
                f"eval split ({eval_records:,} records): the train split would be empty; lower "
                "--eval-fraction or add documents (documents are split whole, by their identity)")
    return f"the train split would be empty ({documents:,} document(s) gave no instance)"


def empty_training_split_error(splits: dict[str, dict[str, Any]], inputs: dict[str, list[str]]) -> str | None:
    """`task`: why a training split (``mode`` train) with no records cannot be trained on, or None."""
    for name, info in splits.items():
        if info.get("mode") == "train" and sum(s["records"] for s in info["shards"]) == 0:
            files = inputs.get(name, [])
            where = ", ".join(files[:3]) + (" ..." if len(files) > 3 else "")
            return (f"split {name!r} ({where}) has no examples: the train split would be empty; check the "
                    "file(s) (a header line alone holds no example)")
    return None


def unk_warning(tokens: int, unk: int, do_lower_case: bool, what: str, source: str) -> str | None:
    """Many [UNK] tokens mean a vocab that does not fit the text, most often its casing (`run`, `task`)."""
    if not tokens or unk / tokens <= MAX_UNK_RATE:
        return None
    casing = "uncased (lowercased)" if do_lower_case else "cased"
    return (f"{unk / tokens:.1%} of the {tokens:,} {what} are [UNK] (above {MAX_UNK_RATE:.0%}): the vocab "
            f"does not fit {source}; check that it is {casing} like this run (--do-lower-case/--no-lower-case) "
            f"and of {source}'s language, or train one with `bert-datagen vocab`")


def run_warnings(manifest: Manifest, config: DatagenConfig, raw_totals: dict[str, Any]) -> list[str]:
    """Warnings for the run summary (they do not change the dataset)."""
    warnings = []
    eval_split = manifest.splits.get("eval")
    if config.eval_fraction > 0 and eval_split is not None and eval_split.records < MIN_EVAL_RECORDS:
        documents = raw_totals.get("read_docs/eval", 0)
        warnings.append(
            f"the eval split has only {eval_split.records:,} records (from {documents:,} of "
            f"{manifest.totals['documents']:,} documents, --eval-fraction {config.eval_fraction}); "
            f"eval metrics on fewer than {MIN_EVAL_RECORDS} records are mostly noise: raise --eval-fraction")
    unk = unk_warning(int(raw_totals.get("read_tokens", 0)), int(raw_totals.get("unk_tokens", 0)),
                      config.do_lower_case, "input tokens", "the corpus")
    if unk:
        warnings.append(unk)
    for split, info in manifest.splits.items():
        shards = len(info.shards)
        if split == "train" and shards > info.records:  # eval is sized by --target-shard-mb alone
            warnings.append(f"{split}: {shards} shards for {info.records:,} records, so "
                            f"{shards - info.records} or more are empty: lower --num-shards")
    return warnings
