"""Where a shard's records are, for a loader: their byte offsets, from the shard's record index
(`bert_datagen.datagen.tfrecord_index`), checked before any record is placed by them.

Three ways, by what the dataset has:

- **Block digests** (datasets written since they were added): the index is read a block of lines at a
  time, only the blocks of the records asked for, and each block is checked against its digest
  (the digests file itself against the manifest's sha256, read once) and its lines against each
  other and the shard's ends. A rank of N then reads about 1/N of each index, not all of it.
- **Index only**: an index is read whole, once, and checked whole (its lines chaining from byte 0 to
  the shard's size, then its size and sha256 against the manifest): lines shifted by a record still
  chain wherever they are cut, so lines read a few at a time could place records wrongly unseen.
- **No index** (datasets written before indexes): the shard's length headers are walked once (12
  bytes a record, each header CRC checked), in 8 MB blocks.

Offsets are kept as they are learned (4 bytes a record where the shard is under 4 GB).
"""

from __future__ import annotations

import hashlib

import numpy as np

from bert_datagen.contract.dataset import ShardRef
from bert_datagen.contract.fs import FileSystem
from bert_datagen.contract.manifest import IndexInfo
from bert_datagen.datagen.tfrecord import RecordError, record_offsets
from bert_datagen.datagen.tfrecord_index import (
    DIGEST_BYTES,
    RecordIndexError,
    check_run,
    line_width,
    parse_lines,
)


class ShardIndexError(ValueError):
    """A shard's offsets could not be found or did not check out; the message names the file."""


