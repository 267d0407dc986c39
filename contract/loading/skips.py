"""Global batches a run leaves out (`bert-train pretrain --skip-batches A-B`): the usual way past a
loss spike, made deterministic. A run's training step ``s`` reads global batch ``batch_of_step(s)``:
the ``s``-th batch of the order that no skipped range holds. Ranges are inclusive, in global batch
indices (what `bert-datagen batches --step K` shows), and only batches not yet trained on can be
skipped, so a run's past never changes.
"""

from __future__ import annotations

from collections.abc import Sequence

from bert_datagen.contract.bounds import INT64_MAX, check_int

Ranges = list[tuple[int, int]]


class SkipError(ValueError):
    """Ranges that cannot be skipped (malformed, or batches the run has already trained on)."""


def parse_ranges(text: str) -> Ranges:
    """``"A-B,C,D-E"`` -> sorted, merged inclusive ranges; SkipError for anything else."""
    ranges: Ranges = []
    for part in (p.strip() for p in text.split(",")):
        first, dash, last = part.partition("-")
        try:
            a = int(first)
            b = int(last) if dash else a
        except ValueError:
            raise SkipError(f"{part!r} is not a batch range: write A-B (inclusive) or A, e.g. 1200-1299") from None
        if a < 0 or b < a:
            raise SkipError(f"{part!r} is not a batch range: it needs 0 <= A <= B")
        if b > INT64_MAX:
            raise SkipError(f"{part!r}: batch {b} is past the last one a global order can index ({INT64_MAX})")
        ranges.append((a, b))
    return merge(ranges)


def merge(ranges: Sequence[Sequence[int]]) -> Ranges:
    """Sorted, overlapping or touching ranges joined."""
    checked = []
    for r in ranges:
        if len(r) != 2:
            raise SkipError(f"{r!r} is not a batch range [first, last]")
        a = check_int(r[0], "a skipped range's first batch")
        checked.append((a, check_int(r[1], "a skipped range's last batch", a)))
    out: Ranges = []
    for a, b in sorted(checked):
        if out and a <= out[-1][1] + 1:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def batch_of_step(step: int, ranges: Sequence[Sequence[int]]) -> int:
    """The global batch a run reads at training step ``step`` (0-based)."""
    batch = check_int(step, "step")
    for a, b in merge(ranges):
        if a <= batch:
            batch += b - a + 1
    return batch


def add_ranges(recorded: Sequence[Sequence[int]], new: Sequence[Sequence[int]], next_step: int) -> Ranges:
    """``recorded`` plus ``new`` for a run whose next training step is ``next_step``. A range already
    recorded may be given again (the same command run twice); a new one must lie wholly after the
    last batch the run trained on."""
    check_int(next_step, "next_step")
    recorded = merge(recorded)
    next_batch = batch_of_step(next_step, recorded)
    fresh = [r for r in merge(new) if not _covered(r, recorded)]
    for a, b in fresh:
        if a < next_batch:
            raise SkipError(f"batches {a}-{b}: the run has already trained on global batches up to "
                            f"{next_batch - 1} (its next step {next_step} reads batch {next_batch}); only later "
                            "batches can be skipped")
    return merge(recorded + fresh)


def _covered(r: tuple[int, int], ranges: Ranges) -> bool:
    return any(a <= r[0] and r[1] <= b for a, b in ranges)
