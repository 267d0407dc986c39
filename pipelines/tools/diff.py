"""`bert-datagen diff`: are two datasets the same data? Manifests, shard checksums, first differing record."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from bert_datagen.contract.dataset import Dataset, DatasetError, ShardRef
from bert_datagen.pipelines.tools.inspection import shown_token
from bert_datagen.pipelines.tools.kinds import tools_for
from bert_datagen.pipelines.tools.shards import iter_payloads

# Manifest fields that say how or from where a dataset was made, not what it holds: two datasets that
# differ only here are the same data (the input's content is pinned by input.fingerprint).
# Where the documents came from, not what they are: the same documents gzip-compressed, split into
# other files or listed by other patterns give the same fingerprint and shards.
INFORMATIONAL = ("created_by", "tool", "input.patterns", "input.files", "input.bytes")


@dataclass
class DiffReport:
    fields: list[tuple[str, object, object]]  # manifest fields (config.*, vocab.*, ...) that differ
    shards: list[tuple[str, str | None, str | None]]  # (path, sha256 in A or None, sha256 in B or None)
    first_record: dict | None = None
    notes: list[tuple[str, object, object]] = field(default_factory=list)  # informational differences

    @property
    def identical(self) -> bool:
        return not self.fields and not self.shards


def _flat(d: object, prefix: str = "") -> dict[str, object]:
    if isinstance(d, dict):
        out: dict[str, object] = {}
        for k, v in d.items():
            out.update(_flat(v, f"{prefix}{k}."))
        return out if out or not prefix else {prefix[:-1]: {}}
    return {prefix[:-1]: d}


def _split_records(ds: Dataset, split: str) -> Iterator[tuple[ShardRef, int, bytes]]:
    for ref in ds.shards:
        if ref.split == split:
            for i, payload in iter_payloads(ref):
                yield ref, i, payload


def _first_difference(a: Dataset, b: Dataset, splits: list[str]) -> dict | None:
    """The first record that differs between the two datasets, split by split, across shard boundaries."""
    for split in splits:
        ia, ib = _split_records(a, split), _split_records(b, split)
        n = 0
        while True:
            ra, rb = next(ia, None), next(ib, None)
            if ra is None and rb is None:
                break
            if ra is not None and rb is not None and ra[2] == rb[2]:
                n += 1
                continue
            side = {}
            for key, ds, rec in (("a", a, ra), ("b", b, rb)):
                if rec is None:
                    side[key] = None
                    continue
                view, problems = tools_for(ds.kind).record_view(ds, split, rec[1], rec[2])
                side[key] = {"shard": rec[0].name, "index": rec[1], "view": view,
                             "problem": problems[0][1] if problems else None}
            return {"split": split, "position": n, **side}
    return None


def _with_config_defaults(ds: Dataset) -> dict:
    """A config field added after a dataset was made has its default there (it made no difference).
    The defaults are those of the dataset's own kind: a task dataset's config has no dupe_factor."""
    assert ds.manifest is not None
    manifest = ds.manifest.to_dict()
    return {**manifest, "config": {**tools_for(ds.kind).config_defaults(), **manifest.get("config", {})}}


def diff_datasets(a: Dataset, b: Dataset, *, records: bool = True) -> DiffReport:
    if a.manifest is None or b.manifest is None:
        raise DatasetError("diff compares two datasets with manifests")
    fa = {k: v for k, v in _flat(_with_config_defaults(a)).items() if ".shards" not in k}
    fb = {k: v for k, v in _flat(_with_config_defaults(b)).items() if ".shards" not in k}
    differ = [(k, fa.get(k), fb.get(k)) for k in sorted(set(fa) | set(fb)) if fa.get(k) != fb.get(k)]
    info = [d for d in differ if any(d[0] == p or d[0].startswith(p + ".") for p in INFORMATIONAL)]
    fields = [d for d in differ if d not in info]
    sha_a = {s.name: s.expected.sha256 for s in a.shards if s.expected}
    sha_b = {s.name: s.expected.sha256 for s in b.shards if s.expected}
    shards = [(p, sha_a.get(p), sha_b.get(p)) for p in sorted(set(sha_a) | set(sha_b), key=_shard_order(a, b))
              if sha_a.get(p) != sha_b.get(p)]
    report = DiffReport(fields, shards, notes=info)
    if records and shards:
        splits = list(dict.fromkeys(a.splits + b.splits))
        report.first_record = _first_difference(a, b, splits)
    return report


def _shard_order(a: Dataset, b: Dataset) -> Callable[[str], int]:
    order = {s.name: i for i, s in enumerate(a.shards + b.shards) if s.name}
    return lambda p: order.get(p, 0)


def _side_by_side(first: dict, width: int = 28) -> list[str]:
    va = first["a"]["view"] if first["a"] else None
    vb = first["b"]["view"] if first["b"] else None
    lines = [f"{'pos':>5} {'seg':>3}  {'A':<{width}} {'B':<{width}}"]
    ta = va["tokens"] if va else []
    tb = vb["tokens"] if vb else []
    for i in range(max(len(ta), len(tb))):
        x = shown_token(ta[i]) if i < len(ta) else ""
        y = shown_token(tb[i]) if i < len(tb) else ""
        seg = ta[i]["segment"] if i < len(ta) else tb[i]["segment"]
        mark = " " if x == y and (i >= len(ta) or i >= len(tb) or ta[i]["segment"] == tb[i]["segment"]) else "*"
        lines.append(f"{i:>5} {seg:>3}{mark} {x[:width]:<{width}} {y[:width]:<{width}}")
    def label(v: dict | None) -> str:
        if v is None:
            return "-"
        if "next_sentence_label" in v:
            return f"{v['next_sentence_label']} {v['relation']}"
        return str(v.get("label_text", v.get("label", v.get("unique_id", ""))))

    name = "NSP" if (va or vb or {}).get("next_sentence_label") is not None else "label"
    lines.append(f"{name:>9}  {label(va):<{width}} {label(vb):<{width}}")
    return lines


def format_diff(report: DiffReport, a_name: str, b_name: str) -> str:
    notes = [f"  (informational) {k}: {va!r} -> {vb!r}" for k, va, vb in report.notes]
    if report.identical:
        return "\n".join([f"identical: {a_name} and {b_name} hold the same data (same config, vocab, counts "
                          "and shard checksums)"] + notes)
    lines = [f"different: {a_name} (A) and {b_name} (B)"] + notes
    if report.fields:
        lines.append(f"{len(report.fields)} manifest field(s) differ:")
        lines += [f"  {k}: {va!r} -> {vb!r}" for k, va, vb in report.fields]
    if report.shards:
        lines.append(f"{len(report.shards)} shard(s) differ:")
        for path, x, y in report.shards:
            if x is None or y is None:
                lines.append(f"  {path}: only in {'B' if x is None else 'A'}")
            else:
                lines.append(f"  {path}: sha256 {x[:16]}... -> {y[:16]}...")
    first = report.first_record
    if first:
        where = ", ".join(f"{k.upper()} {first[k]['shard']} record {first[k]['index']}"
                          for k in ("a", "b") if first[k])
        lines.append(f"first differing record: split {first['split']}, record {first['position']} of the split "
                     f"({where})")
        for k in ("a", "b"):
            if first[k] is None:
                lines.append(f"  {k.upper()} has no record there (the split ends)")
            elif first[k]["problem"]:
                lines.append(f"  {k.upper()} record does not parse: {first[k]['problem']}")
        lines += ["  " + line for line in _side_by_side(first)]
    return "\n".join(lines)
