"""Pre-training's reading of ``--data`` (`DatasetInfo`): the dataset the contract opened, or TFRecord
globs of the original tool, with what the trainer derives from it (`bert_datagen.trainer.pretrain.data`
opens and checks it)."""

from __future__ import annotations

from dataclasses import dataclass, field

from bert_datagen.contract.dataset import Dataset, ShardRef
from bert_datagen.contract.features import word_segmented
from bert_datagen.contract.manifest import Manifest
from bert_datagen.datagen.record_layout import feature_spec, packed_feature_spec


@dataclass
class DatasetInfo:
    """Pre-training's reading of ``--data``: the dataset the contract opened (``dataset``; None for
    TFRecord globs of the original tool), with what the trainer derives from it: the lengths a
    sequence has (a packed row's predictions per sequence), each split's files and record counts,
    the identity runs record. What the manifest says is read from it, not copied."""

    source: str
    max_seq_length: int
    max_predictions_per_seq: int
    train_files: list[str]
    eval_files: list[str] = field(default_factory=list)
    train_records: int | None = None  # the manifest's, else counted once (`split_records`)
    train_counts: list[int] | None = None  # records of each train file (manifest, else counted once)
    dataset: Dataset | None = None
    identity: dict = field(default_factory=dict)  # {"fingerprint", "shards"}: see dataset_identity
    # Packed rows (`bert-datagen run --packing`): the most sequences per row; 0 = one per record.
    sequences_per_row: int = 0
    # The manifest as it was before it was read (`manifest_version`): what `check_unchanged` and the
    # training input compare with, so that a replaced dataset stops the run. None: TFRecord globs.
    manifest_version: str | None = None

    @property
    def manifest(self) -> Manifest | None:
        return None if self.dataset is None else self.dataset.manifest

    @property
    def vocab_size(self) -> int | None:
        return None if self.manifest is None else self.manifest.vocab.size

    @property
    def eval_records(self) -> int | None:
        return None if self.manifest is None else self.manifest.split_records("eval")

    @property
    def objective(self) -> str:
        """nsp | doc-sentences | full-sentences (TFRecord globs: the original's nsp)."""
        return "nsp" if self.manifest is None else data_kind(self.manifest)[0]

    @property
    def masking(self) -> str:
        """static | dynamic (the input pipeline masks, bert_datagen.trainer.pretrain.dynamic_input)."""
        return "static" if self.manifest is None else data_kind(self.manifest)[1]

    @property
    def word_segmented(self) -> bool:
        """Data of a word segmenter: with dynamic masking its records carry `word_continues_bits`."""
        return self.manifest is not None and word_segmented(self.manifest.config)

    @property
    def train_refs(self) -> list[ShardRef] | None:
        """The train shards as the manifest lists them (sizes, indexes)."""
        return None if self.dataset is None else self.dataset.split_shards("train")

    @property
    def eval_refs(self) -> list[ShardRef] | None:
        return None if self.dataset is None else self.dataset.split_shards("eval")

    @property
    def eval_counts(self) -> list[int] | None:
        return None if self.dataset is None else [r.expected.records for r in self.dataset.split_shards("eval")]  # type: ignore[union-attr]

    @property
    def has_nsp(self) -> bool:
        return self.objective == "nsp"

    @property
    def packed(self) -> bool:
        return self.sequences_per_row > 0

    def features(self) -> dict[str, tuple[str, int]]:
        if self.packed:
            return packed_feature_spec(self.max_seq_length, self.max_predictions_per_seq,
                                       self.sequences_per_row, self.objective)
        return feature_spec(self.max_seq_length, self.max_predictions_per_seq, self.objective, self.masking,
                            word_bits=self.word_segmented)


def data_kind(manifest: Manifest) -> tuple[str, str]:
    """(objective, masking) of a dataset; manifests from before these options are nsp + static."""
    config = manifest.config
    return str(config.get("objective", "nsp")), str(config.get("masking", "static"))
