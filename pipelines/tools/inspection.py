"""`bert-datagen inspect`: records decoded back to text (segments, masked positions, NSP label)."""

from __future__ import annotations

from bert_datagen.contract.dataset import Dataset, ShardRef
from bert_datagen.datagen.example_codec import Batch
from bert_datagen.datagen.packed_rules import check_packed_batch
from bert_datagen.datagen.record_rules import RecordShape, derive
from bert_datagen.pipelines.tools.shards import pick_shard, read_records
from bert_datagen.vocab.vocab_file import Vocab


def record_view(batch: Batch, row: int, vocab: Vocab, shape: RecordShape) -> dict:
    """One record as plain data: tokens of A and B, masked positions with their kind and label (a
    packed row: its sequences, each such a view)."""
    if shape.max_sequences_per_row:
        return _packed_view(batch, row, vocab, shape)
    f = {k: v[row] for k, v in batch.features.items()}
    one = Batch(batch.index[row:row + 1], {k: v[row:row + 1] for k, v in batch.features.items()})
    lay = derive(one, shape)
    length, sep1 = int(lay.length[0]), int(lay.first_sep[0])
    k = int(lay.n_masked[0])  # 0 for dynamic masking: the trainer masks these records
    masked = {}
    for j in range(k):
        pos, label = int(f["masked_lm_positions"][j]), int(f["masked_lm_ids"][j])
        shown = int(f["input_ids"][pos]) if 0 <= pos < len(f["input_ids"]) else -1
        kind = "mask" if shown == shape.mask_id else ("kept" if shown == label else "random")
        masked[pos] = {"position": pos, "kind": kind, "shown": vocab.display_token(shown), "label": vocab.display_token(label)}
    tokens = []
    for i in range(length):
        entry = {"token": vocab.display_token(int(lay.original[0, i])), "segment": int(f["segment_ids"][i])}
        if i in masked:
            entry["masked"] = masked[i]
        tokens.append(entry)
    has_nsp = "next_sentence_labels" in f
    nsp = int(f["next_sentence_labels"][0]) if has_nsp else None
    # Without NSP the record is one segment (a [SEP] inside it separates documents).
    a_end = sep1 if sep1 > 0 and has_nsp else max(length - 1, 0)
    extra = {"instance_key": f"{int(f['instance_key'][0]) & ((1 << 64) - 1):#018x}"} if "instance_key" in f else {}
    return {
        "index": int(batch.index[row]),
        "length": length,
        "next_sentence_label": nsp,
        "relation": {0: "IsNext", 1: "NotNext"}.get(nsp, "invalid") if has_nsp else "none (no NSP)",
        **extra,
        "tokens": tokens,
        "a": [t["token"] for t in tokens[1:a_end]],
        "b": [t["token"] for t in tokens[a_end + 1:length - 1]],
        "masked": [masked[p] for p in sorted(masked)],
    }


def _packed_view(batch: Batch, row: int, vocab: Vocab, shape: RecordShape) -> dict:
    """A packed row: its sequences (record views, in row order) and all their tokens, row positions."""
    one = Batch(batch.index[row:row + 1], {k: v[row:row + 1] for k, v in batch.features.items()})
    problems, _, instances = check_packed_batch(one, shape, limit=1)
    starts = [int(c) for c in one.features["cls_positions"][0]]
    seqs = [{**record_view(instances, i, vocab, shape.instance_shape()), "cls_position": starts[i]}
            for i in range(len(instances))]
    tokens = [{**t, "sequence": k + 1} for k, v in enumerate(seqs) for t in v["tokens"]]
    labels = [v["next_sentence_label"] for v in seqs]
    has_nsp = "next_sentence_labels" in one.features
    return {
        "index": int(batch.index[row]),
        "packed": True,
        "length": len(tokens),
        "positions": shape.max_seq_length,
        "problem": problems[0][1] if problems else None,
        "next_sentence_label": labels if has_nsp else None,
        "relation": ", ".join(v["relation"] for v in seqs),
        "sequences": seqs,
        "tokens": tokens,
        "masked": [{**m, "position": m["position"] + v["cls_position"]} for v in seqs for m in v["masked"]],
    }


def shown_token(entry: dict) -> str:
    m = entry.get("masked")
    if m is None:
        return entry["token"]
    if m["kind"] == "mask":
        return f"{{MASK:{m['label']}}}"
    if m["kind"] == "kept":
        return f"{{kept:{m['label']}}}"
    return f"{{random {m['shown']}:{m['label']}}}"


def _segment_text(tokens: list[dict], words: bool) -> str:
    if not words:
        return " ".join(shown_token(t) for t in tokens)
    # Join WordPiece continuations to the word before them; a masked piece keeps its marker.
    out: list[str] = []
    for t in tokens:
        shown = shown_token(t)
        if t["token"].startswith("##") and out:
            out[-1] += shown if "masked" in t else shown[2:]
        else:
            out.append(shown)
    return " ".join(out)


def format_record(view: dict, shard_name: str, words: bool = False) -> str:
    """Human-readable text of a record_view (``words``: ## pieces joined into words)."""
    if view.get("packed"):
        lines = [f"{shard_name} row {view['index']}: {len(view['sequences'])} sequences, {view['length']} of "
                 f"{view['positions']} positions used" + (f"; BROKEN: {view['problem']}" if view["problem"] else "")]
        for k, seq in enumerate(view["sequences"], start=1):
            head, *body = format_record(seq, shard_name, words).splitlines()
            lines.append(f"  sequence {k} at position {seq['cls_position']}: {head.split(': ', 1)[1]}")
            lines += ["  " + line for line in body]
        return "\n".join(lines)
    tokens = view["tokens"]
    a_end = 1 + len(view["a"])
    nsp = view["next_sentence_label"]
    if nsp is None:  # packed sentences, one segment
        head = f"{shard_name} record {view['index']}: {view['length']} tokens, {len(view['masked'])} masked, no NSP"
        body = ["  text: " + _segment_text(tokens[1:a_end], words)]
    else:
        why = {0: "B follows A in the document",
               1: "B is a random segment, not the text after A: from another document, or from this one when "
                  "it is alone in its NotNext pool"}.get(nsp, "")
        head = (f"{shard_name} record {view['index']}: {view['length']} tokens, {len(view['masked'])} masked, "
                f"NSP label {nsp} = {view['relation']}" + (f" ({why})" if why else ""))
        body = ["  A: " + _segment_text(tokens[1:a_end], words),
                "  B: " + _segment_text(tokens[a_end + 1:view["length"] - 1], words)]
    if "instance_key" in view:
        masked_line = f"  masked: none stored (dynamic masking; instance_key {view['instance_key']})"
    else:
        masked_line = "  masked: " + ", ".join(
            f"{m['position']} {'[MASK]' if m['kind'] == 'mask' else m['kind']}"
            + (f" ({m['shown']})" if m["kind"] == "random" else "") + f" -> {m['label']}"
            for m in view["masked"])
    return "\n".join([head, *body, masked_line])


def inspect_records(ds: Dataset, *, split: str | None, shard: int, index: int, count: int
                    ) -> tuple[ShardRef, list[dict], list[str]]:
    ref = pick_shard(ds, split, shard)
    batch, problems = read_records(ref, ds.shape, index, count)
    views = [record_view(batch, r, ds.vocab, ds.shape) for r in range(len(batch))]
    return ref, views, problems
