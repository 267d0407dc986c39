"""The dataset card: DIR/README.md, a human-readable summary of a dataset's manifest.

Written before the manifest (the manifest is the last file of a run), atomically, so a directory
with a card but no manifest is still recognisably incomplete. Each kind of dataset has its own card
(`bert_datagen.pipelines.tools.kinds`).
"""

from __future__ import annotations

from bert_datagen.contract.manifest import CARD_NAME, MANIFEST_NAME, Manifest
from bert_datagen.pipelines.beam import fsio
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
