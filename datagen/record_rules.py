"""The BERT record rules: what a pre-training record must look like, checked for a batch at once.

[CLS] A [SEP] B [SEP], 1s-then-0s masks, segment ids, masked positions and weights, the recipe's
masked count: every check is a NumPy expression over the batch, and names the record it fails on.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from bert_datagen.datagen.example_codec import Batch
from bert_datagen.datagen.record_layout import (
    WORD_BITS,
    WORD_BITS_PER_VALUE,
    feature_spec,
    pack_word_bits,
    unpack_word_bits,
)

MAX_PROBLEMS_PER_SHARD = 20


@dataclass(frozen=True)
class RecordShape:
    """What a record must look like; small and picklable for the worker processes."""

    max_seq_length: int
    max_predictions: int
    vocab_size: int
    cls_id: int
    sep_id: int
    mask_id: int | None
    pad_id: int | None
    unk_id: int | None
    # From the manifest's config; None for data without one (the masked-count check is skipped).
    masked_lm_prob: float | None = None
    masking_unit: str = "token"  # word, span: masks fall on whole groups, which may leave a record short
    objective: str = "nsp"  # nsp: [CLS] A [SEP] B [SEP]; doc-/full-sentences: [CLS] text [SEP], no label
    masking: str = "static"  # dynamic: unmasked records with an instance_key, in key order
    max_sequences_per_row: int = 0  # > 0: packed rows of up to this many instances (bert_datagen.datagen.packed)
    word_bits: bool = False  # data of a word segmenter: dynamic masking's records carry word_continues_bits

    def spec(self) -> dict[str, tuple[str, int]]:
        """The features these records carry (``bert_datagen.datagen.record_layout.feature_spec``)."""
        return feature_spec(self.max_seq_length, self.max_predictions, self.objective, self.masking,
                            self.max_sequences_per_row, self.word_bits)

    def instance_shape(self) -> RecordShape:
        """The shape of one instance of a packed row (itself for unpacked records)."""
        return dataclasses.replace(self, max_sequences_per_row=0)


@dataclass
class Layout:
    """Per-record quantities derived from a batch (original tokens restored at masked positions)."""

    length: np.ndarray  # real tokens (sum of input_mask)
    first_sep: np.ndarray
    n_masked: np.ndarray
    original: np.ndarray  # input_ids with labels put back at masked positions


def derive(batch: Batch, shape: RecordShape) -> Layout:
    f = batch.features
    ids = f["input_ids"]
    n, s = ids.shape
    length = f["input_mask"].sum(axis=1)
    original = ids.copy()
    if "masked_lm_weights" in f:
        w = f["masked_lm_weights"]
        n_masked = (w == 1).sum(axis=1)
        pos = f["masked_lm_positions"]
        active = (w == 1) & (pos >= 0) & (pos < s)
        rows, cols = np.nonzero(active)
        original[rows, pos[rows, cols]] = f["masked_lm_ids"][rows, cols]
    else:  # dynamic masking: nothing is masked yet
        n_masked = np.zeros(n, np.int64)
    inside = np.arange(s) < length[:, None]
    is_sep = (original == shape.sep_id) & inside
    first_sep = np.where(is_sep.any(axis=1), np.argmax(is_sep, axis=1), -1)
    return Layout(length, first_sep, n_masked, original)


def check_batch(batch: Batch, shape: RecordShape, layout: Layout | None = None,
                limit: int = MAX_PROBLEMS_PER_SHARD) -> tuple[list[tuple[int, str]], int]:
    """Broken invariants as (record index, message), at most ``limit`` per check, and their total count.

    A record gets at most one message per check; checks that depend on the layout are skipped for
    records whose layout is already wrong.
    """
    if len(batch) == 0:
        return [], 0
    lay = layout or derive(batch, shape)
    f = batch.features
    ids, mask, seg = f["input_ids"], f["input_mask"], f["segment_ids"]
    n, s = ids.shape
    v = shape.vocab_size
    ar = np.arange(s)
    length = lay.length
    inside = ar < length[:, None]
    orig = lay.original
    sep1 = lay.first_sep
    rows = np.arange(n)
    checks: list[tuple[np.ndarray, Callable[[int], str]]] = []

    def first(m: np.ndarray, r: int) -> int:
        return int(np.argmax(m[r]))

    bad_ids = (ids < 0) | (ids >= v)
    checks.append((bad_ids.any(1), lambda r: f"input_ids[{first(bad_ids, r)}]={ids[r, first(bad_ids, r)]} "
                   f"is not below the vocab size {v}"))
    bad_mask = mask != inside
    checks.append((bad_mask.any(1), lambda r: f"input_mask is not 1s then 0s (position {first(bad_mask, r)})"))
    bad_pad = ~inside & ((ids != 0) | (seg != 0))
    checks.append((bad_pad.any(1), lambda r: f"padding position {first(bad_pad, r)} has a non-zero "
                   "input_id or segment_id"))
    is_sep = (orig == shape.sep_id) & inside
    n_sep = is_sep.sum(1)
    n_cls = ((orig == shape.cls_id) & inside).sum(1)
    last = orig[rows, np.clip(length - 1, 0, s - 1)]
    if shape.objective == "nsp":
        layout_ok = ((length >= 5) & (orig[:, 0] == shape.cls_id) & (n_cls == 1) & (n_sep == 2)
                     & (last == shape.sep_id) & (sep1 >= 2) & (sep1 <= length - 3))
        layout_name = "[CLS] A [SEP] B [SEP]"
        want_seg = (ar > sep1[:, None]) & inside
    else:
        # Packed sentences: one segment; full-sentences has a [SEP] between documents inside it
        # (never first, never two in a row), doc-sentences none.
        doubled = (is_sep[:, 1:] & is_sep[:, :-1]).any(1)
        inner_ok = (n_sep == 1) if shape.objective == "doc-sentences" else ~doubled
        layout_ok = ((length >= 3) & (orig[:, 0] == shape.cls_id) & (n_cls == 1) & (n_sep >= 1)
                     & (last == shape.sep_id) & (sep1 >= 2) & inner_ok)
        layout_name = "[CLS] sentences [SEP]"
        want_seg = np.zeros_like(inside)
    checks.append((~layout_ok, lambda r: (
        f"not {layout_name}: {int(length[r])} tokens, first token "
        f"{'[CLS]' if orig[r, 0] == shape.cls_id else orig[r, 0]}, {int(n_cls[r])} [CLS], "
        f"{int(n_sep[r])} [SEP] (first at {int(sep1[r])}), last token id {int(last[r])}")))
    special = [t for t in (shape.pad_id, shape.mask_id) if t is not None]
    stray = np.isin(orig, special) & inside
    checks.append((stray.any(1) & layout_ok, lambda r: f"special token id {orig[r, first(stray, r)]} inside "
                   f"the text at position {first(stray, r)}"))
    bad_seg = seg != want_seg
    checks.append((bad_seg.any(1) & layout_ok, lambda r: (
        f"segment_ids wrong at position {first(bad_seg, r)} (expected 0 through the first [SEP] at "
        f"{int(sep1[r])}, 1 up to the second at {int(length[r]) - 1}, 0 padding)" if shape.objective == "nsp"
        else f"segment_ids wrong at position {first(bad_seg, r)} (one segment: all 0)")))
    if "masked_lm_weights" in f:
        checks += _masking_checks(f, shape, lay, layout_ok, is_sep, n_cls + n_sep)
    if "next_sentence_labels" in f:
        nsp = f["next_sentence_labels"][:, 0]
        checks.append(((nsp != 0) & (nsp != 1), lambda r: f"next_sentence_labels is {nsp[r]} (must be 0 or 1)"))
    if "instance_key" in f:
        # Shards are written in key order; within a batch of consecutive records keys must increase.
        key = f["instance_key"][:, 0].view(np.uint64)
        index = np.asarray(batch.index)
        down = np.zeros(n, bool)
        down[1:] = (key[1:] <= key[:-1]) & (index[1:] == index[:-1] + 1)
        checks.append((down, lambda r: f"instance_key {int(key[r]):#018x} is not above the previous record's "
                       "(records are written in key order, keys are unique)"))
    if WORD_BITS in f:
        checks += _word_bits_checks(f[WORD_BITS], inside & (orig != shape.cls_id) & (orig != shape.sep_id))

    problems = []
    total = 0
    for failed, message in checks:
        rows_failed = np.nonzero(failed)[0]
        total += len(rows_failed)
        for r in rows_failed[:limit]:
            problems.append((int(batch.index[r]), message(int(r))))
    return problems, total


def _word_bits_checks(bits: np.ndarray, text: np.ndarray) -> list[tuple[np.ndarray, Callable[[int], str]]]:
    """The checks of ``word_continues_bits``: only bits of positions in the row, and a word goes on
    only over text tokens (``text``: inside the row, not [CLS] or [SEP])."""
    continues = unpack_word_bits(bits, text.shape[1])
    odd = pack_word_bits(continues) != bits
    off_text = continues & ~text

    def first(m: np.ndarray, r: int) -> int:
        return int(np.argmax(m[r]))

    return [(odd.any(1), lambda r: f"{WORD_BITS}[{first(odd, r)}]={int(bits[r, first(odd, r)])} holds bits of "
             f"no position (each value holds {WORD_BITS_PER_VALUE} positions, up to max_seq_length)"),
            (off_text.any(1), lambda r: f"{WORD_BITS} continues a word at position {first(off_text, r)}, which is "
             "not a text token (padding, [CLS] or [SEP])")]


def _masking_checks(f: dict[str, np.ndarray], shape: RecordShape, lay: Layout, layout_ok: np.ndarray,
                    is_sep: np.ndarray, specials: np.ndarray) -> list[tuple[np.ndarray, Callable[[int], str]]]:
    """The checks of statically masked records: weights, positions, labels, the recipe's count."""
    pos, mids, w = f["masked_lm_positions"], f["masked_lm_ids"], f["masked_lm_weights"]
    n, p = pos.shape
    s = f["input_ids"].shape[1]
    v = shape.vocab_size
    length = lay.length
    arp = np.arange(p)
    rows = np.arange(n)
    checks: list[tuple[np.ndarray, Callable[[int], str]]] = []

    def first(m: np.ndarray, r: int) -> int:
        return int(np.argmax(m[r]))

    k = lay.n_masked
    w_ok = ((w == 0) | (w == 1)) & (w == (arp < k[:, None]))
    checks.append((~w_ok.all(1), lambda r: "masked_lm_weights are not 1s then 0s: "
                   f"{w[r].tolist()}"))
    act = arp < k[:, None]
    out_seq = act & ((pos < 1) | (pos >= length[:, None]))
    checks.append((out_seq.any(1), lambda r: f"masked position {pos[r, first(out_seq, r)]} is not strictly "
                   f"inside the sequence (1..{int(length[r]) - 1})"))
    on_sep = act & is_sep[rows[:, None], np.clip(pos, 0, s - 1)]
    checks.append((on_sep.any(1) & layout_ok, lambda r: f"masked position {pos[r, first(on_sep, r)]} is on [SEP]"))
    unsorted = act[:, 1:] & (pos[:, 1:] <= pos[:, :-1])
    checks.append((unsorted.any(1), lambda r: f"masked_lm_positions not strictly increasing: "
                   f"{pos[r, :int(k[r])].tolist()}"))
    bad_label = act & ((mids < 0) | (mids >= v))
    checks.append((bad_label.any(1), lambda r: f"masked_lm_ids[{first(bad_label, r)}]="
                   f"{mids[r, first(bad_label, r)]} is not below the vocab size {v}"))
    bad_tail = ~act & ((pos != 0) | (mids != 0))
    checks.append((bad_tail.any(1), lambda r: f"masked_lm_positions/ids entry {first(bad_tail, r)} has weight 0 "
                   "but is not 0"))
    if shape.masked_lm_prob is not None:
        # The recipe: min(max_predictions, max(1, round(len * masked_lm_prob))) positions (round half to
        # even, as Python and np.round do), fewer only when there are fewer candidates (every token but
        # [CLS] and [SEP]); whole-word and span masking may take fewer because they skip or cut groups.
        want = np.minimum(np.minimum(p, np.maximum(1, np.round(length * shape.masked_lm_prob).astype(np.int64))),
                          length - specials)
        groups = shape.masking_unit != "token"
        wrong_k = (k > want) if groups else (k != want)
        checks.append((wrong_k & layout_ok, lambda r: (
            f"masks {int(k[r])} positions; the recipe gives {'at most ' if groups else ''}"
            f"{int(want[r])} for {int(length[r])} tokens at masked_lm_prob {shape.masked_lm_prob}")))
    return checks
