"""Brief pre-training runs on real text, for the learning benchmark (benchmarks/bench_learning.py)
and their full-size versions (benchmarks/bench_learning.py): datasets built by the real pipeline
(`bert-datagen vocab` + `bert-datagen run`) from ../shared/corpora, a tiny model trained for the
first steps of a schedule, and its held-out figures."""

from __future__ import annotations

import collections
import json
from pathlib import Path

import numpy as np
from click.testing import CliRunner

from bert_datagen.trainer.interop.restore import restore_model
from bert_datagen.trainer.pretrain.config import TrainConfig
from bert_datagen.trainer.pretrain.data import eval_batches, open_pretraining_data
from bert_datagen.trainer.pretrain.train import pretrain

# (format, files under ../shared/corpora): Wikipedia in three languages and two French novels.
MULTILINGUAL = (("wikiextractor", "enwiki_extract_2015/wiki_00"), ("wikiextractor", "zhwiki_sample/wiki_00"),
                ("wikiextractor", "viwiki_sample/wiki_00"), ("text", "gutenberg_fr/*.txt"))


def bert_datagen(*args: str) -> None:
    from bert_datagen.pipelines.cli import main

    result = CliRunner().invoke(main, list(args))
    assert result.exit_code == 0, result.output + repr(result.exception)


def wiki_dataset(corpora: Path, out: Path) -> str:
    """English Wikipedia (four files), 64 tokens; FileNotFoundError without the corpus."""
    wiki = corpora / "enwiki_extract_2015"
    if not (wiki / "wiki_00").is_file():
        raise FileNotFoundError(f"{wiki} has no wiki_00")
    pattern = str(wiki / "wiki_0[0-3]")
    bert_datagen("vocab", "--input", pattern, "--input-format", "wikiextractor", "--output", str(out / "vocab.txt"),
                 "--vocab-size", "2000", "--num-unused", "0")
    bert_datagen("run", "--input", pattern, "--input-format", "wikiextractor", "--vocab", str(out / "vocab.txt"),
                 "--output", str(out / "data"), "--max-seq-length", "64", "--max-predictions-per-seq", "10",
                 "--dupe-factor", "1", "--eval-fraction", "0.1", "--num-shards", "2", "--quiet")
    return str(out / "data")


def multilingual_dataset(corpora: Path, out: Path) -> str:
    """One jsonl corpus (a document a line) from several formats, read by the pipeline's own readers,
    then 128-token data; FileNotFoundError when a source is missing."""
    from bert_datagen.datagen.config import DatagenConfig
    from bert_datagen.datagen.readers import read_documents

    corpus = out / "corpus.jsonl"
    with corpus.open("w", encoding="utf-8") as f:
        for fmt, pattern in MULTILINGUAL:
            paths = sorted(corpora.glob(pattern))
            if not paths:
                raise FileNotFoundError(f"{corpora / pattern} matches no file")
            for path in paths:
                for raw in read_documents(str(path), path.read_bytes(), DatagenConfig(input_format=fmt), {}):
                    if raw.paragraphs:
                        f.write(json.dumps({"text": "\n".join(raw.paragraphs)}, ensure_ascii=False) + "\n")
    # 6,000 single characters in the initial alphabet: Chinese text needs them, or [UNK] becomes the
    # most frequent masked token.
    bert_datagen("vocab", "--input", str(corpus), "--input-format", "jsonl", "--output", str(out / "vocab.txt"),
                 "--vocab-size", "12000", "--num-unused", "0", "--limit-alphabet", "6000")
    bert_datagen("run", "--input", str(corpus), "--input-format", "jsonl", "--vocab", str(out / "vocab.txt"),
                 "--output", str(out / "data"), "--max-seq-length", "128", "--max-predictions-per-seq", "20",
                 "--dupe-factor", "2", "--eval-fraction", "0.1", "--num-shards", "2", "--quiet")
    return str(out / "data")


def most_frequent_masked_token(info) -> int:
    counts: collections.Counter[int] = collections.Counter()
    for batch in eval_batches(info, 256, files=info.train_files):
        ids, weights = batch["masked_lm_ids"], batch["masked_lm_weights"]
        counts.update(ids[weights > 0].tolist())
    return counts.most_common(1)[0][0]


def train_briefly(data: str, run: Path, stop_at: int, seed: int = 1, **settings) -> dict:
    """Train a tiny model for the first ``stop_at`` steps of a schedule; its eval figures."""
    info = open_pretraining_data(data)
    top = most_frequent_masked_token(info)
    pretrain(TrainConfig(data=data, out=str(run), model="tiny", seed=seed, checkpoint_every=settings["steps"],
                         log_every=200, eval_batches=1, shuffle_buffer=2000, **settings), log=print, stop_at=stop_at)
    model, _, _ = restore_model(run)
    r = evaluate(model, info, top)
    print(f"eval: MLM accuracy {r['mlm_accuracy']:.4f} vs most-frequent-token {r['mlm_baseline']:.4f}; NSP "
          f"accuracy {r['nsp_accuracy']:.4f} (majority class {r['nsp_majority']:.4f}), balanced "
          f"{r['nsp_balanced']:.4f}, {r['per_class']}")
    return r


def evaluate(model, info, top: int) -> dict:
    import tensorflow as tf

    forward = tf.function(lambda batch: model(batch, training=False))  # a few times faster than eager calls
    hits = weight = base_hits = 0.0
    per_class = {0: [0, 0], 1: [0, 0]}  # label -> [correct, total]
    for batch in eval_batches(info, 64):
        out = {k: v.numpy() for k, v in forward(batch).items()}
        w = batch["masked_lm_weights"]
        ids = batch["masked_lm_ids"]
        hits += float((w * (out["mlm_logits"].argmax(-1) == ids)).sum())
        base_hits += float((w * (ids == top)).sum())
        weight += float(w.sum())
        labels = batch["next_sentence_labels"].ravel()
        guess = out["nsp_logits"].argmax(-1)
        for label in (0, 1):
            per_class[label][0] += int(((guess == label) & (labels == label)).sum())
            per_class[label][1] += int((labels == label).sum())
    total = sum(t for _, t in per_class.values())
    return {"mlm_accuracy": hits / weight, "mlm_baseline": base_hits / weight, "mlm_weight": weight,
            "nsp_accuracy": sum(c for c, _ in per_class.values()) / total,
            "nsp_majority": max(t for _, t in per_class.values()) / total,
            "nsp_balanced": float(np.mean([c / t for c, t in per_class.values()])), "per_class": per_class}
