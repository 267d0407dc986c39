"""`verify`, `inspect`, `stats` and `diff` on task datasets (manifest "kind": "task").

verify: every shard's and side file's sha256, size and record count against the manifest, TFRecord
framing and CRCs, every record parsed against its split's feature spec and checked with the task
record rules (`bert_datagen.datagen.tasks.rules`), the side files against the records, the counts against the
records. inspect: a record as text with its label, answer span or word tags. stats: lengths,
truncation share, label balance, windows per example.
"""

from __future__ import annotations

import hashlib
import time
from collections import Counter

import numpy as np

from bert_datagen.contract.dataset import Dataset, ShardRef
from bert_datagen.contract.manifest import CARD_NAME, MANIFEST_NAME, VOCAB_NAME
from bert_datagen.datagen.example_codec import decode_batch, decode_exact
from bert_datagen.datagen.tasks.config import CLASSIFICATION, REGRESSION, SPAN, TAGGING
from bert_datagen.datagen.tasks.features import task_feature_spec
from bert_datagen.datagen.tasks.lengths import LengthsError, read_lengths
from bert_datagen.datagen.tasks.rules import TaskShape, check_records, check_side, sequence_layout
from bert_datagen.pipelines.beam import fsio
from bert_datagen.pipelines.tools.shards import iter_payloads, map_shards, pick_shard
from bert_datagen.pipelines.tools.stats import pyplot, write_png
from bert_datagen.pipelines.tools.verify import ShardTask, VerifyReport, verify_shard


def split_spec(ds: Dataset, split: str) -> dict[str, tuple[str, int]]:
    return dict(ds.manifest.splits[split].features)  # type: ignore[union-attr, arg-type]


def task_shape(ds: Dataset, split: str) -> TaskShape:
    task = ds.manifest.task  # type: ignore[union-attr]
    training = "start_positions" in ds.manifest.splits[split].features  # type: ignore[union-attr, operator]
    v = ds.vocab
    return TaskShape(task["type"], len(task["labels"]), len(v), v.cls_id, v.sep_id, training)  # type: ignore[union-attr]


def decode_record(ds: Dataset, split: str, payload: bytes) -> dict[str, np.ndarray]:
    """One record as a one-row column dict (RecordError when it is not the split's features)."""
    return {k: v[None, :] for k, v in decode_exact(payload, split_spec(ds, split)).items()}


def read_split(ds: Dataset, split: str, limit: int | None = None) -> tuple[dict[str, np.ndarray], list[str]]:
    """The split's records in order as columns (at most `limit`), and the records that do not parse."""
    spec = split_spec(ds, split)
    where: list[tuple[str, int]] = []
    payloads: list[bytes] = []
    for ref in ds.split_shards(split):
        for i, payload in iter_payloads(ref):
            if limit is not None and len(payloads) >= limit:
                break
            where.append((ref.name, i))
            payloads.append(payload)
    batch, bad = decode_batch(payloads, list(range(len(payloads))), spec)
    problems = [f"{where[k][0]}: record {where[k][1]}: does not parse as the split's features: {m}" for k, m in bad]
    return batch.features, problems


def _side_lines(ds: Dataset, split: str, name: str) -> list[str]:
    return fsio.read_bytes(fsio.join(ds.root, split, name)).decode("utf-8").splitlines()  # type: ignore[arg-type]


