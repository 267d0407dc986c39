"""TensorFlow's checkpoint format (the "tensor bundle" of `tf.train.Checkpoint`, TF1's `Saver` and
`tf.raw_ops.SaveV2`), read and written without TensorFlow, so the JAX backend can start from Google's
released checkpoints and export them byte for byte as TensorFlow does.

A checkpoint PREFIX is `PREFIX.index`, a sorted string table (`sstable`) mapping "" to a
BundleHeaderProto (shard count, byte order, version) and each tensor's name to a BundleEntryProto
(dtype, shape, data shard, offset, size, masked CRC32C of the bytes), and `PREFIX.data-SSSSS-of-NNNNN`,
the tensors' raw little-endian bytes back to back. The writer gives the bytes SaveV2 gives for the
same arrays in the same order (one shard, data in the given order, the index sorted by name).

Paths go through the project's filesystem seam (`bert_datagen.contract.fs`): local files, s3:// and
gs:// alike, never tf.io.gfile. String, resource and variant tensors, and partitioned (sliced)
variables, are listed but refused when read.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import google_crc32c
import ml_dtypes
import numpy as np

from bert_datagen.contract.fs import DEFAULT_FS, PathFS, is_remote, replacing
from bert_datagen.datagen.protowire import (
    BYTES,
    VARINT,
    WireError,
    field_bytes,
    field_fixed32,
    field_varint,
    iter_fields,
    read_varint,
    signed64,
)
from bert_datagen.datagen.tfrecord import mask_crc
from bert_datagen.trainer.errors import CheckpointError, CheckpointFormatError
from bert_datagen.trainer.interop.sstable import TableError, iter_table, table_bytes

# TensorFlow's DataType enum (types.proto) for the dtypes whose bytes are a plain little-endian array.
DTYPES: dict[int, np.dtype] = {
    1: np.dtype("<f4"), 2: np.dtype("<f8"), 3: np.dtype("<i4"), 4: np.dtype("u1"), 5: np.dtype("<i2"),
    6: np.dtype("i1"), 8: np.dtype("<c8"), 9: np.dtype("<i8"), 10: np.dtype("?"),
    14: np.dtype(ml_dtypes.bfloat16), 17: np.dtype("<u2"), 18: np.dtype("<c16"), 19: np.dtype("<f2"),
    22: np.dtype("<u4"), 23: np.dtype("<u8"),
}
_CODES = {dtype: code for code, dtype in DTYPES.items()}
_OTHER_DTYPES = {7: "string", 11: "qint8", 12: "quint8", 13: "qint32", 15: "qint16", 16: "quint16",
                 20: "resource", 21: "variant"}
_BUNDLE_VERSION = 1  # the format version this code reads and writes (TensorFlow's kTensorBundleVersion)
_LITTLE_ENDIAN = 0
_SLICE_KEY_LEAD = b"\x00"  # the keys of a partitioned variable's slices (TensorFlow's encoded names)
_READ_CHUNK = 64 << 20


class BundleError(CheckpointFormatError, CheckpointError):
    """A checkpoint that is missing, truncated, corrupt or of a kind not read here; names the file.

    Both a format error (what a bad --init-checkpoint raises) and a checkpoint error (what a bad
    checkpoint of a run raises), so either kind of caller catches it."""


@dataclass(frozen=True)
class TensorEntry:
    """One tensor of the index: where its bytes are and what they must hash to."""

    name: str
    dtype_code: int
    shape: tuple[int, ...]
    shard: int = 0
    offset: int = 0
    size: int = 0
    crc32c: int = 0  # masked
    sliced: bool = False  # a partitioned variable: its bytes are in slices under other keys

    @property
    def dtype(self) -> np.dtype | None:
        return DTYPES.get(self.dtype_code)

    @property
    def dtype_name(self) -> str:
        dtype = self.dtype
        return str(dtype.name if dtype is not None else _OTHER_DTYPES.get(self.dtype_code, f"#{self.dtype_code}"))


def index_path(prefix: str) -> str:
    return prefix + ".index"


def data_path(prefix: str, shard: int, num_shards: int) -> str:
    return f"{prefix}.data-{shard:05d}-of-{num_shards:05d}"


def _masked_crc(data: np.ndarray) -> int:
    return mask_crc(google_crc32c.value(data))


# --- the two protos --------------------------------------------------------------------------------


def header_bytes() -> bytes:
    """BundleHeaderProto{num_shards: 1, endianness: LITTLE, version{producer: 1}} as SaveV2 writes it."""
    version = field_varint(1, _BUNDLE_VERSION)
    return field_varint(1, 1) + field_varint(2, _LITTLE_ENDIAN) + field_bytes(3, version)


def entry_bytes(entry: TensorEntry) -> bytes:
    dims = b"".join(field_bytes(2, field_varint(1, d)) for d in entry.shape)
    return (field_varint(1, entry.dtype_code) + field_bytes(2, dims) + field_varint(3, entry.shard)
            + field_varint(4, entry.offset) + field_varint(5, entry.size) + field_fixed32(6, entry.crc32c))


def _parse_header(value: bytes) -> tuple[int, int, int, list[int]]:
    """(num_shards, endianness, min_consumer, bad_consumers)."""
    num_shards, endianness, min_consumer, bad = 0, _LITTLE_ENDIAN, 0, []
    for number, wire, field in iter_fields(value):
        if number == 1 and wire == VARINT:
            num_shards = signed64(field)
        elif number == 2 and wire == VARINT:
            endianness = field
        elif number == 3 and wire == BYTES:
            for vnum, vwire, vfield in iter_fields(field):
                if vnum == 2 and vwire == VARINT:
                    min_consumer = signed64(vfield)
                elif vnum == 3 and vwire == VARINT:
                    bad.append(signed64(vfield))
                elif vnum == 3 and vwire == BYTES:  # packed
                    pos = 0
                    while pos < len(vfield):
                        v, pos = read_varint(vfield, pos)
                        bad.append(signed64(v))
    return num_shards, endianness, min_consumer, bad


def _parse_shape(value: bytes) -> tuple[int, ...] | None:
    """The dimensions of a TensorShapeProto; None for an unknown rank or size."""
    dims: list[int] = []
    for number, wire, field in iter_fields(value):
        if number == 2 and wire == BYTES:
            size = 0
            for dnum, dwire, dfield in iter_fields(field):
                if dnum == 1 and dwire == VARINT:
                    size = signed64(dfield)
            if size < 0:
                return None
            dims.append(size)
        elif number == 3 and wire == VARINT and field:
            return None
    return tuple(dims)


def _parse_entry(name: str, value: bytes) -> TensorEntry:
    fields: dict[int, int] = {}
    shape: tuple[int, ...] | None = ()
    sliced = False
    for number, wire, field in iter_fields(value):
        if number == 2 and wire == BYTES:
            shape = _parse_shape(field)
        elif number == 7 and wire == BYTES:
            sliced = True
        elif isinstance(field, int):
            fields[number] = field
    if shape is None:
        raise WireError(f"tensor {name}: shape of unknown rank or size")
    return TensorEntry(name, fields.get(1, 0), shape, shard=signed64(fields.get(3, 0)),
                       offset=signed64(fields.get(4, 0)), size=signed64(fields.get(5, 0)),
                       crc32c=fields.get(6, 0), sliced=sliced)


# --- reading ---------------------------------------------------------------------------------------


class BundleReader:
    """A checkpoint's index, read and checked when opened; tensors are read on request (only the
    bytes of those asked for, so a model's weights come without a release's optimizer slots)."""

    def __init__(self, prefix: str | os.PathLike, fs: PathFS = DEFAULT_FS) -> None:
        self.prefix = os.fspath(prefix)
        self.fs = fs
        path = index_path(self.prefix)
        try:
            with fs.open_read(path) as f:
                raw = f.read()
        except FileNotFoundError as e:
            raise BundleError(f"{path}: no such checkpoint index") from e
        except OSError as e:
            raise BundleError(f"{path}: cannot read: {e.strerror or e}") from e
        try:
            self.num_shards, self.entries = self._parse(raw)
        except (TableError, WireError) as e:
            raise BundleError(f"{path}: not a readable TF checkpoint index: {e}") from e

    def _parse(self, raw: bytes) -> tuple[int, dict[str, TensorEntry]]:
        items = iter_table(raw)
        first = next(items, None)
        if first is None or first[0] != b"":
            raise TableError("no header entry (not a TF checkpoint index)")
        num_shards, endianness, min_consumer, bad = _parse_header(first[1])
        if endianness != _LITTLE_ENDIAN:
            raise TableError("written on a big-endian machine; only little-endian checkpoints are read")
        if min_consumer > _BUNDLE_VERSION or _BUNDLE_VERSION in bad:
            raise TableError(f"needs a newer reader (format version {min_consumer}; this reads {_BUNDLE_VERSION})")
        if num_shards < 1:
            raise TableError(f"header names {num_shards} data shards")
        entries: dict[str, TensorEntry] = {}
        for key, value in items:
            if key.startswith(_SLICE_KEY_LEAD):
                continue  # a slice of a partitioned variable, listed under the variable's own name
            try:
                name = key.decode("utf-8")
            except UnicodeDecodeError as e:
                raise TableError(f"tensor name {key[:80]!r} is not UTF-8") from e
            entry = _parse_entry(name, value)
            self._check_entry(entry, num_shards)
            entries[name] = entry
        return num_shards, entries

    @staticmethod
    def _check_entry(entry: TensorEntry, num_shards: int) -> None:
        if not 0 <= entry.shard < num_shards or entry.offset < 0 or entry.size < 0:
            raise TableError(f"tensor {entry.name}: shard {entry.shard} of {num_shards}, offset {entry.offset}, "
                             f"size {entry.size}")
        dtype = entry.dtype
        if dtype is not None and not entry.sliced:
            expected = math.prod(entry.shape) * dtype.itemsize  # (exact: a corrupt shape cannot wrap around)
            if entry.size != expected:
                raise TableError(f"tensor {entry.name}: {entry.size} bytes for {dtype.name}{list(entry.shape)} "
                                 f"({expected} expected)")

    def shapes(self) -> dict[str, tuple[int, ...]]:
        """Every tensor's shape, by name (partitioned variables under their whole shape)."""
        return {name: entry.shape for name, entry in self.entries.items()}

    def _readable(self, name: str) -> TensorEntry:
        entry = self.entries.get(name)
        if entry is None:
            raise BundleError(f"{index_path(self.prefix)}: no tensor {name!r}")
        if entry.sliced:
            raise BundleError(f"{self.prefix}: {name} is a partitioned (sliced) variable, not read without "
                              "TensorFlow; save it whole (e.g. tf.train.Saver without partitioners)")
        if entry.dtype is None:
            raise BundleError(f"{self.prefix}: {name} is a {entry.dtype_name} tensor; only numeric tensors are read")
        return entry

    def read(self, names: Iterable[str]) -> dict[str, np.ndarray]:
        """The named tensors as NumPy arrays of their dtype (each checked against its CRC32C)."""
        wanted = [self._readable(name) for name in names]
        arrays: dict[str, np.ndarray] = {}
        for shard in sorted({e.shard for e in wanted}):
            path = data_path(self.prefix, shard, self.num_shards)
            in_shard = sorted((e for e in wanted if e.shard == shard), key=lambda e: e.offset)
            try:
                with self.fs.open_read(path) as f:
                    length = f.seek(0, os.SEEK_END)
                    for entry in in_shard:
                        if entry.offset + entry.size > length:
                            raise BundleError(f"{path}: {length} bytes, but tensor {entry.name} lies at bytes "
                                              f"[{entry.offset}, {entry.offset + entry.size}) (truncated?)")
                        arrays[entry.name] = self._read_entry(f, entry, path)
            except FileNotFoundError as e:
                raise BundleError(f"{path}: data file missing (the checkpoint is incomplete)") from e
            except OSError as e:
                raise BundleError(f"{path}: cannot read: {e.strerror or e}") from e
        return {name: arrays[name] for name in names}

    def tensor(self, name: str) -> np.ndarray:
        return self.read([name])[name]

    @staticmethod
    def _read_entry(f, entry: TensorEntry, path: str) -> np.ndarray:
        buf = np.empty(entry.size, np.uint8)
        f.seek(entry.offset)
        done = 0
        while done < entry.size:  # a stream may return less than asked (a bucket's blocks)
            got = f.readinto(memoryview(buf[done:done + _READ_CHUNK]))
            if not got:
                raise BundleError(f"{path}: ends inside tensor {entry.name} (bytes [{entry.offset}, "
                                  f"{entry.offset + entry.size}) expected; truncated?)")
            done += got
        if _masked_crc(buf) != entry.crc32c:
            raise BundleError(f"{path}: tensor {entry.name}: CRC32C mismatch (corrupt data)")
        return buf.view(entry.dtype).reshape(entry.shape)


