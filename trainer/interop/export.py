"""`bert-train export`: a run's checkpoint as Google's TF1 release layout or a Hugging Face directory.

An export is written into a temporary sibling directory and renamed into place last, so an
interrupted export leaves nothing that looks complete. Every export holds `EXPORT_MARK` (what wrote
it, which version, which format). An existing `--out` is replaced only with `--overwrite`, and only
when it is an earlier export of ours: it holds a valid mark and nothing but the files an export
writes; any other directory, and any file, is refused and left as it was.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from bert_datagen.contract.dataset import DatasetError, open_dataset
from bert_datagen.contract.fs import DEFAULT_FS, TMP_MARKER, is_remote, os_error_in, temp_name
from bert_datagen.contract.manifest import MANIFEST_NAME, Manifest, ManifestError
from bert_datagen.trainer.errors import CheckpointFormatError, TrainConfigError, TrainerError
from bert_datagen.trainer.interop.hf_checkpoint import (
    HF_WEIGHTS,
    hf_config_from_bert_config,
    save_safetensors,
    tf1_to_hf,
    write_hf_tokenizer,
)
from bert_datagen.trainer.interop.restore import restore_model
from bert_datagen.trainer.interop.tf1 import write_tf1_checkpoint
from bert_datagen.trainer.model.weights import check_arrays, expected_tf1_shapes, model_tf1_arrays
from bert_datagen.trainer.runtime import checkpoint as ckpt_lib
from bert_datagen.trainer.runtime.rundir import output_lock
from bert_datagen.vocab.vocab_file import SPECIAL_TOKENS

FORMATS = ("tf1", "hf")
# Every name an export of any kind writes (a fine-tuned run's tf1 export adds TASK_FILE): a marked
# directory holding only these is an earlier export of ours, whichever run and format wrote it.
TASK_FILE = "task.json"
_TF1_EXPORT_FILES = ("bert_config.json", "checkpoint", "vocab.txt", TASK_FILE)
_TF1_EXPORT_PREFIX = "bert_model.ckpt."
_HF_EXPORT_FILES = ("config.json", HF_WEIGHTS, "vocab.txt", "tokenizer_config.json")
_OLD_PREFIX = ".old-"  # an earlier export set aside during a swap (temp dirs: contract.fs.temp_name)
EXPORT_MARK = "bert_train_export.json"
_WRITTEN_BY = "bert-train export"


@dataclass(frozen=True)
class ExportConfig:
    run: str  # run directory (latest checkpoint) or one RUN/ckpt-NNNNNNNN directory
    format: str
    out: str
    vocab: str | None = None  # overrides the vocab of the run's dataset
    do_lower_case: bool | None = None  # overrides the dataset's setting
    overwrite: bool = False

    def __post_init__(self) -> None:
        if self.format not in FORMATS:
            raise TrainConfigError(f"format {self.format!r} not in {FORMATS}")


@dataclass(frozen=True)
class VocabSource:
    data: bytes
    origin: str
    do_lower_case: bool | None


def vocab_tokens(vocab: bytes, source: str, vocab_size: int) -> list[str]:
    """The tokens of a vocab.txt (id = line number), checked against the model's vocab_size."""
    try:
        tokens = vocab.decode("utf-8").splitlines()
    except UnicodeDecodeError as e:
        raise CheckpointFormatError(f"{source}: vocab is not UTF-8: {e}") from e
    if len(tokens) > vocab_size:
        raise CheckpointFormatError(f"{source}: vocab has {len(tokens)} tokens but the model only "
                                    f"{vocab_size} embeddings")
    missing = [t for t in SPECIAL_TOKENS if t not in tokens]
    if missing:
        raise CheckpointFormatError(f"{source}: vocab lacks the special tokens {missing}")
    return tokens


# --- the vocab to ship -----------------------------------------------------------------------------


def _read(path: str) -> bytes:
    """A file's bytes as stored: local and bucket paths (s3://, gs://) through the project's filesystem
    seam, whose clients honour the configured endpoint (tf.io.gfile has no s3:// and its gs:// client
    ignores the emulator)."""
    try:
        with DEFAULT_FS.open_read(path) as f:
            return f.read()
    except OSError as exc:
        raise TrainConfigError(f"{path}: cannot read: {exc.strerror or exc}") from exc


def _dataset_manifest(data: str) -> Manifest | None:
    """The manifest of the run's dataset; None for TFRecord globs and manifests that cannot be read.
    Through the contract with the TensorFlow-free filesystem (runtime.dataset_dir's twin uses
    tf.io.gfile for other schemes, and importing it needs TensorFlow), so an export runs without it."""
    if not is_remote(data) and not os.path.exists(os.path.join(data, MANIFEST_NAME)):
        return None
    try:
        return open_dataset(data, DEFAULT_FS, need_vocab=False).manifest
    except (ManifestError, DatasetError, OSError):
        return None