def _manifest_problems(ds: Dataset) -> list[str]:
    m = ds.manifest
    assert m is not None and ds.root is not None
    src = fsio.join(ds.root, MANIFEST_NAME)
    task = m.task
    problems = []
    digest = hashlib.sha256(fsio.read_bytes(ds.vocab.path)).hexdigest()  # type: ignore[union-attr]
    if digest != m.vocab.sha256:
        problems.append(f"{ds.vocab.path}: sha256 is {digest}, manifest says {m.vocab.sha256}")  # type: ignore[union-attr]
    listed = set()
    for split, info in m.splits.items():
        training = info.mode == "train" and task["type"] == SPAN
        want = {k: list(v) for k, v in task_feature_spec(task["type"], task["max_seq_length"], training).items()}
        got = {k: list(v) for k, v in info.features.items()} if info.features is not None else None
        if got != want:
            problems.append(f"{src}: splits.{split}.features is {got}, expected {want}")
        if info.counts.get("features") != info.records:
            problems.append(f"{src}: splits.{split}.counts.features disagrees with its {info.records} records")
        for s in info.shards:
            listed.add(s.path)
            if s.index is not None:
                listed.add(s.index.path)
                if s.index.blocks is not None:
                    listed.add(s.index.blocks.path)
            if s.lengths is not None:
                listed.add(s.lengths.path)
        for f in info.side:
            listed.add(f.path)
            path = fsio.join(ds.root, *f.path.split("/"))
            if not fsio.exists(path):
                problems.append(f"{f.path}: side file is missing")
                continue
            data = fsio.read_bytes(path)
            if len(data) != f.bytes or hashlib.sha256(data).hexdigest() != f.sha256:
                problems.append(f"{f.path}: size or sha256 differs from the manifest")
        for path in fsio.listdir(fsio.join(ds.root, split)):
            rel = f"{split}/{path.rstrip('/').rsplit('/', 1)[-1]}"
            if rel not in listed:
                problems.append(f"{rel}: stray file not listed in the manifest")
    for path in fsio.listdir(ds.root):
        name = path.rstrip("/").rsplit("/", 1)[-1]
        if name not in (MANIFEST_NAME, CARD_NAME, VOCAB_NAME, m.vocab.path, *m.splits):
            problems.append(f"{name}: stray file not listed in the manifest")
    return problems


def _record_problems(ds: Dataset, split: str, refs: list[ShardRef], limit: int) -> list[str]:
    columns, problems = read_split(ds, split)
    if problems:
        return problems
    shape = task_shape(ds, split)
    found = check_records(columns, shape, limit)
    info = ds.manifest.splits[split]  # type: ignore[union-attr]
    names = [f.path.rsplit("/", 1)[-1] for f in info.side]
    if "windows.jsonl" in names and "examples.jsonl" in names:
        found += check_side(columns, shape, _side_lines(ds, split, "examples.jsonl"),
                            _side_lines(ds, split, "windows.jsonl"), ds.vocab.tokens, limit)  # type: ignore[union-attr]
    # Shard record counts: verify has already compared them with the files.
    starts = np.cumsum([0] + [ref.expected.records if ref.expected else 0 for ref in refs])
    found += _lengths_problems(ds, refs, starts, columns["input_mask"].sum(axis=1))

    def where(i: int) -> str:
        if i < 0:
            return f"{split}: "
        k = int(np.searchsorted(starts, i, side="right") - 1)
        return f"{refs[min(k, len(refs) - 1)].name}: record {i - int(starts[min(k, len(refs) - 1)])}: "

    return [f"{where(i)}{message}" for i, message in found]


def _lengths_problems(ds: Dataset, refs: list[ShardRef], starts: np.ndarray, lengths: np.ndarray,
                      ) -> list[tuple[int, str]]:
    """Each shard's lengths file against its manifest entry and its records' token counts."""
    found: list[tuple[int, str]] = []
    for k, ref in enumerate(refs):
        entry = ref.expected.lengths if ref.expected else None
        if entry is None:
            continue
        path = fsio.join(ds.root, *entry.path.split("/"))  # type: ignore[arg-type]
        if not fsio.exists(path):
            found.append((-1, f"lengths {entry.path} are missing (length grouping then reads whole windows)"))
            continue
        try:
            listed = read_lengths(fsio.read_bytes(path), ref.expected.records, entry.bytes,  # type: ignore[union-attr]
                                  entry.sha256, entry.path)
        except LengthsError as e:
            found.append((-1, str(e)))
            continue
        wrong = np.flatnonzero(listed != lengths[int(starts[k]):int(starts[k + 1])])
        if len(wrong):
            found.append((int(starts[k] + wrong[0]), f"lengths {entry.path} say {int(listed[wrong[0]])} tokens, the "
                                                     f"record holds {int(lengths[starts[k] + wrong[0]])}"))
    return found


