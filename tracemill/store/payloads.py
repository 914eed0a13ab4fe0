"""Large attribute values, stored once (table `payloads`) and read back whole or a page at a time."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any, TypeVar

from sqlalchemy import Connection, func, select

from tracemill.store.tables import PayloadRow

PAYLOAD_MIN_CHARS = 1024
REF_KEY = "$payload"

K = TypeVar("K")


def digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def reference(text: str) -> tuple[str, dict[str, Any]]:
    """The digest of a large value and what stands in its place in a span's attributes."""
    key = digest(text)
    return key, {REF_KEY: key, "chars": len(text)}


def is_reference(value: Any) -> bool:
    return isinstance(value, Mapping) and isinstance(value.get(REF_KEY), str)


def read_payload(conn: Connection, key: str, offset: int = 0, limit: int | None = None) -> str:
    """A stored value, or the page of it from character `offset`, `limit` characters long."""
    if offset == 0 and limit is None:
        body: Any = PayloadRow.body
    elif limit is None:
        body = func.substr(PayloadRow.body, offset + 1)
    else:
        body = func.substr(PayloadRow.body, offset + 1, limit)
    value = conn.execute(select(body).where(PayloadRow.digest == key)).scalar_one_or_none()
    if value is None:
        raise KeyError(f"no payload {key}")
    return value


def resolve_all(conn: Connection, spans: Mapping[K, Mapping[str, Any]]) -> dict[K, dict[str, Any]]:
    """Spans' attributes (by any key) with every stored-once value back in place, the values read in one query; a
    value whose payload is gone stays its reference."""
    keys = {v[REF_KEY] for attributes in spans.values() for v in attributes.values() if is_reference(v)}
    if not keys:
        return {key: dict(attributes) for key, attributes in spans.items()}
    bodies = dict(conn.execute(select(PayloadRow.digest, PayloadRow.body).where(PayloadRow.digest.in_(keys))).all())
    return {key: {k: bodies.get(v[REF_KEY], v) if is_reference(v) else v for k, v in attributes.items()}
            for key, attributes in spans.items()}


def resolve(conn: Connection, attributes: Mapping[str, Any]) -> dict[str, Any]:
    """A span's attributes with every stored-once value back in place."""
    return resolve_all(conn, {0: attributes})[0]
