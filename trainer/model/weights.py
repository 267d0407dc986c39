"""The TF1 variable name as the pivot of every checkpoint layout: which weights BERT pre-training has
(by original name and TF1 shape), checking a set of named arrays against them, and moving them in and
out of our Keras model (`bert_datagen.trainer.model.bert.tf1_variable_map` says which variable holds which name).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from bert_datagen.trainer.errors import CheckpointFormatError, CheckpointMismatchError
from bert_datagen.trainer.model.bert import BertPretrainer, tf1_variable_map

# --- expected TF1 layout -------------------------------------------------------------------------

_DENSE_IN_LAYER = (
    ("attention/self/query", "hidden", "hidden"),
    ("attention/self/key", "hidden", "hidden"),
    ("attention/self/value", "hidden", "hidden"),
    ("attention/output/dense", "hidden", "hidden"),
    ("intermediate/dense", "hidden", "intermediate"),
    ("output/dense", "intermediate", "hidden"),
)

# Names that live in original checkpoints but are not model weights: optimizer slots, step
# counters, loss-scale state of mixed-precision runs and the object graph of TF2 checkpoints.
_NON_WEIGHT = re.compile(
    r"(^|/)(adam_m|adam_v|Adam|Adam_1|Momentum|LAMB|LAMB_1|ExponentialMovingAverage)$"
    r"|^global_step$|^_CHECKPOINTABLE_OBJECT_GRAPH$|(^|/)(loss_scale|good_steps|current_loss_scale)$"
)


def _cfg(config: Mapping | object, key: str) -> int:
    value = config[key] if isinstance(config, Mapping) else getattr(config, key)
    return int(value)


def expected_tf1_shapes(config: Mapping | object) -> dict[str, tuple[int, ...]]:
    """Every weight of BERT pre-training (all heads) by its original TF1 name, with its TF1 shape.

    `config` is an original bert_config.json dict or any object with the same attribute names.
    """
    h = _cfg(config, "hidden_size")
    dims = {"hidden": h, "intermediate": _cfg(config, "intermediate_size")}
    v = _cfg(config, "vocab_size")
    shapes: dict[str, tuple[int, ...]] = {
        "bert/embeddings/word_embeddings": (v, h),
        "bert/embeddings/token_type_embeddings": (_cfg(config, "type_vocab_size"), h),
        "bert/embeddings/position_embeddings": (_cfg(config, "max_position_embeddings"), h),
        "bert/embeddings/LayerNorm/gamma": (h,),
        "bert/embeddings/LayerNorm/beta": (h,),
    }
    for i in range(_cfg(config, "num_hidden_layers")):
        prefix = f"bert/encoder/layer_{i}"
        for scope, d_in, d_out in _DENSE_IN_LAYER:
            shapes[f"{prefix}/{scope}/kernel"] = (dims[d_in], dims[d_out])
            shapes[f"{prefix}/{scope}/bias"] = (dims[d_out],)
        for scope in ("attention/output/LayerNorm", "output/LayerNorm"):
            shapes[f"{prefix}/{scope}/gamma"] = (h,)
            shapes[f"{prefix}/{scope}/beta"] = (h,)
    shapes.update({
        "bert/pooler/dense/kernel": (h, h),
        "bert/pooler/dense/bias": (h,),
        "cls/predictions/transform/dense/kernel": (h, h),
        "cls/predictions/transform/dense/bias": (h,),
        "cls/predictions/transform/LayerNorm/gamma": (h,),
        "cls/predictions/transform/LayerNorm/beta": (h,),
        "cls/predictions/output_bias": (v,),
        "cls/seq_relationship/output_weights": (2, h),
        "cls/seq_relationship/output_bias": (2,),
    })
    return shapes


def is_non_weight(name: str) -> bool:
    """True for optimizer slots, `global_step` and other bookkeeping found in training checkpoints."""
    return bool(_NON_WEIGHT.search(name))


# --- checking a set of named arrays against what is expected --------------------------------------


@dataclass
class LoadReport:
    """What a load used and what it left aside (the caller decides whether to log it)."""

    source: str
    format: str
    loaded: int = 0
    ignored: list[str] = field(default_factory=list)  # optimizer slots, step counters
    unexpected: list[str] = field(default_factory=list)  # weights the model has no place for

    def summary(self) -> str:
        text = f"loaded {self.loaded} weights from {self.format} checkpoint {self.source}"
        if self.ignored:
            text += f"; ignored {len(self.ignored)} non-weight variables (optimizer slots, step counters)"
        if self.unexpected:
            shown = ", ".join(self.unexpected[:8]) + (" ..." if len(self.unexpected) > 8 else "")
            text += f"; {len(self.unexpected)} unused variables: {shown}"
        return text


def check_arrays(arrays: Mapping[str, tuple[int, ...] | np.ndarray],
                 expected: Mapping[str, tuple[int, ...]], source: str) -> None:
    """Raise one error listing EVERY missing and every mis-shaped weight (not just the first)."""
    missing = sorted(name for name in expected if name not in arrays)
    misshaped = []
    for name, shape in expected.items():
        if name in arrays:
            got = arrays[name]
            got_shape = tuple(int(d) for d in (got.shape if hasattr(got, "shape") else got))
            if got_shape != tuple(shape):
                misshaped.append(f"{name}: checkpoint has {list(got_shape)}, model needs {list(shape)}")
    if not missing and not misshaped:
        return
    lines = [f"{source}: checkpoint does not fit the model "
             f"({len(missing)} missing, {len(misshaped)} mis-shaped)"]
    lines += [f"  missing: {name}" for name in missing]
    lines += [f"  mis-shaped: {text}" for text in sorted(misshaped)]
    if misshaped:
        lines.append("  (does --bert-config describe the same model as the checkpoint?)")
    raise CheckpointMismatchError("\n".join(lines))


def as_float32(value: np.ndarray, name: str, source: str) -> np.ndarray:
    array = np.asarray(value)
    if not np.issubdtype(array.dtype, np.floating):
        raise CheckpointFormatError(f"{source}: {name} has dtype {array.dtype}, expected a floating-point weight")
    return np.array(array, dtype=np.float32, order="C")  # a copy: never a view of a mapped file

# --- our Keras model ------------------------------------------------------------------------------


def model_tf1_arrays(model: BertPretrainer) -> dict[str, np.ndarray]:
    """The model's weights keyed by original TF1 name, as float32 NumPy arrays in TF1 layout."""
    return {name: np.array(var.numpy() if hasattr(var, "numpy") else var, dtype=np.float32)
            for name, var in tf1_variable_map(model).items()}


def model_expected_shapes(model: BertPretrainer) -> dict[str, tuple[int, ...]]:
    return {name: tuple(int(d) for d in var.shape) for name, var in tf1_variable_map(model).items()}


def assign_tf1_arrays(model: BertPretrainer, arrays: Mapping[str, np.ndarray], source: str = "weights") -> None:
    """Set every model weight from TF1-named arrays; all names and shapes are checked first."""
    variables = tf1_variable_map(model)
    check_arrays(arrays, {n: tuple(int(d) for d in v.shape) for n, v in variables.items()}, source)
    for name, var in variables.items():
        var.assign(np.asarray(arrays[name], dtype=var.dtype))

