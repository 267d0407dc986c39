"""The golden pre-training dataset's config and pinned digests."""

from __future__ import annotations

from bert_datagen.datagen.config import DatagenConfig

CONFIG = DatagenConfig(max_seq_length=32, max_predictions_per_seq=5, dupe_factor=2, num_shards=2,
                       eval_fraction=0.2, notnext_pool_size=10, random_seed=12345,
                       input_format="sentences")
GOLDEN_SHARDS = {
    "eval/part-00000-of-00001.tfrecord": "287f5377e0b1918475e93dc256d86f671b8a0df10025eee2c80ae4ec7444dfef",
    "train/part-00000-of-00002.tfrecord": "d2395ccd0bded43e248060cd42487aaabd1b3ae4017b5218714fc8932e4be9c3",
    "train/part-00001-of-00002.tfrecord": "b897e25baf2bfbf544892909f5841ca8439b4252d9ebb24edb12d1f092b5193e",
}
GOLDEN_FINGERPRINT = "cc674e253a2cefd93dfda28224e541e252a7204b5aba07962f31fc34db51c8c3"
