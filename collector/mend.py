"""Export bodies whose strings are not all valid UTF-8, mended rather than refused whole.

A protobuf decoder refuses a whole request for one string field with bad UTF-8, and a JSON decoder a whole body for
one lone surrogate escape (`"\\ud83d"`: what an SDK writes for text cut inside an emoji, as OpenTelemetry JS's
attribute length limit does), losing every other span of the request. Here each such string gets U+FFFD in place of
what cannot be stored, and a note names where it was (`resourceSpans[0].scopeSpans[0].spans[3].attributes[2]....`),
which the answer's partial success carries as a warning. Only bodies the strict decoders refused come here.
"""

from __future__ import annotations

import re
from collections import Counter
from typing import Any

from google.protobuf.descriptor import Descriptor, FieldDescriptor

from tracemill.verify import strict_json

_NOTE = "not valid UTF-8: stored with U+FFFD in place of what could not be"
_SURROGATE = re.compile("[\ud800-\udfff]")


class Unmendable(ValueError):
    """The body is not the message it claims to be, whatever its strings."""


def mend_protobuf(body: bytes, descriptor: Descriptor) -> tuple[bytes, list[str]]:
    """`body` with each string field that is not valid UTF-8 decoded with U+FFFD for its bad bytes, and a note for
    each. Raises Unmendable where the wire format itself is broken."""
    notes: list[str] = []
    return _mended(body, descriptor, "", notes), notes


def _mended(data: bytes, descriptor: Descriptor, where: str, notes: list[str]) -> bytes:
    out = bytearray()
    seen: Counter[int] = Counter()
    at = 0
    while at < len(data):
        start = at
        tag, at = _varint(data, at)
        tag_end = at
        number, wire = tag >> 3, tag & 7
        if wire == 0:
            _, at = _varint(data, at)
        elif wire in (1, 5):
            at += 8 if wire == 1 else 4
        elif wire == 2:
            size, value_at = _varint(data, at)
            at = value_at + size
            field = descriptor.fields_by_number.get(number)
            if at <= len(data) and field is not None and field.type in (field.TYPE_STRING, field.TYPE_MESSAGE):
                place = f"{where}.{field.json_name}" if where else field.json_name
                if field.is_repeated:
                    place += f"[{seen[number]}]"
                    seen[number] += 1
                value = _mended_value(data[value_at:at], field, place, notes)
                out += data[start:tag_end] + _encoded_varint(len(value)) + value
                continue
        else:
            raise Unmendable(f"wire type {wire} at byte {start}")
        if at > len(data):
            raise Unmendable(f"a field at byte {start} runs past the end of its message")
        out += data[start:at]
    return bytes(out)


def _mended_value(value: bytes, field: FieldDescriptor, place: str, notes: list[str]) -> bytes:
    if field.type == field.TYPE_MESSAGE:
        return _mended(value, field.message_type, place, notes)
    try:
        value.decode("utf-8")
    except UnicodeDecodeError:
        notes.append(f"{place}: {_NOTE}")
        return value.decode("utf-8", "replace").encode()
    return value


def _varint(data: bytes, at: int) -> tuple[int, int]:
    value = shift = 0
    while at < len(data) and shift < 70:
        byte = data[at]
        at += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, at
        shift += 7
    raise Unmendable(f"a varint at byte {at} does not end")


def _encoded_varint(value: int) -> bytes:
    out = bytearray()
    while value >= 0x80:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def mend_json(body: bytes) -> tuple[Any, list[str]]:
    """`body` decoded with each string holding a lone surrogate (an escape, or a byte that is not UTF-8) given U+FFFD
    in its place, and a note for each. Raises Unmendable where it is not JSON either way."""
    try:
        decoded = strict_json(body.decode("utf-8", "surrogateescape"))
    except (ValueError, RecursionError) as exc:
        raise Unmendable(str(exc)) from exc
    notes: list[str] = []
    return _mended_json(decoded, "", notes), notes


def _mended_json(value: Any, where: str, notes: list[str]) -> Any:
    if isinstance(value, str):
        if _SURROGATE.search(value) is None:
            return value
        notes.append(f"{where}: {_NOTE}")
        return _SURROGATE.sub("\ufffd", value)
    if isinstance(value, dict):
        mended = {}
        for key, item in value.items():
            key = _mended_json(key, f"{where} (a key)", notes)
            mended[key] = _mended_json(item, f"{where}.{key}" if where else key, notes)
        return mended
    if isinstance(value, list):
        return [_mended_json(item, f"{where}[{n}]", notes) for n, item in enumerate(value)]
    return value
