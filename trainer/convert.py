"""Checkpoint interop: Google's original TF1 names, our Keras weights, Hugging Face `BertForPreTraining`.

The TF1 variable name is the pivot. The model tells us which Keras variable holds which TF1 name
(`trainer.model.tf1_variable_map`); this module reads and writes checkpoints keyed by those names and
translates them to and from Hugging Face's names (RECIPE.md section 8: dense kernels are stored
[in, out] in TF1 and [out, in] in PyTorch; everything else keeps its layout).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import uuid
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from trainer.config import ConfigError

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


class CheckpointFormatError(ConfigError):
    """A checkpoint, config or output path that cannot be used; the message names the file."""


class CheckpointMismatchError(CheckpointFormatError):
    """A checkpoint lacks weights the model needs, or holds them in the wrong shape."""


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


# --- TF1 checkpoints ------------------------------------------------------------------------------


def resolve_tf1_prefix(path: str | os.PathLike) -> str:
    """The checkpoint prefix for `path`: a prefix itself, or a directory holding one checkpoint.

    Goes through tf.io.gfile, so gs:// paths work like local ones.
    """
    import tensorflow as tf

    path = str(path)
    gfile = tf.io.gfile
    if gfile.isdir(path):
        latest = tf.train.latest_checkpoint(path)
        if latest:
            return latest
        indexes = sorted(os.path.basename(p)[: -len(".index")] for p in gfile.glob(path.rstrip("/") + "/*.index"))
        if len(indexes) == 1:
            return path.rstrip("/") + "/" + indexes[0]
        if not indexes:
            raise CheckpointFormatError(f"{path}: directory holds no TF checkpoint (no *.index file)")
        raise CheckpointFormatError(f"{path}: directory holds several checkpoints ({', '.join(indexes)}); "
                                    "pass the prefix, e.g. DIR/bert_model.ckpt")
    if gfile.exists(path + ".index"):
        return path
    if path.endswith(".index") and gfile.exists(path):
        return path[: -len(".index")]
    raise CheckpointFormatError(f"{path}: no TF checkpoint here (expected {path}.index and its data files)")


def read_tf1_checkpoint(path: str | os.PathLike,
                        expected: Mapping[str, tuple[int, ...]]) -> tuple[dict[str, np.ndarray], LoadReport]:
    """The expected weights of an original-layout checkpoint, as float32 NumPy arrays.

    Shapes are checked from the index before any tensor is read, so a wrong `bert_config.json`
    fails fast with every offending name.
    """
    import tensorflow as tf

    prefix = resolve_tf1_prefix(path)
    try:
        reader = tf.train.load_checkpoint(prefix)
    except Exception as e:  # TF raises several types for corrupt or truncated files
        raise CheckpointFormatError(f"{prefix}: cannot read TF checkpoint: {e}") from e
    shapes = reader.get_variable_to_shape_map()
    check_arrays(shapes, expected, prefix)
    report = LoadReport(source=prefix, format="tf1")
    for name in sorted(shapes):
        if name in expected:
            continue
        (report.ignored if is_non_weight(name) else report.unexpected).append(name)
    arrays = {name: _as_float32(reader.get_tensor(name), name, prefix) for name in expected}
    report.loaded = len(arrays)
    return arrays, report


def _as_float32(value: np.ndarray, name: str, source: str) -> np.ndarray:
    array = np.asarray(value)
    if not np.issubdtype(array.dtype, np.floating):
        raise CheckpointFormatError(f"{source}: {name} has dtype {array.dtype}, expected a floating-point weight")
    return np.array(array, dtype=np.float32, order="C")  # a copy: never a view of a mapped file


def write_tf1_checkpoint(prefix: str | os.PathLike, arrays: Mapping[str, np.ndarray]) -> str:
    """Write a TF checkpoint whose variable names are exactly the keys (no object-graph suffixes).

    SaveV2 writes the named tensors as they are, which is what TF1 `Saver` produced for Google's
    checkpoints; a `checkpoint` state file beside it lets `tf.train.latest_checkpoint(DIR)` find it.
    """
    import tensorflow as tf

    prefix = str(prefix)
    names = sorted(arrays)
    tf.raw_ops.SaveV2(prefix=prefix, tensor_names=names, shape_and_slices=[""] * len(names),
                      tensors=[np.ascontiguousarray(arrays[n], dtype=np.float32) for n in names])
    base = os.path.basename(prefix)
    state = f'model_checkpoint_path: "{base}"\nall_model_checkpoint_paths: "{base}"\n'
    Path(os.path.dirname(prefix) or ".", "checkpoint").write_text(state)
    return prefix


# --- Hugging Face names ---------------------------------------------------------------------------


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
        array = _as_float32(state[hf], hf, source)
        arrays[tf1] = np.ascontiguousarray(array.T if transpose else array)
    report.loaded = len(arrays)
    return arrays, report


# --- configs --------------------------------------------------------------------------------------

_BERT_CONFIG_KEYS = ("attention_probs_dropout_prob", "hidden_act", "hidden_dropout_prob", "hidden_size",
                     "initializer_range", "intermediate_size", "max_position_embeddings",
                     "num_attention_heads", "num_hidden_layers", "type_vocab_size", "vocab_size")
# The original `gelu` is the tanh approximation; Hugging Face calls that `gelu_new`.
_TANH_GELU_NAMES = ("gelu_new", "gelu_pytorch_tanh", "gelu_fast")


def hf_config_from_bert_config(bert_config: Mapping, pad_token_id: int = 0) -> dict:
    """`config.json` for `BertForPreTraining` from an original `bert_config.json` dict."""
    act = bert_config.get("hidden_act", "gelu")
    if act != "gelu":
        raise CheckpointFormatError(f"hidden_act {act!r}: only the original (tanh) gelu is supported")
    config = {k: bert_config[k] for k in _BERT_CONFIG_KEYS if k in bert_config}
    config.update({
        "architectures": ["BertForPreTraining"],
        "model_type": "bert",
        "hidden_act": "gelu_new",
        "layer_norm_eps": 1e-12,
        "pad_token_id": int(pad_token_id),
        "position_embedding_type": "absolute",
        "tie_word_embeddings": True,
        "dtype": "float32",
    })
    return dict(sorted(config.items()))


def bert_config_from_hf_config(hf_config: Mapping, source: str) -> dict:
    """An original `bert_config.json` dict from a Hugging Face BERT `config.json`.

    Hugging Face's own copies of Google's checkpoints say `"gelu"` (erf) although the weights were
    trained with the tanh form; we accept that with a warning rather than refuse Google's models.
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
    if act == "gelu":
        warnings.warn(f"{source}: hidden_act 'gelu' (erf) is loaded into the original tanh-GELU model; "
                      "outputs differ slightly from Hugging Face's", stacklevel=2)
    elif act not in _TANH_GELU_NAMES:
        problems.append(f"hidden_act {act!r} is not a GELU")
    if hf_config.get("tie_word_embeddings") is False:
        problems.append("tie_word_embeddings is false; the model ties the MLM decoder to the embeddings")
    missing = [k for k in _BERT_CONFIG_KEYS if k != "hidden_act" and k not in hf_config]
    if missing:
        problems.append(f"missing keys {missing}")
    if problems:
        raise CheckpointFormatError(f"{source}: not a BERT config this model can load: " + "; ".join(problems))
    config = {k: hf_config[k] for k in _BERT_CONFIG_KEYS if k != "hidden_act"}
    config["hidden_act"] = "gelu"
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


_SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")


def vocab_tokens(vocab: bytes, source: str, vocab_size: int) -> list[str]:
    """The tokens of a vocab.txt (id = line number), checked against the model's vocab_size."""
    try:
        tokens = vocab.decode("utf-8").splitlines()
    except UnicodeDecodeError as e:
        raise CheckpointFormatError(f"{source}: vocab is not UTF-8: {e}") from e
    if len(tokens) > vocab_size:
        raise CheckpointFormatError(f"{source}: vocab has {len(tokens)} tokens but the model only "
                                    f"{vocab_size} embeddings")
    missing = [t for t in _SPECIAL_TOKENS if t not in tokens]
    if missing:
        raise CheckpointFormatError(f"{source}: vocab lacks the special tokens {missing}")
    return tokens


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


# --- whole exports (atomic: written into a temporary sibling, renamed into place last) -------------

_EXPORT_MARKERS = ("bert_config.json", "config.json")


def _atomic_dir(out: str | os.PathLike, overwrite: bool) -> tuple[Path, Path]:
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise CheckpointFormatError(f"{out}: exists and is not a directory")
    if out.exists() and any(out.iterdir()):
        if not overwrite:
            raise CheckpointFormatError(f"{out}: output directory exists and is not empty (pass --overwrite)")
        # --overwrite replaces an earlier export, never an arbitrary directory.
        if not any((out / marker).is_file() for marker in _EXPORT_MARKERS):
            raise CheckpointFormatError(f"{out}: not an earlier export (no bert_config.json or config.json); "
                                        "refusing to replace it")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.parent / f".tmp-{uuid.uuid4().hex}-{out.name}"
    tmp.mkdir()
    return out, tmp