def verify_task(ds: Dataset, *, workers: int | None = None, check_records: bool = True,
                max_problems: int = 20) -> VerifyReport:
    t0 = time.perf_counter()
    problems = _manifest_problems(ds)
    shards = map_shards(verify_shard, [ShardTask(ref, None, False, max_problems) for ref in ds.shards], workers)
    count = len(problems)
    for r in shards:
        problems += r.problems
        count += r.problem_count
    if check_records and count == 0:
        for split in ds.splits:
            found = _record_problems(ds, split, ds.split_shards(split), max_problems)
            problems += found
            count += len(found)
    return VerifyReport(problems, shards, count, time.perf_counter() - t0, True)


# ---------------------------------------------------------------- inspect


def float32_value(x: float | np.floating) -> float:
    """A stored float32 as the number it was written from: a target of 3.4 is kept as the float32
    nearest it, whose exact value 3.4000000953674316 is noise to a reader; the shortest decimal
    that reads back as the same float32 is 3.4."""
    return float(str(np.float32(x)))


def record_view(ds: Dataset, split: str, f: dict[str, np.ndarray], row: int) -> dict:
    """One record as plain data: its pieces by segment and its label, answer span or word tags."""
    task = ds.manifest.task  # type: ignore[union-attr]
    vocab = ds.vocab
    length, boundary = (int(x[0]) for x in sequence_layout({k: v[row:row + 1] for k, v in f.items()}))
    pieces = [vocab.display_token(int(t)) for t in f["input_ids"][row, :length]]  # type: ignore[union-attr]
    view: dict = {"length": length, "tokens": [{"token": t, "segment": int(f["segment_ids"][row, i])}
                                               for i, t in enumerate(pieces)]}
    kind = task["type"]
    if kind in (CLASSIFICATION, REGRESSION):
        label = f["label_ids"][row, 0]
        view["a"], view["b"] = pieces[1:boundary - 1 if boundary < length else length - 1], pieces[boundary:length - 1]
        view["label"] = float32_value(label) if kind == REGRESSION else int(label)
        if kind == CLASSIFICATION and 0 <= int(label) < len(task["labels"]):
            view["label_text"] = task["labels"][int(label)]
    elif kind == SPAN:
        view["unique_id"] = int(f["unique_ids"][row, 0])
        view["question"], view["window"] = pieces[1:boundary - 1], pieces[boundary:length - 1]
        if "start_positions" in f:
            s, e = int(f["start_positions"][row, 0]), int(f["end_positions"][row, 0])
            view.update(start=s, end=e, is_impossible=int(f["is_impossible"][row, 0]),
                        answer=pieces[s:e + 1] if (s, e) != (0, 0) else [])
    else:
        labels = f["label_ids"][row]
        view["tags"] = [(pieces[i], task["labels"][int(labels[i])] if 0 <= labels[i] < len(task["labels"])
                         else int(labels[i])) for i in range(length) if labels[i] >= 0]
    return view


def format_task_record(view: dict, where: str) -> str:
    head = f"{where}: {view['length']} tokens"
    if "label" in view:
        lines = [f"{head}, label {view['label']}" + (f" = {view['label_text']}" if "label_text" in view else ""),
                 "  A: " + " ".join(view["a"])]
        if view["b"]:
            lines.append("  B: " + " ".join(view["b"]))
    elif "unique_id" in view:
        lines = [f"{head}, unique_id {view['unique_id']}", "  question: " + " ".join(view["question"]),
                 "  window: " + " ".join(view["window"])]
        if "start" in view:
            span = " ".join(view["answer"]) if view["answer"] else "(none: 0/0, [CLS])"
            lines.append(f"  answer: {view['start']}..{view['end']} {span}"
                         + (" (impossible)" if view["is_impossible"] else ""))
    else:
        lines = [head, "  " + " ".join(f"{p}/{t}" for p, t in view["tags"])]
    return "\n".join(lines)


