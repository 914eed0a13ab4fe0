"""The trace explorer's reads: traces newest first, by filter, in pages that each read a bounded stretch of the store
(so that a page costs the same on a store of a million spans as on a small one), their summaries, and the values the
filters can take."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import ColumnElement, Connection, func, or_, select

from tracemill.store.queries import CallFilter
from tracemill.store.tables import SpanRow, ToolCallRow

C = ToolCallRow


@dataclass(frozen=True, slots=True)
class TraceFilter:
    """Which traces to list. `calls` selects traces by their tool calls (model, harness, tool, domain, stage, dates of
    the calls); `since`/`until` are when spans were received; `text` is a trace id, or words in a call's raw output or
    tool name."""

    calls: CallFilter = CallFilter()
    service: str | None = None
    since: datetime | None = None
    until: datetime | None = None
    text: str | None = None

    def by_calls(self) -> bool:
        return bool(self.calls.conditions()) or bool(self.text)


@dataclass(frozen=True, slots=True)
class TraceSummary:
    trace_id: str
    root: str | None  # the root span's name; None while the root has not arrived
    service: str | None
    start_time_ns: int
    end_time_ns: int
    spans: int
    calls: int
    failed_calls: int
    models: tuple[str, ...]
    domains: tuple[str, ...]
    received_at: datetime


@dataclass(frozen=True, slots=True)
class TracePage:
    """One page of traces; `before` continues the listing with older ones (None: nothing older). `searched_to` is the
    oldest receive time the page read back to, which a page that found fewer than asked for reports."""

    traces: list[TraceSummary]
    before: int | None
    searched_to: datetime | None


_HEX32 = re.compile(r"[0-9a-f]{32}")


def _text_condition(text: str) -> ColumnElement[bool]:
    needle = "%" + text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"
    return or_(C.raw.like(needle, escape="\\"), C.name.like(needle, escape="\\"))


def traces(conn: Connection, f: TraceFilter = TraceFilter(), before: int | None = None, limit: int = 50,
           window: int = 50_000, windows: int = 8) -> TracePage:
    """Traces newest first. Reads at most `windows` stretches of `window` ids (of `spans`, or of `tool_calls` when
    the filter is on calls), so that a page costs the same on a store of any size; `before` from the page returned
    goes on from where it stopped."""
    text = (f.text or "").strip()
    if _HEX32.fullmatch(text.lower()):
        found = trace_summaries(conn, [text.lower()])
        return TracePage(found, None, None)
    if f.by_calls():
        return _traces_by_calls(conn, f, text, before, limit, window, windows)
    return _traces_by_roots(conn, f, before, limit, window, windows)


def _top(conn: Connection, column: Any) -> int:
    return int(conn.execute(select(func.max(column))).scalar() or 0) + 1


def _received_at(conn: Connection, below: int) -> datetime | None:
    return conn.execute(select(SpanRow.received_at).where(SpanRow.id < below)
                        .order_by(SpanRow.id.desc()).limit(1)).scalar()


def _traces_by_roots(conn: Connection, f: TraceFilter, before: int | None, limit: int, window: int,
                     windows: int) -> TracePage:
    top = before if before is not None else _top(conn, SpanRow.id)
    conditions = [SpanRow.parent_span_id.is_(None)]
    if f.service is not None:
        conditions.append(SpanRow.service_name == f.service)
    if f.since is not None:
        conditions.append(SpanRow.received_at >= f.since)
    if f.until is not None:
        conditions.append(SpanRow.received_at < f.until)
    found: list[tuple[str, int]] = []
    low = top
    for _ in range(windows):
        if low <= 1 or len(found) >= limit:
            break
        high, low = low, max(low - window, 1)
        rows = conn.execute(select(SpanRow.trace_id, SpanRow.id)
                            .where(SpanRow.id >= low, SpanRow.id < high, *conditions)
                            .order_by(SpanRow.id.desc()).limit(limit - len(found))).all()
        found.extend((r.trace_id, r.id) for r in rows)
        if len(found) >= limit:
            low = found[-1][1]
        elif f.since is not None and (_received_at(conn, low + 1) or f.since) < f.since:
            low = 1
    return TracePage(trace_summaries(conn, [t for t, _ in found]), low if low > 1 else None,
                     _received_at(conn, low + 1) if len(found) < limit else None)


def _traces_by_calls(conn: Connection, f: TraceFilter, text: str, before: int | None, limit: int, window: int,
                     windows: int) -> TracePage:
    top = before if before is not None else _top(conn, C.id)
    conditions = f.calls.conditions()
    if text:
        conditions.append(_text_condition(text))
    if f.since is not None:
        conditions.append(C.created_at >= f.since)
    if f.until is not None:
        conditions.append(C.created_at < f.until)
    listed: dict[str, int] = {}
    low = top
    for _ in range(windows):
        if low <= 1 or len(listed) >= limit:
            break
        high, low = low, max(low - window, 1)
        rows = conn.execute(select(C.trace_id, C.id).where(C.id >= low, C.id < high, *conditions)
                            .order_by(C.id.desc())).all()
        fresh: dict[str, int] = {}
        for row in rows:
            if row.trace_id not in listed and row.trace_id not in fresh:
                fresh[row.trace_id] = row.id
        # A trace belongs to the page of its newest matching call: one that also matched above `top` was listed.
        if fresh and before is not None:
            seen = set(conn.execute(select(C.trace_id).where(C.trace_id.in_(list(fresh)), C.id >= top, *conditions)
                                    .distinct()).scalars())
            fresh = {t: i for t, i in fresh.items() if t not in seen}
        if fresh and f.service is not None:
            keep = set(conn.execute(select(SpanRow.trace_id).where(SpanRow.trace_id.in_(list(fresh)),
                                                                   SpanRow.service_name == f.service)
                                    .distinct()).scalars())
            fresh = {t: i for t, i in fresh.items() if t in keep}
        for trace_id, call_id in fresh.items():
            if len(listed) >= limit:
                low = call_id + 1
                break
            listed[trace_id] = call_id
    oldest = None
    if len(listed) < limit and low > 1:
        oldest = conn.execute(select(C.created_at).where(C.id < low).order_by(C.id.desc()).limit(1)).scalar()
    return TracePage(trace_summaries(conn, list(listed)), low if low > 1 else None, oldest)


def trace_summaries(conn: Connection, trace_ids: Sequence[str]) -> list[TraceSummary]:
    """What a trace list shows of each of these traces, in the order given (traces the store lacks are left out)."""
    if not trace_ids:
        return []
    wanted = list(dict.fromkeys(trace_ids))
    spans = {r.trace_id: r for r in conn.execute(
        select(SpanRow.trace_id, func.count().label("n"), func.min(SpanRow.start_time_ns).label("start"),
               func.max(SpanRow.end_time_ns).label("end"), func.max(SpanRow.received_at).label("received"))
        .where(SpanRow.trace_id.in_(wanted)).group_by(SpanRow.trace_id))}
    roots = {r.trace_id: r for r in conn.execute(
        select(SpanRow.trace_id, SpanRow.name, SpanRow.service_name)
        .where(SpanRow.trace_id.in_(wanted), SpanRow.parent_span_id.is_(None)))}
    by_trace: dict[str, list[Any]] = {t: [] for t in wanted}
    for row in conn.execute(select(C.trace_id, C.model, C.domain, C.stage, C.execution_status)
                            .where(C.trace_id.in_(wanted))):
        by_trace[row.trace_id].append(row)
    found = []
    for trace_id in wanted:
        span_row = spans.get(trace_id)
        if span_row is None:
            continue
        root = roots.get(trace_id)
        rows = by_trace[trace_id]
        found.append(TraceSummary(
            trace_id=trace_id, root=root.name if root else None, service=root.service_name if root else None,
            start_time_ns=int(span_row.start), end_time_ns=int(span_row.end), spans=int(span_row.n), calls=len(rows),
            failed_calls=sum(1 for r in rows if r.stage is not None or r.execution_status == "error"),
            models=tuple(sorted({r.model for r in rows if r.model})),
            domains=tuple(sorted({r.domain for r in rows if r.domain})), received_at=span_row.received))
    return found


@dataclass(frozen=True, slots=True)
class Facets:
    """The values a filter can take, with how many calls have each."""

    models: dict[str, int]
    harness_versions: dict[str, int]
    domains: dict[str, int]
    tools: dict[str, int]
    services: tuple[str, ...]  # of the traces received most recently
    counted_to: int = 0  # the newest tool_calls id counted


def facets(conn: Connection, recent_spans: int = 100_000, known: Facets | None = None,
           window: int = 100_000) -> Facets:
    """Filter values: every model, harness version, domain and tool of the stored calls, and the services of the
    traces among the newest `recent_spans` spans. With `known` (an earlier answer) only the calls stored since are
    read; the calls are read in windows of ids, one GROUP BY each."""
    counts = [dict(d) for d in (known.models, known.harness_versions, known.domains, known.tools)] if known else \
        [{}, {}, {}, {}]
    low = known.counted_to if known else 0
    top = _top(conn, C.id) - 1
    while low < top:
        high = min(low + window, top)
        # The most varied column first: SQLite sorts the rows of a GROUP BY, and then compares fewer columns.
        rows = conn.execute(select(C.model, C.harness_version, C.domain, C.name, func.count())
                            .where(C.id > low, C.id <= high).group_by(C.name, C.model, C.harness_version, C.domain))
        for *values, n in rows:
            for found, value in zip(counts, values, strict=True):
                if value is not None:
                    found[value] = found.get(value, 0) + int(n)
        low = high
    spans_top = _top(conn, SpanRow.id)
    services = conn.execute(select(SpanRow.service_name).where(SpanRow.id >= spans_top - recent_spans,
                                                               SpanRow.parent_span_id.is_(None),
                                                               SpanRow.service_name.is_not(None)).distinct())
    return Facets(*counts, tuple(sorted(services.scalars())), max(low, known.counted_to if known else 0))