def _publish(tmp: Path, out: Path) -> None:
    if out.exists():
        old = out.parent / f".old-{uuid.uuid4().hex}-{out.name}"
        os.replace(out, old)
        os.replace(tmp, out)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(tmp, out)


def export_tf1(out: str | os.PathLike, arrays: Mapping[str, np.ndarray], bert_config: Mapping,
               vocab: bytes | None, overwrite: bool = False) -> Path:
    """DIR/bert_model.ckpt.{index,data-*}, DIR/bert_config.json and DIR/vocab.txt, like Google's release."""
    check_arrays(arrays, expected_tf1_shapes(bert_config), "export")
    if vocab is not None:
        vocab_tokens(vocab, "export", int(bert_config["vocab_size"]))
    out, tmp = _atomic_dir(out, overwrite)
    try:
        write_tf1_checkpoint(tmp / "bert_model.ckpt", arrays)
        (tmp / "bert_config.json").write_text(json.dumps(dict(bert_config), indent=2, sort_keys=True) + "\n")
        if vocab is not None:
            (tmp / "vocab.txt").write_bytes(vocab)
        _publish(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def export_hf(out: str | os.PathLike, arrays: Mapping[str, np.ndarray], bert_config: Mapping,
              vocab: bytes | None, do_lower_case: bool = True, overwrite: bool = False) -> Path:
    """config.json, model.safetensors (BertForPreTraining names) and tokenizer files.

    Tied copies are left out, as `save_pretrained` does: transformers re-ties the MLM decoder to the
    word embeddings and its bias to `cls.predictions.bias` on load.
    """
    from safetensors.numpy import save_file

    check_arrays(arrays, expected_tf1_shapes(bert_config), "export")
    pad_id = 0
    if vocab is not None:
        pad_id = vocab_tokens(vocab, "export", int(bert_config["vocab_size"])).index("[PAD]")
    out, tmp = _atomic_dir(out, overwrite)
    try:
        config = hf_config_from_bert_config(bert_config, pad_token_id=pad_id)
        (tmp / "config.json").write_text(json.dumps(config, indent=2) + "\n")
        save_file(tf1_to_hf(arrays), str(tmp / HF_WEIGHTS), metadata={"format": "pt"})
        if vocab is not None:
            write_hf_tokenizer(tmp, vocab, do_lower_case, int(bert_config["max_position_embeddings"]))
        _publish(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


# --- reading any supported checkpoint -------------------------------------------------------------


def checkpoint_format(path: str | os.PathLike) -> str:
    """'hf' for a Hugging Face model directory, 'tf1' for a TF checkpoint prefix or directory."""
    if is_hf_dir(path):
        return "hf"
    resolve_tf1_prefix(path)  # raises a clear error when there is no checkpoint
    return "tf1"


def init_checkpoint_config(path: str | os.PathLike, bert_config_path: str | os.PathLike | None = None) -> dict:
    """The original bert_config dict describing the checkpoint at `path`.

    TF1: `--bert-config`, else bert_config.json beside the checkpoint. Hugging Face: its config.json;
    a `--bert-config` given as well must agree with it on the model's shape.
    """
    given = _read_bert_config(str(bert_config_path)) if bert_config_path else None
    if checkpoint_format(path) == "hf":
        hf_config = str(Path(path) / "config.json")
        config = bert_config_from_hf_config(read_hf_config(path), hf_config)
        if given is not None:
            _check_same_shape(given, config, str(bert_config_path), hf_config)
        return config
    if given is not None:
        return given
    beside = os.path.dirname(resolve_tf1_prefix(path)) + "/bert_config.json"
    return _read_bert_config(beside, missing_hint=f"{path}: no --bert-config given and no bert_config.json "
                                                  "beside the checkpoint")


def _read_bert_config(path: str, missing_hint: str | None = None) -> dict:
    """A bert_config.json (local or gs://) with the original defaults filled in; only vocab_size is required."""
    import tensorflow as tf

    from trainer.config import BertConfig

    if not tf.io.gfile.exists(path):
        raise CheckpointFormatError(missing_hint or f"{path}: no such bert_config.json")
    try:
        with tf.io.gfile.GFile(path, "r") as f:
            data = json.loads(f.read())
        if not isinstance(data, dict):
            raise ValueError("not a JSON object")
        return BertConfig.from_dict(data).to_dict()
    except (tf.errors.OpError, ValueError, TypeError) as e:
        raise CheckpointFormatError(f"{path}: cannot read bert_config.json: {e}") from e


def _check_same_shape(a: Mapping, b: Mapping, name_a: str, name_b: str) -> None:
    keys = ("hidden_size", "intermediate_size", "max_position_embeddings", "num_attention_heads",
            "num_hidden_layers", "type_vocab_size", "vocab_size")
    diff = [f"{k}: {a.get(k)} vs {b.get(k)}" for k in keys if a.get(k) != b.get(k)]
    if diff:
        raise CheckpointFormatError(f"{name_a} and {name_b} describe different models: " + "; ".join(diff))


def read_checkpoint_arrays(path: str | os.PathLike,
                           expected: Mapping[str, tuple[int, ...]]) -> tuple[dict[str, np.ndarray], LoadReport]:
    """TF1-named float32 weights from a TF1 checkpoint or a Hugging Face directory."""
    if checkpoint_format(path) == "hf":
        return hf_to_tf1(read_hf_state(path), expected, str(path))
    return read_tf1_checkpoint(path, expected)


# --- our Keras model ------------------------------------------------------------------------------


def model_tf1_arrays(model) -> dict[str, np.ndarray]:
    """The model's weights keyed by original TF1 name, as float32 NumPy arrays in TF1 layout."""
    from trainer.model import tf1_variable_map

    return {name: np.array(var.numpy() if hasattr(var, "numpy") else var, dtype=np.float32)
            for name, var in tf1_variable_map(model).items()}


def model_expected_shapes(model) -> dict[str, tuple[int, ...]]:
    from trainer.model import tf1_variable_map

    return {name: tuple(int(d) for d in var.shape) for name, var in tf1_variable_map(model).items()}


def assign_tf1_arrays(model, arrays: Mapping[str, np.ndarray], source: str = "weights") -> None:
    """Set every model weight from TF1-named arrays; all names and shapes are checked first."""
    from trainer.model import tf1_variable_map

    variables = tf1_variable_map(model)
    check_arrays(arrays, {n: tuple(int(d) for d in v.shape) for n, v in variables.items()}, source)
    for name, var in variables.items():
        var.assign(np.asarray(arrays[name], dtype=var.dtype))


def load_init_checkpoint(model, path: str | os.PathLike) -> LoadReport:
    """Initialize `model` from an original TF1 checkpoint (prefix or directory) or a Hugging Face dir.

    Every weight of the model must be present with its shape, heads included; optimizer slots and
    `global_step` are ignored. Raises CheckpointMismatchError listing all offending names.
    """
    expected = model_expected_shapes(model)
    arrays, report = read_checkpoint_arrays(path, expected)
    assign_tf1_arrays(model, arrays, report.source)
    return report


def restore_external_model(path: str | os.PathLike, bert_config_path: str | os.PathLike | None = None,
                           dtype: str | None = None):
    """A model built from a TF1 checkpoint's bert_config (or a Hugging Face config) with its weights.

    Returns (model, BertConfig, LoadReport).
    """
    from trainer.config import BertConfig
    from trainer.model import build_model

    bert = BertConfig.from_dict(init_checkpoint_config(path, bert_config_path))
    model = build_model(bert, seed=0, dtype=dtype)
    return model, bert, load_init_checkpoint(model, path)


def evaluate_external(path: str | os.PathLike, data: str, bert_config_path: str | os.PathLike | None = None,
                      batch_size: int = 32, max_batches: int | None = None, split: str = "eval",
                      max_seq_length: int | None = None,
                      max_predictions_per_seq: int | None = None) -> dict[str, float]:
    """`bert-train eval --init-checkpoint`: MLM/NSP figures of a TF1 checkpoint or Hugging Face dir."""
    from trainer.train import evaluate_restored

    model, bert, report = restore_external_model(path, bert_config_path)
    result = evaluate_restored(model, bert, data, batch_size, max_batches, split, max_seq_length,
                               max_predictions_per_seq)
    result["checkpoint"] = report.source
    result["step"] = _checkpoint_step(report)
    result["load_report"] = report.summary()
    return result


def _checkpoint_step(report: LoadReport) -> int | None:
    """`global_step` of a TF1 training checkpoint when it has one (released checkpoints may not)."""
    if report.format != "tf1" or "global_step" not in report.ignored:
        return None
    import tensorflow as tf

    return int(tf.train.load_checkpoint(report.source).get_tensor("global_step"))
