"""Predictions and task metrics of a fine-tuned model on one split, and the files they are written to.

- classification / regression: GLUE metrics (`bert_datagen.trainer.finetune.metrics`); `predictions.tsv` in GLUE's
  submission layout (header `index<TAB>prediction`, then one row per example, label strings);
- span: RECIPE.md section 10 post-processing (`bert_datagen.trainer.finetune.squad_postprocess`) and the official SQuAD
  v1.1 / v2.0 scores (`bert_datagen.trainer.finetune.squad_eval`); `predictions.json`, `nbest_predictions.json`,
  `null_odds.json` (v2.0) and the raw per-window logits `logits.npz`;
- tagging: the tag of each word from the logits at its first piece in the window that owns it,
  conlleval scores; `predictions.conll` (word, gold, predicted per line; blank line between
  sentences; without gold column for unlabelled splits).

`bert-train predict --out DIR` writes these files with `predictions_record.json` (what wrote them,
from which run, data and split): DIR must be new, empty, or (with --overwrite) such a directory of
ours; never a dataset, a run, or inside one (`check_predictions_out`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from bert_datagen.contract.loading.task_batches import bucket_length
from bert_datagen.trainer.errors import DataError, TrainConfigError
from bert_datagen.trainer.finetune import cmrc_eval, squad_eval, squad_postprocess
from bert_datagen.trainer.finetune import metrics as metric_lib
from bert_datagen.trainer.finetune.data import TaskDataset, TaskSplit, read_side_file, read_split
from bert_datagen.trainer.runtime import rundir
from bert_datagen.trainer.runtime.inference import MODEL_INPUTS, model_predictor
from bert_datagen.trainer.runtime.rundir import write_atomic


@dataclass
class SplitPredictions:
    """What a model predicted on a split, ready for metrics and files."""

    task_type: str
    arrays: dict[str, np.ndarray]  # logits (and labels / unique ids) in record order
    metrics: dict[str, float] = field(default_factory=dict)
    details: dict = field(default_factory=dict)  # per-type NER scores, SQuAD extras
    outputs: dict = field(default_factory=dict)  # what the files are written from


def primary_metric(dataset: TaskDataset) -> str:
    if dataset.task_type in ("classification", "regression"):
        return metric_lib.task_metric_names(dataset.task_kind, dataset.task_type)[1]
    return "f1"


def is_squad_v2(dataset: TaskDataset) -> bool:
    return dataset.task_kind == "squad2" or bool(dataset.task.get("version_2_with_negative"))


# Task types whose predictions read no output at padding positions: their batches are cut to
# their bucket length (`trim_to_bucket`), per-token outputs padded back with zeros. Span
# predictions rank every position of the window, padding included (as the original does), so
# their batches keep the full length and the padding's logits stay what they always were.
TRIMMED_TASK_TYPES = ("classification", "regression", "tagging")
# What the predictions are scored and written with, besides the model's outputs.
CARRIED_FEATURES = ("label_ids", "unique_ids", "start_positions", "end_positions")


def trim_to_bucket(inputs: dict[str, np.ndarray], max_seq_length: int) -> dict[str, np.ndarray]:
    """The batch cut to the shortest bucket length (`bucket_lengths`) that holds its longest row."""
    length = bucket_length(int(inputs["input_mask"].sum(axis=1).max()), max_seq_length)
    return {k: v[:, :length] for k, v in inputs.items()}


def predict_arrays(model, split: TaskSplit, batch_size: int, trim: bool = False,
                   backend: str = "tensorflow") -> dict[str, np.ndarray]:
    """Run the model over a split in record order; logits plus the label/id features, concatenated.
    `trim`: each batch runs at its bucket length (same predictions, less work on padding)."""
    seq_length = split.features["input_ids"][1]
    predict = model_predictor(model, backend)
    parts: dict[str, list[np.ndarray]] = {}
    # In record order through the loaders every framework shares, against the dataset the command
    # opened: one replaced since is refused at its first batch.
    for batch in read_split(split, batch_size):
        inputs = {k: batch[k] for k in MODEL_INPUTS}
        if trim:
            inputs = trim_to_bucket(inputs, seq_length)
        for k, v in predict(inputs).items():
            if v.ndim == 3 and v.shape[1] < seq_length:  # per-token logits of a trimmed batch
                v = np.pad(v, [(0, 0), (0, seq_length - v.shape[1]), (0, 0)])
            parts.setdefault(k, []).append(v)
        for k in CARRIED_FEATURES:
            if k in batch:
                parts.setdefault(k, []).append(batch[k])
    if not parts:
        raise DataError(f"split {split.name!r} has no records")
    return {k: np.concatenate(v) for k, v in parts.items()}


def evaluate_split(model, dataset: TaskDataset, split_name: str, batch_size: int, *, need_labels: bool,
                   null_score_diff_threshold: float = 0.0, span_metric: str = "auto",
                   backend: str = "tensorflow") -> SplitPredictions:
    split = dataset.split(split_name)
    if need_labels and not split.labelled:
        raise DataError(f"{dataset.source}: split {split_name!r} is unlabelled; it can be predicted "
                        "(`bert-train predict`) but not evaluated")
    arrays = predict_arrays(model, split, batch_size, trim=dataset.task_type in TRIMMED_TASK_TYPES,
                            backend=backend)
    result = SplitPredictions(dataset.task_type, arrays)
    kind = dataset.task_type
    if kind in ("classification", "regression"):
        _classification(result, dataset, split)
    elif kind == "span":
        _span(result, dataset, split, null_score_diff_threshold, span_metric)
    else:
        _tagging(result, dataset, split)
    return result


def _classification(result: SplitPredictions, dataset: TaskDataset, split: TaskSplit) -> None:
    logits = result.arrays["logits"]
    predicted = logits if dataset.task_type == "regression" else np.argmax(logits, axis=-1)
    result.outputs["predicted"] = predicted
    if split.labelled:
        gold = result.arrays["label_ids"].reshape(-1)
        result.metrics = metric_lib.classification_metrics(dataset.task_kind, dataset.task_type, gold, predicted)


def span_metric_of(examples: list[dict], version_2: bool, wanted: str = "auto") -> str:
    """"cmrc2018" or "squad": `wanted`, or for "auto" CMRC 2018's for data whose contexts were read
    as unspaced text (their examples carry `word_starts`, datagen/tasks/squad_read.py)."""
    if wanted == "auto":
        return "cmrc2018" if not version_2 and any("word_starts" in e for e in examples) else "squad"
    if wanted == "cmrc2018" and version_2:
        raise DataError("--span-metric cmrc2018 scores answerable questions only (SQuAD v1.1 layout); this "
                        "dataset is SQuAD v2.0")
    return wanted


def _span(result: SplitPredictions, dataset: TaskDataset, split: TaskSplit, threshold: float,
          span_metric: str = "auto") -> None:
    examples = read_side_file(split, "examples.jsonl", dataset.source)
    windows = read_side_file(split, "windows.jsonl", dataset.source)
    v2 = is_squad_v2(dataset)
    metric = span_metric_of(examples, v2, span_metric)
    post = squad_postprocess.postprocess(
        examples, windows, result.arrays["unique_ids"].reshape(-1), result.arrays["start_logits"],
        result.arrays["end_logits"], version_2=v2, do_lower_case=dataset.do_lower_case,
        null_score_diff_threshold=threshold)
    result.outputs["squad"] = post
    if not split.labelled:
        return
    gold = [{"paragraphs": [{"qas": [
        {"id": e["id"], "answers": [] if e.get("is_impossible") else [{"text": t} for t in e.get("answers", [])]}
        for e in examples]}]}]
    if metric == "cmrc2018":
        scores = cmrc_eval.evaluate(squad_eval.iter_questions(gold), post.predictions)
        result.metrics = {"exact_match": scores["exact_match"], "f1": scores["f1"]}
        result.details = {**scores, "metric": "cmrc2018"}
    elif v2:
        scores = squad_eval.evaluate_v2(gold, post.predictions, post.null_odds)
        result.metrics = {"exact": scores["exact"], "f1": scores["f1"]}
        result.details = scores
    else:
        scores = squad_eval.evaluate_v1(gold, post.predictions)
        result.metrics = {"exact_match": scores["exact_match"], "f1": scores["f1"]}
        result.details = scores


def word_predictions(windows: list[dict], logits: np.ndarray, examples: list[dict]) -> list[list[int]]:
    """Per example, the predicted tag index of every word (from the window that owns it)."""
    out = [[-1] * len(e["words"]) for e in examples]
    index_of = {int(e["index"]): i for i, e in enumerate(examples)}
    for row, window in enumerate(windows):
        word_ids = np.asarray(window["word_ids"])
        owned = np.flatnonzero(word_ids >= 0)
        tags = np.argmax(logits[row, owned], axis=-1)
        example = out[index_of[int(window["example_index"])]]
        for position, tag in zip(word_ids[owned], tags, strict=True):
            example[int(position)] = int(tag)
    missing = [i for i, tags in enumerate(out) if -1 in tags]
    if missing:
        raise DataError(f"{len(missing)} examples have words no window owns (first: example {missing[0]})")
    return out


def _tagging(result: SplitPredictions, dataset: TaskDataset, split: TaskSplit) -> None:
    examples = read_side_file(split, "examples.jsonl", dataset.source)
    windows = read_side_file(split, "windows.jsonl", dataset.source)
    predicted = word_predictions(windows, result.arrays["logits"], examples)
    tags = [[dataset.labels[i] for i in sentence] for sentence in predicted]
    result.outputs["tagging"] = (examples, tags)
    if split.labelled:
        score = metric_lib.conlleval([e["tags"] for e in examples], tags)
        result.metrics = {k: float(score.overall[k]) for k in ("precision", "recall", "f1")}
        result.metrics["token_accuracy"] = score.token_accuracy
        result.details = score.to_dict()


# ------------------------------------------------------------------ files


def write_outputs(out_dir: str | Path, dataset: TaskDataset, result: SplitPredictions) -> list[Path]:
    """The prediction files for the task type (see the module docstring), plus metrics.json when
    the split was labelled."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    kind = dataset.task_type
    if kind in ("classification", "regression"):
        predicted = result.outputs["predicted"]
        rows = [f"{i}\t{v:.6g}" if kind == "regression" else f"{i}\t{dataset.labels[int(v)]}"
                for i, v in enumerate(predicted)]
        path = out / "predictions.tsv"
        write_atomic(path, "index\tprediction\n" + "".join(r + "\n" for r in rows))
        written.append(path)
    elif kind == "span":
        arrays = result.arrays
        written.append(squad_postprocess.write_raw_logits(out, arrays["unique_ids"].reshape(-1),
                                                          arrays["start_logits"], arrays["end_logits"]))
        written += squad_postprocess.write_predictions(out, result.outputs["squad"], is_squad_v2(dataset))
    else:
        examples, tags = result.outputs["tagging"]
        lines = []
        for example, predicted in zip(examples, tags, strict=True):
            gold = example.get("tags")
            for w, word in enumerate(example["words"]):
                lines.append(f"{word}\t{gold[w]}\t{predicted[w]}" if gold else f"{word}\t{predicted[w]}")
            lines.append("")
        path = out / "predictions.conll"
        write_atomic(path, "\n".join(lines) + ("\n" if lines else ""))
        written.append(path)
    if result.metrics:
        path = out / "metrics.json"
        write_atomic(path, json.dumps({"metrics": result.metrics, "details": result.details}, indent=2,
                                      sort_keys=True) + "\n")
        written.append(path)
    return written


