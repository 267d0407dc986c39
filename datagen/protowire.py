"""The protocol-buffer wire format, the little of it TensorFlow's checkpoint index needs: varints,
fixed32, length-delimited fields. Hand-written so reading and writing a checkpoint needs neither
TensorFlow's generated protos nor the protobuf package (the JAX install has neither)."""

from __future__ import annotations

import struct
from collections.abc import Iterator

VARINT, FIXED64, BYTES, FIXED32 = 0, 1, 2, 5
_MAX_VARINT_BYTES = 10  # a 64-bit value


class WireError(ValueError):
    """Bytes that are not a valid encoding; the caller adds which file they came from."""


def varint(value: int) -> bytes:
    """The varint of a value in [0, 2**64); negative int32/int64 fields are written as their
    two's complement, as protobuf does."""
    if value < 0:
        value += 1 << 64
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def read_varint(buf: bytes, pos: int, end: int | None = None) -> tuple[int, int]:
    """(value, position after it) of the varint at ``pos``; WireError when it runs past ``end``."""
    end = len(buf) if end is None else end
    value = shift = 0
    for i in range(pos, min(end, pos + _MAX_VARINT_BYTES)):
        byte = buf[i]
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, i + 1
        shift += 7
    raise WireError(f"truncated or overlong varint at byte {pos}")


def signed64(value: int) -> int:
    """A varint read back as the int64 it encodes."""
    return value - (1 << 64) if value >= 1 << 63 else value


def field_varint(number: int, value: int) -> bytes:
    """A varint field, left out when 0 (proto3 writes no default scalar)."""
    return varint(number << 3 | VARINT) + varint(value) if value else b""


def field_fixed32(number: int, value: int) -> bytes:
    return varint(number << 3 | FIXED32) + struct.pack("<I", value) if value else b""


def field_bytes(number: int, payload: bytes) -> bytes:
    """A length-delimited field (a message or a string); a set message is written even when empty."""
    return varint(number << 3 | BYTES) + varint(len(payload)) + payload


def iter_fields(buf: bytes) -> Iterator[tuple[int, int, int | bytes]]:
    """(field number, wire type, value) of each field of a message: an int for varints and fixed
    widths, the bytes of a length-delimited field; WireError on anything malformed."""
    pos, end = 0, len(buf)
    while pos < end:
        key, pos = read_varint(buf, pos, end)
        number, wire = key >> 3, key & 7
        if number == 0:
            raise WireError(f"field number 0 at byte {pos}")
        if wire == VARINT:
            value, pos = read_varint(buf, pos, end)
            yield number, wire, value
        elif wire in (FIXED32, FIXED64):
            width = 4 if wire == FIXED32 else 8
            if pos + width > end:
                raise WireError(f"truncated fixed-width field {number}")
            yield number, wire, int.from_bytes(buf[pos:pos + width], "little")
            pos += width
        elif wire == BYTES:
            size, pos = read_varint(buf, pos, end)
            if pos + size > end:
                raise WireError(f"field {number} runs past the end of its message")
            yield number, wire, bytes(buf[pos:pos + size])
            pos += size
        else:
            raise WireError(f"unsupported wire type {wire} (field {number})")
