"""A tiny model trained briefly on real text learns both objectives.

Data comes from the real pipeline (`bert-datagen vocab` + `bert-datagen run`) on text from
../shared/corpora. Two runs:

- English Wikipedia, 64 tokens: MLM accuracy at least twice that of always predicting the most
  frequent masked token.
- Wikipedia in English, Chinese and Vietnamese plus two French novels, 128 tokens, mixed into one
  corpus as multilingual BERT mixed Wikipedias: NSP balanced accuracy (mean of per-class recalls,
  so a constant guess scores 0.5 whatever the class mix) clearly above 0.5, and MLM again at least
  twice its baseline.

Why two corpora (measured on this machine, tiny model, 128 tokens): on English-only Wikipedia
NotNext differs from IsNext only by topic, a relation between the segments that a from-scratch
tiny model had not picked up after 2,000 steps of 8 at learning rates 1e-3, 5e-4 or 3e-4 (NSP
predictions constant), nor after 750 NSP-only steps of 32 at 1e-4 (balanced accuracy 0.54). When
NotNext partners are often in another language, it picks the relation up within a few hundred
steps, which is what a brief test can check: labels, pooler, NSP head, loss and gradients all
work. The learning rate matters: at 1e-3 the [CLS] pathway collapses (pooled outputs nearly equal
across examples; NSP stays at the class prior even on the mixed corpus), at 5e-4 it does not.
"""

from __future__ import annotations

import collections

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

from click.testing import CliRunner  # noqa: E402

from bert_datagen.trainer.interop.loading import restore_model  # noqa: E402
from bert_datagen.trainer.pretrain.data import eval_dataset, open_pretraining_data  # noqa: E402
from bert_datagen.trainer.pretrain.train import pretrain  # noqa: E402
from bert_datagen.trainer.run.config import TrainConfig  # noqa: E402

pytestmark = pytest.mark.integration


def bert_datagen(*args: str) -> None:
    from bert_datagen.pipelines.cli import main

    result = CliRunner().invoke(main, list(args))
    assert result.exit_code == 0, result.output + repr(result.exception)


@pytest.fixture(scope="module")
def wiki_dataset(shared_corpora, tmp_path_factory) -> str:
    wiki = shared_corpora / "enwiki_extract_2015"
    if not (wiki / "wiki_00").is_file():
        pytest.skip(f"{wiki} has no wiki_00")
    out = tmp_path_factory.mktemp("learn")
    pattern = str(wiki / "wiki_0[0-3]")
    bert_datagen("vocab", "--input", pattern, "--input-format", "wikiextractor", "--output", str(out / "vocab.txt"),
                 "--vocab-size", "2000", "--num-unused", "0")
    bert_datagen("run", "--input", pattern, "--input-format", "wikiextractor", "--vocab", str(out / "vocab.txt"),
                 "--output", str(out / "data"), "--max-seq-length", "64", "--max-predictions-per-seq", "10",
                 "--dupe-factor", "1", "--eval-fraction", "0.1", "--num-shards", "2", "--quiet")
    return str(out / "data")


def most_frequent_masked_token(info) -> int:
    counts: collections.Counter[int] = collections.Counter()
    for batch in eval_dataset(info, 256, files=info.train_files):
        ids, weights = batch["masked_lm_ids"].numpy(), batch["masked_lm_weights"].numpy()
        counts.update(ids[weights > 0].tolist())
    return counts.most_common(1)[0][0]


def test_tiny_model_learns_masked_lm_from_english_text(wiki_dataset, tmp_path):
    # The first 800 steps of a 2500-step schedule (stop_at: the trajectory is exactly that of the
    # full run). A from-scratch MLM first sits on a plateau, guessing tokens by frequency; with
    # batches of 8 at lr 1e-3 this run leaves it after ~400 updates. Measured on this data: runs
    # whose learning rate decays sooner (1000-1500-step schedules) or with batches of 32 were still
    # on the plateau after 1000+ steps, so the settings here are not arbitrary.
    r = train_briefly(wiki_dataset, tmp_path / "run", stop_at=800, batch_size=8, steps=2500,
                      learning_rate=1e-3, warmup_steps=250)
    assert r["mlm_weight"] > 2000 and min(t for _, t in r["per_class"].values()) > 50
    assert r["mlm_accuracy"] >= 2 * r["mlm_baseline"]
    # Most pairs at 64 tokens are NotNext (one-sentence chunks force it); a run this short learns
    # that prior, not the relation (see the module docstring and the next test).
    assert r["nsp_accuracy"] > 0.5 and r["nsp_accuracy"] >= r["nsp_majority"] - 0.02