def dataset_vocab(data: str) -> VocabSource | None:
    """The vocab a bert-datagen dataset was made with (checked against its manifest's sha256)."""
    manifest = _dataset_manifest(data)
    if manifest is None:
        return None
    vocab = manifest.vocab
    path = os.path.join(data, vocab.path)
    content = _read(path)
    if hashlib.sha256(content).hexdigest() != vocab.sha256:
        raise TrainConfigError(f"{path}: does not match the sha256 in {data}/manifest.json; pass --vocab")
    return VocabSource(content, path, vocab.do_lower_case)


def resolve_vocab(cfg: ExportConfig, data: str | None) -> VocabSource:
    if cfg.vocab:
        source = VocabSource(_read(cfg.vocab), cfg.vocab, cfg.do_lower_case)
    else:
        source = dataset_vocab(data) if data else None
        if source is None:
            raise TrainConfigError(f"the run's dataset ({data}) has no manifest naming its vocab: pass --vocab FILE")
    if cfg.format == "tf1":  # Google's layout ships no tokenizer settings: the casing is not needed
        return VocabSource(source.data, source.origin, None)
    lower = cfg.do_lower_case if cfg.do_lower_case is not None else source.do_lower_case
    if lower is None:
        raise TrainConfigError(f"{source.origin}: whether the text was lowercased is unknown: "
                               "pass --do-lower-case or --no-do-lower-case")
    return VocabSource(source.data, source.origin, bool(lower))


def export_run(cfg: ExportConfig) -> tuple[Path, Path]:
    """Write the export; returns (output directory, checkpoint it came from)."""
    check_export_target(Path(cfg.out), cfg.overwrite)  # before any work
    # The trainer's own loader: the weights are checked against the model they belong to.
    model, bert, ckpt = restore_model(cfg.run)
    state = ckpt_lib.load_state(ckpt)
    vocab = resolve_vocab(cfg, state.get("data"))
    arrays = model_tf1_arrays(model)
    if cfg.format == "tf1":
        out = export_tf1(cfg.out, arrays, bert.to_dict(), vocab.data, overwrite=cfg.overwrite)
    else:
        out = export_hf(cfg.out, arrays, bert.to_dict(), vocab.data, vocab.do_lower_case, overwrite=cfg.overwrite)
    return out, ckpt


# --- whole exports (atomic: written into a temporary sibling, renamed into place last) -------------


def _is_export_file(name: str) -> bool:
    return (name in _TF1_EXPORT_FILES or name in _HF_EXPORT_FILES or name == EXPORT_MARK
            or name.startswith(_TF1_EXPORT_PREFIX))


def _has_export_mark(out: Path) -> bool:
    try:
        mark = json.loads((out / EXPORT_MARK).read_text())
    except (OSError, ValueError):
        return False
    return isinstance(mark, dict) and mark.get("written_by") == _WRITTEN_BY


def check_export_target(out: Path, overwrite: bool) -> None:
    """Refuse an `--out` the export may not replace (raises CheckpointFormatError naming it)."""
    if out.exists() and not out.is_dir():
        raise CheckpointFormatError(f"{out}: exists and is not a directory")
    if not out.is_dir():
        return
    try:
        entries = [p.name for p in out.iterdir()]
    except OSError as exc:
        raise CheckpointFormatError(f"{out}: cannot read the output directory: {exc.strerror}") from exc
    if not entries:
        return
    if not overwrite:
        raise CheckpointFormatError(f"{out}: output directory exists and is not empty (pass --overwrite)")
    # --overwrite replaces an earlier export, never an arbitrary directory: file names prove nothing
    # (a user's config.json is named as ours), the mark an export writes does; and the directory
    # must hold nothing else, since it is replaced whole.
    if not _has_export_mark(out):
        raise CheckpointFormatError(f"{out}: not an earlier export of ours (no valid {EXPORT_MARK}); "
                                    "refusing to replace it")
    foreign = sorted(name for name in entries if not (_is_export_file(name) and (out / name).is_file()))
    if foreign:
        raise CheckpointFormatError(f"{out}: holds files an export does not write ({', '.join(foreign[:5])}); "
                                    "refusing to replace it")


def _recover_interrupted(out: Path) -> None:
    """Undo what a killed export of `out` left beside it (only names with our marks): a temp dir is
    removed; an earlier export set aside for a swap that never happened is put back."""
    if not out.parent.is_dir():
        return
    marked = re.compile(rf"^({re.escape(TMP_MARKER)}|{re.escape(_OLD_PREFIX)})[0-9a-f]{{32}}-{re.escape(out.name)}$")
    for sibling in sorted(out.parent.iterdir()):
        if not (marked.match(sibling.name) and sibling.is_dir()):
            continue
        if sibling.name.startswith(_OLD_PREFIX) and not out.exists():
            os.replace(sibling, out)
        else:
            shutil.rmtree(sibling, ignore_errors=True)


def _atomic_dir(out: str | os.PathLike, overwrite: bool) -> tuple[Path, Path]:
    out = Path(out)
    _recover_interrupted(out)
    check_export_target(out, overwrite)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.parent / temp_name(out.name)
        tmp.mkdir()
    except OSError as exc:
        raise CheckpointFormatError(f"{out}: cannot write the export here: {exc.strerror}") from exc
    return out, tmp