def inspect_task(ds: Dataset, *, split: str | None, shard: int, index: int, count: int) -> tuple[ShardRef, list]:
    ref = pick_shard(ds, split, shard)
    spec = split_spec(ds, ref.split)
    rows = [decode_exact(p, spec) for i, p in iter_payloads(ref) if index <= i < index + count]
    cols = {k: np.stack([r[k] for r in rows]) for k in spec} if rows else {}
    return ref, [{"index": index + r, **record_view(ds, ref.split, cols, r)} for r in range(len(rows))]


# ---------------------------------------------------------------- stats


def task_stats(ds: Dataset, split: str | None = None) -> dict:
    """Per split: lengths, truncation, label balance, windows per example, and the histograms
    `plot_task_stats` draws (lengths of the non-padding tokens; labels, tags, targets or answers)."""
    task = ds.manifest.task  # type: ignore[union-attr]
    out: dict = {"task": task["kind"], "type": task["type"], "splits": {}, "problems": []}
    for name in ([split] if split else ds.splits):
        f, problems = read_split(ds, name)
        out["problems"] += problems
        info = ds.manifest.splits[name]  # type: ignore[union-attr]
        counts = info.counts
        real = f["input_mask"].sum(axis=1)
        lengths = real if len(real) else np.zeros(1, np.int64)
        s = {"records": int(len(f["input_ids"])), "examples": counts.get("examples"),
             "length": {"min": int(lengths.min()), "mean": round(float(lengths.mean()), 2),
                        "p50": int(np.percentile(lengths, 50)), "p95": int(np.percentile(lengths, 95)),
                        "max": int(lengths.max())},
             "full_length_share": round(float((lengths == task["max_seq_length"]).mean()), 4),
             "truncated_share": round(counts.get("truncated_examples", 0) / max(counts.get("examples") or 1, 1), 4),
             "windows_per_example": info.windows_per_example}
        if task["type"] == CLASSIFICATION:
            s["labels"] = dict(sorted(Counter(task["labels"][int(i)] if 0 <= i < len(task["labels"]) else str(i)
                                              for i in f["label_ids"][:, 0].tolist()).items()))
        elif task["type"] == REGRESSION and len(f["label_ids"]):
            v = f["label_ids"][:, 0]
            s["labels"] = {"min": float32_value(v.min()), "mean": round(float(v.mean()), 4), "max": float32_value(v.max())}
        elif task["type"] == TAGGING:
            tags = f["label_ids"][f["label_ids"] >= 0]
            s["labels"] = {task["labels"][int(i)]: int(c) for i, c in zip(*np.unique(tags, return_counts=True),
                                                                          strict=True)}
        elif "start_positions" in f:
            s["windows_with_answer_share"] = round(float((f["start_positions"][:, 0] > 0).mean()), 4)
        s["histograms"] = _histograms(f, real, task, info.labelled, s.get("labels"))
        out["splits"][name] = s
    return out


