"""A model-call span and its GenAI log events (`collector.logs`), joined by trace and span id whichever arrives first.

An instrumentation that sends the model's messages as log events (OpenTelemetry's openai-v2 by default) sends a chat
span with no output on it. Such a span *awaits events*; its events are kept in `log_events`. The writer of the span
looks for its stored events, and the writer of events looks for their stored span; whichever commits second finds
the other and writes the span's tool_calls rows from the span as if its events were on it (`with_events`). The two
writers take turns on a trace (`lock_traces`), so that the second always sees the first's commit; rows are
idempotent, so a span or an event sent again changes nothing.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace
from typing import Any

from sqlalchemy import Connection, select, text

from tracemill.collector.logs import LogEvent
from tracemill.spans import SpanRecord
from tracemill.store.queries import by_span_keys
from tracemill.store.queries import span as stored_span
from tracemill.store.tables import LogEventRow

_MODEL_OPERATIONS = frozenset({"chat", "text_completion", "generate_content"})
_CHOICE = "gen_ai.choice"
# one statement for all of a request's keys, each locked in the order of the keys (PostgreSQL evaluates a volatile
# output expression after the sort)
_LOCK = text("SELECT pg_advisory_xact_lock(hashtextextended(k, 4318)) FROM unnest(CAST(:keys AS text[])) AS k "
             "ORDER BY k")

Key = tuple[str, str]  # (trace id, span id)


def awaits_events(span: SpanRecord) -> bool:
    """A GenAI model-call span without its output: the output may be (or come) in log events. Read only for spans in
    which no call was found."""
    attrs = span.attributes
    return attrs.get("gen_ai.operation.name") in _MODEL_OPERATIONS and "gen_ai.output.messages" not in attrs


def with_events(span: SpanRecord, events: list[LogEvent]) -> SpanRecord:
    """The span as extraction should read it: the `gen_ai.choice` events' messages (in choice order) as its output
    messages, and the `gen_ai.*` attributes its events carry (the latest conventions' one event per call holds
    `gen_ai.output.messages` and `gen_ai.tool.definitions`), wherever the span does not say them itself."""
    added: dict[str, Any] = {}
    choices = sorted(
        (e for e in events if e.event_name == _CHOICE and isinstance(e.body, dict)),
        key=lambda e: (_choice_index(e.body), e.time_ns),
    )
    messages = [e.body["message"] for e in choices if isinstance(e.body.get("message"), dict)]
    if messages:
        added["gen_ai.output.messages"] = [{"role": "assistant", **m} for m in messages]
    for event in sorted(events, key=lambda e: e.time_ns):
        for key, value in event.attributes.items():
            if key.startswith("gen_ai.") and key not in added:
                added[key] = value
    return replace(span, attributes={**added, **span.attributes})


def _choice_index(body: dict[str, Any]) -> int:
    index = body.get("index")
    return index if isinstance(index, int) and not isinstance(index, bool) else 0


def lock_traces(conn: Connection, dialect: str, trace_ids: Iterable[str]) -> None:
    """On PostgreSQL, a transaction lock per trace, taken in one order by every writer. SQLite needs none: its writers
    take turns for the whole store (BEGIN IMMEDIATE). A writer locks its traces once, before any other key
    (`lock_keys`)."""
    lock_keys(conn, dialect, trace_ids)


def lock_keys(conn: Connection, dialect: str, keys: Iterable[str]) -> None:
    """On PostgreSQL, a transaction lock per key, all taken in one statement in the keys' order. Writers take their
    trace locks first and any other keys after, each kind once a transaction: every writer locks in one order, so
    none waits for another that waits for it."""
    if dialect == "postgresql":
        ordered = sorted(set(keys))
        if ordered:
            conn.execute(_LOCK, {"keys": ordered})


def stored_events(conn: Connection, keys: set[Key]) -> dict[Key, list[LogEvent]]:
    """The stored events of these spans, in the order they were stored."""
    found: dict[Key, list[LogEvent]] = {}
    if not keys:
        return found
    statement = select(LogEventRow.trace_id, LogEventRow.span_id, LogEventRow.event_name, LogEventRow.time_ns,
                       LogEventRow.attributes, LogEventRow.body).order_by(LogEventRow.id)
    for row in by_span_keys(conn, statement, sorted(keys), LogEventRow):
        found.setdefault((row.trace_id, row.span_id), []).append(LogEvent(*row))
    return found


def stored_spans(conn: Connection, keys: set[Key]) -> list[SpanRecord]:
    """Those of these spans that are stored and await events, their large values in place."""
    spans = (stored_span(conn, trace_id, span_id) for trace_id, span_id in sorted(keys))
    return [s for s in spans if s is not None and awaits_events(s)]


def event_rows(events: list[LogEvent], now: Any) -> list[dict[str, Any]]:
    return [
        {
            "trace_id": e.trace_id,
            "span_id": e.span_id,
            "digest": e.digest(),
            "event_name": e.event_name,
            "time_ns": e.time_ns,
            "attributes": e.attributes,
            "body": e.body,
            "received_at": now,
        }
        for e in events
    ]
