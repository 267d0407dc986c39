"""A tiny model trained briefly on real text learns: MLM accuracy at least twice that of always
predicting the most frequent masked token, NSP above 0.5 and at least the majority-class rate.

Data comes from the real pipeline (`bert-datagen vocab` + `bert-datagen run`) on English Wikipedia
text from ../shared/corpora. The generated pairs are mostly NotNext (single-sentence chunks force it),
so plain NSP accuracy of a constant guess already exceeds 0.5: the test also prints the balanced
accuracy (mean of per-class recalls), which a short run does not lift far above 0.5.
"""

from __future__ import annotations

import collections

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

from click.testing import CliRunner  # noqa: E402

from trainer.config import TrainConfig  # noqa: E402
from trainer.data import eval_dataset, open_dataset  # noqa: E402
from trainer.train import pretrain, restore_model  # noqa: E402

pytestmark = pytest.mark.integration


def bert_datagen(*args: str) -> None:
    from pipelines.cli import main

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


def test_tiny_model_learns_from_real_text(wiki_dataset, tmp_path):
    info = open_dataset(wiki_dataset)
    top = most_frequent_masked_token(info)
    run = tmp_path / "run"
    # The first 800 steps of a 2500-step schedule (stop_at: the trajectory is exactly that of the
    # full run). A from-scratch MLM first sits on a plateau, guessing tokens by frequency; with
    # batches of 8 at lr 1e-3 this run leaves it after ~400 updates. Measured on this data: runs
    # whose learning rate decays sooner (1000-1500-step schedules) or with batches of 32 were still
    # on the plateau after 1000+ steps, so the settings here are not arbitrary.
    pretrain(TrainConfig(data=wiki_dataset, out=str(run), model="tiny", batch_size=8, steps=2500,
                         learning_rate=1e-3, warmup_steps=250, seed=1, checkpoint_every=2500, log_every=200,
                         eval_batches=1, shuffle_buffer=2000), log=print, stop_at=800)

    model, _, _ = restore_model(run)
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
    mlm_accuracy, baseline = hits / weight, base_hits / weight
    nsp_accuracy = sum(c for c, _ in per_class.values()) / sum(t for _, t in per_class.values())
    majority = max(t for _, t in per_class.values()) / sum(t for _, t in per_class.values())
    balanced_nsp = np.mean([c / t for c, t in per_class.values()])
    print(f"eval: MLM accuracy {mlm_accuracy:.4f} vs most-frequent-token {baseline:.4f}; NSP accuracy "
          f"{nsp_accuracy:.4f} (majority class {majority:.4f}, balanced {balanced_nsp:.4f}, {per_class})")
    assert weight > 2000 and min(t for _, t in per_class.values()) > 50
    assert mlm_accuracy >= 2 * baseline
    # Most pairs are NotNext (one-sentence chunks force it); a run this short learns that prior,
    # not yet the pair itself (balanced accuracy stays near 0.5).
    assert nsp_accuracy > 0.5 and nsp_accuracy >= majority - 0.02
