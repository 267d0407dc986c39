"""Hugging Face `BertForPreTraining`: its weight names and layouts, its `config.json`, its model
directories (safetensors, single or sharded) and tokenizer files.

The table is RECIPE.md section 8: dense kernels are stored [in, out] in TF1 and [out, in] in PyTorch;
LayerNorm gamma/beta are weight/bias; everything else keeps its layout.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from bert_datagen.contract.fs import os_error_in
from bert_datagen.trainer.errors import CheckpointFormatError, CheckpointMismatchError
from bert_datagen.trainer.model.weights import LoadReport, as_float32, check_arrays


def _hf_name(tf1: str) -> tuple[str, bool]:
    """The Hugging Face name of a TF1 weight and whether its layout is transposed there."""
    special = {
        "cls/predictions/output_bias": "cls.predictions.bias",
        "cls/seq_relationship/output_weights": "cls.seq_relationship.weight",
        "cls/seq_relationship/output_bias": "cls.seq_relationship.bias",
    }
    if tf1 in special:
        return special[tf1], False
    name = re.sub(r"/layer_(\d+)/", r"/layer/\1/", tf1)
    transpose = name.endswith("/kernel")
    name = re.sub(r"/(kernel|gamma)$", "/weight", name)
    name = re.sub(r"/beta$", "/bias", name)
    if name.endswith("_embeddings"):
        name += "/weight"
    return name.replace("/", "."), transpose


def hf_name_table(expected: Mapping[str, tuple[int, ...]]) -> dict[str, tuple[str, bool]]:
    """TF1 name -> (Hugging Face name, transposed) for every expected weight."""
    table = {tf1: _hf_name(tf1) for tf1 in expected}
    if len({hf for hf, _ in table.values()}) != len(table):
        raise AssertionError("two TF1 names map to one Hugging Face name")
    return table


def tf1_to_hf(arrays: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Re-key TF1-named weights to `BertForPreTraining` names, transposing dense kernels."""
    out = {}
    for tf1, array in arrays.items():
        hf, transpose = _hf_name(tf1)
        out[hf] = np.ascontiguousarray(array.T if transpose else array)
    return out


# Spellings found in older Hugging Face / pytorch-pretrained-bert files, normalized on read.
def _normalize_hf_key(key: str) -> str:
    key = re.sub(r"LayerNorm\.gamma$", "LayerNorm.weight", key)
    return re.sub(r"LayerNorm\.beta$", "LayerNorm.bias", key)


def hf_to_tf1(state: Mapping[str, np.ndarray], expected: Mapping[str, tuple[int, ...]],
              source: str) -> tuple[dict[str, np.ndarray], LoadReport]:
    """TF1-named weights from a `BertForPreTraining` state dict, checked against `expected`.

    Tied copies (`cls.predictions.decoder.weight`/`.bias`, written by older transformers) are
    accepted when they equal the weights they are tied to; our model cannot represent untied ones.
    """
    state = {_normalize_hf_key(k): v for k, v in state.items()}
    table = hf_name_table(expected)
    report = LoadReport(source=source, format="hf")
    tied = {"cls.predictions.decoder.weight": "bert.embeddings.word_embeddings.weight",
            "cls.predictions.decoder.bias": "cls.predictions.bias"}
    if "cls.predictions.bias" not in state and "cls.predictions.decoder.bias" in state:
        state["cls.predictions.bias"] = state["cls.predictions.decoder.bias"]
    for copy, original in tied.items():
        if copy in state and original in state:
            if not np.array_equal(np.asarray(state[copy]), np.asarray(state[original])):
                raise CheckpointMismatchError(
                    f"{source}: {copy} differs from {original}; the model ties them, so an untied "
                    "checkpoint cannot be loaded without changing its predictions")
            report.ignored.append(copy)
    # Checked under the Hugging Face names and layout: that is what the user will find in the file.
    hf_expected = {hf: tuple(expected[tf1][::-1]) if transpose else tuple(expected[tf1])
                   for tf1, (hf, transpose) in table.items()}
    check_arrays({k: np.shape(v) for k, v in state.items()}, hf_expected, source)
    known = {hf for hf, _ in table.values()} | set(tied)
    for key in sorted(state):
        if key not in known:
            (report.ignored if key.endswith("position_ids") else report.unexpected).append(key)
    arrays = {}
    for tf1, (hf, transpose) in table.items():
        array = as_float32(state[hf], hf, source)
        arrays[tf1] = np.ascontiguousarray(array.T if transpose else array)
    report.loaded = len(arrays)
    return arrays, report


