"""Where a fine-tuning run's encoder weights come from.

- `--init-from RUN`: a pre-training run of ours (or one of its checkpoint directories);
- `--init-checkpoint PATH`: an original TF1 checkpoint (prefix or directory), a Hugging Face
  `BertForPreTraining` directory, or a Hugging Face `BertModel` directory whose weight names have no
  `bert.` prefix (e.g. all-MiniLM-L6-v2).

Only the encoder (`bert/...` names) is taken; pre-training heads in the checkpoint are dropped and
the task head keeps its seeded initial values. Every missing or mis-shaped encoder weight is
reported in one error.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from bert_datagen.trainer.model.config import BertConfig
from bert_datagen.trainer.model.heads import FineTuneModel, encoder_variable_map
from bert_datagen.trainer.runtime import checkpoint as ckpt_lib

if TYPE_CHECKING:
    from bert_datagen.contract.manifest import Manifest


def encoder_shapes(model: FineTuneModel) -> dict[str, tuple[int, ...]]:
    return {name: tuple(int(d) for d in var.shape) for name, var in encoder_variable_map(model).items()}


def with_bert_prefix(state: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """A `BertModel` state dict (names without `bert.`) renamed like `BertForPreTraining`'s."""
    if any(key.startswith("bert.") for key in state):
        return state
    return {f"bert.{key}": value for key, value in state.items()}


def read_encoder_arrays(path: str, expected: dict[str, tuple[int, ...]]) -> tuple[dict[str, np.ndarray], str]:
    """TF1-named encoder arrays from a TF1 checkpoint or a Hugging Face directory; (arrays, summary)."""
    from bert_datagen.trainer.interop.hf_checkpoint import hf_to_tf1, read_hf_state
    from bert_datagen.trainer.interop.restore import checkpoint_format
    from bert_datagen.trainer.interop.tf1 import read_tf1_checkpoint

    if checkpoint_format(path) == "hf":
        arrays, report = hf_to_tf1(with_bert_prefix(read_hf_state(path)), expected, str(path))
    else:
        arrays, report = read_tf1_checkpoint(path, expected)
    dropped = [n for n in report.unexpected if n.startswith(("cls", "cls.", "cls/"))]
    others = [n for n in report.unexpected if n not in dropped]
    summary = f"loaded {report.loaded} encoder weights from {report.format} checkpoint {report.source}"
    if dropped:
        summary += f"; dropped {len(dropped)} pre-training head weights"
    if others:
        summary += f"; {len(others)} unused variables: " + ", ".join(others[:8]) + (" ..." if len(others) > 8 else "")
    return arrays, summary


def init_checkpoint_config(path: str, bert_config_file: str | None = None) -> BertConfig:
    """The model an `--init-checkpoint` describes (its config.json / bert_config.json, or the file given)."""
    from bert_datagen.trainer.interop.restore import init_checkpoint_config as checkpoint_config

    return BertConfig.from_dict(checkpoint_config(path, bert_config_file))


def init_from_run_config(path: str) -> BertConfig:
    ckpt = ckpt_lib.resolve_checkpoint(path)
    return BertConfig.from_dict(ckpt_lib.load_state(ckpt)["bert_config"])


def initialise_encoder(model: FineTuneModel, init_from: str | None, init_checkpoint: str | None) -> str:
    """Assign the encoder weights; returns a one-line description of what was loaded."""
    variables = encoder_variable_map(model)
    if init_from:
        ckpt = ckpt_lib.resolve_checkpoint(init_from)
        arrays = ckpt_lib.load_arrays(ckpt, ckpt_lib.MODEL_FILE)
        ckpt_lib.assign_named_weights(variables, arrays, str(ckpt / ckpt_lib.MODEL_FILE))
        return f"encoder initialised from {ckpt}"
    if init_checkpoint:
        arrays, summary = read_encoder_arrays(init_checkpoint, encoder_shapes(model))
        for name, var in variables.items():
            var.assign(np.asarray(arrays[name], dtype=np.float32))
        return summary
    raise ValueError("fine-tuning needs --init-from or --init-checkpoint")


def _checkpoint_vocab(init_from: str | None, init_checkpoint: str | None) -> Path | None:
    """The vocab.txt that came with the init checkpoint, when there is one beside it."""
    if init_checkpoint:
        p = Path(init_checkpoint)
        for candidate in (p / "vocab.txt", p.parent / "vocab.txt"):
            if candidate.is_file():
                return candidate
    return None


@dataclass(frozen=True)
class VocabRef:
    """A vocab to compare by content: its sha256, and its file when there is one to read."""

    sha256: str
    path: str | None
    described: str  # e.g. "the vocab.txt beside the checkpoint, /x/vocab.txt"


def _vocab_tokens(path: str) -> list[str] | None:
    try:
        return Path(path).read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError):
        return None


def init_vocab(init_from: str | None, init_checkpoint: str | None) -> VocabRef | None:
    """The vocab the init checkpoint was trained with, when it says: the vocab.txt beside an
    --init-checkpoint (TF1 or Hugging Face directory), or the dataset an --init-from run recorded
    (dataset.json; for runs recorded before it held the vocab, the dataset it names, if unchanged)."""
    found = _checkpoint_vocab(init_from, init_checkpoint)
    if found is not None:
        return VocabRef(hashlib.sha256(found.read_bytes()).hexdigest(), str(found),
                        f"the vocab.txt beside the checkpoint, {found}")
    if not init_from:
        return None
    run = ckpt_lib.resolve_checkpoint(init_from).parent
    try:
        recorded = json.loads((run / "dataset.json").read_text())
    except (OSError, ValueError):
        return None
    data = str(recorded.get("data", ""))
    manifest = _unchanged_manifest(data, recorded.get("fingerprint"))
    sha = recorded.get("vocab_sha256") or (manifest.vocab.sha256 if manifest else None)
    if not sha:
        return None
    path = str(Path(data) / manifest.vocab.path) if manifest else None
    return VocabRef(str(sha), path, f"the vocab of {run}'s pre-training dataset {data}")


def _unchanged_manifest(data: str, fingerprint: str | None) -> Manifest | None:
    """The manifest of the dataset a run recorded, if it is still the same dataset."""
    from bert_datagen.trainer.runtime.dataset_dir import load_dataset_manifest

    manifest = load_dataset_manifest(data) if data else None
    return manifest if manifest is not None and manifest.fingerprint == fingerprint else None


def same_vocab(a: VocabRef, b_sha256: str, b_path: str) -> bool:
    """Equal bytes, or equal tokens (a copy with other line endings is the same vocab)."""
    if a.sha256 == b_sha256:
        return True
    if a.path is None:
        return False
    tokens = _vocab_tokens(a.path)
    return tokens is not None and tokens == _vocab_tokens(b_path)
