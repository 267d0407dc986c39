"""The data-generation config: parsed by the CLI, passed down, written into the manifest."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

from bert_datagen.datagen.masking_units import masking_units
from bert_datagen.datagen.record_layout import MASKINGS, OBJECTIVES

INPUT_FORMATS = ("text", "sentences", "jsonl", "wikiextractor")
# `text` files: how documents are found (bert_datagen.datagen.readers); auto detects Gutenberg books and WikiText.
TEXT_LAYOUTS = ("auto", "plain", "book", "wikitext")
SEED_RANGE = (-(2**63), 2**63 - 1)
# Longer rows than any model's position table; the masked-position arrays are never longer either.
MAX_SEQ_LENGTH = 100_000
MAX_SHARDS = 100_000  # shard names have five digits
# The shard size target, MiB: below a hundredth of a MiB a shard holds a few records, and the 100,000
# shards it allows would cover only 1 GB; above 64 GiB a shard, which is merged in memory (about
# twice its size), outgrows any worker. Outside the range a tiny target got round MAX_SHARDS (163,056
# shards planned) or ended in ZeroDivisionError, a huge one in OverflowError.
TARGET_SHARD_MB_RANGE = (0.01, 65536.0)
# --read-chunk-mb, MiB: a range of under a KiB is a read task for every few documents (1e-9 made one
# a byte), and one over 64 GiB is more of a file than a worker should hold; int(MiB * 2**20) of 1e308
# overflowed.
READ_CHUNK_MB_RANGE = (0.001, 65536.0)
# --notnext-pool-tokens: a pool under a thousand tokens is a few instances' worth (pools of two
# documents each, thousands of staging files); 2**40 tokens (4 TiB as int32) is beyond any worker,
# i.e. no bound.
NOTNEXT_POOL_TOKENS_RANGE = (1_000, 2**40)
DEFAULT_NOTNEXT_POOL_TOKENS = 16_000_000


def check_target_shard_mb(value: float) -> None:
    """ConfigError unless ``value`` is a finite shard size target in TARGET_SHARD_MB_RANGE."""
    low, high = TARGET_SHARD_MB_RANGE
    if not (math.isfinite(value) and low <= value <= high):
        raise ConfigError(f"--target-shard-mb {value} must be in [{low:g}, {high:g}] MiB (a shard of a few "
                          f"records up to one a worker merges in memory; at most {MAX_SHARDS:,} shards)")


def check_shard_count(count: int, split: str, target_shard_mb: float) -> int:
    """``count`` (the shards of ``split`` at ``target_shard_mb``) unless it is more than MAX_SHARDS:
    ConfigError naming the option that sized it."""
    if count > MAX_SHARDS:
        raise ConfigError(f"--target-shard-mb {target_shard_mb:g}: the {split} split would be {count:,} shards, "
                          f"more than {MAX_SHARDS:,} (every shard is a file): raise --target-shard-mb")
    return count


class ConfigError(ValueError):
    """An option value that cannot produce valid data."""


def masking_unit_of(masking_unit: str, whole_word_mask: bool) -> str:
    """The masking unit of a config spelled either way (options, or a manifest's config: those written
    before masking units record only ``whole_word_mask``, the original's spelling of "word")."""
    return "word" if whole_word_mask and masking_unit == "token" else masking_unit


@dataclass(frozen=True)
class DatagenConfig:
    """Everything that decides the bytes of a dataset (runner options do not)."""

    max_seq_length: int = 128
    max_predictions_per_seq: int = 20
    masked_lm_prob: float = 0.15
    short_seq_prob: float = 0.1
    dupe_factor: int = 10
    random_seed: int = 12345
    # The original's spelling of masking_unit "word", kept because manifests record it (and older ones
    # only it): True exactly when masking_unit is "word" or "span". Code reads masking_unit.
    whole_word_mask: bool = False
    masking_unit: str = "token"
    objective: str = "nsp"
    masking: str = "static"
    do_lower_case: bool = True
    mask_ratios: tuple[float, float, float] = (0.8, 0.1, 0.1)  # [MASK], keep, random
    input_format: str = "text"
    text_layout: str = "auto"  # input_format text: auto-detected, or plain, book, wikitext (bert_datagen.datagen.readers)
    text_field: str = "text"
    sentence_splitter: str = "nupunkt"
    # Whole-word masking over the words of this segmenter (bert_datagen.datagen.segmenters), not the
    # basic tokenizer's (where every CJK ideograph is a word). None: the original's words.
    word_segmenter: str | None = None
    strict_utf8: bool = False
    num_shards: int | None = None  # None: derived from target_shard_mb
    target_shard_mb: float = 64.0
    eval_fraction: float = 0.0
    notnext_pool_size: int = 10000  # documents per NotNext pool
    # Tokens per NotNext pool at most (bert_datagen.datagen.placement.pool_cuts): what a pool's pass
    # holds in memory grows with them. None: no bound (manifests written before it existed).
    notnext_pool_tokens: int | None = DEFAULT_NOTNEXT_POOL_TOKENS
    max_notnext_tries: int = 10
    # Packed rows (bert_datagen.datagen.packed): several whole instances per row, at most this many.
    packing: bool = False
    max_sequences_per_row: int = 3
    packing_group_size: int = 8192  # instances of a shard, in key order, packed together

    def __post_init__(self) -> None:
        # Either spelling gives the same config (and the same manifest); spans are made of whole words too.
        object.__setattr__(self, "masking_unit", masking_unit_of(self.masking_unit, self.whole_word_mask))
        if self.masking_unit in ("word", "span"):
            object.__setattr__(self, "whole_word_mask", True)
        self.validate()

    def validate(self) -> None:
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if isinstance(value, float) and not math.isfinite(value):
                raise ConfigError(f"--{f.name.replace('_', '-')} {value} must be a finite number")
        if any(not math.isfinite(r) for r in self.mask_ratios):
            raise ConfigError(f"--mask-ratios {self.mask_ratios} must be finite numbers")
        if self.max_seq_length < 5:
            raise ConfigError(
                f"--max-seq-length {self.max_seq_length} is too small: it must leave room for "
                "[CLS] A [SEP] B [SEP] with at least one token each (minimum 5)"
            )
        if self.max_seq_length > MAX_SEQ_LENGTH:
            raise ConfigError(f"--max-seq-length {self.max_seq_length} is unreasonably large")
        if not 0.0 < self.masked_lm_prob <= 1.0:
            raise ConfigError(f"--masked-lm-prob {self.masked_lm_prob} must be in (0, 1]")
        if not 1 <= self.max_predictions_per_seq <= MAX_SEQ_LENGTH:
            raise ConfigError(f"--max-predictions-per-seq {self.max_predictions_per_seq} must be in "
                              f"[1, {MAX_SEQ_LENGTH}]")
        if not 0.0 <= self.short_seq_prob <= 1.0:
            raise ConfigError(f"--short-seq-prob {self.short_seq_prob} must be in [0, 1]")
        if self.dupe_factor < 1:
            raise ConfigError(f"--dupe-factor {self.dupe_factor} must be >= 1")
        if len(self.mask_ratios) != 3 or any(r < 0 for r in self.mask_ratios) or abs(sum(self.mask_ratios) - 1.0) > 1e-6:
            raise ConfigError(f"--mask-ratios {self.mask_ratios} must be three non-negative numbers summing to 1")
        if self.masking_unit not in masking_units():
            raise ConfigError(f"--masking-unit {self.masking_unit!r} is not one of {', '.join(masking_units())}")
        if self.objective not in OBJECTIVES:
            raise ConfigError(f"--objective {self.objective!r} is not one of {', '.join(OBJECTIVES)}")
        if self.masking not in MASKINGS:
            raise ConfigError(f"--masking {self.masking!r} is not one of {', '.join(MASKINGS)}")
        if self.masking == "dynamic" and self.dupe_factor != 1:
            raise ConfigError(f"--dupe-factor {self.dupe_factor} with --masking dynamic: dynamic data is "
                              "written once, unmasked (the trainer draws a new mask each epoch)")
        if self.input_format not in INPUT_FORMATS:
            raise ConfigError(f"--input-format {self.input_format!r} is not one of {', '.join(INPUT_FORMATS)}")
        if self.num_shards is not None and self.num_shards < 1:
            raise ConfigError(f"--num-shards {self.num_shards} must be >= 1")
        if self.num_shards is not None and self.num_shards > MAX_SHARDS:
            raise ConfigError(f"--num-shards {self.num_shards} is more than {MAX_SHARDS:,}: every shard is a file, "
                              "written even when empty")
        check_target_shard_mb(self.target_shard_mb)
        if not 0.0 <= self.eval_fraction < 1.0:
            raise ConfigError(f"--eval-fraction {self.eval_fraction} must be in [0, 1)")
        if self.notnext_pool_size < 2:
            raise ConfigError(f"--notnext-pool-size {self.notnext_pool_size} must be >= 2")
        low, high = NOTNEXT_POOL_TOKENS_RANGE
        if self.notnext_pool_tokens is not None and not low <= self.notnext_pool_tokens <= high:
            raise ConfigError(f"--notnext-pool-tokens {self.notnext_pool_tokens} must be in [{low:,}, {high:,}] "
                              "(the most tokens a NotNext pool holds)")
        if not SEED_RANGE[0] <= self.random_seed <= SEED_RANGE[1]:
            raise ConfigError(f"--random-seed {self.random_seed} must fit in 64 signed bits")
        if self.text_layout not in TEXT_LAYOUTS:
            raise ConfigError(f"--text-layout {self.text_layout!r} is not one of {', '.join(TEXT_LAYOUTS)}")
        if self.input_format == "jsonl" and not self.text_field:
            raise ConfigError("--text-field must not be empty")
        if self.max_notnext_tries < 1:
            raise ConfigError(f"max_notnext_tries {self.max_notnext_tries} must be >= 1")
        self._validate_packing()
        self._validate_segmenter()

    def _validate_segmenter(self) -> None:
        if self.word_segmenter is None:
            return
        from bert_datagen.datagen.segmenters import available_segmenters

        if self.word_segmenter not in available_segmenters():
            raise ConfigError(f"--word-segmenter {self.word_segmenter!r} is not one of "
                              f"{', '.join(available_segmenters())}")
        if self.masking_unit == "token":
            raise ConfigError("--word-segmenter groups characters into whole words: it needs --whole-word-mask "
                              "(or --masking-unit span)")

    def _validate_packing(self) -> None:
        if not self.packing:
            return
        # A row of S sequences needs room for S minimal instances ([CLS] x [SEP] is 3 tokens).
        if not 2 <= self.max_sequences_per_row <= max(2, self.max_seq_length // 3):
            raise ConfigError(f"--max-sequences-per-row {self.max_sequences_per_row} must be in "
                              f"[2, {max(2, self.max_seq_length // 3)}] at --max-seq-length {self.max_seq_length}")
        if self.packing_group_size < 1:
            raise ConfigError(f"packing_group_size {self.packing_group_size} must be >= 1")
        if self.masking == "dynamic":
            raise ConfigError("--packing with --masking dynamic is not supported: packed rows are masked "
                              "when they are written (use --masking static)")

    @classmethod
    def from_recorded(cls, recorded: dict[str, Any]) -> DatagenConfig:
        """The config a manifest recorded (`to_dict`), as far as it names fields of this version
        (older manifests lack the later ones: their defaults; ``extra`` is not a field)."""
        names = {f.name for f in dataclasses.fields(cls)}
        known = {k: v for k, v in recorded.items() if k in names}
        if "mask_ratios" in known:
            known["mask_ratios"] = tuple(known["mask_ratios"])
        # Pools had no token bound before the field existed: such a manifest's data was made without one.
        known.setdefault("notnext_pool_tokens", None)
        if isinstance(known.get("word_segmenter"), dict):  # to_dict records the segmenter's identity
            known["word_segmenter"] = known["word_segmenter"]["name"]
        return cls(**known)

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
        if not self.packing:  # unpacked data keeps the manifest it always had
            for name in ("packing", "max_sequences_per_row", "packing_group_size"):
                del d[name]
        if self.word_segmenter is None:  # so does data masked without a segmenter
            del d["word_segmenter"]
        else:
            from bert_datagen.datagen.segmenters import segmenter_info

            d["word_segmenter"] = segmenter_info(self.word_segmenter)
        return d