PREDICTIONS_RECORD = "predictions_record.json"
_WRITTEN_BY = "bert-train predict"
# Every name `write_outputs` may write, whatever the task and split.
PREDICTION_FILES = ("predictions.tsv", "predictions.conll", "predictions.json", "nbest_predictions.json",
                    "null_odds.json", squad_postprocess.RAW_LOGITS_FILE, "metrics.json")


def _predictions_record(out: Path) -> dict | None:
    try:
        record = json.loads((out / PREDICTIONS_RECORD).read_text())
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) and record.get("written_by") == _WRITTEN_BY else None


def check_predictions_out(given: str | Path, overwrite: bool) -> list[str]:
    """Refuse (TrainConfigError naming --out) a directory predictions may not be written to, before any
    work; returns the files an earlier `bert-train predict` wrote there (to replace)."""
    out = rundir.check_local_dir(given)
    rundir.refuse_inside_dataset(out)
    kind = rundir.run_kind(out) if out.is_dir() else None
    if kind is not None:
        raise TrainConfigError(f"--out {out}: a {kind}; write predictions to a directory of their own")
    run = rundir.enclosing(out.parent, rundir.has_run_record)
    if run is not None:
        raise TrainConfigError(f"--out {out}: inside the run {run}; write predictions outside it")
    previous: list[str] = []
    if rundir.entries_of(out):
        record = _predictions_record(out)
        if record is None:
            raise TrainConfigError(f"--out {out}: exists, is not empty and holds no predictions of ours (no "
                                   f"{PREDICTIONS_RECORD}); give a new or empty directory")
        if not overwrite:
            raise TrainConfigError(f"--out {out}: holds the predictions of an earlier `bert-train predict` (run "
                                   f"{record.get('run')}, split {record.get('split')!r}); pass --overwrite to replace them")
        previous = [str(name) for name in record.get("files", []) if Path(str(name)).name == name]
        # Our directory, but a file it may write now that the earlier predict did not (a user's
        # metrics.json beside the predictions of an unlabelled split): never replaced.
        theirs = [name for name in PREDICTION_FILES if name not in previous and (out / name).exists()]
        if theirs:
            raise TrainConfigError(f"--out {out}: {theirs[0]} was not written by the earlier `bert-train predict` "
                                   f"(its {PREDICTIONS_RECORD} does not list it) and would be replaced; move it away")
    rundir.check_writable(out)
    return previous


