"""Golden checksums: a fixed corpus and config must keep producing these exact shard bytes.

If a change alters them on purpose (a new RNG purpose, a recipe fix), update the pins in the same
commit and say why: every dataset made before no longer reproduces.
"""

from __future__ import annotations

from bert_datagen.pipelines.pretraining.run import generate_dataset
from tests.support.pipeline_corpus import (
    make_documents,
    manifest_of,
    shard_digests,
    write_sentence_files,
    write_vocab,
)
from tests.support.pipeline_golden import CONFIG, GOLDEN_FINGERPRINT, GOLDEN_SHARDS

GOLDEN_TOTALS = {"documents": 30, "sentences": 159, "tokens": 1673, "instances": 173, "masked_tokens": 780,
                 "notnext_fraction": 0.630058, "decode_errors": 0, "dropped_documents": 0,
                 "duplicate_documents": 0}


def test_golden_dataset(tmp_path) -> None:
    write_sentence_files(tmp_path / "in", make_documents(30, seed=42, max_sentences=8), n_files=2)
    vocab = write_vocab(tmp_path / "vocab.txt")
    out = tmp_path / "out"
    generate_dataset(CONFIG, inputs=[str(tmp_path / "in" / "*.txt")], vocab_path=str(vocab), output_dir=str(out))
    manifest = manifest_of(out)
    assert shard_digests(out) == GOLDEN_SHARDS
    assert manifest["input"]["fingerprint"] == GOLDEN_FINGERPRINT
    assert {k: manifest["totals"][k] for k in GOLDEN_TOTALS} == GOLDEN_TOTALS
    listed = {s["path"]: s["sha256"] for split in manifest["splits"].values() for s in split["shards"]}
    assert listed == GOLDEN_SHARDS