# --- configs --------------------------------------------------------------------------------------

_BERT_CONFIG_KEYS = ("attention_probs_dropout_prob", "hidden_act", "hidden_dropout_prob", "hidden_size",
                     "initializer_range", "intermediate_size", "max_position_embeddings",
                     "num_attention_heads", "num_hidden_layers", "type_vocab_size", "vocab_size")
# Hugging Face's names of the tanh approximation (the original BERT's activation); its "gelu" is erf,
# our "gelu_exact" (trainer/runtime/config.py: the original's "gelu" is tanh).
_TANH_GELU_NAMES = ("gelu_new", "gelu_pytorch_tanh", "gelu_fast")
_TO_HF_ACT = {"gelu": "gelu_new", "gelu_new": "gelu_new", "gelu_exact": "gelu"}


def hf_config_from_bert_config(bert_config: Mapping, pad_token_id: int = 0) -> dict:
    """`config.json` for `BertForPreTraining` from an original `bert_config.json` dict.

    The activation keeps its meaning: the original's tanh "gelu" becomes "gelu_new", "gelu_exact"
    (erf) becomes Hugging Face's "gelu".
    """
    act = bert_config.get("hidden_act", "gelu")
    if act not in _TO_HF_ACT:
        raise CheckpointFormatError(f"hidden_act {act!r}: only 'gelu' (tanh, the original's), 'gelu_new' "
                                    "(the same) and 'gelu_exact' (erf) are supported")
    config = {k: bert_config[k] for k in _BERT_CONFIG_KEYS if k in bert_config}
    config.update({
        "architectures": ["BertForPreTraining"],
        "model_type": "bert",
        "hidden_act": _TO_HF_ACT[act],
        "layer_norm_eps": 1e-12,
        "pad_token_id": int(pad_token_id),
        "position_embedding_type": "absolute",
        "tie_word_embeddings": True,
        "dtype": "float32",
    })
    return dict(sorted(config.items()))


def bert_config_from_hf_config(hf_config: Mapping, source: str) -> dict:
    """An original `bert_config.json` dict from a Hugging Face BERT `config.json`.

    The activation keeps its meaning: Hugging Face's erf "gelu" becomes "gelu_exact", its tanh names
    the original's "gelu".
    """
    problems = []
    if hf_config.get("model_type", "bert") != "bert":
        problems.append(f"model_type {hf_config.get('model_type')!r} is not 'bert'")
    if hf_config.get("position_embedding_type", "absolute") != "absolute":
        problems.append(f"position_embedding_type {hf_config['position_embedding_type']!r} is not 'absolute'")
    eps = float(hf_config.get("layer_norm_eps", 1e-12))
    if eps != 1e-12:
        problems.append(f"layer_norm_eps {eps} is not 1e-12")
    act = hf_config.get("hidden_act", "gelu")
    if act != "gelu" and act not in _TANH_GELU_NAMES:
        problems.append(f"hidden_act {act!r} is not a GELU")
    if hf_config.get("tie_word_embeddings") is False:
        problems.append("tie_word_embeddings is false; the model ties the MLM decoder to the embeddings")
    missing = [k for k in _BERT_CONFIG_KEYS if k != "hidden_act" and k not in hf_config]
    if missing:
        problems.append(f"missing keys {missing}")
    if problems:
        raise CheckpointFormatError(f"{source}: not a BERT config this model can load: " + "; ".join(problems))
    config = {k: hf_config[k] for k in _BERT_CONFIG_KEYS if k != "hidden_act"}
    config["hidden_act"] = "gelu_exact" if act == "gelu" else "gelu"
    return dict(sorted(config.items()))


# --- Hugging Face directories ---------------------------------------------------------------------

HF_WEIGHTS = "model.safetensors"
HF_INDEX = "model.safetensors.index.json"


