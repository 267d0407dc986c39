"""Pre-training data: a bert-datagen dataset (through its manifest) or TFRecord globs of the original
tool, described (`DatasetInfo`) and checked before the first step (kind, shards and sizes, lengths,
first records, token ids, fit with the model), and its train split as the global order reads it
(`training_source`).

Training batches of new runs come from the global order (`trainer/runtime/ordered_input.py`), the
eval split from the same loaders in file order (`eval_batches`); both as NumPy arrays, on either
backend. The tf.data pipeline of runs started by an earlier version is `earlier_runs_input.py`, used
for them alone.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
from collections.abc import Iterator

import numpy as np

from bert_datagen.contract.dataset import ShardRef
from bert_datagen.contract.features import PRETRAINING, TASK, word_segmented
from bert_datagen.contract.loading.source import (
    LoadError,
    Source,
    files_source,
    manifest_version,
    masking_config,
)
from bert_datagen.contract.loading.source import check_unchanged as check_manifest_unchanged
from bert_datagen.contract.loading.split_records import SplitRecords
from bert_datagen.contract.manifest import MANIFEST_NAME, Manifest
from bert_datagen.contract.vocab_io import load_vocab
from bert_datagen.datagen.config import DatagenConfig
from bert_datagen.datagen.dynamic import mask_records
from bert_datagen.datagen.example_exact import decode_example
from bert_datagen.datagen.record_layout import INSTANCE_KEY, WORD_BITS, feature_spec, packed_feature_spec
from bert_datagen.datagen.tfrecord import RecordError, iter_tfrecords, masked_crc32c
from bert_datagen.trainer.errors import DataError
from bert_datagen.trainer.model.config import BertConfig
from bert_datagen.trainer.pretrain.dataset_info import DatasetInfo, data_kind
from bert_datagen.trainer.runtime import gfs
from bert_datagen.trainer.runtime.dataset_dir import open_manifest_dataset
from bert_datagen.trainer.runtime.gfs import GFILE_FS
from bert_datagen.trainer.runtime.ordered_input import data_error


def with_sequence_weights(batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Packed rows without NSP carry no `next_sentence_weights`; the losses count sequences by
    them, so derive them: slot s is present when the row holds more than s sequences."""
    if "next_sentence_weights" in batch or "cls_positions" not in batch:
        return batch
    present = np.max(batch["sequence_ids"], axis=-1, keepdims=True)  # [B,1]: sequences in the row
    slots = np.arange(1, batch["cls_positions"].shape[-1] + 1)[None, :]
    return {**batch, "next_sentence_weights": (slots <= present).astype(np.float32)}


def open_pretraining_data(data: str, max_seq_length: int | None = None, max_predictions_per_seq: int | None = None,
                 eval_data: str | None = None) -> DatasetInfo:
    """Describe `data`: a dataset directory with manifest.json, or a TFRecord glob (comma-separated
    globs allowed) from the original tool, for which the two lengths must be given."""
    if gfs.isdir(data):
        if not gfs.exists(os.path.join(data, MANIFEST_NAME)) and max_seq_length is not None:
            info = _from_globs(os.path.join(data, "*"), max_seq_length, max_predictions_per_seq, eval_data)
        else:
            info = _from_manifest(data)
            refuse_manifest_contradictions(info, max_seq_length, max_predictions_per_seq, eval_data)
    else:
        info = _from_globs(data, max_seq_length, max_predictions_per_seq, eval_data)
    info.identity = dataset_identity(info)
    return info


def refuse_manifest_contradictions(info: DatasetInfo, max_seq_length: int | None,
                                   max_predictions_per_seq: int | None, eval_data: str | None) -> None:
    """A dataset with a manifest states its lengths and splits; the options for TFRecord globs
    without one may repeat them but not contradict them (the data would win, the record would lie)."""
    manifest = f"{info.source}/{MANIFEST_NAME}"
    for option, given, states in (("--max-seq-length", max_seq_length, info.max_seq_length),
                                  ("--max-predictions-per-seq", max_predictions_per_seq,
                                   info.max_predictions_per_seq)):
        if given is not None and given != states:
            raise DataError(f"{option} {given} contradicts {manifest}, which says {states}: the records have "
                            f"the manifest's shape (the option is for TFRecord globs without a manifest)")
    if eval_data:
        raise DataError(f"--eval-data {eval_data} does not apply to a dataset with a manifest: {manifest} "
                        "names its eval split (the option is for TFRecord globs without a manifest)")


