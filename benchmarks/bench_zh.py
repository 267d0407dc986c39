"""Chinese (issue #33), on ../shared/corpora/zhwiki_sample: vocab coverage, whole-word masking over
jieba's words, and its cost.

In one run:
- `train_vocab` with the CLI's defaults (--vocab-size 8000): tokens written, the share of [UNK]
  in the corpus tokenized with it;
- MB/s of the data path from documents to masked rows (tokenize, plan, lay out, mask: what `run`
  does per document, no Beam), character whole-word masking against `--word-segmenter jieba`;
  best of REPEATS, interleaved;
- CMRC 2018 trial (../shared/tasks/cmrc2018/trial.json) as training data, with a vocab trained on
  its contexts: answers re-anchored, the share of gold answers whose labelled token span is their
  own tokenization (recoverable), and the share that come back character-exact when that span is
  "predicted" (also ignoring the gold answers' own leading/trailing spaces);
- over DUPE_PASSES passes with jieba: the share of masked CJK characters whose whole segmented
  word (in the document, not only in the row) is masked, and why the others are not (truncation
  cut the word at the edge of A or B; the greedy scan never takes part of a group, so the
  prediction cap cuts none), against the same share with character masking;
- the same share with `--masking dynamic`: one unmasked copy of the records with their
  `word_continues_bits`, masked as the loaders mask them (`mask_records`) in DUPE_PASSES epochs.
"""

from __future__ import annotations

import dataclasses
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
CORPUS = REPO.parent / "shared" / "corpora" / "zhwiki_sample" / "wiki_00"
TRIAL = REPO.parent / "shared" / "tasks" / "cmrc2018" / "trial.json"
REPEATS = 3
DUPE_PASSES = 5


def _documents(config):
    from bert_datagen.datagen.readers import read_documents

    return list(read_documents(str(CORPUS), CORPUS.read_bytes(), config, {}))


def _build(raws, tokenizer, config, vocab, passes: int = 1):
    from bert_datagen.datagen.documents import tokenize_documents, unique_documents
    from bert_datagen.datagen.instances import masked_rows, plan_pool_pass

    docs, _ = unique_documents(tokenize_documents(raws, tokenizer, config, {}))
    out = []
    for pass_index in range(passes):
        plan = plan_pool_pass(docs, pass_index, config)
        rows = np.arange(len(plan))
        out.append((plan, masked_rows(plan, rows, config, vocab)))
    return out


def whole_word_share(plan, batch, vocab) -> dict[str, int]:
    """Masked CJK characters whose document word (jieba's) is masked whole, and those cut by truncation."""
    from bert_datagen.datagen.documents import split_marks
    from tests.support.wwm import cjk_ids

    ids, cont = split_marks(plan.tokens)
    n_tok = ids.shape[0]
    starts = np.flatnonzero(~cont)
    start_of = starts[np.searchsorted(starts, np.arange(n_tok), side="right") - 1]
    end_of = np.append(starts, n_tok)[np.searchsorted(starts, np.arange(n_tok), side="right")]
    is_cjk = cjk_ids(vocab)
    counts = {"masked_cjk": 0, "whole": 0, "cut_by_truncation": 0, "partly_masked": 0}
    pos, w = batch.masked_lm_positions, batch.masked_lm_weights
    for r in range(pos.shape[0]):
        p = pos[r][w[r] > 0].astype(np.int64)
        la, lb = int(plan.len_a[r]), int(plan.len_b[r])
        in_a = (p >= 1) & (p <= la)
        doc = np.where(in_a, plan.a_lo[r] + p - 1, plan.b_lo[r] + p - la - 2)
        row_lo = (int(plan.a_lo[r]), int(plan.b_lo[r]))
        row_hi = (row_lo[0] + la, row_lo[1] + lb)
        masked = set(doc.tolist())
        for d, a_side in zip(doc.tolist(), in_a.tolist(), strict=True):
            if not is_cjk[ids[d]]:
                continue
            counts["masked_cjk"] += 1
            lo, hi = int(start_of[d]), int(end_of[d])
            side = 0 if a_side else 1
            if lo < row_lo[side] or hi > row_hi[side]:
                counts["cut_by_truncation"] += 1
            elif all(x in masked for x in range(lo, hi)):
                counts["whole"] += 1
            else:
                counts["partly_masked"] += 1
    return counts


def _dynamic_share(raws, tokenizer, config, vocab) -> dict[str, int]:
    """``whole_word_share`` of dynamic masking's records over DUPE_PASSES epochs of masks."""
    from bert_datagen.datagen.dynamic import mask_records

    config = dataclasses.replace(config, masking="dynamic", dupe_factor=1)
    [(plan, batch)] = _build(raws, tokenizer, config, vocab)
    total = dict.fromkeys(("masked_cjk", "whole", "cut_by_truncation", "partly_masked"), 0)
    for epoch in range(DUPE_PASSES):
        masked = mask_records(batch.input_ids, batch.input_mask, batch.instance_key, epoch, config.random_seed,
                              config, vocab, batch.word_continues_bits)
        for k, v in whole_word_share(plan, masked, vocab).items():
            total[k] += v
    return total