def is_hf_dir(path: str | os.PathLike) -> bool:
    path = Path(path)
    return path.is_dir() and (path / "config.json").is_file() and (
        (path / HF_WEIGHTS).is_file() or (path / HF_INDEX).is_file() or (path / "pytorch_model.bin").is_file())


def read_hf_config(directory: str | os.PathLike) -> dict:
    path = Path(directory) / "config.json"
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise CheckpointFormatError(f"{path}: cannot read Hugging Face config: {e}") from e


def read_hf_state(directory: str | os.PathLike) -> dict[str, np.ndarray]:
    """All tensors of a Hugging Face model directory (single or sharded safetensors)."""
    directory = Path(directory)
    if (directory / HF_WEIGHTS).is_file():
        files = [directory / HF_WEIGHTS]
    elif (directory / HF_INDEX).is_file():
        index = json.loads((directory / HF_INDEX).read_text())
        files = [directory / name for name in sorted(set(index["weight_map"].values()))]
    else:
        raise CheckpointFormatError(f"{directory}: only safetensors weights are supported (found pytorch_model.bin; "
                         "re-save it with `save_pretrained(..., safe_serialization=True)`)")
    state = {}
    for file in files:
        state.update(read_safetensors(file))
    return state


_SAFETENSORS_DTYPES = {"F64": "<f8", "F32": "<f4", "F16": "<f2", "I64": "<i8", "I32": "<i4",
                       "I16": "<i2", "I8": "i1", "U8": "u1", "BOOL": "?"}


def save_safetensors(tensors: Mapping[str, np.ndarray], path: str | os.PathLike) -> None:
    """safetensors' ``save_file`` (the metadata transformers expects); a failed write (a full disk)
    as the OSError it is, naming the file: safetensors reports it as a SafetensorError without one."""
    from safetensors import SafetensorError
    from safetensors.numpy import save_file

    try:
        save_file(dict(tensors), str(path), metadata={"format": "pt"})
    except SafetensorError as exc:
        failed = os_error_in(str(exc), str(path))
        if failed is None:
            raise
        raise failed from exc


def read_safetensors(path: str | os.PathLike) -> dict[str, np.ndarray]:
    """Tensors of one .safetensors file, memory-mapped; bfloat16 is widened to float32.

    Read directly (8-byte little-endian header size, JSON header, raw data) because the
    `safetensors` NumPy backend refuses bfloat16, the dtype half-precision uploads often use.
    """
    try:
        data = np.memmap(path, dtype=np.uint8, mode="r")
        size = int.from_bytes(data[:8].tobytes(), "little")
        header = json.loads(data[8:8 + size].tobytes())
        base = 8 + size
        state = {}
        for key, info in header.items():
            if key == "__metadata__":
                continue
            start, end = info["data_offsets"]
            raw = data[base + start: base + end]
            if info["dtype"] == "BF16":
                array = (raw.view("<u2").astype(np.uint32) << 16).view(np.float32)
            elif info["dtype"] in _SAFETENSORS_DTYPES:
                array = raw.view(_SAFETENSORS_DTYPES[info["dtype"]])
            else:
                raise ValueError(f"tensor {key} has unsupported dtype {info['dtype']}")
            state[key] = array.reshape(info["shape"])
        return state
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise CheckpointFormatError(f"{path}: cannot read safetensors: {e}") from e


def write_hf_tokenizer(directory: str | os.PathLike, vocab: bytes, do_lower_case: bool,
                       model_max_length: int) -> None:
    """vocab.txt and tokenizer_config.json: what `AutoTokenizer.from_pretrained(DIR)` needs.

    With do_lower_case the original also strips accents; `strip_accents: null` means the same there.
    """
    directory = Path(directory)
    (directory / "vocab.txt").write_bytes(vocab)
    config = {
        "tokenizer_class": "BertTokenizer",
        "do_lower_case": bool(do_lower_case),
        "strip_accents": None,
        "tokenize_chinese_chars": True,
        "model_max_length": int(model_max_length),
        "unk_token": "[UNK]", "sep_token": "[SEP]", "pad_token": "[PAD]",
        "cls_token": "[CLS]", "mask_token": "[MASK]",
    }
    (directory / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")


