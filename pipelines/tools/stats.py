"""`bert-datagen stats`: lengths, masking, NotNext share, padding, [UNK] rate, top tokens; histograms."""

from __future__ import annotations

import io
import types
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from bert_datagen.contract.dataset import Dataset, DatasetError, ShardRef
from bert_datagen.datagen.example_codec import Batch, decode_raw
from bert_datagen.datagen.packed_rules import check_packed_batch
from bert_datagen.datagen.record_rules import MAX_PROBLEMS_PER_SHARD, RecordShape, derive
from bert_datagen.pipelines.beam import fsio
from bert_datagen.pipelines.tools.shards import map_shards, shard_stream

if TYPE_CHECKING:
    from matplotlib.figure import Figure


@dataclass
class StatsAccum:
    seq_len: np.ndarray
    a_len: np.ndarray
    b_len: np.ndarray
    masked: np.ndarray
    token_counts: np.ndarray
    mask_kinds: np.ndarray  # [MASK], kept, random
    records: int = 0
    notnext: int = 0
    pad_positions: int = 0
    positions: int = 0
    text_tokens: int = 0
    unk: int = 0
    unreadable: int = 0
    problems: list[str] = field(default_factory=list)
    # Packed rows: sequences per row, and the rows' own positions and padding (the fields above
    # describe their instances, as the unpacked dataset would hold them).
    per_row: np.ndarray = field(default_factory=lambda: np.zeros(1, np.int64))
    row_positions: int = 0
    row_pad: int = 0

    @classmethod
    def empty(cls, shape: RecordShape) -> StatsAccum:
        s, p = shape.max_seq_length, shape.max_predictions
        return cls(np.zeros(s + 1, np.int64), np.zeros(s + 1, np.int64), np.zeros(s + 1, np.int64),
                   np.zeros(p + 1, np.int64), np.zeros(shape.vocab_size, np.int64), np.zeros(3, np.int64),
                   per_row=np.zeros(shape.max_sequences_per_row + 1, np.int64))

    def add(self, other: StatsAccum) -> None:
        for name in ("seq_len", "a_len", "b_len", "masked", "token_counts", "mask_kinds", "per_row"):
            getattr(self, name)[:] += getattr(other, name)
        for name in ("records", "notnext", "pad_positions", "positions", "text_tokens", "unk", "unreadable",
                     "row_positions", "row_pad"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.problems += other.problems[: max(0, MAX_PROBLEMS_PER_SHARD - len(self.problems))]

    def add_batch(self, batch: Batch, shape: RecordShape) -> None:
        if len(batch) == 0:
            return
        lay = derive(batch, shape)
        f = batch.features
        s = shape.max_seq_length
        length = np.clip(lay.length, 0, s)
        sep1 = lay.first_sep
        if shape.objective == "nsp":
            a = np.clip(sep1 - 1, 0, s)
            b = np.clip(length - sep1 - 2, 0, s)
        else:  # one segment (inner [SEP]s between documents count as its tokens), no B
            a, b = np.clip(length - 2, 0, s), np.zeros(0, np.int64)
        self.seq_len += np.bincount(length, minlength=s + 1)[: s + 1]
        self.a_len += np.bincount(a, minlength=s + 1)[: s + 1]
        self.b_len += np.bincount(b, minlength=s + 1)[: s + 1]
        self.masked += np.bincount(np.clip(lay.n_masked, 0, shape.max_predictions),
                                   minlength=shape.max_predictions + 1)
        self.records += len(batch)
        if "next_sentence_labels" in f:
            self.notnext += int((f["next_sentence_labels"][:, 0] == 1).sum())
        self.pad_positions += int((s - length).sum())
        self.positions += len(batch) * s
        inside = np.arange(s) < length[:, None]
        text = inside & (lay.original != shape.cls_id) & (lay.original != shape.sep_id)
        ids = lay.original[text]
        ids = ids[(ids >= 0) & (ids < shape.vocab_size)]
        self.token_counts += np.bincount(ids, minlength=shape.vocab_size)
        self.text_tokens += int(text.sum())
        if shape.unk_id is not None:
            self.unk += int((lay.original[text] == shape.unk_id).sum())
        if "masked_lm_weights" not in f:  # dynamic masking: the trainer masks these records
            return
        w = f["masked_lm_weights"] == 1
        pos = np.clip(f["masked_lm_positions"], 0, s - 1)
        shown = np.take_along_axis(f["input_ids"], pos, axis=1)[w]
        label = f["masked_lm_ids"][w]
        is_mask = shown == (shape.mask_id if shape.mask_id is not None else -1)
        kept = ~is_mask & (shown == label)
        self.mask_kinds += np.array([is_mask.sum(), kept.sum(), (~is_mask & ~kept).sum()], np.int64)


@dataclass
class StatsTask:
    ref: ShardRef
    shape: RecordShape


def stats_shard(task: StatsTask) -> StatsAccum:
    acc = StatsAccum.empty(task.shape)
    stream = shard_stream(task.ref)
    shape = task.shape.instance_shape()
    for raw in stream.raw_batches():
        batch, problems = decode_raw(raw, task.shape)
        if task.shape.max_sequences_per_row:
            acc.row_positions += batch.features["input_mask"].size
            acc.row_pad += int((batch.features["input_mask"] == 0).sum())
            count = batch.features["sequence_ids"].max(axis=1, initial=0)
            acc.per_row += np.bincount(np.clip(count, 0, len(acc.per_row) - 1), minlength=len(acc.per_row))
            broken, _, batch = check_packed_batch(batch, task.shape)
            problems += broken  # stats describe only the rows that keep the rules
        acc.unreadable += len(problems)
        acc.problems += [f"{task.ref.name}: record {i}: {m}" for i, m in problems][:MAX_PROBLEMS_PER_SHARD]
        acc.add_batch(batch, shape)
    acc.unreadable += len(stream.problems)
    acc.problems += [f"{task.ref.name}: {m}" for _, m in stream.problems]
    return acc


def _hist_summary(hist: np.ndarray) -> dict:
    total = int(hist.sum())
    if total == 0:
        return {"mean": None, "min": None, "p50": None, "p95": None, "max": None, "histogram": hist.tolist()}
    values = np.arange(len(hist))
    cum = np.cumsum(hist)
    nz = np.nonzero(hist)[0]
    return {
        "mean": round(float((values * hist).sum() / total), 3),
        "min": int(nz[0]),
        "p50": int(np.searchsorted(cum, 0.5 * total)),
        "p95": int(np.searchsorted(cum, 0.95 * total)),
        "max": int(nz[-1]),
        "histogram": hist.tolist(),
    }


def compute_stats(ds: Dataset, *, split: str | None = None, workers: int | None = None, top: int = 20) -> dict:
    refs = [r for r in ds.shards if split is None or r.split == split]
    if not refs:
        raise DatasetError(f"no shards in split {split!r} (splits: {', '.join(ds.splits)})")
    acc = StatsAccum.empty(ds.shape)
    for part in map_shards(stats_shard, [StatsTask(r, ds.shape) for r in refs], workers):
        acc.add(part)
    n = max(acc.records, 1)
    order = np.argsort(-acc.token_counts, kind="stable")[:top]
    kinds = max(int(acc.mask_kinds.sum()), 1)
    return {
        "dataset": ds.root or ",".join(r.name for r in refs[:3]) + (" ..." if len(refs) > 3 else ""),
        "split": split or "all",
        "shards": len(refs),
        "records": acc.records,
        "unreadable_records": acc.unreadable,
        "max_seq_length": ds.shape.max_seq_length,
        "max_predictions_per_seq": ds.shape.max_predictions,
        "objective": ds.shape.objective,
        "masking": ds.shape.masking,
        "seq_length": _hist_summary(acc.seq_len),
        "a_length": _hist_summary(acc.a_len),
        "b_length": _hist_summary(acc.b_len),
        "masked_count": _hist_summary(acc.masked),
        "notnext_share": round(acc.notnext / n, 6) if ds.shape.objective == "nsp" else None,
        "padding_share": round(acc.pad_positions / max(acc.positions, 1), 6),
        "unk_rate": round(acc.unk / max(acc.text_tokens, 1), 6),
        "text_tokens": acc.text_tokens,
        "mask_kinds": {"mask": round(int(acc.mask_kinds[0]) / kinds, 6),
                       "kept": round(int(acc.mask_kinds[1]) / kinds, 6),
                       "random": round(int(acc.mask_kinds[2]) / kinds, 6)},
        "top_tokens": [{"token": ds.vocab.display_token(int(i)), "id": int(i), "count": int(acc.token_counts[i]),
                        "share": round(int(acc.token_counts[i]) / max(acc.text_tokens, 1), 6)}
                       for i in order if acc.token_counts[i] > 0],
        "problems": acc.problems,
        **({"packing": _packing_stats(acc)} if ds.shape.max_sequences_per_row else {}),
    }


def _packing_stats(acc: StatsAccum) -> dict:
    """Packed rows: how many, sequences per row, and their padding next to the unpacked records'."""
    rows = int(acc.per_row.sum())
    return {
        "rows": rows,
        "max_sequences_per_row": len(acc.per_row) - 1,
        "sequences_per_row": _hist_summary(acc.per_row),
        "padding_share": round(acc.row_pad / max(acc.row_positions, 1), 6),
        "unpacked_padding_share": round(acc.pad_positions / max(acc.positions, 1), 6),
        "rows_saved": round(1 - rows / max(acc.records, 1), 6),
    }


def format_stats(st: dict) -> str:
    lines = [f"{st['dataset']}  split {st['split']}: {st['records']} records in {st['shards']} shards "
             f"(max_seq_length {st['max_seq_length']}, max_predictions_per_seq {st['max_predictions_per_seq']})"]
    packing = st.get("packing")
    if packing:
        spr = packing["sequences_per_row"]
        lines.append(f"packed: the {st['records']} records are sequences in {packing['rows']} rows "
                     f"(up to {packing['max_sequences_per_row']} a row, mean {spr['mean']}); the figures "
                     "below are per sequence")
    if st["unreadable_records"]:
        lines.append(f"WARNING: {st['unreadable_records']} records could not be read (run verify)")
    objective, masking = st.get("objective", "nsp"), st.get("masking", "static")
    if objective != "nsp" or masking != "static":
        lines.append(f"objective {objective}{' (no NSP: one segment per record)' if objective != 'nsp' else ''}, "
                     f"masking {masking}{' (unmasked records: the trainer masks them)' if masking == 'dynamic' else ''}")
    lines.append(f"{'':<22}{'mean':>9}{'min':>7}{'p50':>7}{'p95':>7}{'max':>7}")
    rows = [("sequence length", "seq_length")]
    rows += [("A length", "a_length"), ("B length", "b_length")] if objective == "nsp" else []
    rows += [("masked tokens", "masked_count")] if masking == "static" else []
    for label, key in rows:
        h = st[key]
        if h["mean"] is None:
            lines.append(f"{label:<22}{'-':>9}")
            continue
        lines.append(f"{label:<22}{h['mean']:>9.2f}{h['min']:>7}{h['p50']:>7}{h['p95']:>7}{h['max']:>7}")
    mk = st["mask_kinds"]
    if st["notnext_share"] is not None:
        lines.append(f"{'NotNext share':<22}{st['notnext_share']:>9.4f}")
    if packing:
        lines += [f"{'padding share packed':<22}{packing['padding_share']:>9.4f}   of the rows' positions",
                  f"{'padding share unpacked':<22}{packing['unpacked_padding_share']:>9.4f}   the same "
                  f"sequences one a record ({packing['rows_saved']:.1%} fewer rows packed)"]
    else:
        lines.append(f"{'padding share':<22}{st['padding_share']:>9.4f}")
    lines += [
        f"{'[UNK] rate':<22}{st['unk_rate']:>9.4f}   of {st['text_tokens']} text tokens",
    ]
    if masking == "static":
        lines.append(f"{'masked as':<22}[MASK] {mk['mask']:.3f}  kept {mk['kept']:.3f}  random {mk['random']:.3f}")
    lines.append("most frequent tokens: " + ", ".join(f"{t['token']} {t['share']:.4f}" for t in st["top_tokens"][:10]))
    return "\n".join(lines)


def pyplot() -> types.ModuleType:
    """matplotlib's pyplot on the Agg backend (files only, no display); DatasetError naming the extra
    when matplotlib is missing, so `--plot` fails with one line, not a traceback."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        raise DatasetError("--plot needs matplotlib: pip install 'bert-datagen[plot]'") from e
    return plt


def write_png(fig: Figure, path: str) -> str:
    """The figure as a PNG at `path`, written atomically (rendered in memory, then a temp file renamed),
    so an interrupted plot never leaves a half-written file; the figure is closed."""
    plt = pyplot()
    out = io.BytesIO()
    fig.tight_layout()
    fig.savefig(out, format="png", dpi=100)
    plt.close(fig)
    fsio.write_atomic(path, out.getvalue())
    return path


def plot_stats(st: dict, path: str) -> str:
    """Histograms of the stats in a PNG. Needs matplotlib (the `plot` extra)."""
    plt = pyplot()
    fig, axes = plt.subplots(2, 2, figsize=(10, 7))
    for ax, (label, key) in zip(axes.flat, (("sequence length", "seq_length"), ("A length", "a_length"),
                                             ("B length", "b_length"), ("masked tokens", "masked_count")),
                                strict=True):
        hist = st[key]["histogram"]
        ax.bar(range(len(hist)), hist, width=1.0)
        ax.set_title(f"{label} (mean {st[key]['mean']})")
        ax.set_xlabel("tokens")
        ax.set_ylabel("records")
    nsp = f"NotNext {st['notnext_share']:.3f}" if st["notnext_share"] is not None else "no NSP"
    fig.suptitle(f"{st['dataset']} [{st['split']}]: {st['records']} records, {nsp}, "
                 f"padding {st['padding_share']:.3f}")
    return write_png(fig, path)
