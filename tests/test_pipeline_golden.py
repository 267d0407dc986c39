"""Golden checksums: a fixed corpus and config must keep producing these exact shard bytes.

If a change alters them on purpose (a new RNG purpose, a recipe fix), update the pins in the same
commit and say why: every dataset made before no longer reproduces.
"""

from __future__ import annotations

from datagen.config import DatagenConfig
from pipelines.pretraining.run import generate_dataset
from tests.support.pipeline_corpus import (
    make_documents,
    manifest_of,
    shard_digests,
    write_sentence_files,
    write_vocab,
)

CONFIG = DatagenConfig(max_seq_length=32, max_predictions_per_seq=5, dupe_factor=2, num_shards=2,
                       eval_fraction=0.2, notnext_pool_size=10, random_seed=12345,
                       input_format="sentences")

GOLDEN_SHARDS = {
    "eval/part-00000-of-00001.tfrecord": "287f5377e0b1918475e93dc256d86f671b8a0df10025eee2c80ae4ec7444dfef",
    "train/part-00000-of-00002.tfrecord": "d2395ccd0bded43e248060cd42487aaabd1b3ae4017b5218714fc8932e4be9c3",
    "train/part-00001-of-00002.tfrecord": "b897e25baf2bfbf544892909f5841ca8439b4252d9ebb24edb12d1f092b5193e",
}
GOLDEN_FINGERPRINT = "cc674e253a2cefd93dfda28224e541e252a7204b5aba07962f31fc34db51c8c3"
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