def training_source(info: DatasetInfo) -> Source:
    """The train split as the global order reads it (`trainer/runtime/ordered_input.py`): its shards and
    their record counts, the dataset's fingerprint, the features the model reads, and for dynamic
    masking the dataset's vocab and masking options."""
    split_records(info, "train")  # counts a glob's files, once
    return _split_source(info, info.train_files, info.train_counts, info.train_refs)


def _split_source(info: DatasetInfo, files: list[str], counts: list[int], refs: list[ShardRef] | None) -> Source:
    masking = {}
    if info.masking == "dynamic":
        masking = {"vocab": dataset_vocab(info), "mask_config": dataset_masking(info)}
    return files_source(info.source, files, counts, info.identity["fingerprint"], info.features(),
                        PRETRAINING, GFILE_FS, **masking, refs=refs, version=info.manifest_version)


def dataset_vocab(info: DatasetInfo):
    assert info.manifest is not None  # dynamic data is always a dataset of ours
    return load_vocab(os.path.join(info.source, info.manifest.vocab.path), GFILE_FS)


def dataset_masking(info: DatasetInfo) -> DatagenConfig:
    """The dataset's masking options (masked_lm_prob, max predictions, ratios, unit) from its manifest."""
    assert info.manifest is not None
    try:
        return masking_config(info.manifest)
    except (TypeError, ValueError) as exc:
        raise DataError(f"{info.source}: the manifest's config cannot be used for dynamic masking: {exc}") from exc


