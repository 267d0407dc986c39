"""The staging file format: a pool's documents, or a task's records for one shard, as one blob.

Bulk data goes through files under ``DIR/.staging-<run>/`` and only paths and counts go through the
runner's shuffle (``bert_datagen.pipelines.pretraining.transforms``); this module is the bytes of those files. They live
only for one run, so the format is whatever is fastest to write and to map back: named NumPy
arrays behind a small JSON header, read back as views of the file's bytes (no copy, no pickle).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import BinaryIO

import numpy as np

from bert_datagen.datagen.documents import TokenizedDocument
from bert_datagen.datagen.framed import EncodedRecords
from bert_datagen.datagen.instances import FlatPool

_STAGING_MAGIC = b"BDSTAGE1"


def _pack_arrays(**arrays: np.ndarray) -> bytes:
    """Named arrays as one blob: magic, header length, a JSON header (dtype, shape, offset), raw bytes.

    Not ``np.savez``: its zip container computes a CRC over every byte and copies the data twice,
    which cost more than the encoding itself; these files live only for one run.
    """
    header, at = {}, 0
    raw = []
    for name, array in arrays.items():
        array = np.ascontiguousarray(array)
        header[name] = [array.dtype.str, list(array.shape), at]
        raw.append(array.data.cast("B") if array.size else b"")
        at += array.nbytes
    head = json.dumps(header, sort_keys=True).encode()
    return b"".join([_STAGING_MAGIC, len(head).to_bytes(4, "little"), head, *raw])


def _unpack_arrays(data: bytes, path: str) -> dict[str, np.ndarray]:
    if data[:len(_STAGING_MAGIC)] != _STAGING_MAGIC:
        raise RuntimeError(f"{path}: not a staging file of this run (bad magic)")
    at = len(_STAGING_MAGIC)
    size = int.from_bytes(data[at:at + 4], "little")
    header = json.loads(data[at + 4:at + 4 + size])
    base = at + 4 + size
    out = {}
    for name, (dtype, shape, offset) in header.items():
        count = int(np.prod(shape)) if shape else 1
        out[name] = np.frombuffer(data, dtype=np.dtype(dtype), count=count, offset=base + offset).reshape(shape)
    return out


def pool_to_bytes(docs: Sequence[TokenizedDocument]) -> bytes:
    def cat(arrays: list[np.ndarray], dtype) -> np.ndarray:
        return np.concatenate(arrays).astype(dtype, copy=False) if arrays else np.zeros(0, dtype)

    return _pack_arrays(
        doc_ids=np.fromiter((int(d.doc_id) for d in docs), dtype=np.uint64, count=len(docs)),
        n_tokens=np.fromiter((len(d.tokens) for d in docs), dtype=np.int64, count=len(docs)),
        n_sentences=np.fromiter((len(d.sentence_ends) for d in docs), dtype=np.int64, count=len(docs)),
        tokens=cat([np.asarray(d.tokens) for d in docs], np.int32),
        sentence_ends=cat([np.asarray(d.sentence_ends) for d in docs], np.int32),
    )


def pool_from_bytes(data: bytes, path: str) -> list[TokenizedDocument]:
    """The documents of a pool file's bytes (``path`` names it in errors); arrays are views of ``data``."""
    a = _unpack_arrays(data, path)
    tok_at = np.concatenate([[0], np.cumsum(a["n_tokens"])])
    sent_at = np.concatenate([[0], np.cumsum(a["n_sentences"])])
    return [TokenizedDocument(doc_id=int(a["doc_ids"][i]), tokens=a["tokens"][tok_at[i]:tok_at[i + 1]],
                              sentence_ends=a["sentence_ends"][sent_at[i]:sent_at[i + 1]])
            for i in range(len(a["doc_ids"]))]


def _read_exact(stream: BinaryIO, at: int, size: int, path: str) -> bytes:
    stream.seek(at)
    data = stream.read(size) if size else b""
    if len(data) != size:
        raise RuntimeError(f"{path}: staging file cut short ({len(data)} of {size} bytes at {at})")
    return data


class StagedPool:
    """A file written by ``pool_to_bytes``, read in pieces: the per-document counts and identities
    first, then only the bytes of the documents asked for. A pool takes its run of every read task's
    spill file this way, without loading the rest of it."""

    def __init__(self, stream: BinaryIO, path: str) -> None:
        self._stream, self._path = stream, path
        head = _read_exact(stream, 0, len(_STAGING_MAGIC) + 4, path)
        if head[:len(_STAGING_MAGIC)] != _STAGING_MAGIC:
            raise RuntimeError(f"{path}: not a staging file of this run (bad magic)")
        size = int.from_bytes(head[len(_STAGING_MAGIC):], "little")
        self._header = json.loads(_read_exact(stream, len(head), size, path))
        self._base = len(head) + size
        n = int(self._header["doc_ids"][1][0])
        self.doc_ids = self._array("doc_ids", 0, n)
        self.n_tokens = self._array("n_tokens", 0, n)
        self.n_sentences = self._array("n_sentences", 0, n)

    def _array(self, name: str, start: int, stop: int) -> np.ndarray:
        dtype, _, offset = self._header[name]
        item = np.dtype(dtype).itemsize
        raw = _read_exact(self._stream, self._base + offset + start * item, (stop - start) * item, self._path)
        return np.frombuffer(raw, dtype=np.dtype(dtype))

    def documents(self, lo: int, hi: int) -> list[TokenizedDocument]:
        """Documents ``lo:hi``, reading only their tokens and sentence ends."""
        tok_at = np.concatenate([[0], np.cumsum(self.n_tokens[lo:hi])]) + int(self.n_tokens[:lo].sum())
        sent_at = np.concatenate([[0], np.cumsum(self.n_sentences[lo:hi])]) + int(self.n_sentences[:lo].sum())
        tokens = self._array("tokens", int(tok_at[0]), int(tok_at[-1]))
        ends = self._array("sentence_ends", int(sent_at[0]), int(sent_at[-1]))
        tok_at, sent_at = tok_at - tok_at[0], sent_at - sent_at[0]
        return [TokenizedDocument(doc_id=int(self.doc_ids[lo + i]), tokens=tokens[tok_at[i]:tok_at[i + 1]],
                                  sentence_ends=ends[sent_at[i]:sent_at[i + 1]])
                for i in range(hi - lo)]


def flat_pool_from_bytes(data: bytes, path: str) -> FlatPool:
    """A pool file's documents as one ``FlatPool`` (views of ``data``), with no per-document objects:
    what each pass of an ``nsp`` pool needs."""
    a = _unpack_arrays(data, path)
    return FlatPool.of_arrays(a["doc_ids"], a["n_sentences"], a["tokens"], a["sentence_ends"])


def records_to_bytes(records: EncodedRecords) -> bytes:
    return _pack_arrays(keys=records.keys, lengths=records.lengths, blob=np.frombuffer(records.blob, np.uint8))


def records_from_bytes(data: bytes, path: str) -> EncodedRecords:
    a = _unpack_arrays(data, path)
    return EncodedRecords(a["keys"], a["lengths"], a["blob"])  # a view of the file's bytes, not a copy
