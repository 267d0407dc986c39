"""The data-generation config: parsed by the CLI, passed down, written into the manifest."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

INPUT_FORMATS = ("text", "sentences", "jsonl", "wikiextractor")


class ConfigError(ValueError):
    """An option value that cannot produce valid data."""


@dataclass(frozen=True)
class DatagenConfig:
    """Everything that decides the bytes of a dataset (runner options do not)."""

    max_seq_length: int = 128
    max_predictions_per_seq: int = 20
    masked_lm_prob: float = 0.15
    short_seq_prob: float = 0.1
    dupe_factor: int = 10
    random_seed: int = 12345
    whole_word_mask: bool = False
    do_lower_case: bool = True
    mask_ratios: tuple[float, float, float] = (0.8, 0.1, 0.1)  # [MASK], keep, random
    input_format: str = "text"
    text_layout: str = "auto"  # input_format text: auto-detected, or plain, book, wikitext (datagen.readers)
    text_field: str = "text"
    sentence_splitter: str = "nupunkt"
    strict_utf8: bool = False
    num_shards: int | None = None  # None: derived from target_shard_mb
    target_shard_mb: float = 64.0
    eval_fraction: float = 0.0
    notnext_pool_size: int = 10000  # documents per NotNext pool
    max_notnext_tries: int = 10

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        if self.max_seq_length < 5:
            raise ConfigError(
                f"--max-seq-length {self.max_seq_length} is too small: it must leave room for "
                "[CLS] A [SEP] B [SEP] with at least one token each (minimum 5)"
            )
        if self.max_seq_length > 100_000:
            raise ConfigError(f"--max-seq-length {self.max_seq_length} is unreasonably large")
        if not 0.0 < self.masked_lm_prob <= 1.0:
            raise ConfigError(f"--masked-lm-prob {self.masked_lm_prob} must be in (0, 1]")
        if self.max_predictions_per_seq < 1:
            raise ConfigError(f"--max-predictions-per-seq {self.max_predictions_per_seq} must be >= 1")
        if not 0.0 <= self.short_seq_prob <= 1.0:
            raise ConfigError(f"--short-seq-prob {self.short_seq_prob} must be in [0, 1]")
        if self.dupe_factor < 1:
            raise ConfigError(f"--dupe-factor {self.dupe_factor} must be >= 1")
        if len(self.mask_ratios) != 3 or any(r < 0 for r in self.mask_ratios) or abs(sum(self.mask_ratios) - 1.0) > 1e-6:
            raise ConfigError(f"--mask-ratios {self.mask_ratios} must be three non-negative numbers summing to 1")
        if self.input_format not in INPUT_FORMATS:
            raise ConfigError(f"--input-format {self.input_format!r} is not one of {', '.join(INPUT_FORMATS)}")
        if self.num_shards is not None and self.num_shards < 1:
            raise ConfigError(f"--num-shards {self.num_shards} must be >= 1")
        if self.target_shard_mb <= 0:
            raise ConfigError(f"--target-shard-mb {self.target_shard_mb} must be > 0")
        if not 0.0 <= self.eval_fraction < 1.0:
            raise ConfigError(f"--eval-fraction {self.eval_fraction} must be in [0, 1)")
        if self.notnext_pool_size < 2:
            raise ConfigError(f"--notnext-pool-size {self.notnext_pool_size} must be >= 2")

    def to_dict(self) -> dict[str, Any]:
        """The config as a manifest records it.

        ``text_layout`` is written as ``extra: {"text_layout": ...}`` (and the default as
        ``extra: {}``), the form manifests have always had, so the same run keeps giving the same
        manifest bytes.
        """
        d = dataclasses.asdict(self)
        d["mask_ratios"] = list(self.mask_ratios)
        layout = d.pop("text_layout")
        d["extra"] = {} if layout == "auto" else {"text_layout": layout}
        return d
