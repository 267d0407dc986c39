"""The model's configuration: `BertConfig`, read and written in the ORIGINAL `bert_config.json` format
(the file Google ships with its checkpoints), so a config travels between this trainer, the original
code and Hugging Face converters unchanged; and the named sizes of RECIPE.md section 6.

Beside the model it configures (as nanoGPT keeps `GPTConfig` beside `GPT`): the model package needs
nothing of the training loop's.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bert_datagen.trainer.errors import TrainConfigError

# Sizes by name: RECIPE.md section 6 (layers, hidden, heads, FFN).
MODEL_SIZES: dict[str, tuple[int, int, int, int]] = {
    "tiny": (2, 128, 2, 512),
    "mini": (4, 256, 4, 1024),
    "small": (4, 512, 8, 2048),
    "medium": (8, 512, 8, 2048),
    "base": (12, 768, 12, 3072),
    "large": (24, 1024, 16, 4096),
}


# The original bert_config.json's names: "gelu" is the tanh approximation (the original code's own
# `gelu`), "gelu_new" Hugging Face's name of the same; "gelu_exact" is the erf GELU, which Hugging Face
# calls "gelu". Only trainer/interop/hf_checkpoint.py translates between the two vocabularies.
HIDDEN_ACTS = ("gelu", "gelu_new", "gelu_exact")


@dataclass
class BertConfig:
    """The original `BertConfig` fields, with the original defaults.

    `hidden_act` keeps the original's meaning, so Google's `bert_config.json` files and earlier runs
    load unchanged: `"gelu"` (the default; alias `"gelu_new"`) is the tanh approximation the original
    code trained with; `"gelu_exact"` is the erf GELU of Hugging Face BERT models (their `"gelu"`,
    e.g. all-MiniLM-L6-v2).
    """

    vocab_size: int
    hidden_size: int = 768
    num_hidden_layers: int = 12
    num_attention_heads: int = 12
    intermediate_size: int = 3072
    hidden_act: str = "gelu"
    hidden_dropout_prob: float = 0.1
    attention_probs_dropout_prob: float = 0.1
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    initializer_range: float = 0.02

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        for name in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                     "intermediate_size", "max_position_embeddings", "type_vocab_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise TrainConfigError(f"BertConfig.{name} must be a positive integer, got {value!r}")
        if self.hidden_size % self.num_attention_heads:
            raise TrainConfigError(
                f"hidden_size {self.hidden_size} is not a multiple of num_attention_heads "
                f"{self.num_attention_heads}"
            )
        if self.hidden_act not in HIDDEN_ACTS:
            raise TrainConfigError(f"hidden_act {self.hidden_act!r} is not supported (choose one of "
                                   f"{', '.join(HIDDEN_ACTS)})")
        for name in ("hidden_dropout_prob", "attention_probs_dropout_prob"):
            value = getattr(self, name)
            if not 0.0 <= float(value) < 1.0:
                raise TrainConfigError(f"BertConfig.{name} must be in [0, 1), got {value!r}")
        if not float(self.initializer_range) > 0:
            raise TrainConfigError(f"initializer_range must be positive, got {self.initializer_range!r}")

    @property
    def head_size(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @classmethod
    def from_name(cls, name: str, vocab_size: int, **overrides: Any) -> BertConfig:
        """A named size from RECIPE.md section 6 (tiny, mini, small, medium, base, large)."""
        if name not in MODEL_SIZES:
            raise TrainConfigError(f"unknown model size {name!r}; choose one of {', '.join(MODEL_SIZES)}")
        layers, hidden, heads, ffn = MODEL_SIZES[name]
        return cls(vocab_size=vocab_size, hidden_size=hidden, num_hidden_layers=layers,
                   num_attention_heads=heads, intermediate_size=ffn, **overrides)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> BertConfig:
        # Original files carry only these keys; Hugging Face config.json files carry many more,
        # which are ignored so that either can be read.
        known = {f.name for f in dataclasses.fields(cls)}
        if "vocab_size" not in data:
            raise TrainConfigError("bert config has no vocab_size")
        return cls(**{k: v for k, v in data.items() if k in known})

    @classmethod
    def from_json_file(cls, path: str | Path) -> BertConfig:
        try:
            data = json.loads(Path(path).read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as exc:
            raise TrainConfigError(f"{path}: cannot read bert config: {exc}") from exc
        if not isinstance(data, dict):
            raise TrainConfigError(f"{path}: bert config must be a JSON object")
        try:
            return cls.from_dict(data)
        except (TrainConfigError, TypeError) as exc:
            raise TrainConfigError(f"{path}: {exc}") from exc

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def to_json(self) -> str:
        """The original `bert_config.json` text (sorted keys, 2-space indent)."""
        return json.dumps(self.to_dict(), indent=2, sort_keys=True) + "\n"
