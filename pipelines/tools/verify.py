"""`bert-datagen verify`: prove a dataset is exactly what its manifest describes.

Everything streams: a shard is read in fixed-size chunks (hashed as it is read), framed records are
collected into batches, and each batch is parsed and checked with NumPy in one go, one shard per
worker process.
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass, field

import numpy as np

from bert_datagen.contract.dataset import Dataset, ShardRef
from bert_datagen.contract.features import word_segmented
from bert_datagen.contract.manifest import CARD_NAME, MANIFEST_NAME, VOCAB_NAME
from bert_datagen.datagen.example_codec import decode_raw
from bert_datagen.datagen.packed_rules import check_packed_batch
from bert_datagen.datagen.record_layout import feature_spec
from bert_datagen.datagen.record_rules import MAX_PROBLEMS_PER_SHARD, RecordShape, check_batch
from bert_datagen.datagen.tfrecord_index import FRAME_OVERHEAD, block_digests, index_of_lengths
from bert_datagen.pipelines.beam import fsio
from bert_datagen.pipelines.tools.shards import map_shards, shard_stream


@dataclass
class ShardTask:
    ref: ShardRef
    shape: RecordShape
    check_records: bool = True
    max_problems: int = MAX_PROBLEMS_PER_SHARD


@dataclass
class ShardResult:
    ref: ShardRef
    records: int = 0
    bytes: int = 0
    sha256: str = ""
    problems: list[str] = field(default_factory=list)
    problem_count: int = 0
    notnext: int = 0
    masked: int = 0
    seconds: float = 0.0
    instances: int = 0  # the records themselves, or the sequences of packed rows


def _add(result: ShardResult, index: int | None, message: str, limit: int) -> None:
    result.problem_count += 1
    if len(result.problems) < limit:
        where = f"record {index}: " if index is not None and not message.startswith("record ") else ""
        result.problems.append(f"{result.ref.name}: {where}{message}")


def verify_shard(task: ShardTask) -> ShardResult:
    """Hash, frame, parse and check one shard; compare with its manifest entry when there is one."""
    t0 = time.perf_counter()
    ref = task.ref
    res = ShardResult(ref)
    if not fsio.exists(ref.path):
        _add(res, None, "shard is missing", task.max_problems)
        return res
    stream = shard_stream(ref)
    lengths = []  # every record's payload length, for the index
    try:
        for raw in stream.raw_batches():
            lengths.append(np.asarray(raw.lengths, np.int64))
            if not task.check_records:
                continue
            batch, problems = decode_raw(raw, task.shape)
            if task.shape.max_sequences_per_row:
                checked, total, batch = check_packed_batch(batch, task.shape, limit=task.max_problems)
            else:
                checked, total = check_batch(batch, task.shape, limit=task.max_problems)
            for index, message in sorted(problems + checked):
                _add(res, index, message, task.max_problems)
            res.problem_count += total - len(checked)
            res.instances += len(batch)
            features = batch.features  # data without NSP or with dynamic masking lacks some
            if "next_sentence_labels" in features:
                res.notnext += int((features["next_sentence_labels"] == 1).sum())
            if "masked_lm_weights" in features:
                res.masked += int((features["masked_lm_weights"] == 1).sum())
    except OSError as e:
        _add(res, None, f"cannot read: {e}", task.max_problems)
    for index, message in stream.problems:
        _add(res, index, message, task.max_problems)
    res.records, res.bytes, res.sha256 = stream.records, stream.bytes, stream.hexdigest()
    exp = ref.expected
    if exp is not None:
        if res.bytes != exp.bytes:
            _add(res, None, f"size is {res.bytes} bytes, manifest says {exp.bytes}", task.max_problems)
        if res.sha256 != exp.sha256:
            _add(res, None, f"sha256 is {res.sha256}, manifest says {exp.sha256}", task.max_problems)
        if res.records != exp.records:
            _add(res, None, f"holds {res.records} records, manifest says {exp.records}", task.max_problems)
        if ref.index is not None and not stream.problems:
            frames = np.concatenate([np.zeros(0, np.int64), *lengths]) + FRAME_OVERHEAD
            for problem in index_problems(ref, frames):
                _add(res, None, problem, task.max_problems)
    res.seconds = time.perf_counter() - t0
    return res


def index_problems(ref: ShardRef, frames: np.ndarray) -> list[str]:
    """The shard's record index (and its block digests) against its manifest entry and the frames the
    shard holds."""
    path, entry = ref.index  # type: ignore[misc]
    name = entry.path
    if not fsio.exists(path):
        return [f"index {name} is missing (readers fall back to walking the shard)"]
    data = fsio.read_bytes(path)
    if len(data) != entry.bytes or hashlib.sha256(data).hexdigest() != entry.sha256:
        return [f"index {name}: size or sha256 differs from the manifest"]
    if data != index_of_lengths(frames):
        return [f"index {name}: does not describe the shard's records (offsets or lengths differ)"]
    blocks = entry.blocks
    if blocks is None:
        return []
    blocks_path = ref.beside(blocks.path)
    if not fsio.exists(blocks_path):
        return [f"index block digests {blocks.path} are missing"]
    digests = fsio.read_bytes(blocks_path)
    if len(digests) != blocks.bytes or hashlib.sha256(digests).hexdigest() != blocks.sha256:
        return [f"index block digests {blocks.path}: size or sha256 differs from the manifest"]
    if digests != block_digests(data, len(frames), blocks.lines):
        return [f"index block digests {blocks.path}: do not match the index's blocks of {blocks.lines} lines"]
    return []


@dataclass
class VerifyReport:
    problems: list[str]
    shards: list[ShardResult]
    problem_count: int
    seconds: float
    has_manifest: bool

    @property
    def ok(self) -> bool:
        return self.problem_count == 0

    @property
    def records(self) -> int:
        return sum(s.records for s in self.shards)

    @property
    def bytes(self) -> int:
        return sum(s.bytes for s in self.shards)


def _manifest_problems(ds: Dataset, vocab_bytes: bytes | None) -> list[str]:
    """Edits to the manifest that make it disagree with itself, the vocab or the directory."""
    m = ds.manifest
    assert m is not None and ds.root is not None
    src = fsio.join(ds.root, MANIFEST_NAME)
    problems = []
    cfg = m.config
    seq, preds = m.shape
    if cfg.get("max_seq_length", seq) != seq or cfg.get("max_predictions_per_seq", preds) != preds:
        problems.append(f"{src}: config max_seq_length/max_predictions_per_seq ({cfg.get('max_seq_length')}/"
                        f"{cfg.get('max_predictions_per_seq')}) disagree with features ({seq}/{preds})")
    if "random_seed" in cfg and m.seed != cfg["random_seed"]:
        problems.append(f"{src}: seed {m.seed} disagrees with config.random_seed {cfg['random_seed']}")
    objective, masking = cfg.get("objective", "nsp"), cfg.get("masking", "static")
    packed = int(cfg.get("max_sequences_per_row", 0)) if cfg.get("packing") else 0
    for name, (dtype, count) in feature_spec(seq, preds, objective, masking, packed, word_segmented(cfg)).items():
        if m.features[name] != (dtype, count):
            problems.append(f"{src}: features.{name} is {list(m.features[name])}, expected {[dtype, count]}")
    seen: set[str] = set()
    for split, info in m.splits.items():
        for s in info.shards:
            if s.path in seen:
                problems.append(f"{src}: shard {s.path} is listed twice")
            seen.add(s.path)
            if s.index is not None:
                seen.add(s.index.path)
                if s.index.blocks is not None:
                    seen.add(s.index.blocks.path)
            if not s.path.startswith(split + "/"):
                problems.append(f"{src}: shard {s.path} of split {split} is not under {split}/")
        for key, listed, total in (("records", info.records, sum(s.records for s in info.shards)),
                                   ("bytes", info.bytes, sum(s.bytes for s in info.shards))):
            if listed != total:
                problems.append(f"{src}: splits.{split}.{key} is {listed} but its shards sum to {total}")
    vocab = m.vocab
    if vocab_bytes is not None:
        digest = hashlib.sha256(vocab_bytes).hexdigest()
        if digest != vocab.sha256:
            problems.append(f"{ds.vocab.path}: sha256 is {digest}, manifest says {vocab.sha256}")
        if len(ds.vocab) != vocab.size:
            problems.append(f"{ds.vocab.path}: {len(ds.vocab)} tokens, manifest says vocab.size {vocab.size}")
    # Files in the split directories that the manifest does not list (and shards it lists that are gone
    # show up per shard as missing).
    for split in m.splits:
        split_dir = fsio.join(ds.root, split)
        for path in fsio.listdir(split_dir):
            rel = f"{split}/{path.rstrip('/').rsplit('/', 1)[-1]}"
            if rel not in seen:
                kind = ("leftover temp file of an interrupted write" if fsio.TMP_MARKER in rel
                        else "stray file not listed in the manifest")
                problems.append(f"{rel}: {kind}")
    for path in fsio.listdir(ds.root):
        name = path.rstrip("/").rsplit("/", 1)[-1]
        if name not in (MANIFEST_NAME, CARD_NAME, vocab.path, VOCAB_NAME):
            problems.append(f"{name}: stray file not listed in the manifest")
    return problems


def _totals_problems(ds: Dataset, shards: list[ShardResult], records_checked: bool) -> list[str]:
    """The manifest's totals against what the shards hold (only when every record parsed)."""
    m = ds.manifest
    assert m is not None and ds.root is not None
    src = fsio.join(ds.root, MANIFEST_NAME)
    totals = m.totals
    records = sum(s.records for s in shards)
    problems = []
    packed = bool(m.config.get("packing"))
    if packed and totals.get("packed_rows", records) != records:
        problems.append(f"{src}: totals.packed_rows is {totals['packed_rows']} but the shards hold {records} rows")
    if "instances" in totals and not packed and totals["instances"] != records:
        problems.append(f"{src}: totals.instances is {totals['instances']} but the shards hold {records} records")
    if not records_checked:
        return problems
    records = sum(s.instances for s in shards)
    if "instances" in totals and packed and totals["instances"] != records:
        problems.append(f"{src}: totals.instances is {totals['instances']} but the rows hold {records} sequences")
    if "masked_tokens" in totals:
        masked = sum(s.masked for s in shards)
        if totals["masked_tokens"] != masked:
            problems.append(f"{src}: totals.masked_tokens is {totals['masked_tokens']} but the records "
                            f"mask {masked} tokens")
    if "notnext_fraction" in totals and records:
        share = sum(s.notnext for s in shards) / records
        if abs(float(totals["notnext_fraction"]) - share) > 1e-6:
            problems.append(f"{src}: totals.notnext_fraction is {totals['notnext_fraction']} but the "
                            f"records' NotNext share is {share:.6f}")
    return problems


def verify(ds: Dataset, *, workers: int | None = None, check_records: bool = True,
           max_problems: int = MAX_PROBLEMS_PER_SHARD) -> VerifyReport:
    """Check a dataset end to end; the report lists every problem found (bounded per shard)."""
    t0 = time.perf_counter()
    pre: list[str] = []
    if ds.manifest is not None:
        vocab_bytes = fsio.read_bytes(ds.vocab.path)
        pre = _manifest_problems(ds, vocab_bytes)
    tasks = [ShardTask(ref, ds.shape, check_records, max_problems) for ref in ds.shards]
    shards = map_shards(verify_shard, tasks, workers)
    problems = list(pre)
    count = len(pre)
    for r in shards:
        problems += r.problems
        count += r.problem_count
        if r.problem_count > len(r.problems):
            problems.append(f"{r.ref.name}: ... and {r.problem_count - len(r.problems)} more problems")
    if ds.manifest is not None and count == 0:
        post = _totals_problems(ds, shards, check_records)
        problems += post
        count += len(post)
    return VerifyReport(problems, shards, count, time.perf_counter() - t0, ds.manifest is not None)
