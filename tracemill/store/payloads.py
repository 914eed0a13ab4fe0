"""Large attribute values, stored once (table `payloads`) and read back whole or a page at a time.

A value of `PAYLOAD_MIN_CHARS` or more stands in a span's attributes as a reference: `{"$payload": sha256, "chars":
n}`, or, for a conversation (`CONVERSATIONS`) of `PARTS_MIN_CHARS` or more, `{"$parts": [[sha256, chars], ...],
"chars": n}`, each part a payload of its own. An agent sends its whole conversation with every model call, so the
conversation of a run's k-th call repeats the k-1 before it: stored whole, a run's conversations grow with the square
of its length; cut into parts that the next call's conversation shares, they grow with its length."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Mapping
from typing import Any, TypeVar

from sqlalchemy import Connection, func, select

from tracemill.store.tables import PayloadRow

PAYLOAD_MIN_CHARS = 1024
PARTS_MIN_CHARS = 4 * PAYLOAD_MIN_CHARS  # a shorter value is stored whole: a few KB a model call at most
REF_KEY = "$payload"
PARTS_KEY = "$parts"
# the attributes that hold a model call's whole conversation as JSON (OpenTelemetry GenAI, LangSmith, OpenInference,
# and a generation's input in Langfuse's and OpenLLMetry's entity attributes)
CONVERSATIONS = ("gen_ai.input.messages", "gen_ai.prompt", "input.value", "langfuse.observation.input",
                 "traceloop.entity.input")
# where one JSON object ends and the next begins, as messages do in a conversation whatever their keys (GenAI's and
# OpenAI's role first, LangChain's serialized `{"lc": 1, ...}`): parts are cut after the first's brace, the comma going
# with the next; and after the last message, before the brackets that close the conversation (`_closing`)
OBJECT_BOUNDARY = re.compile(r'\}\s*,\s*\{')
OBJECT_BEFORE_BRACKET = re.compile(r'\}(?=\s*\])')

K = TypeVar("K")


def digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def split_parts(text: str) -> list[str]:
    """`text` cut before each object (a message) that begins `PAYLOAD_MIN_CHARS` or more after the last cut (where it
    has `PARTS_MIN_CHARS`), the comma before it going with it, and before the brackets that close the whole. Where a
    cut falls depends only on the text before it, so a conversation and the same conversation a few messages later
    are cut alike: they share every part but the last messages, and a message long enough to be a part of its own is
    stored once however many later calls resend it."""
    if len(text) < PARTS_MIN_CHARS:
        return [text]
    parts, last = [], 0
    while (found := OBJECT_BOUNDARY.search(text, last + PAYLOAD_MIN_CHARS - 1)) is not None:
        parts.append(text[last:found.start() + 1])
        last = found.start() + 1
    if parts and (closing := _closing(text, last)) is not None:
        parts.append(text[last:closing])
        last = closing
    parts.append(text[last:])
    return parts


def _closing(text: str, last: int) -> int | None:
    """Where the brackets that close a conversation begin, after `last`: in the run of closing brackets and braces
    that ends the text, after the last brace that a bracket follows (the last message's: `}]` of GenAI's list,
    `}]]}` of LangSmith's `{"messages": [[...]]}`)."""
    ends = [m.end() for m in OBJECT_BEFORE_BRACKET.finditer(text, max(last + 1, len(text.rstrip("]} \t\r\n"))))]
    return ends[-1] if ends else None


def reference(text: str) -> tuple[str, dict[str, Any]]:
    """The digest of a large value stored whole and what stands in its place in a span's attributes."""
    key = digest(text)
    return key, {REF_KEY: key, "chars": len(text)}


def in_parts(text: str) -> tuple[list[tuple[str, str]], dict[str, Any]] | None:
    """A conversation (an attribute of `CONVERSATIONS`) as the payloads it is stored in, (digest, body) each, and the
    reference that stands in its place; None where it is stored whole (`reference`)."""
    parts = split_parts(text)
    if len(parts) == 1:
        return None
    pieces = [(digest(part), part) for part in parts]
    return pieces, {PARTS_KEY: [[key, len(part)] for key, part in pieces], "chars": len(text)}


def is_reference(value: Any) -> bool:
    return isinstance(value, Mapping) and (isinstance(value.get(REF_KEY), str)
                                           or isinstance(value.get(PARTS_KEY), list))


def digests(reference: Mapping[str, Any]) -> list[str]:
    """The payloads a reference's value is made of, in order."""
    key = reference.get(REF_KEY)
    return [key] if isinstance(key, str) else [str(part[0]) for part in reference[PARTS_KEY]]


def assemble(reference: Mapping[str, Any], bodies: Mapping[str, str]) -> str | None:
    """A reference's value from its payloads' bodies; None when one is not among them."""
    key = reference.get(REF_KEY)
    if isinstance(key, str):
        return bodies.get(key)
    found = [bodies.get(key) for key in digests(reference)]
    return None if any(body is None for body in found) else "".join(found)  # type: ignore[arg-type]


def bodies_of(conn: Connection, keys: Iterable[str]) -> dict[str, str]:
    """{digest: body} of the payloads stored under these digests, read a few hundred at a time."""
    wanted = sorted(set(keys))
    found: dict[str, str] = {}
    for start in range(0, len(wanted), 500):
        found.update(conn.execute(select(PayloadRow.digest, PayloadRow.body)
                                  .where(PayloadRow.digest.in_(wanted[start:start + 500]))).all())
    return found


def read_payload(conn: Connection, reference: Mapping[str, Any], offset: int = 0, limit: int | None = None) -> str:
    """A stored value, or the page of it from character `offset`, `limit` characters long: only the payloads the page
    falls in are read."""
    if isinstance(reference.get(REF_KEY), str):
        key = reference[REF_KEY]
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
    end = None if limit is None else offset + limit
    wanted, at = [], 0
    for key, chars in reference[PARTS_KEY]:
        if at + chars > offset and (end is None or at < end):
            wanted.append((str(key), at))
        at += int(chars)
    bodies = bodies_of(conn, [key for key, _ in wanted])
    if missing := [key for key, _ in wanted if key not in bodies]:
        raise KeyError(f"no payload {missing[0]}")
    text = "".join(bodies[key] for key, _ in wanted)
    first = wanted[0][1] if wanted else offset
    return text[offset - first:None if end is None else end - first]


def resolve_all(conn: Connection, spans: Mapping[K, Mapping[str, Any]]) -> dict[K, dict[str, Any]]:
    """Spans' attributes (by any key) with every stored-once value back in place, the values read together; a value
    whose payload is gone stays its reference."""
    keys = {key for attributes in spans.values() for v in attributes.values() if is_reference(v) for key in digests(v)}
    if not keys:
        return {key: dict(attributes) for key, attributes in spans.items()}
    bodies = bodies_of(conn, keys)
    return {key: {k: _resolved(v, bodies) if is_reference(v) else v for k, v in attributes.items()}
            for key, attributes in spans.items()}


def _resolved(reference: Mapping[str, Any], bodies: Mapping[str, str]) -> Any:
    value = assemble(reference, bodies)
    return reference if value is None else value


def resolve(conn: Connection, attributes: Mapping[str, Any]) -> dict[str, Any]:
    """A span's attributes with every stored-once value back in place."""
    return resolve_all(conn, {0: attributes})[0]