def _publish(tmp: Path, out: Path) -> None:
    _fsync_tree(tmp)
    if out.exists():
        # Two renames: the old export stays whole until the new one is complete beside it.
        old = out.parent / f"{_OLD_PREFIX}{uuid.uuid4().hex}-{out.name}"
        os.replace(out, old)
        os.replace(tmp, out)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(tmp, out)


def _write_mark(directory: Path) -> None:
    from bert_datagen.datagen import __version__

    fmt = "hf" if (directory / "config.json").is_file() else "tf1"
    mark = {"written_by": _WRITTEN_BY, "version": __version__, "format": fmt}
    (directory / EXPORT_MARK).write_text(json.dumps(mark, indent=2, sort_keys=True) + "\n")


def _fsync_tree(directory: Path) -> None:
    for path in directory.iterdir():
        with open(path, "rb") as f:
            os.fsync(f.fileno())


def _default_modes(directory: Path) -> None:
    """Give every file the mode a plain open() gives it (0666 less the umask): writers such as
    safetensors' create theirs 0600, so one file of the export would be private and the rest not."""
    umask = os.umask(0)
    os.umask(umask)
    for path in directory.rglob("*"):
        if path.is_file() and not path.is_symlink():
            path.chmod(0o666 & ~umask)


def write_export_dir(out: str | os.PathLike, overwrite: bool, write: Callable[[Path], None]) -> Path:
    """The one way an export directory is written: `write(tmp)` fills a temp sibling of `out`, which
    is renamed into place when complete (see the module docstring for what may be replaced). The
    export holds `out`'s lock (beside it) throughout: its recovery removes temp siblings of `out`."""
    with output_lock(out, replaced_whole=True):
        out, tmp = _atomic_dir(out, overwrite)
        try:
            write(tmp)
            _write_mark(tmp)
            _default_modes(tmp)
            _publish(tmp, out)
        except BaseException as exc:
            shutil.rmtree(tmp, ignore_errors=True)
            failed = _failed_write(exc, tmp, out)
            if failed is not None:
                raise failed from exc
            raise
    return out


def _failed_write(exc: BaseException, tmp: Path, out: Path) -> OSError | None:
    """A failed write into the export (a full disk) as one OSError naming the file of ``out`` it was
    writing, not the temp directory's name; a library that reports it only as text (safetensors) is
    read for the errno and the path."""
    def shown(path: str) -> str:
        return str(out) + path[len(str(tmp)):] if path.startswith(str(tmp)) else path

    if isinstance(exc, OSError):
        if exc.errno is None or exc.filename2 is not None:  # a rename's error names both paths already
            return None
        return OSError(exc.errno, exc.strerror, shown(str(exc.filename or tmp)))
    if not isinstance(exc, Exception) or isinstance(exc, TrainerError):
        return None
    text = str(exc)
    path = re.search(re.escape(str(tmp)) + r"[^\s;'\"]*", text)
    return os_error_in(text, shown(path.group(0) if path else str(tmp)))


def export_tf1(out: str | os.PathLike, arrays: Mapping[str, np.ndarray], bert_config: Mapping,
               vocab: bytes | None, overwrite: bool = False) -> Path:
    """DIR/bert_model.ckpt.{index,data-*}, DIR/bert_config.json and DIR/vocab.txt, like Google's release."""
    check_arrays(arrays, expected_tf1_shapes(bert_config), "export")
    if vocab is not None:
        vocab_tokens(vocab, "export", int(bert_config["vocab_size"]))

    def write(tmp: Path) -> None:
        write_tf1_checkpoint(tmp / "bert_model.ckpt", arrays)
        (tmp / "bert_config.json").write_text(json.dumps(dict(bert_config), indent=2, sort_keys=True) + "\n")
        if vocab is not None:
            (tmp / "vocab.txt").write_bytes(vocab)

    return write_export_dir(out, overwrite, write)


def export_hf(out: str | os.PathLike, arrays: Mapping[str, np.ndarray], bert_config: Mapping,
              vocab: bytes | None, do_lower_case: bool = True, overwrite: bool = False) -> Path:
    """config.json, model.safetensors (BertForPreTraining names) and tokenizer files.

    Tied copies are left out, as `save_pretrained` does: transformers re-ties the MLM decoder to the
    word embeddings and its bias to `cls.predictions.bias` on load.
    """
    check_arrays(arrays, expected_tf1_shapes(bert_config), "export")
    pad_id = 0
    if vocab is not None:
        pad_id = vocab_tokens(vocab, "export", int(bert_config["vocab_size"])).index("[PAD]")

    def write(tmp: Path) -> None:
        config = hf_config_from_bert_config(bert_config, pad_token_id=pad_id)
        (tmp / "config.json").write_text(json.dumps(config, indent=2) + "\n")
        save_safetensors(tf1_to_hf(arrays), tmp / HF_WEIGHTS)
        if vocab is not None:
            write_hf_tokenizer(tmp, vocab, do_lower_case, int(bert_config["max_position_embeddings"]))

    return write_export_dir(out, overwrite, write)