class ShardOffsets:
    """The offsets of a shard's records (``offsets[i]``: where record ``i``'s frame starts; the
    shard's size last), filled as records are asked for (`learn`)."""

    def __init__(self, ref: ShardRef, count: int, fs: FileSystem) -> None:
        self.ref, self.count, self.fs = ref, count, fs
        self.size = ref.expected.bytes if ref.expected else None
        wide = self.size is None or self.size >= 1 << 32
        self.offsets = np.zeros(count + 1, np.int64 if wide else np.uint32)
        index = ref.index
        self.blocks = index[1].blocks if index is not None else None
        self._digests: bytes | None = None
        self._known: np.ndarray | None = None  # per block of lines: learned
        self._whole = False

    def missing(self, records: np.ndarray) -> bool:
        """Whether any of these records' offsets is still to be learned."""
        if self._whole:
            return False
        if self._known is None or not len(records):
            return bool(len(records))
        return not self._known[np.unique(np.asarray(records) // self.blocks.lines)].all()

    def learn(self, records: np.ndarray) -> None:
        """Learn the offsets of these records (and the shard's size after its last): their blocks of
        index lines when the index has block digests, else the whole index or a walk of the shard."""
        if not self.missing(records):
            return
        index = self.ref.index
        try:
            if index is None:
                self.offsets[:] = self._walked()
                self._whole = True
            elif self.blocks is None:
                self.offsets[:] = check_index(self.fs.read_bytes(index[0]), self.count, self.size, index[1], index[0])
                self._whole = True
            else:
                self._learn_blocks(np.asarray(records, np.int64))
        except RecordIndexError as e:
            raise ShardIndexError(f"corrupt index: {e} (bert-datagen verify tells more)") from e
        except FileNotFoundError as e:
            raise ShardIndexError(f"{index[0]}: index listed in the manifest is missing") from e
        except OSError as e:
            raise ShardIndexError(f"{index[0]}: cannot read index: {e}") from e

    def _walked(self) -> np.ndarray:
        ref = self.ref
        try:
            with self.fs.open_read(ref.path) as f:
                offsets = record_offsets(f.read, self.count, ref.path)
        except RecordError as e:
            raise ShardIndexError(str(e).replace(f"{ref.path}: ", f"{ref.path}: corrupt shard: ", 1)) from e
        except FileNotFoundError as e:
            raise ShardIndexError(f"{ref.path}: shard listed in the manifest is missing") from e
        except OSError as e:
            raise ShardIndexError(f"{ref.path}: cannot read shard: {e}") from e
        if self.size is not None and int(offsets[-1]) != self.size:
            raise ShardIndexError(f"{ref.path}: corrupt shard: {self.count} records end at byte {int(offsets[-1])}, "
                                  f"the manifest says {self.size} bytes (bert-datagen verify tells more)")
        return offsets

    def _learn_blocks(self, records: np.ndarray) -> None:
        path, entry = self.ref.index  # type: ignore[misc]
        blocks = self.blocks
        lines, count = blocks.lines, self.count
        width = line_width(entry.bytes, count)
        n_blocks = -(-count // lines)
        if self._digests is None:
            digests_path = self.ref.beside(blocks.path)
            try:
                digests = self.fs.read_bytes(digests_path)
            except FileNotFoundError as e:
                raise ShardIndexError(f"{digests_path}: index block digests listed in the manifest are missing") from e
            except OSError as e:
                raise ShardIndexError(f"{digests_path}: cannot read index block digests: {e}") from e
            if len(digests) != blocks.bytes or hashlib.sha256(digests).hexdigest() != blocks.sha256:
                raise RecordIndexError(f"{digests_path}: its size or sha256 differs from the manifest's: the block "
                                       "digests were changed after the dataset was written")
            if len(digests) != n_blocks * DIGEST_BYTES:
                raise RecordIndexError(f"{digests_path}: {len(digests)} bytes for {n_blocks} blocks of {lines} lines")
            self._digests, self._known = digests, np.zeros(n_blocks, bool)
        todo = np.unique(records // lines)
        todo = todo[~self._known[todo]]
        # Neighbouring blocks are one ranged read.
        run = np.flatnonzero(np.concatenate([[True], np.diff(todo) != 1]))
        ends = np.append(run[1:], len(todo))
        spans = [(int(todo[a]), int(todo[b - 1]) + 1) for a, b in zip(run, ends, strict=True)]
        parts = self.fs.read_ranges(path, [(a * lines * width, min(b * lines, count) * width) for a, b in spans])
        for (first_block, end_block), data in zip(spans, parts, strict=True):
            for b in range(first_block, end_block):
                at = (b - first_block) * lines * width
                block = data[at:at + min(lines, count - b * lines) * width]
                self._learn_block(b, block, width, path)

    def _learn_block(self, b: int, block: bytes, width: int, path: str) -> None:
        lines, count = self.blocks.lines, self.count
        first = b * lines
        digest = hashlib.sha256(block).digest()[:DIGEST_BYTES]
        if digest != self._digests[b * DIGEST_BYTES:(b + 1) * DIGEST_BYTES]:
            raise RecordIndexError(f"{path}: lines {first}-{first + len(block) // width - 1} do not match their "
                                   "block digest: the index was changed after the dataset was written")
        offsets, lengths = parse_lines(block, width, first, path)
        check_run(offsets, lengths, first + len(offsets) == count, self.size, first, path)
        self.offsets[first:first + len(offsets)] = offsets
        self.offsets[first + len(offsets)] = offsets[-1] + lengths[-1]
        self._known[b] = True


def check_index(data: bytes, records: int, shard_size: int | None, entry: IndexInfo | None,
                path: str) -> np.ndarray:
    """The offsets (count + 1, the shard's size last) of a shard's whole index ``data``, checked
    against what the manifest says: a line per record, each ending where the next starts, the first
    at byte 0 and the last ending at the shard's size, then the index's size and sha256 (a mismatch
    there with sound lines: lines that chain but name other records). RecordIndexError says why."""
    if not records:
        if data:
            raise RecordIndexError(f"{path}: {len(data)} bytes for a shard without records")
        return np.zeros(1, np.int64)
    offsets, lengths = parse_lines(data, line_width(len(data), records), 0, path)
    check_run(offsets, lengths, True, shard_size, 0, path)
    if entry is not None and len(data) != entry.bytes:
        raise RecordIndexError(f"{path}: {len(data)} bytes, the manifest says {entry.bytes}")
    if entry is not None and (digest := hashlib.sha256(data).hexdigest()) != entry.sha256:
        raise RecordIndexError(f"{path}: its sha256 is {digest}, the manifest says {entry.sha256}: the index "
                               "was changed after the dataset was written")
    return np.append(offsets, offsets[-1] + lengths[-1])
