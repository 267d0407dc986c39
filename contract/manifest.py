"""`manifest.json`: what a dataset directory holds, with checksums (schema in docs/manifest.md).

The manifest is the last file a run writes; a directory without one is not a complete dataset.
Readers reject a manifest of another schema or of a newer schema version, naming the file and field.

`Manifest` is the one reader and writer: `Manifest.load` validates the JSON and gives typed splits,
shards and indexes; `Manifest.build` makes a new one, `write` puts it on disk. The functions on plain
dicts below it (`load_manifest`, `build_manifest`, `write_manifest`, ...) are the raw JSON form, for
code that edits a manifest's fields (tests making damaged datasets).
"""

from __future__ import annotations

import copy
import hashlib
import json
import platform
from dataclasses import dataclass, field
from typing import Any

from bert_datagen.contract.features import (
    DEFAULT_KIND,
    PRETRAINING,
    REQUIRED_FEATURES,
    REQUIRED_FEATURES_BY_KIND,
    REQUIRED_TOP_BY_KIND,
    TASK,
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
REQUIRED_BLOCKS = ("path", "lines", "bytes", "sha256")
REQUIRED_SIDE = ("path", "bytes", "sha256")  # a task split's side files
__all__ = ["CARD_NAME", "MANIFEST_NAME", "REQUIRED_FEATURES", "SCHEMA", "SCHEMA_VERSION", "VOCAB_NAME",
           "FeatureSpec", "IndexInfo", "Manifest", "ManifestError", "ShardInfo", "SideFile", "SplitInfo",
           "VocabInfo", "build_manifest", "load_manifest", "manifest_bytes", "manifest_identity",
           "manifest_kind", "validate_manifest", "write_manifest"]

FeatureSpec = tuple[str, int]  # (dtype, length) of one feature: ("int64", 128)


class ManifestError(ValueError):
    """A manifest that is missing, unreadable, of another schema, or missing a field; says which."""


@dataclass(frozen=True)
class BlockDigests:
    """An index's block digests (datagen/tfrecord_index.py): ``lines`` index lines a digest."""
    path: str
    lines: int
    bytes: int
    sha256: str


@dataclass(frozen=True)
class IndexInfo:
    """A shard's record index (datagen/tfrecord_index.py): ``path`` relative to the dataset;
    ``blocks`` None for datasets written before block digests (readers then read the whole index)."""
    path: str
    bytes: int
    sha256: str
    blocks: BlockDigests | None = None


@dataclass(frozen=True)
class ShardInfo:
    """One TFRecord shard as the manifest lists it; ``index`` None for datasets written before
    indexes (readers then walk the shard's headers)."""
    path: str  # relative to the dataset directory, '/' separators: "train/part-00000-of-00004.tfrecord"
    records: int
    bytes: int
    sha256: str
    index: IndexInfo | None = None
    # A task shard's record lengths (datagen/tasks/lengths.py); None for pre-training shards and for
    # task datasets written before them (length grouping then reads whole windows).
    lengths: SideFile | None = None


@dataclass(frozen=True)
class SideFile:
    """A task split's file beside its shards (examples.jsonl, windows.jsonl)."""
    path: str
    bytes: int
    sha256: str


@dataclass(frozen=True)
class SplitInfo:
    """One split: its shards and their sums, and what a task dataset's split says of itself."""
    name: str
    shards: tuple[ShardInfo, ...]
    records: int
    bytes: int
    # Task datasets only (docs/tasks.md): the split's own feature spec, whether it is built for
    # training ("train") or prediction ("predict"), its counts and side files.
    features: dict[str, FeatureSpec] | None = None
    mode: str | None = None
    labelled: bool = True  # False: a split without labels (its label ids are placeholders)
    counts: dict[str, Any] = field(default_factory=dict)
    side: tuple[SideFile, ...] = ()
    windows_per_example: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class VocabInfo:
    path: str  # the vocab copy beside the manifest, relative to the dataset directory
    sha256: str
    size: int
    do_lower_case: bool | None = None  # absent in the oldest manifests


@dataclass(frozen=True)
class Manifest:
    """A validated manifest.json. The typed fields are what readers use; the JSON it was parsed
    from (or built as) is kept whole, so writing it back gives the same bytes, fields this version
    does not name included."""
    schema_version: int
    kind: str  # contract.features PRETRAINING (also when the file has no "kind") or TASK
    tool: dict[str, Any]
    created_by: dict[str, Any]  # informational: runner, python
    config: dict[str, Any]  # the generator's recorded options (DatagenConfig / TaskConfig.to_dict())
    seed: int | None
    vocab: VocabInfo
    input: dict[str, Any]
    features: dict[str, FeatureSpec]
    splits: dict[str, SplitInfo]
    totals: dict[str, Any]
    task: dict[str, Any] | None  # a task dataset's task: kind, type, labels, max_seq_length, ...
    _json: dict[str, Any] = field(repr=False, compare=False)

    @classmethod
    def build(
        cls,
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
    ) -> Manifest:
        """A complete, validated manifest.

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
        return cls.from_dict(manifest, "<new manifest>")

    @classmethod
    def from_dict(cls, data: Any, source: str = MANIFEST_NAME) -> Manifest:
        """The manifest a parsed manifest.json holds (ManifestError naming ``source`` and the field)."""
        validate_manifest(data, source)
        data = copy.deepcopy(data)
        vocab = data["vocab"]
        return cls(
            schema_version=data["schema_version"], kind=manifest_kind(data, source), tool=data["tool"],
            created_by=data.get("created_by") or {}, config=data["config"], seed=data["seed"],
            vocab=VocabInfo(vocab["path"], vocab["sha256"], vocab["size"], vocab.get("do_lower_case")),
            input=data["input"], features=_features(data["features"], "features", source),
            splits={name: _split(name, info, source) for name, info in data["splits"].items()},
            totals=data["totals"], task=data.get("task"), _json=copy.deepcopy(data))

    @classmethod
    def load(cls, dataset_dir: str, fs: FileSystem) -> Manifest:
        """The validated manifest of a dataset directory (raises ManifestError naming file and field)."""
        path = fs.join(dataset_dir, MANIFEST_NAME)
        if not fs.exists(path):
            raise ManifestError(
                f"{path}: no manifest: this is not a complete bert-datagen dataset (an interrupted run, or "
                "data from the original tool: pass --max-seq-length, --max-predictions-per-seq and --vocab)"
            )
        try:
            data = json.loads(fs.read_bytes(path).decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise ManifestError(f"{path}: not valid JSON: {e}") from e
        return cls.from_dict(data, path)

    def to_dict(self) -> dict[str, Any]:
        """The manifest's JSON object (a copy: editing it changes nothing here)."""
        return copy.deepcopy(self._json)

    def to_bytes(self) -> bytes:
        """The canonical bytes: sorted keys, indent 2, trailing newline."""
        return manifest_bytes(self._json)

    def write(self, dataset_dir: str, fs: FileSystem) -> str:
        """Write DIR/manifest.json atomically; returns its path. Write it LAST."""
        path = fs.join(dataset_dir, MANIFEST_NAME)
        fs.write_atomic(path, self.to_bytes())
        return path

    @property
    def split_names(self) -> list[str]:
        """Split names, train first (manifest.json sorts its keys, which would put eval first)."""
        return sorted(self.splits, key=lambda name: (name != "train", name))

    def split_records(self, split: str) -> int:
        """The records of a split; 0 for a split the dataset does not have."""
        info = self.splits.get(split)
        return info.records if info is not None else 0

    @property
    def shape(self) -> tuple[int, int]:
        """(max_seq_length, max_predictions_per_seq) of a pre-training dataset, as its feature spec records
        them. Dynamic masking: the trainer's prediction slots; packed rows: the slots of one instance."""
        if "masked_lm_positions" not in self.features or self.config.get("packing"):
            return self.features["input_ids"][1], int(self.config["max_predictions_per_seq"])
        return self.features["input_ids"][1], self.features["masked_lm_positions"][1]

    @property
    def max_seq_length(self) -> int:
        return self.features["input_ids"][1]

    def identity(self) -> dict:
        """`manifest_identity` of this manifest: what the dataset IS, and its fingerprint."""
        return manifest_identity(self._json)

    @property
    def fingerprint(self) -> str:
        """What the dataset is, whatever its path: the fingerprint `bert-train` records for a run."""
        return self.identity()["fingerprint"]


def _features(specs: Any, where: str, source: str) -> dict[str, FeatureSpec]:
    if not isinstance(specs, dict):
        raise ManifestError(f"{source}: field {where!r} must be an object")
    for name, spec in specs.items():
        _feature_field(spec, f"{where}.{name}", source)
    return {name: (str(spec[0]), int(spec[1])) for name, spec in specs.items()}


def _index_info(entry: dict) -> IndexInfo:
    blocks = entry.get("blocks")
    return IndexInfo(*(entry[k] for k in REQUIRED_INDEX),
                     BlockDigests(*(blocks[k] for k in REQUIRED_BLOCKS)) if blocks is not None else None)


def _split(name: str, info: dict, source: str) -> SplitInfo:
    where = f"splits.{name}"
    shards = tuple(ShardInfo(s["path"], s["records"], s["bytes"], s["sha256"],
                             _index_info(s["index"]) if "index" in s else None,
                             SideFile(*(s["lengths"][k] for k in REQUIRED_SIDE)) if "lengths" in s else None)
                   for s in info["shards"])
    features = _features(info["features"], f"{where}.features", source) if "features" in info else None
    side = info.get("side", [])
    if not isinstance(side, list):
        raise ManifestError(f"{source}: field {where}.side must be a list")
    for i, entry in enumerate(side):
        _require(entry, REQUIRED_SIDE, f"{where}.side[{i}]", source)
    return SplitInfo(name, shards, info["records"], info["bytes"], features, info.get("mode"),
                     bool(info.get("labelled", True)), info.get("counts", {}),
                     tuple(SideFile(f["path"], f["bytes"], f["sha256"]) for f in side),
                     info.get("windows_per_example", {}))


def manifest_bytes(manifest: dict) -> bytes:
    """The manifest's canonical bytes: sorted keys, indent 2, trailing newline."""
    return (json.dumps(manifest, sort_keys=True, indent=2, ensure_ascii=False) + "\n").encode("utf-8")


def build_manifest(**fields: Any) -> dict:
    """`Manifest.build` (same keyword arguments) as a JSON object."""
    return Manifest.build(**fields).to_dict()


def write_manifest(dataset_dir: str, manifest: dict, fs: FileSystem) -> str:
    """Validate a manifest's JSON object and write DIR/manifest.json atomically; returns its path."""
    return Manifest.from_dict(manifest, fs.join(dataset_dir, MANIFEST_NAME)).write(dataset_dir, fs)


def load_manifest(dataset_dir: str, fs: FileSystem) -> dict:
    """`Manifest.load` as a JSON object."""
    return Manifest.load(dataset_dir, fs).to_dict()


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
                if "blocks" in shard["index"]:  # its block digests; older datasets have none
                    blocks = shard["index"]["blocks"]
                    _require(blocks, REQUIRED_BLOCKS, f"{where}.index.blocks", source)
                    _int_field(blocks["bytes"], f"{where}.index.blocks.bytes", source)
                    _int_field(blocks["lines"], f"{where}.index.blocks.lines", source)
                    if blocks["lines"] < 1:
                        raise ManifestError(f"{source}: field {where}.index.blocks.lines must be >= 1")
                    _relative_path(blocks["path"], f"{where}.index.blocks.path", source)
            if "lengths" in shard:  # a task shard's record lengths; older datasets have none
                _require(shard["lengths"], REQUIRED_SIDE, f"{where}.lengths", source)
                _int_field(shard["lengths"]["bytes"], f"{where}.lengths.bytes", source)
                _relative_path(shard["lengths"]["path"], f"{where}.lengths.path", source)
        _int_field(info["records"], f"splits.{split}.records", source)
        _int_field(info["bytes"], f"splits.{split}.bytes", source)


def _relative_path(path: Any, where: str, source: str) -> None:
    if not isinstance(path, str) or path.startswith("/") or "\\" in path or ".." in path.split("/"):
        raise ManifestError(f"{source}: field {where} must be a relative '/' path, got {path!r}")


# What describes the records beside the shards, per kind: a pre-training dataset's features, a task
# dataset's task (its features follow from it). Task datasets list side files (examples.jsonl, ...)
# too; pre-training manifests have none, so one formula covers both.
_IDENTITY_KEY = {PRETRAINING: "features", TASK: "task"}


def manifest_identity(manifest: dict) -> dict:
    """What a dataset IS, independent of how its path is spelled: every shard's and side file's split,
    relative path, record count and sha256, the vocab's sha256 and the features (pre-training) or
    the task (fine-tuning); ``{"fingerprint": sha256 of that, "shards": [...]}``. Runs record it
    and resume only on the same fingerprint, so the formula is frozen: a change would refuse every
    recorded run."""
    key = _IDENTITY_KEY[manifest_kind(manifest)]
    shards = [{"split": name, "path": s["path"], "records": int(s.get("records", 0)), "sha256": s.get("sha256")}
              for name in sorted(manifest["splits"]) for part in ("shards", "side")
              for s in manifest["splits"][name].get(part, [])]
    content = {key: manifest.get(key), "vocab_sha256": manifest["vocab"].get("sha256"), "shards": shards}
    digest = hashlib.sha256(json.dumps(content, sort_keys=True).encode()).hexdigest()
    return {"fingerprint": digest, "shards": shards}
