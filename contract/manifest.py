"""`manifest.json`: what a dataset directory holds, with checksums (schema in docs/manifest.md).

The manifest is the last file a run writes; a directory without one is not a complete dataset.
Readers reject a manifest of another schema or of a newer schema version, naming the file and field.
"""

from __future__ import annotations

import json
import platform
from typing import Any

from bert_datagen.contract.features import (
    DEFAULT_KIND,
    REQUIRED_FEATURES,
    REQUIRED_FEATURES_BY_KIND,
    REQUIRED_TOP_BY_KIND,
    required_features,
)
from bert_datagen.contract.fs import FileSystem
from bert_datagen.datagen import __version__

SCHEMA = "bert-datagen/manifest"
SCHEMA_VERSION = 1
MANIFEST_NAME = "manifest.json"
VOCAB_NAME = "vocab.txt"
CARD_NAME = "README.md"

REQUIRED_TOP = ("schema", "schema_version", "tool", "config", "seed", "vocab", "input", "features",
                "splits", "totals")
REQUIRED_VOCAB = ("path", "sha256", "size")
REQUIRED_SHARD = ("path", "records", "bytes", "sha256")
REQUIRED_INDEX = ("path", "bytes", "sha256")
__all__ = ["CARD_NAME", "MANIFEST_NAME", "REQUIRED_FEATURES", "SCHEMA", "SCHEMA_VERSION", "VOCAB_NAME",
           "ManifestError", "build_manifest", "load_manifest", "manifest_bytes", "manifest_kind",
           "shape_from_manifest", "split_names", "validate_manifest", "write_manifest"]


class ManifestError(ValueError):
    """A manifest that is missing, unreadable, of another schema, or missing a field; says which."""


def build_manifest(
    *,
    config: dict,
    vocab: dict,
    input_info: dict,
    features: dict,
    splits: dict,
    totals: dict,
    created_by: dict | None = None,
    kind: str | None = None,
    extra: dict | None = None,
) -> dict:
    """A complete, validated manifest dict.

    Split-level ``records``/``bytes`` are summed from the shards when the caller leaves them out, so
    they can never disagree with the shard list in a freshly built manifest. ``kind`` None writes no
    "kind" field (a pre-training manifest, byte-identical to those written before kinds existed);
    ``extra`` holds a kind's own top-level fields (e.g. "task").
    """
    norm_splits: dict[str, Any] = {}
    for name, split in splits.items():
        shards = [dict(s) for s in split.get("shards", [])]
        norm_splits[name] = {
            **split,
            "shards": shards,
            "records": split.get("records", sum(int(s["records"]) for s in shards)),
            "bytes": split.get("bytes", sum(int(s["bytes"]) for s in shards)),
        }
    manifest = {
        "schema": SCHEMA,
        "schema_version": SCHEMA_VERSION,
        "tool": {"name": "bert-datagen", "version": __version__},
        "created_by": dict(created_by) if created_by is not None else {"python": platform.python_version()},
        "config": dict(config),
        "seed": config.get("random_seed"),
        "vocab": dict(vocab),
        "input": dict(input_info),
        "features": {k: [str(v[0]), int(v[1])] for k, v in features.items()},
        "splits": norm_splits,
        "totals": dict(totals),
    }
    if kind is not None:
        manifest["kind"] = kind
    if extra:
        manifest.update(extra)
    validate_manifest(manifest, "<new manifest>")
    return manifest


def manifest_bytes(manifest: dict) -> bytes:
    """The manifest's canonical bytes: sorted keys, indent 2, trailing newline."""
    return (json.dumps(manifest, sort_keys=True, indent=2, ensure_ascii=False) + "\n").encode("utf-8")


def write_manifest(dataset_dir: str, manifest: dict, fs: FileSystem) -> str:
    """Validate and write DIR/manifest.json atomically; returns its path. Write it LAST."""
    path = fs.join(dataset_dir, MANIFEST_NAME)
    validate_manifest(manifest, path)
    fs.write_atomic(path, manifest_bytes(manifest))
    return path