def read_bundle(prefix: str | os.PathLike, names: Iterable[str] | None = None,
                fs: PathFS = DEFAULT_FS) -> dict[str, np.ndarray]:
    """The named tensors of a checkpoint (every tensor when ``names`` is None)."""
    reader = BundleReader(prefix, fs)
    return reader.read(list(reader.entries) if names is None else list(names))


# --- writing ---------------------------------------------------------------------------------------


def _as_tensor(prefix: str, name: str, array: np.ndarray) -> np.ndarray:
    if not isinstance(name, str) or not name or name.startswith("\x00"):
        raise BundleError(f"{prefix}: tensor name {name!r}: must be a non-empty string")
    array = np.asarray(array)
    if array.dtype.byteorder == ">":
        array = array.astype(array.dtype.newbyteorder("<"))
    if array.dtype not in _CODES:
        raise BundleError(f"{prefix}: tensor {name} has dtype {array.dtype}, which a checkpoint is not written "
                          f"with here (numeric: {', '.join(sorted({d.name for d in DTYPES.values()}))})")
    return array if array.flags.c_contiguous else array.copy(order="C")  # (ascontiguousarray: 0-d to 1-d)


def write_bundle(prefix: str | os.PathLike, arrays: Mapping[str, np.ndarray], fs: PathFS = DEFAULT_FS) -> str:
    """Write ``arrays`` as the checkpoint PREFIX: the bytes `tf.raw_ops.SaveV2` writes for the same names
    and arrays in the same order. The data file is written first and the index last, each to a temp
    name renamed into place, so an index is only ever found beside its complete data."""
    prefix = os.fspath(prefix)
    tensors = [(name, _as_tensor(prefix, name, array)) for name, array in arrays.items()]
    entries, offset = [], 0
    for name, array in tensors:
        flat = array.reshape(-1).view(np.uint8)
        entries.append(TensorEntry(name, _CODES[array.dtype], tuple(array.shape), offset=offset,
                                   size=flat.size, crc32c=_masked_crc(flat)))
        offset += flat.size
    index = table_bytes([(b"", header_bytes())]
                        + sorted((e.name.encode("utf-8"), entry_bytes(e)) for e in entries))
    data = data_path(prefix, 0, 1)
    if is_remote(prefix):  # an object is written whole
        fs.write_atomic(data, b"".join(a.tobytes() for _, a in tensors))
    else:
        fs.makedirs(os.path.dirname(prefix))
        with replacing(data, durable=True) as tmp, open(tmp, "wb") as f:
            for _, array in tensors:
                f.write(array.reshape(-1).view(np.uint8).data)
    fs.write_atomic(index_path(prefix), index)
    return prefix

