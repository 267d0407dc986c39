"""The sorted string table (LevelDB's table format) that indexes a TensorFlow checkpoint, written the
way TensorFlow's `table::TableBuilder` writes it and read back with every block's CRC checked.

Layout: data blocks of prefix-compressed entries (a restart point every 16 entries), an empty
metaindex block, an index block (one entry per data block: a key >= the block's last key and < the
next block's first, and the block's handle), then a 48-byte footer (the two handles as varints,
zero-padded, and LevelDB's magic number). Each block is followed by a type byte (0: uncompressed,
the only kind checkpoints use) and the masked CRC32C of the block and that byte.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Iterator

from bert_datagen.datagen.protowire import WireError, read_varint, varint
from bert_datagen.datagen.tfrecord import masked_crc32c

MAGIC = 0xDB4775248B80FB57
FOOTER_BYTES = 48  # two handles padded to 2 * 2 * 10 bytes, then the 8-byte magic
BLOCK_SIZE = 256 << 10  # TensorFlow's table::Options default: a data block ends past this estimate
RESTART_INTERVAL = 16
_OVERLY_LARGE = 2
_TRAILER_BYTES = 5
_UNCOMPRESSED = 0


class TableError(ValueError):
    """A table that is truncated, corrupt or of a kind we do not read; the caller names the file."""


class _BlockBuilder:
    def __init__(self, restart_interval: int) -> None:
        self.restart_interval = restart_interval
        self.buffer = bytearray()
        self.restarts = [0]
        self.counter = 0
        self.last_key = b""

    @property
    def empty(self) -> bool:
        return not self.buffer

    def size_estimate(self) -> int:
        return len(self.buffer) + 4 * len(self.restarts) + 4

    def add(self, key: bytes, value: bytes) -> None:
        shared = 0
        if self.counter < self.restart_interval:
            limit = min(len(key), len(self.last_key))
            while shared < limit and key[shared] == self.last_key[shared]:
                shared += 1
        else:
            self.restarts.append(len(self.buffer))
            self.counter = 0
        self.buffer += varint(shared) + varint(len(key) - shared) + varint(len(value))
        self.buffer += key[shared:] + value
        self.last_key = key
        self.counter += 1

    def finish(self) -> bytes:
        return bytes(self.buffer) + b"".join(struct.pack("<I", r) for r in self.restarts) + \
            struct.pack("<I", len(self.restarts))


def _shortest_separator(start: bytes, limit: bytes) -> bytes:
    """A short key >= ``start`` and < ``limit`` (the index key between two data blocks)."""
    common = 0
    while common < min(len(start), len(limit)) and start[common] == limit[common]:
        common += 1
    if common < min(len(start), len(limit)):
        byte = start[common]
        if byte < 0xFF and byte + 1 < limit[common]:
            return start[:common] + bytes([byte + 1])
    return start


def _short_successor(key: bytes) -> bytes:
    """A short key >= ``key`` (the index key after the last data block)."""
    for i, byte in enumerate(key):
        if byte != 0xFF:
            return key[:i] + bytes([byte + 1])
    return key


def _handle(offset: int, size: int) -> bytes:
    return varint(offset) + varint(size)


def table_bytes(items: Iterable[tuple[bytes, bytes]], block_size: int = BLOCK_SIZE) -> bytes:
    """The table of ``items`` (keys strictly increasing, bytewise), byte for byte as TensorFlow's
    TableBuilder with compression off writes it."""
    out = bytearray()
    data = _BlockBuilder(RESTART_INTERVAL)
    index = _BlockBuilder(1)  # every index entry a restart point, as LevelDB's index block
    pending: tuple[int, int] | None = None  # the handle of a block whose index key awaits the next key
    last_key: bytes | None = None

    def write_block(block: _BlockBuilder) -> tuple[int, int]:
        contents = block.finish()
        handle = (len(out), len(contents))
        out.extend(contents)
        out.extend(bytes([_UNCOMPRESSED]) + struct.pack("<I", masked_crc32c(contents + bytes([_UNCOMPRESSED]))))
        return handle

    for key, value in items:
        if last_key is not None and key <= last_key:
            raise ValueError(f"table keys out of order: {key!r} after {last_key!r}")
        # An entry of twice the block size starts a block of its own (TensorFlow's builder does so).
        if last_key is not None and len(key) + len(value) >= _OVERLY_LARGE * block_size and not data.empty:
            pending, data = write_block(data), _BlockBuilder(RESTART_INTERVAL)
        if pending is not None:
            index.add(_shortest_separator(last_key, key), _handle(*pending))
            pending = None
        data.add(key, value)
        last_key = key
        if data.size_estimate() >= block_size:
            pending, data = write_block(data), _BlockBuilder(RESTART_INTERVAL)
    if not data.empty:
        pending = write_block(data)
    metaindex = write_block(_BlockBuilder(RESTART_INTERVAL))
    if pending is not None:
        index.add(_short_successor(last_key), _handle(*pending))
    index_handle = write_block(index)
    footer = _handle(*metaindex) + _handle(*index_handle)
    out.extend(footer + bytes(FOOTER_BYTES - 8 - len(footer)) + struct.pack("<Q", MAGIC))
    return bytes(out)


# --- reading ---------------------------------------------------------------------------------------


def _read_handle(buf: bytes, pos: int, end: int) -> tuple[tuple[int, int], int]:
    offset, pos = read_varint(buf, pos, end)
    size, pos = read_varint(buf, pos, end)
    return (offset, size), pos


def _block(table: bytes, handle: tuple[int, int], what: str) -> bytes:
    offset, size = handle
    if offset + size + _TRAILER_BYTES > len(table) - FOOTER_BYTES:
        raise TableError(f"{what} block [{offset}, {offset + size}) lies past the end of the table (truncated?)")
    contents = table[offset:offset + size]
    kind = table[offset + size]
    stored = struct.unpack_from("<I", table, offset + size + 1)[0]
    if masked_crc32c(contents + bytes([kind])) != stored:
        raise TableError(f"{what} block at byte {offset}: CRC mismatch (corrupt)")
    if kind != _UNCOMPRESSED:
        raise TableError(f"{what} block at byte {offset}: compressed (type {kind}); TensorFlow's checkpoints "
                         "are written uncompressed")
    return contents


def _entries(block: bytes, what: str) -> Iterator[tuple[bytes, bytes]]:
    if len(block) < 4:
        raise TableError(f"{what} block too short")
    restarts = struct.unpack_from("<I", block, len(block) - 4)[0]
    end = len(block) - 4 - 4 * restarts
    if restarts < 1 or end < 0:
        raise TableError(f"{what} block: bad restart count {restarts}")
    pos, key = 0, b""
    try:
        while pos < end:
            shared, pos = read_varint(block, pos, end)
            fresh, pos = read_varint(block, pos, end)
            size, pos = read_varint(block, pos, end)
            if shared > len(key) or pos + fresh + size > end:
                raise TableError(f"{what} block: entry at byte {pos} runs past its block")
            key = key[:shared] + block[pos:pos + fresh]
            pos += fresh
            yield key, block[pos:pos + size]
            pos += size
    except WireError as e:
        raise TableError(f"{what} block: {e}") from e


def iter_table(table: bytes) -> Iterator[tuple[bytes, bytes]]:
    """Every (key, value) of a table, in key order; TableError when it is truncated or corrupt."""
    if len(table) < FOOTER_BYTES:
        raise TableError(f"{len(table)} bytes, shorter than a table's footer (truncated?)")
    if struct.unpack_from("<Q", table, len(table) - 8)[0] != MAGIC:
        raise TableError("no table magic number at the end (truncated, or not a checkpoint index)")
    footer_at = len(table) - FOOTER_BYTES
    try:
        _, pos = _read_handle(table, footer_at, len(table) - 8)  # the metaindex: nothing in it we use
        index_handle, _ = _read_handle(table, pos, len(table) - 8)
    except WireError as e:
        raise TableError(f"footer: {e}") from e
    last: bytes | None = None
    for _, handle_bytes in _entries(_block(table, index_handle, "index"), "index"):
        try:
            handle, _ = _read_handle(handle_bytes, 0, len(handle_bytes))
        except WireError as e:
            raise TableError(f"index entry: {e}") from e
        for key, value in _entries(_block(table, handle, "data"), "data"):
            if last is not None and key <= last:
                raise TableError(f"keys out of order at {key[:80]!r} (corrupt)")
            last = key
            yield key, value