def load_manifest(dataset_dir: str, fs: FileSystem) -> dict:
    """The validated manifest of a dataset directory (raises ManifestError naming file and field)."""
    path = fs.join(dataset_dir, MANIFEST_NAME)
    if not fs.exists(path):
        raise ManifestError(
            f"{path}: no manifest: this is not a complete bert-datagen dataset (an interrupted run, or "
            "data from the original tool: pass --max-seq-length, --max-predictions-per-seq and --vocab)"
        )
    try:
        manifest = json.loads(fs.read_bytes(path).decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ManifestError(f"{path}: not valid JSON: {e}") from e
    validate_manifest(manifest, path)
    return manifest


def _require(obj: Any, keys: tuple[str, ...], where: str, source: str) -> None:
    if not isinstance(obj, dict):
        raise ManifestError(f"{source}: field {where!r} must be an object")
    for key in keys:
        if key not in obj:
            raise ManifestError(f"{source}: missing field {where + '.' if where else ''}{key}")


def _int_field(value: Any, where: str, source: str) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ManifestError(f"{source}: field {where} must be a non-negative integer, got {value!r}")


def manifest_kind(manifest: dict, source: str = MANIFEST_NAME) -> str:
    """The dataset kind: "pretraining" (also when the field is absent) or "task"."""
    kind = manifest.get("kind", DEFAULT_KIND)
    if kind not in REQUIRED_FEATURES_BY_KIND:
        known = ", ".join(sorted(REQUIRED_FEATURES_BY_KIND))
        raise ManifestError(f"{source}: field kind is {kind!r}, expected one of {known}")
    return kind


def _feature_field(spec: Any, where: str, source: str) -> None:
    if (not isinstance(spec, list | tuple) or len(spec) != 2 or spec[0] not in ("int64", "float32")
            or not isinstance(spec[1], int) or spec[1] < 1):
        raise ManifestError(f"{source}: field {where} must be [dtype, length], got {spec!r}")


def validate_manifest(manifest: Any, source: str = MANIFEST_NAME) -> None:
    """Raise ManifestError unless the manifest has this schema's shape."""
    if not isinstance(manifest, dict):
        raise ManifestError(f"{source}: the manifest must be a JSON object")
    if manifest.get("schema") != SCHEMA:
        raise ManifestError(f"{source}: field schema is {manifest.get('schema')!r}, expected {SCHEMA!r}")
    version = manifest.get("schema_version")
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise ManifestError(f"{source}: field schema_version must be a positive integer, got {version!r}")
    if version > SCHEMA_VERSION:
        raise ManifestError(
            f"{source}: schema_version {version} is newer than this tool knows ({SCHEMA_VERSION}); "
            "upgrade bert-datagen"
        )
    kind = manifest_kind(manifest, source)
    _require(manifest, REQUIRED_TOP + REQUIRED_TOP_BY_KIND[kind], "", source)
    _require(manifest["vocab"], REQUIRED_VOCAB, "vocab", source)
    _int_field(manifest["vocab"]["size"], "vocab.size", source)
    required = required_features(kind, manifest.get("config"))
    _require(manifest["features"], required, "features", source)
    for name in required:
        _feature_field(manifest["features"][name], f"features.{name}", source)
    if not isinstance(manifest["splits"], dict):
        raise ManifestError(f"{source}: field splits must be an object")
    for split, info in manifest["splits"].items():
        _require(info, ("shards", "records", "bytes"), f"splits.{split}", source)
        if not isinstance(info["shards"], list):
            raise ManifestError(f"{source}: field splits.{split}.shards must be a list")
        for i, shard in enumerate(info["shards"]):
            where = f"splits.{split}.shards[{i}]"
            _require(shard, REQUIRED_SHARD, where, source)
            _int_field(shard["records"], f"{where}.records", source)
            _int_field(shard["bytes"], f"{where}.bytes", source)
            _relative_path(shard["path"], f"{where}.path", source)
            if "index" in shard:  # the shard's record index (datagen/tfrecord_index.py); older datasets have none
                _require(shard["index"], REQUIRED_INDEX, f"{where}.index", source)
                _int_field(shard["index"]["bytes"], f"{where}.index.bytes", source)
                _relative_path(shard["index"]["path"], f"{where}.index.path", source)
        _int_field(info["records"], f"splits.{split}.records", source)
        _int_field(info["bytes"], f"splits.{split}.bytes", source)


def _relative_path(path: Any, where: str, source: str) -> None:
    if not isinstance(path, str) or path.startswith("/") or "\\" in path or ".." in path.split("/"):
        raise ManifestError(f"{source}: field {where} must be a relative '/' path, got {path!r}")


def shape_from_manifest(manifest: dict) -> tuple[int, int]:
    """(max_seq_length, max_predictions_per_seq) as recorded in the manifest's feature spec."""
    features = manifest["features"]
    # Dynamic masking: the trainer's prediction slots; packed rows: the slots of one instance.
    if "masked_lm_positions" not in features or manifest.get("config", {}).get("packing"):
        return int(features["input_ids"][1]), int(manifest["config"]["max_predictions_per_seq"])
    return int(features["input_ids"][1]), int(features["masked_lm_positions"][1])


def split_names(manifest: dict) -> list[str]:
    """Split names, train first (manifest.json sorts its keys, which would put eval first)."""
    return sorted(manifest["splits"], key=lambda name: (name != "train", name))