def write_predictions_dir(out_dir: str | Path, dataset: TaskDataset, result: SplitPredictions, about: dict,
                          previous: list[str]) -> list[Path]:
    """`write_outputs` into a directory `check_predictions_out` accepted, marked as ours by its record
    (written before the files, so an interrupted write leaves a directory --overwrite may replace);
    files of an earlier prediction that this one does not write again are removed."""
    from bert_datagen.datagen import __version__

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    rundir.cleanup_temp(out)
    record = {"written_by": _WRITTEN_BY, "version": __version__, **about}
    # Until complete, the record claims every name this write may create (the check found none of
    # them there but ours), so that an interrupted write leaves nothing a later --overwrite refuses.
    claimed = sorted(set(previous) | set(PREDICTION_FILES))
    write_atomic(out / PREDICTIONS_RECORD, json.dumps({**record, "files": claimed, "complete": False},
                                                      indent=2, sort_keys=True) + "\n")
    written = write_outputs(out, dataset, result)
    names = [p.name for p in written]
    for stale in sorted(set(previous) - set(names)):
        (out / stale).unlink(missing_ok=True)
    write_atomic(out / PREDICTIONS_RECORD, json.dumps({**record, "files": names, "complete": True},
                                                      indent=2, sort_keys=True) + "\n")
    return written