# (format, files under ../shared/corpora): Wikipedia in three languages and two French novels.
MULTILINGUAL = (("wikiextractor", "enwiki_extract_2015/wiki_00"), ("wikiextractor", "zhwiki_sample/wiki_00"),
                ("wikiextractor", "viwiki_sample/wiki_00"), ("text", "gutenberg_fr/*.txt"))


@pytest.fixture(scope="module")
def multilingual_dataset(shared_corpora, tmp_path_factory) -> str:
    """One jsonl corpus (a document a line) from several formats, read by the pipeline's own readers."""
    import json

    from bert_datagen.datagen.config import DatagenConfig
    from bert_datagen.datagen.readers import read_documents

    out = tmp_path_factory.mktemp("multilingual")
    corpus = out / "corpus.jsonl"
    with corpus.open("w", encoding="utf-8") as f:
        for fmt, pattern in MULTILINGUAL:
            paths = sorted(shared_corpora.glob(pattern))
            if not paths:
                pytest.skip(f"{shared_corpora / pattern} matches no file")
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


def train_briefly(data: str, run, stop_at: int, **settings) -> dict:
    """Train a tiny model for the first ``stop_at`` steps of a schedule; its eval figures."""
    info = open_pretraining_data(data)
    top = most_frequent_masked_token(info)
    pretrain(TrainConfig(data=data, out=str(run), model="tiny", seed=1, checkpoint_every=settings["steps"],
                         log_every=200, eval_batches=1, shuffle_buffer=2000, **settings), log=print, stop_at=stop_at)
    model, _, _ = restore_model(run)
    r = evaluate(model, info, top)
    print(f"eval: MLM accuracy {r['mlm_accuracy']:.4f} vs most-frequent-token {r['mlm_baseline']:.4f}; NSP "
          f"accuracy {r['nsp_accuracy']:.4f} (majority class {r['nsp_majority']:.4f}), balanced "
          f"{r['nsp_balanced']:.4f}, {r['per_class']}")
    return r


def evaluate(model, info, top: int) -> dict:
    hits = weight = base_hits = 0.0
    per_class = {0: [0, 0], 1: [0, 0]}  # label -> [correct, total]
    for batch in eval_dataset(info, 64):
        out = model(batch, training=False)
        w = batch["masked_lm_weights"].numpy()
        ids = batch["masked_lm_ids"].numpy()
        hits += float((w * (out["mlm_logits"].numpy().argmax(-1) == ids)).sum())
        base_hits += float((w * (ids == top)).sum())
        weight += float(w.sum())
        labels = batch["next_sentence_labels"].numpy().ravel()
        guess = out["nsp_logits"].numpy().argmax(-1)
        for label in (0, 1):
            per_class[label][0] += int(((guess == label) & (labels == label)).sum())
            per_class[label][1] += int((labels == label).sum())
    total = sum(t for _, t in per_class.values())
    return {"mlm_accuracy": hits / weight, "mlm_baseline": base_hits / weight, "mlm_weight": weight,
            "nsp_accuracy": sum(c for c, _ in per_class.values()) / total,
            "nsp_majority": max(t for _, t in per_class.values()) / total,
            "nsp_balanced": float(np.mean([c / t for c, t in per_class.values()])), "per_class": per_class}


def test_tiny_model_learns_next_sentence_prediction(multilingual_dataset, tmp_path):
    # The first 600 steps of a 1000-step schedule. Measured on this data: NSP balanced accuracy
    # 0.74 after 400 steps, 0.82 after 700; MLM about 4x its baseline.
    r = train_briefly(multilingual_dataset, tmp_path / "run", stop_at=600, batch_size=16, steps=1000,
                      learning_rate=5e-4, warmup_steps=100)
    assert r["mlm_weight"] > 2000 and min(t for _, t in r["per_class"].values()) > 200
    assert r["nsp_balanced"] >= 0.65  # a constant guess scores 0.5
    assert r["nsp_accuracy"] >= r["nsp_majority"] + 0.1
    assert min(c / t for c, t in r["per_class"].values()) >= 0.5  # both classes recognised
    assert r["mlm_accuracy"] >= 2 * r["mlm_baseline"]
