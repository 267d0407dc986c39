"""The dataset card: DIR/README.md, a human-readable summary of a dataset's manifest, and the files
that describe a finished run's dataset beside its shards (vocab.txt, the card, manifest.json last).

The card is written before the manifest (the manifest is the last file of a run), atomically, so a
directory with a card but no manifest is still recognisably incomplete. Each kind of dataset has its
own card (`bert_datagen.pipelines.tools.kinds`); `run` and `task` write theirs here.
"""

from __future__ import annotations

from bert_datagen.contract.manifest import CARD_NAME, MANIFEST_NAME, VOCAB_NAME, Manifest
from bert_datagen.pipelines.beam import fsio, outputs
from bert_datagen.pipelines.tools.kinds import tools_for


def render_card(dataset_dir: str, manifest: Manifest | dict) -> str:
    """The card's Markdown text (of a manifest's JSON object too, validated first)."""
    if not isinstance(manifest, Manifest):
        manifest = Manifest.from_dict(manifest, f"{dataset_dir}/{MANIFEST_NAME}")
    return tools_for(manifest.kind).card(dataset_dir, manifest)


def write_card(dataset_dir: str, manifest: Manifest, into: str | None = None) -> str:
    """Write the card of the dataset at ``dataset_dir`` (the path its commands name) atomically into
    ``into`` (default ``dataset_dir``; a run's staging directory, swapped in later); returns its
    path. Call before the manifest is written."""
    path = fsio.join(into or dataset_dir, CARD_NAME)
    fsio.write_atomic(path, render_card(dataset_dir, manifest).encode("utf-8"))
    return path


def write_dataset_files(out: outputs.DatasetOutput, manifest: Manifest, vocab_bytes: bytes) -> None:
    """vocab.txt, the dataset card, then manifest.json, into the staging directory (the shards are there)."""
    fsio.write_atomic(fsio.join(out.staging, VOCAB_NAME), vocab_bytes)
    write_card(out.directory, manifest, into=out.staging)
    manifest.write(out.staging, fsio.BEAM_FS)