def eval_batches(info: DatasetInfo, batch_size: int, files: list[str] | None = None) -> Iterator[dict[str, np.ndarray]]:
    """The eval split (or `files`: the train split's) in file order, once, full batches only, as the
    model reads them (NumPy), through the loaders every framework shares; a dataset replaced since
    `info` was read is refused at its first batch.

    Dynamic-masking data is masked as in epoch 0 with the dataset's own seed, so every run (any
    training seed) is evaluated on the same masks.
    """
    files = files if files is not None else info.eval_files
    if files == info.train_files:
        split_records(info, "train")
        counts, refs = info.train_counts, info.train_refs
    elif files == info.eval_files and info.eval_counts is not None:
        counts, refs = info.eval_counts, info.eval_refs
    else:
        counts, refs = [count_records(path) for path in files], None
    try:
        source = _split_source(info, files, counts, refs)
        records = SplitRecords(source)
        for start in range(0, len(records) // batch_size * batch_size, batch_size):
            yield _model_batch(info, source, records[start:start + batch_size])
    except LoadError as exc:
        raise data_error(exc) from exc


def _model_batch(info: DatasetInfo, source: Source, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    if source.dynamic:  # the source holds the dataset's masking options and vocab
        seed = int(info.manifest.config.get("random_seed", 0) if info.manifest else 0)
        identity = batch.pop(INSTANCE_KEY)[:, 0]
        word_bits = [batch.pop(WORD_BITS)] if WORD_BITS in batch else []
        masked = mask_records(batch["input_ids"], batch["input_mask"], identity, np.zeros(len(identity), np.int64),
                              seed, source.mask_config, source.vocab, *word_bits)
        batch.update(input_ids=masked.input_ids.astype(np.int32),
                     masked_lm_positions=masked.masked_lm_positions.astype(np.int32),
                     masked_lm_ids=masked.masked_lm_ids.astype(np.int32),
                     masked_lm_weights=masked.masked_lm_weights.astype(np.float32))
    return with_sequence_weights(batch) if info.packed else batch


def check_unchanged(info: DatasetInfo) -> None:
    """DataError unless the dataset is still the one `info` was read from: what the eval split's
    tf.data reads must pass once read, as every batch of the training input does."""
    try:
        check_manifest_unchanged(info.source, info.manifest_version, GFILE_FS)
    except LoadError as exc:
        raise data_error(exc) from exc


def _from_manifest(directory: str) -> DatasetInfo:
    version = manifest_version(directory, GFILE_FS)  # before the manifest is read: see open_source
    ds = open_manifest_dataset(directory)
    if ds.kind != PRETRAINING:
        raise DataError(f"{directory}/{MANIFEST_NAME}: a {ds.kind!r} dataset, not a pre-training dataset: "
                        "bert-train pretrain and eval read the output of `bert-datagen run`"
                        + ("; fine-tune on it with `bert-train finetune`" if ds.kind == TASK else ""))
    manifest = ds.manifest
    assert manifest is not None
    seq_len, max_pred = ds.max_seq_length, ds.max_predictions
    objective, masking = data_kind(manifest)
    sequences = packed_sequences(manifest, f"{directory}/{MANIFEST_NAME}")
    if sequences and masking != "static":
        raise DataError(f"{directory}/{MANIFEST_NAME}: packed rows with {masking} masking: the trainer "
                        "reads packed data with static masks only")
    if sequences:
        # Per sequence, from the row's MLM slots: whatever the manifest's config calls its lengths.
        max_pred = manifest.features.get("masked_lm_positions", ("", 0))[1] // sequences
    segmented = word_segmented(manifest.config)
    expected = (packed_feature_spec(seq_len, max_pred, sequences, objective) if sequences
                else feature_spec(seq_len, max_pred, objective, masking, word_bits=segmented))
    got = manifest.features
    for name, spec in expected.items():
        if got.get(name) != spec:
            raise DataError(f"{directory}/manifest.json: feature {name} is {got.get(name)}, expected {spec}")

    def split_files(split: str) -> tuple[list[str], int]:
        records = manifest.split_records(split)
        return [ref.path for ref in ds.split_shards(split)], records

    train, n_train = split_files("train")
    evals, _ = split_files("eval")
    if not train:
        raise DataError(f"{directory}/manifest.json: the train split has no shards")
    for ref in ds.split_shards("train") + ds.split_shards("eval"):
        check_shard_file(ref.path, ref.expected.bytes, f"{directory}/{MANIFEST_NAME}")  # type: ignore[union-attr]
    return DatasetInfo(source=directory, max_seq_length=seq_len, max_predictions_per_seq=max_pred,
                       train_files=train, eval_files=evals, train_records=n_train,
                       train_counts=[r.expected.records for r in ds.split_shards("train")],  # type: ignore[union-attr]
                       dataset=ds, sequences_per_row=sequences, manifest_version=version)


def packed_sequences(manifest: Manifest, where: str) -> int:
    """The most sequences per row of a packed dataset (its `cls_positions` length), 0 unpacked."""
    if not manifest.config.get("packing"):
        return 0
    spec = manifest.features.get("cls_positions")
    if not spec or spec[1] < 1:
        raise DataError(f"{where}: packed data without a cls_positions feature")
    return spec[1]


def _glob(patterns: str) -> list[str]:
    files: list[str] = []
    for pattern in patterns.split(","):
        matched = sorted(gfs.glob(pattern.strip()))
        if not matched:
            raise DataError(f"{pattern}: no files match")
        files.extend(matched)
    return files


def _from_globs(patterns: str, max_seq_length, max_predictions_per_seq, eval_data) -> DatasetInfo:
    if max_seq_length is None or max_predictions_per_seq is None:
        raise DataError(
            f"{patterns}: not a dataset directory with manifest.json; for TFRecords of the original tool "
            "give --max-seq-length and --max-predictions-per-seq"
        )
    files = [f for f in _glob(patterns) if not f.endswith(".json")]
    return DatasetInfo(source=patterns, max_seq_length=max_seq_length,
                       max_predictions_per_seq=max_predictions_per_seq, train_files=files,
                       eval_files=_glob(eval_data) if eval_data else [])


def check_shard_file(path: str, size: int, manifest: str) -> None:
    """The shard exists, can be opened and has the size the manifest gives (a cheap stat, no read)."""
    try:
        length = gfs.size(path)
    except gfs.not_found_errors() as exc:
        raise DataError(f"{path}: shard listed in {manifest} is missing") from exc
    except gfs.read_errors() as exc:
        raise DataError(f"{path}: cannot read: {getattr(exc, 'message', None) or exc.strerror or exc}") from exc
    if length != size:
        raise DataError(f"{path}: has {length} bytes, {manifest} says {size}: the shard was changed "
                        "or truncated after the dataset was written (bert-datagen verify tells more)")


def dataset_identity(info: DatasetInfo) -> dict:
    """What the dataset IS, independent of how its path is spelled.

    With a manifest: `bert_datagen.contract.manifest.manifest_identity` (fine-tuning's too). For TFRecord
    globs (no checksums without reading everything): file names and sizes.
    """
    if info.manifest is not None:
        # Outside the fingerprint (runs recorded before it keep theirs): what fine-tuning from the
        # run compares its task dataset's vocab with.
        return {**info.manifest.identity(), "vocab_sha256": info.manifest.vocab.sha256}
    shards = [{"split": split, "path": os.path.basename(path), "bytes": _size(path)}
              for split, files in (("train", info.train_files), ("eval", info.eval_files)) for path in files]
    content = {"max_seq_length": info.max_seq_length,
               "max_predictions_per_seq": info.max_predictions_per_seq, "shards": shards}
    digest = hashlib.sha256(json.dumps(content, sort_keys=True).encode()).hexdigest()
    return {"fingerprint": digest, "shards": shards}


def _size(path: str) -> int:
    try:
        return gfs.size(path)
    except gfs.read_errors() as exc:
        raise DataError(f"{path}: cannot read: {getattr(exc, 'message', None) or exc.strerror or exc}") from exc


def count_records(path: str) -> int:
    """Records in one TFRecord file, walking the length headers only (checking their CRCs)."""
    size = _size(path)
    count, offset = 0, 0
    try:
        with gfs.open_read(path) as stream:
            while offset < size:
                header = stream.read(12)
                if len(header) < 12 or masked_crc32c(header[:8]) != struct.unpack("<I", header[8:])[0]:
                    raise DataError(f"corrupt input: {path}: record {count} at byte {offset}: "
                                    "not a TFRecord length header")
                offset += 16 + struct.unpack("<Q", header[:8])[0]
                if offset > size:
                    raise DataError(f"corrupt input: {path}: record {count}: truncated payload")
                stream.seek(offset)
                count += 1
    except gfs.read_errors() as exc:
        raise DataError(f"{path}: cannot read: {getattr(exc, 'message', None) or exc.strerror or exc}") from exc
    return count


def split_records(info: DatasetInfo, split: str) -> int:
    """Records of the train or eval split: from the manifest, else counted."""
    known = info.train_records if split == "train" else info.eval_records
    if known is not None:
        return known
    if split == "eval":
        return sum(count_records(path) for path in info.eval_files)
    info.train_counts = [count_records(path) for path in info.train_files]  # the loaders need them too
    info.train_records = sum(info.train_counts)
    return info.train_records


def check_split_size(info: DatasetInfo, split: str, batch_size: int) -> int:
    """Raise DataError unless the split holds at least one full batch (the input would never yield
    a batch and the run would wait forever); returns its record count."""
    n = split_records(info, split)
    if n < batch_size:
        what = "is empty" if n == 0 else f"has {n} records"
        raise DataError(f"{info.source}: the {split} split {what}, fewer than one batch of {batch_size}: "
                        f"use a smaller --batch-size or a dataset with more {split} records")
    return n


def check_first_records(info: DatasetInfo) -> None:
    """Parse the first record of every shard with the expected feature lengths: a dataset of other
    lengths, or files that are not pre-training records, fail here, before the first step."""
    spec = info.features()
    for path in info.train_files + info.eval_files:
        check_first_record(path, spec)


def check_first_record(path: str, spec: dict[str, tuple[str, int]]) -> None:
    """Raise DataError naming `path` unless its first record (if any) parses with `spec`."""
    try:
        with gfs.open_read(path) as stream:
            payload = next(iter_tfrecords(stream, name=path), None)
    except RecordError as exc:
        raise DataError(f"corrupt input: {exc}") from exc
    except gfs.read_errors() as exc:
        raise DataError(f"{path}: cannot read: {getattr(exc, 'message', None) or exc.strerror or exc}") from exc
    if payload is not None:
        problem = _record_problem(payload, spec)
        if problem:
            raise DataError(f"{path}: record 0: {problem}")


# The features that index the word embeddings (and the MLM output layer).
TOKEN_ID_FEATURES = ("input_ids", "masked_lm_ids")


def _record_problem(payload: bytes, spec: dict[str, tuple[str, int]], vocab_size: int | None = None) -> str | None:
    try:
        features = decode_example(payload)
    except RecordError as exc:
        return f"not a tf.train.Example ({exc})"
    for name, (_, length) in spec.items():
        if name not in features or features[name].size != length:
            got = None if name not in features else features[name].size
            return f"feature {name} has {got} values, expected {length}"
    if vocab_size is not None:
        for name in TOKEN_ID_FEATURES:
            ids = features.get(name)
            if name in spec and ids is not None and ids.size and not 0 <= int(ids.min()) <= int(ids.max()) < vocab_size:
                bad = int(ids.max()) if int(ids.max()) >= vocab_size else int(ids.min())
                return (f"{name} holds token id {bad}, outside the model's vocab_size {vocab_size} "
                        "(the model's vocab size must be that of the vocab the data was made with)")
    return None


def check_token_ids(info: DatasetInfo, vocab_size: int, records_per_shard: int) -> None:
    """Raise DataError naming the record unless the first records of every shard index only
    embeddings the model has: data of a larger vocab than --vocab-size (TFRecord globs state none)
    would otherwise fail inside the first step with a graph stack trace."""
    spec = info.features()
    for path in info.train_files + info.eval_files:
        try:
            with gfs.open_read(path) as stream:
                for index, payload in enumerate(iter_tfrecords(stream, name=path)):
                    if index >= records_per_shard:
                        break
                    problem = _record_problem(payload, spec, vocab_size)
                    if problem:
                        raise DataError(f"{path}: record {index}: {problem}")
        except RecordError as exc:
            raise DataError(f"corrupt input: {exc}") from exc
        except gfs.read_errors() as exc:
            raise DataError(f"{path}: cannot read: {getattr(exc, 'message', None) or exc.strerror or exc}") from exc


def check_fits(info: DatasetInfo, bert: BertConfig) -> None:
    """Raise DataError unless the data can feed the model."""
    problems = []
    if info.max_seq_length > bert.max_position_embeddings:
        problems.append(f"sequences of {info.max_seq_length} tokens exceed the model's "
                        f"max_position_embeddings {bert.max_position_embeddings}")
    if info.max_predictions_per_seq > info.max_seq_length:
        problems.append(f"max_predictions_per_seq {info.max_predictions_per_seq} exceeds the sequence "
                        f"length {info.max_seq_length}")
    if info.vocab_size is not None and info.vocab_size != bert.vocab_size:
        problems.append(f"the data's vocab has {info.vocab_size} tokens, the model's vocab_size is "
                        f"{bert.vocab_size}")
    if bert.type_vocab_size < 2:
        problems.append("type_vocab_size must be at least 2 for sentence pairs")
    if problems:
        raise DataError(f"{info.source}: data and model do not fit: " + "; ".join(problems))


def find_bad_record(files: list[str], max_seq_length: int, max_predictions_per_seq: int,
                    spec: dict[str, tuple[str, int]] | None = None, vocab_size: int | None = None) -> str | None:
    """Scan `files` without TensorFlow; describe the first corrupt record (file, index) or None.

    Called after tf.data fails, because TensorFlow's own errors do not name the file.
    """
    spec = spec or feature_spec(max_seq_length, max_predictions_per_seq)
    for path in files:
        try:
            with gfs.open_read(path) as stream:
                for index, payload in enumerate(iter_tfrecords(stream, name=path)):
                    problem = _record_problem(payload, spec, vocab_size)
                    if problem:
                        return f"{path}: record {index}: {problem}"
        except RecordError as exc:
            return str(exc)
    return None
