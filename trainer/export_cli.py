"""`bert-train export`: a run's checkpoint as Google's TF1 layout or a Hugging Face model directory."""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

import click

from trainer.config import ConfigError

FORMATS = ("tf1", "hf")


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
            raise ConfigError(f"format {self.format!r} not in {FORMATS}")


@dataclass(frozen=True)
class VocabSource:
    data: bytes
    origin: str
    do_lower_case: bool | None


def _read(path: str) -> bytes:
    import tensorflow as tf  # gfile reads local and gs:// paths alike

    try:
        with tf.io.gfile.GFile(path, "rb") as f:
            return f.read()
    except tf.errors.OpError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.message}") from exc


def dataset_vocab(data: str) -> VocabSource | None:
    """The vocab a bert-datagen dataset was made with (checked against its manifest's sha256)."""
    from contract.manifest import MANIFEST_NAME, ManifestError, load_manifest
    from trainer.gfs import GFILE_FS

    if "://" not in data and not os.path.exists(os.path.join(data, MANIFEST_NAME)):
        return None
    try:
        vocab = load_manifest(data, GFILE_FS)["vocab"]
    except (ManifestError, OSError, FileNotFoundError):
        return None
    path = os.path.join(data, vocab["path"])
    content = _read(path)
    if hashlib.sha256(content).hexdigest() != vocab["sha256"]:
        raise ConfigError(f"{path}: does not match the sha256 in {data}/{MANIFEST_NAME}; pass --vocab")
    return VocabSource(content, path, vocab.get("do_lower_case"))


def resolve_vocab(cfg: ExportConfig, data: str | None) -> VocabSource:
    if cfg.vocab:
        source = VocabSource(_read(cfg.vocab), cfg.vocab, cfg.do_lower_case)
    else:
        source = dataset_vocab(data) if data else None
        if source is None:
            raise ConfigError(f"the run's dataset ({data}) has no manifest naming its vocab: pass --vocab FILE")
    lower = cfg.do_lower_case if cfg.do_lower_case is not None else source.do_lower_case
    if lower is None:
        raise ConfigError(f"{source.origin}: whether the text was lowercased is unknown: "
                          "pass --do-lower-case or --no-do-lower-case")
    return VocabSource(source.data, source.origin, bool(lower))


def export_run(cfg: ExportConfig) -> tuple[Path, Path]:
    """Write the export; returns (output directory, checkpoint it came from)."""
    from trainer import checkpoint as ckpt_lib
    from trainer import convert
    from trainer.train import restore_model

    # The trainer's own loader: the weights are checked against the model they belong to.
    model, bert, ckpt = restore_model(cfg.run)
    state = ckpt_lib.load_state(ckpt)
    vocab = resolve_vocab(cfg, state.get("data"))
    arrays = convert.model_tf1_arrays(model)
    if cfg.format == "tf1":
        out = convert.export_tf1(cfg.out, arrays, bert.to_dict(), vocab.data, overwrite=cfg.overwrite)
    else:
        out = convert.export_hf(cfg.out, arrays, bert.to_dict(), vocab.data, vocab.do_lower_case,
                                overwrite=cfg.overwrite)
    return out, ckpt


@click.command("export")
@click.option("--run", "run", required=True,
              help="Run directory (its latest checkpoint) or one RUN/ckpt-NNNNNNNN directory.")
@click.option("--format", "fmt", type=click.Choice(FORMATS), required=True,
              help="tf1: bert_model.ckpt + bert_config.json + vocab.txt (Google's layout); "
                   "hf: config.json + model.safetensors + tokenizer files for BertForPreTraining.")
@click.option("--out", required=True, help="Output directory (written atomically).")
@click.option("--vocab", default=None,
              help="vocab.txt to ship (default: the one named by the run's dataset manifest).")
@click.option("--do-lower-case/--no-do-lower-case", default=None,
              help="Tokenizer casing (default: from the dataset manifest).")
@click.option("--overwrite", is_flag=True, help="Replace an earlier export in --out.")
def export_command(run, fmt, out, vocab, do_lower_case, overwrite) -> None:
    """Export a run's checkpoint for the original TF1 code or for Hugging Face transformers."""
    from trainer.checkpoint import CheckpointError

    try:
        cfg = ExportConfig(run=run, format=fmt, out=out, vocab=vocab, do_lower_case=do_lower_case,
                           overwrite=overwrite)
        written, ckpt = export_run(cfg)
    except (ConfigError, CheckpointError) as exc:
        raise click.ClickException(str(exc)) from exc
    click.echo(f"exported {ckpt} as {fmt} to {written}")