def _histograms(f: dict[str, np.ndarray], lengths: np.ndarray, task: dict, labelled: bool,
                labels: dict | None) -> dict:
    """What the plot draws of a split; nothing of the labels of an unlabelled split (its label ids are
    placeholders) or of a prediction-mode SQuAD split (its records hold no answer)."""
    h: dict = {"length": np.bincount(lengths, minlength=task["max_seq_length"] + 1).tolist()}
    if not labelled:
        return h
    if task["type"] in (CLASSIFICATION, TAGGING):
        h["labels"] = labels
    elif task["type"] == REGRESSION and len(f["label_ids"]):
        counts, edges = np.histogram(f["label_ids"][:, 0], bins=20)
        h["target"] = {"counts": counts.tolist(), "edges": [round(float(e), 6) for e in edges]}
    elif "start_positions" in f:
        start, end = f["start_positions"][:, 0], f["end_positions"][:, 0]
        inside = start > 0  # 0/0 ([CLS]): the window does not hold the answer, or there is none
        h["answers"] = {"answer in window": int(inside.sum()), "no answer": int((~inside).sum())}
        # Clipped: stats reads unverified data, where a broken record may end before it starts.
        h["answer_length"] = np.bincount(np.clip(end[inside] - start[inside] + 1, 0, None), minlength=1).tolist()
    return h


def plot_task_stats(st: dict, path: str) -> str:
    """A PNG with a row per split: the length histogram, then the label distribution (classification,
    tagging), the target histogram (regression), or answer-in-window counts and the answer-length
    histogram (span). Needs matplotlib (the `plot` extra), as the pre-training plot."""
    plt = pyplot()
    kind = st["type"]
    cols = 3 if kind == SPAN else 2
    splits = st["splits"]
    fig, axes = plt.subplots(len(splits), cols, figsize=(5 * cols, 3.2 * len(splits)), squeeze=False)
    for row, (name, s) in zip(axes, splits.items(), strict=True):
        h = s["histograms"]
        _bars(row[0], range(len(h["length"])), h["length"], f"{name}: sequence length (mean {s['length']['mean']})",
              "non-padding tokens", "records", width=1.0)
        if "labels" in h:
            what = "tags (first pieces)" if kind == TAGGING else "labels"
            _bars(row[1], list(h["labels"]), list(h["labels"].values()), f"{name}: {what}", "", "count")
        elif "target" in h:
            t = h["target"]
            row[1].stairs(t["counts"], t["edges"], fill=True)
            row[1].set(title=f"{name}: target", xlabel="value", ylabel="records")
        elif "answers" in h:
            _bars(row[1], list(h["answers"]), list(h["answers"].values()), f"{name}: windows", "", "records")
            _bars(row[2], range(len(h["answer_length"])), h["answer_length"], f"{name}: answer length",
                  "pieces", "windows", width=1.0)
        else:
            why = "prediction mode: no answers in the records" if kind == SPAN else "unlabelled split"
            for ax in row[1:]:
                ax.text(0.5, 0.5, why, ha="center", va="center", transform=ax.transAxes)
                ax.set_axis_off()
    fig.suptitle(f"{st['task']} ({kind})")
    return write_png(fig, path)


def _bars(ax, x, heights: list, title: str, xlabel: str, ylabel: str, width: float = 0.8) -> None:
    ax.bar(x, heights, width=width)
    ax.set(title=title, xlabel=xlabel, ylabel=ylabel)
    if not isinstance(x, range):
        ax.tick_params(axis="x", labelrotation=45 if len(x) > 4 else 0)


def format_task_stats(st: dict) -> str:
    lines = [f"task {st['task']} ({st['type']})"]
    for name, s in st["splits"].items():
        ln = s["length"]
        lines.append(f"{name}: {s['records']} records, {s['examples']} examples; length min {ln['min']} mean "
                     f"{ln['mean']} p50 {ln['p50']} p95 {ln['p95']} max {ln['max']}; at the limit "
                     f"{s['full_length_share']:.1%}; truncated examples {s['truncated_share']:.1%}")
        if s.get("labels"):
            lines.append("  labels: " + ", ".join(f"{k} {v}" for k, v in s["labels"].items()))
        if s.get("windows_per_example"):
            lines.append("  windows per example: " + ", ".join(f"{k}: {v}" for k, v in s["windows_per_example"].items()))
        if "windows_with_answer_share" in s:
            lines.append(f"  windows holding the answer: {s['windows_with_answer_share']:.1%}")
    return "\n".join(lines)
