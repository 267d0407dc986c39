"""A tiny model trained briefly on real text learns both objectives.

Data comes from the real pipeline (`bert-datagen vocab` + `bert-datagen run`, tests/support/learning.py):
Wikipedia in English, Chinese and Vietnamese plus two French novels, 128 tokens, mixed into one
corpus as multilingual BERT mixed Wikipedias. Checked: NSP balanced accuracy (mean of per-class
recalls, so a constant guess scores 0.5 whatever the class mix) clearly above 0.5, both classes
recognised, and MLM accuracy at least twice that of always predicting the most frequent masked
token. The longer runs (this one to 600 steps, and English Wikipedia at 64 tokens for MLM) are in
`make bench` (benchmarks/bench_learning.py).

Why a mixed corpus (measured on this machine, tiny model, 128 tokens): on English-only Wikipedia
NotNext differs from IsNext only by topic, a relation between the segments that a from-scratch
tiny model had not picked up after 2,000 steps of 8 at learning rates 1e-3, 5e-4 or 3e-4 (NSP
predictions constant), nor after 750 NSP-only steps of 32 at 1e-4 (balanced accuracy 0.54). When
NotNext partners are often in another language, it picks the relation up within a few hundred
steps, which is what a brief test can check: labels, pooler, NSP head, loss and gradients all
work. The learning rate matters: at 1e-3 the [CLS] pathway collapses (pooled outputs nearly equal
across examples; NSP stays at the class prior even on the mixed corpus), at 5e-4 it does not.
"""

from __future__ import annotations

import pytest

tf = pytest.importorskip("tensorflow")

from tests.support.learning import multilingual_dataset, train_briefly  # noqa: E402

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def mixed_dataset(shared_corpora, tmp_path_factory) -> str:
    try:
        return multilingual_dataset(shared_corpora, tmp_path_factory.mktemp("multilingual"))
    except FileNotFoundError as e:
        pytest.skip(str(e))


def test_tiny_model_learns_next_sentence_prediction_and_masked_lm(mixed_dataset, tmp_path):
    # The first 300 steps of a 1000-step schedule (the benchmark goes on to 600: balanced accuracy
    # 0.75 on 2026-12-02). Measured at 300 steps with seeds 1, 3, 4, 5: NSP balanced accuracy 0.75,
    # 0.80, 0.69, 0.76 (smallest class recall 0.57 or more), MLM 3.6-4.2x its baseline. Runs that have
    # not learned NSP predict one class (balanced 0.50), as seeds 2, 3 and 4 did at 150 steps and
    # seeds 3 and 4 still did at 200, so fewer steps would test the seed's luck rather than the model.
    r = train_briefly(mixed_dataset, tmp_path / "run", stop_at=300, batch_size=16, steps=1000,
                      learning_rate=5e-4, warmup_steps=100)
    assert r["mlm_weight"] > 2000 and min(t for _, t in r["per_class"].values()) > 200
    assert r["nsp_balanced"] >= 0.65  # a constant guess scores 0.5
    assert r["nsp_accuracy"] >= r["nsp_majority"] + 0.1
    assert min(c / t for c, t in r["per_class"].values()) >= 0.5  # both classes recognised
    assert r["mlm_accuracy"] >= 2 * r["mlm_baseline"]