def _cmrc() -> dict:
    import json

    from bert_datagen.datagen.tasks.config import TaskConfig
    from bert_datagen.vocab.tokenizer import BertTokenizer
    from bert_datagen.vocab.train import train_vocab
    from bert_datagen.vocab.vocab_file import Vocab
    from tests.support.span_roundtrip import gold_roundtrip
    from tests.support.taskdata_fixtures import build_file

    data = json.loads(TRIAL.read_text(encoding="utf-8"))
    contexts = [p["context"] for a in data["data"] for p in a["paragraphs"]]
    tok = BertTokenizer(Vocab.from_tokens(train_vocab(contexts, vocab_size=8000, do_lower_case=True)))
    records, _ = build_file(TaskConfig(kind="squad"), "train", TRIAL, tok)
    got = gold_roundtrip(records, tok)
    n = got["examples"]
    for miss in got["misses"]:
        print(f"  not exact: {miss['id']}: gold {miss['answer']!r}, span gives {miss['predicted']!r}")
    return {"cmrc_questions": records.counts["examples"], "cmrc_reanchored": records.counts.get("reanchored_answers", 0),
            "cmrc_with_answer_window": n, "cmrc_recoverable_share": round(got["recoverable"] / n, 4),
            "cmrc_exact_share": round(got["exact"] / n, 4),
            "cmrc_exact_but_gold_spaces_share": round(
                (got["exact"] + sum(m["predicted"] == m["answer"].strip() for m in got["misses"])) / n, 4)}


def main() -> dict:
    if not CORPUS.is_file():
        print(f"bench_zh: needs {CORPUS}; skipped")
        return {"skipped": True}
    sys.path.insert(0, str(REPO))
    from bert_datagen.datagen.config import DatagenConfig
    from bert_datagen.datagen.documents import tokenize_documents
    from bert_datagen.datagen.segmenters import get_segmenter
    from bert_datagen.vocab.tokenizer import BertTokenizer
    from bert_datagen.vocab.train import train_vocab
    from bert_datagen.vocab.vocab_file import Vocab

    char = DatagenConfig(whole_word_mask=True, dupe_factor=DUPE_PASSES)
    seg = dataclasses.replace(char, word_segmenter="jieba")
    raws = _documents(char)
    texts = [p for d in raws for p in d.paragraphs or []]
    megabytes = sum(len(t.encode()) for t in texts) / 1e6
    start = time.perf_counter()
    vocab = Vocab.from_tokens(train_vocab(texts, vocab_size=8000, do_lower_case=True))
    vocab_s = time.perf_counter() - start
    tokenizer = BertTokenizer(vocab)
    ids = np.concatenate(tokenizer.encode_batch_ids(texts))
    unk = float(np.mean(ids == vocab.unk_id))
    get_segmenter("jieba")  # the dictionary load, once per process, is not part of the rate

    best = {"char": float("inf"), "jieba": float("inf")}
    for _ in range(REPEATS):
        for name, config in (("char", char), ("jieba", seg)):
            start = time.perf_counter()
            _build(raws, tokenizer, config, vocab)
            best[name] = min(best[name], time.perf_counter() - start)
    start = time.perf_counter()
    tokenize_documents(raws, tokenizer, char, {})
    tokenize_s = time.perf_counter() - start

    shares = {}
    for name, config in (("char", char), ("jieba", seg)):
        total = dict.fromkeys(("masked_cjk", "whole", "cut_by_truncation", "partly_masked"), 0)
        marked_raws_config = seg  # measured against jieba's words in both cases
        plans = _build(raws, tokenizer, config, vocab, DUPE_PASSES)
        marked = _build(raws, tokenizer, marked_raws_config, vocab, DUPE_PASSES) if name == "char" else plans
        for (_, batch), (plan, _) in zip(plans, marked, strict=True):
            for k, v in whole_word_share(plan, batch, vocab).items():
                total[k] += v
        shares[name] = total
    shares["dynamic_jieba"] = _dynamic_share(raws, tokenizer, seg, vocab)

    figures = {
        "corpus_mb": round(megabytes, 3), "vocab_tokens": vocab.size, "vocab_seconds": round(vocab_s, 2),
        "unk_share": round(unk, 5), "char_mb_per_s": round(megabytes / best["char"], 3),
        "jieba_mb_per_s": round(megabytes / best["jieba"], 3),
        "jieba_vs_char_time": round(best["jieba"] / best["char"], 2),
        "tokenize_only_mb_per_s": round(megabytes / tokenize_s, 3),
    }
    for name, total in shares.items():
        n = max(total["masked_cjk"], 1)
        figures[f"{name}_masked_cjk"] = total["masked_cjk"]
        figures[f"{name}_whole_word_share"] = round(total["whole"] / n, 4)
        figures[f"{name}_cut_by_truncation_share"] = round(total["cut_by_truncation"] / n, 4)
        figures[f"{name}_partly_masked_share"] = round(total["partly_masked"] / n, 4)
    if TRIAL.is_file():
        figures.update(_cmrc())
    width = max(map(len, figures))
    for k, v in figures.items():
        print(f"  {k:<{width}}  {v}")
    return figures


if __name__ == "__main__":
    main()
