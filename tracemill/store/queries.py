"""The store's read side: tool calls by filter (streamed in batches), a trace's spans with their payloads back in place,
the tools a call was offered. `tracemill stats`, the miner, the UI and the collector's look-backs read through here;
nothing here writes (`committed_ids` takes a lock, for a moment, to read)."""

from __future__ import annotations

from collections.abc import Collection, Iterable, Iterator, Sequence
from dataclasses import dataclass, fields
from datetime import datetime
from typing import Any, NamedTuple

import orjson
from sqlalchemy import (
    ColumnElement,
    Connection,
    Engine,
    Select,
    String,
    and_,
    bindparam,
    case,
    exists,
    func,
    null,
    or_,
    select,
    text,
)
from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import aliased

from tracemill.spans import SpanRecord
from tracemill.store.payloads import resolve_all
from tracemill.store.tables import LogEventRow, SpanRow, ToolCallRow, ToolExecutionRow, ToolsetRow
from tracemill.tools import Tool, normalize_tools

C = ToolCallRow
E = ToolExecutionRow


class FilterError(ValueError):
    """A filter value the store holds no call for; the message names the filter and the value."""


# the service the reviser sidecar (`tracemill serve`) traces as: its record of the model's answers as sent, and of
# its revisions (as the output of the model `tracemill-reviser:VERSION`)
SIDECAR_SERVICE = "tracemill-serve"


@dataclass(frozen=True, slots=True)
class CallFilter:
    """Which tool calls to read. Unset fields do not filter."""

    since: datetime | None = None  # stored at or after
    until: datetime | None = None  # stored before
    after_id: int | None = None  # tool_calls.id greater than this (what is new since an earlier read)
    up_to_id: int | None = None  # tool_calls.id at most this (`committed_ids`: a read that misses no call)
    # what is new since an earlier read that ended at these ids (`committed_ids`): the calls after `since_call_id`,
    # and the earlier ones, valid as sent, whose execution was stored after `since_execution_id` and failed
    since_call_id: int | None = None
    since_execution_id: int | None = None
    # the executions counted: those stored up to this id (`committed_ids`). A call whose failed execution was stored
    # later reads as not run yet, so that a read of the store is as of one moment even while executions arrive: the
    # next read since it finds the call as `failed_late`, and no two reads both take it as failed
    up_to_execution_id: int | None = None
    model: str | None = None
    harness_version: str | None = None
    domain: str | None = None
    tool: str | None = None
    # the service whose span holds the call: with the reviser sidecar in front of a model, the store holds both the
    # model's answers as sent (the sidecar's service) and what the agent got (the agent's)
    service: str | None = None
    trace_id: str | None = None
    failed: bool | None = None  # True: a verifier stage failed or the execution failed; False: neither
    stage: str | None = None  # a verifier stage (parse, tool_name, schema), `execution` (ran and failed) or `ok`

    def conditions(self) -> list[ColumnElement[bool]]:
        found: list[ColumnElement[bool]] = []
        for value, condition in ((self.since, lambda v: C.created_at >= v), (self.until, lambda v: C.created_at < v),
                                 (self.after_id, lambda v: C.id > v), (self.up_to_id, lambda v: C.id <= v),
                                 (self.model, lambda v: C.model == v),
                                 (self.harness_version, lambda v: C.harness_version == v),
                                 (self.domain, lambda v: C.domain == v), (self.tool, lambda v: C.name == v),
                                 (self.service, lambda v: C.service_name == v),
                                 (self.trace_id, lambda v: C.trace_id == v)):
            if value is not None:
                found.append(condition(value))
        if self.since_call_id is not None:
            found.append(_new_since(self.since_call_id, self.since_execution_id, self.up_to_execution_id))
        status = self.execution_status()
        if self.failed is not None:
            ran_well = or_(status.is_(None), status != "error")  # NULL-safe, unlike NOT
            found.append(or_(C.stage.is_not(None), ~ran_well) if self.failed else and_(C.stage.is_(None), ran_well))
        if self.stage is not None:
            found.append(_stage_condition(self.stage, status))
        return found

    def execution_status(self) -> ColumnElement[Any]:
        """`tool_calls.execution_status` as this read counts it (`up_to_execution_id`)."""
        return _counted(C.execution_status, self.up_to_execution_id)

    def execution_error(self) -> ColumnElement[Any]:
        """`tool_calls.execution_error` as this read counts it."""
        return _counted(C.execution_error, self.up_to_execution_id)

    def apply(self, statement: Select[Any]) -> Select[Any]:
        conditions = self.conditions()
        return statement.where(and_(*conditions)) if conditions else statement

    def to_dict(self) -> dict[str, Any]:
        return {f.name: (v.isoformat() if isinstance(v, datetime) else v)
                for f in fields(self) if (v := getattr(self, f.name)) is not None}


STAGES = ("parse", "tool_name", "schema", "execution", "ok")


def _failed(execution: Any) -> ColumnElement[bool]:
    """A call valid as sent whose execution failed, that execution stored as `execution` (a ToolExecutionRow alias)."""
    return and_(_stage_condition("execution"), execution.trace_id == C.trace_id,
                execution.span_id == C.execution_span_id)


def _stored_between(execution: Any, after_id: int, up_to_id: int | None) -> ColumnElement[bool]:
    later = execution.id > after_id
    return later if up_to_id is None else and_(later, execution.id <= up_to_id)


def _counted(column: ColumnElement[Any], up_to_execution_id: int | None) -> ColumnElement[Any]:
    """An execution column of `tool_calls`, NULL where the call's failed execution was stored after that id."""
    if up_to_execution_id is None:
        return column
    ran = aliased(E)
    later = exists().where(ran.trace_id == C.trace_id, ran.span_id == C.execution_span_id,
                           ran.id > up_to_execution_id).correlate(C)
    return case((and_(C.execution_status == "error", later), null()), else_=column)


def failed_late(since_execution_id: int, up_to_execution_id: int | None = None) -> ColumnElement[bool]:
    """A call valid as sent whose execution, stored after that execution id (and up to the other), failed: a call an
    earlier read took as valid (its execution had not arrived)."""
    ran = aliased(E)
    return exists().where(_failed(ran), _stored_between(ran, since_execution_id, up_to_execution_id)).correlate(C)


def first_failed_late(conn: Connection, f: CallFilter, up_to_id: int, since_execution_id: int) -> int | None:
    """The oldest call `f` selects, up to `up_to_id`, that `failed_late` since that execution (found from the
    executions stored since, not by reading the older calls)."""
    ran = aliased(E)
    statement = f.apply(select(func.min(C.id)).select_from(ran).join(C, _failed(ran)))
    late = _stored_between(ran, since_execution_id, f.up_to_execution_id)
    return conn.execute(statement.where(late, C.id <= up_to_id)).scalar()


def _new_since(since_call_id: int, since_execution_id: int | None,
               up_to_execution_id: int | None) -> ColumnElement[bool]:
    newer = C.id > since_call_id
    return newer if since_execution_id is None else or_(newer, failed_late(since_execution_id, up_to_execution_id))


def _stage_condition(stage: str, status: ColumnElement[Any] = C.execution_status) -> ColumnElement[bool]:
    """`status`: the execution status as the read counts it (`CallFilter.execution_status`)."""
    if stage == "ok":
        return and_(C.stage.is_(None), or_(status.is_(None), status != "error"))
    if stage == "execution":
        return and_(C.stage.is_(None), status == "error")
    if stage not in STAGES:
        raise FilterError(f"no verdict stage {stage!r}; known: {', '.join(STAGES)}")
    return C.stage == stage


_CHECKED = {"model": C.model, "harness_version": C.harness_version, "domain": C.domain, "tool": C.name,
            "service": C.service_name}


def check_filter(conn: Connection, f: CallFilter) -> None:
    """Raise FilterError when a model, harness version, domain, tool or service named in `f` matches no stored call
    (so that a typo is said rather than read as "nothing there")."""
    for name, column in _CHECKED.items():
        value = getattr(f, name)
        if value is not None and conn.execute(select(column).where(column == value).limit(1)).first() is None:
            known = [v for v in conn.execute(select(column).distinct().limit(21)).scalars() if v is not None]
            shown = ", ".join(map(str, sorted(known)[:20])) + (", ..." if len(known) > 20 else "")
            raise FilterError(f"no stored call has {name.replace('_', ' ')} {value!r}; known: {shown or 'none'}")


class StoredCall(NamedTuple):
    """One row of `tool_calls` (see `tracemill.store.tables.ToolCallRow` for what each field holds). A named tuple:
    the miner reads a million of them, and a frozen dataclass's `__init__` cost seven times as much."""

    id: int
    trace_id: str
    span_id: str
    call_index: int
    tool_call_id: str | None
    raw: str
    name: str | None
    arguments: dict[str, Any] | None
    toolset_id: int | None
    parsed: bool
    name_valid: bool | None
    schema_valid: bool | None
    stage: str | None
    violations: list[dict[str, Any]]
    execution_status: str | None
    execution_error: str | None
    execution_result: str | None
    execution_span_id: str | None
    model: str | None
    harness_version: str | None
    domain: str | None
    repairs_id: int | None
    start_time_ns: int
    created_at: datetime

    @property
    def failed(self) -> bool:
        return self.stage is not None or self.execution_status == "error"


_CALL_COLUMNS = tuple(getattr(C, name) for name in StoredCall._fields)


def _call_columns(unread: Collection[str], f: CallFilter) -> tuple[ColumnElement[Any], ...]:
    """The columns of a `StoredCall` as `f` reads them (its execution status, `CallFilter.up_to_execution_id`),
    those named in `unread` as NULL (a tool's result is up to 64 K characters: a reader of a million calls that does
    not need them does not hold them)."""
    if not unread and f.up_to_execution_id is None:
        return _CALL_COLUMNS
    if unknown := set(unread) - set(StoredCall._fields):
        raise ValueError(f"not a field of StoredCall: {', '.join(sorted(unknown))}")
    columns = {name: null().label(name) if name in unread else getattr(C, name) for name in StoredCall._fields}
    if f.up_to_execution_id is not None:
        counted = {"execution_status": f.execution_status(), "execution_error": f.execution_error()}
        columns.update((name, column.label(name)) for name, column in counted.items() if name not in unread)
    return tuple(columns.values())


def calls(conn: Connection, f: CallFilter = CallFilter(), limit: int | None = None,
          unread: Collection[str] = ()) -> list[StoredCall]:
    """The calls `f` selects, oldest first; the fields named in `unread` are left None."""
    statement = f.apply(select(*_call_columns(unread, f))).order_by(C.id)
    if limit is not None:
        statement = statement.limit(limit)
    return [StoredCall(*row) for row in conn.execute(statement).all()]


def iter_calls(engine: Engine, f: CallFilter = CallFilter(), batch: int = 5000) -> Iterator[list[StoredCall]]:
    """The calls `f` selects in batches, oldest first: each batch is read in its own short transaction (keyed on the
    id), so that a long read neither holds memory for the whole store nor keeps a SQLite WAL from being reset."""
    last = f.after_id
    while True:
        with engine.connect() as conn:
            page = calls(conn, CallFilter(**{**_as_kwargs(f), "after_id": last}), batch)
        if not page:
            return
        yield page
        last = page[-1].id


def iter_traces(engine: Engine, f: CallFilter = CallFilter(), batch: int = 5000,
                ends: tuple[int | None, int | None] = (None, None),
                unread: Collection[str] = ()) -> Iterator[list[list[StoredCall]]]:
    """The calls `f` selects, whole traces at a time (each trace's calls in the order they were made), the traces in
    the order their last call was stored. Calls are read in id order, the order the store holds them (on a store
    larger than memory, reads that follow its files instead of jumping about them), in pages of `batch` calls, each
    page its own short transaction; a trace is given once the page holding its last call has been read, about `batch`
    calls at a time. `ends` = (start, stop): only the traces whose last call's id is in [start, stop), so that readers
    can share a store by ranges of ids; a trace's calls stored before `start` are looked up by its id. The fields
    named in `unread` are left None (`calls`)."""
    start, stop = ends
    first_read = _highest(f.after_id, None if start is None else start - 1)  # pages hold ids after this one
    cursor, upper = first_read, _lowest(f.up_to_id, None if stop is None else stop - 1)
    spans: dict[str, tuple[int, int]] = {}  # trace -> its first and last call's ids, for the traces seen and open
    reading: dict[str, list[StoredCall]] = {}  # the calls read so far of the traces this reader gives
    done: list[tuple[int, list[StoredCall]]] = []
    while True:
        with engine.connect() as conn:
            page = calls(conn, CallFilter(**{**_as_kwargs(f), "after_id": cursor, "up_to_id": upper}), batch, unread)
            seen = sorted({c.trace_id for c in page} - spans.keys())
            if seen:
                spans.update(_trace_spans(conn, f, seen))
            mine = [t for t in seen if _ends_in(spans[t][1], start, stop)]
            begun = [t for t in mine if first_read is not None and spans[t][0] <= first_read]
            if begun:  # traces this reader gives that began before its first page
                earlier = f.apply(select(*_call_columns(unread, f))).where(C.trace_id.in_(begun), C.id <= first_read)
                for call in conn.execute(earlier.order_by(C.id)):
                    reading.setdefault(call.trace_id, []).append(StoredCall(*call))
        for t in mine:
            reading.setdefault(t, [])
        for call in page:
            if call.trace_id in reading:
                reading[call.trace_id].append(call)
        last_page = len(page) < batch
        if page:
            cursor = page[-1].id
        for t in [t for t in reading if last_page or spans[t][1] <= cursor]:
            done.append((spans.pop(t)[1], reading.pop(t)))
        if done and (last_page or sum(len(c) for _, c in done) >= batch):
            done.sort(key=lambda item: item[0])
            yield [sorted(c, key=_made) for _, c in done]
            done = []
        if last_page:
            return


def _made(c: StoredCall) -> tuple[int, int, int]:
    return c.start_time_ns, c.call_index, c.id


def _highest(a: int | None, b: int | None) -> int | None:
    return b if a is None else a if b is None else max(a, b)


def _lowest(a: int | None, b: int | None) -> int | None:
    return b if a is None else a if b is None else min(a, b)


def _ends_in(last: int, start: int | None, stop: int | None) -> bool:
    return (start is None or last >= start) and (stop is None or last < stop)


def _trace_spans(conn: Connection, f: CallFilter, traces: Sequence[str]) -> dict[str, tuple[int, int]]:
    """The first and last id of the calls `f` selects in each of these traces."""
    statement = f.apply(select(C.trace_id, func.min(C.id), func.max(C.id))).where(C.trace_id.in_(traces))
    return {trace: (first, last) for trace, first, last in conn.execute(statement.group_by(C.trace_id)).all()}


def trace_starts(engine: Engine, traces: Sequence[str], up_to_id: int | None = None) -> dict[str, int]:
    """When each of these traces began: the start (ns) of its first call among all it has stored (up to `up_to_id`),
    not only those a filter selects or a `--since last` read."""
    if not traces:
        return {}
    statement = select(C.trace_id, func.min(C.start_time_ns)).where(C.trace_id.in_(traces))
    if up_to_id is not None:
        statement = statement.where(C.id <= up_to_id)
    with engine.connect() as conn:
        return {trace: began for trace, began in conn.execute(statement.group_by(C.trace_id)).all()}


def _as_kwargs(f: CallFilter) -> dict[str, Any]:
    return {field.name: getattr(f, field.name) for field in fields(f)}


class StoreBusyError(RuntimeError):
    """The store's writes in progress did not finish in time for a consistent read; the message says so."""


class Committed(NamedTuple):
    """The newest ids such that every row up to them is committed (None: no row yet)."""

    call_id: int | None
    execution_id: int | None


def committed_ids(engine: Engine, wait_seconds: float = 30.0) -> Committed:
    """The newest tool_calls.id such that every call with an id up to it is committed: a read of `id <= it` now, and
    of `id > it` later, together miss no call; and the newest tool_executions.id then, past which a later read finds
    the executions linked to calls since (`CallFilter.since_execution_id`).

    On SQLite writes take turns, so ids follow commit order and the newest id is the answer. On PostgreSQL ids are
    drawn when a row is inserted, before its transaction commits: a read can see id 101 while 100 is still to come. A
    SHARE lock on both tables waits for the inserts in progress (INSERT's ROW EXCLUSIVE lock conflicts with it) and
    holds new ones back for the moment the newest ids are read; every insert after it draws a higher id."""
    with engine.begin() as conn:
        if conn.dialect.name == "postgresql":
            conn.execute(text(f"SET LOCAL lock_timeout = '{int(wait_seconds * 1000)}ms'"))
            try:
                conn.execute(text(f"LOCK TABLE {C.__tablename__}, {E.__tablename__} IN SHARE MODE"))
            except OperationalError as exc:
                raise StoreBusyError(f"the store's writes to {C.__tablename__} and {E.__tablename__} did not finish "
                                     f"within {wait_seconds:g} s (a transaction holds them open); try again") from exc
        calls, executions = conn.execute(select(select(func.max(C.id)).scalar_subquery(),
                                                select(func.max(E.id)).scalar_subquery())).one()
    return Committed(calls, executions)


def count_calls(conn: Connection, f: CallFilter = CallFilter()) -> int:
    return int(conn.execute(f.apply(select(func.count()).select_from(C))).scalar_one())


def call(conn: Connection, call_id: int) -> StoredCall | None:
    row = conn.execute(select(*_CALL_COLUMNS).where(C.id == call_id)).first()
    return StoredCall(*row) if row is not None else None


def toolsets(conn: Connection, ids: Iterable[int]) -> dict[int, list[Tool]]:
    """The tool lists with these ids, as Tools."""
    wanted = set(ids)
    if not wanted:
        return {}
    rows = conn.execute(select(ToolsetRow.id, ToolsetRow.tools).where(ToolsetRow.id.in_(wanted)))
    return {row.id: normalize_tools(row.tools) for row in rows}


def _spans(conn: Connection, rows: Sequence[Any], resolved: bool) -> list[SpanRecord]:
    """The rows as spans; with `resolved`, their stored-once values read back in one query."""
    attributes = {n: row.attributes if isinstance(row.attributes, dict) else {} for n, row in enumerate(rows)}
    attributes = resolve_all(conn, attributes) if resolved else {n: dict(a) for n, a in attributes.items()}
    return [SpanRecord(
        trace_id=row.trace_id, span_id=row.span_id, parent_span_id=row.parent_span_id, name=row.name, kind=row.kind,
        start_time_ns=row.start_time_ns, end_time_ns=row.end_time_ns, status_code=row.status_code,
        status_message=row.status_message, attributes=attributes[n], resource=row.resource or {},
        scope_name=row.scope_name, events=row.events or [], links=row.links or []) for n, row in enumerate(rows)]


_SPAN_COLUMNS = (SpanRow.trace_id, SpanRow.span_id, SpanRow.parent_span_id, SpanRow.name, SpanRow.kind,
                 SpanRow.start_time_ns, SpanRow.end_time_ns, SpanRow.status_code, SpanRow.status_message,
                 SpanRow.attributes, SpanRow.resource, SpanRow.scope_name, SpanRow.events, SpanRow.links)


def trace_spans(conn: Connection, trace_id: str, resolved: bool = True, offset: int = 0,
                limit: int | None = None) -> list[SpanRecord]:
    """A trace's spans in start order, or `limit` of them from `offset`. With `resolved`, large values stored once
    (`payloads`) are back in place; a reader of huge traces asks for `resolved=False` and pages through
    `payloads.read_payload` instead. A page is chosen by the spans' ids and start times alone: only its own spans'
    attributes are read."""
    ordered = (SpanRow.start_time_ns, SpanRow.id)
    within = SpanRow.trace_id == trace_id
    if limit is not None or offset:
        within = SpanRow.id.in_(select(SpanRow.id).where(within).order_by(*ordered).offset(offset).limit(limit))
    rows = conn.execute(select(*_SPAN_COLUMNS).where(within).order_by(*ordered))
    return _spans(conn, rows.all(), resolved)


def span_count(conn: Connection, trace_id: str) -> int:
    return int(conn.execute(select(func.count()).where(SpanRow.trace_id == trace_id)).scalar_one())


def by_span_keys(conn: Connection, statement: Select[Any], keys: Sequence[tuple[str, str]],
                 table: type[SpanRow | LogEventRow] = SpanRow) -> list[Any]:
    """The rows of `statement` over the spans (or their log events: `table`) with these (trace id, span id) keys,
    looked up in the (trace_id, span_id) index: on SQLite joined to the keys bound as one JSON array (one statement
    whatever the keys, so that it is compiled once; given two IN lists SQLite tries every pair of them), on
    PostgreSQL with two IN lists (faster there than a join), the pairs not asked for left out."""
    if conn.dialect.name == "sqlite":
        pairs = func.json_each(bindparam("keys", type_=String)).table_valued("value")
        wanted = select(func.json_extract(pairs.c.value, "$[0]").label("trace_id"),
                        func.json_extract(pairs.c.value, "$[1]").label("span_id")).subquery("wanted")
        joined = statement.select_from(wanted).join(table, and_(table.trace_id == wanted.c.trace_id,
                                                                 table.span_id == wanted.c.span_id))
        return conn.execute(joined, {"keys": orjson.dumps(list(keys)).decode()}).all()
    asked = set(keys)
    rows = conn.execute(statement.where(table.trace_id.in_({t for t, _ in keys}),
                                        table.span_id.in_({s for _, s in keys}))).all()
    return [r for r in rows if (r.trace_id, r.span_id) in asked]


def span(conn: Connection, trace_id: str, span_id: str, resolved: bool = True) -> SpanRecord | None:
    row = conn.execute(select(*_SPAN_COLUMNS).where(SpanRow.trace_id == trace_id, SpanRow.span_id == span_id)).first()
    return _spans(conn, [row], resolved)[0] if row is not None else None


def trace_calls(conn: Connection, trace_ids: Sequence[str]) -> dict[str, list[StoredCall]]:
    """The calls of these traces, each trace's in the order they were made."""
    found: dict[str, list[StoredCall]] = {t: [] for t in trace_ids}
    if not found:
        return found
    rows = conn.execute(select(*_CALL_COLUMNS).where(C.trace_id.in_(set(trace_ids)))
                        .order_by(C.trace_id, C.start_time_ns, C.call_index, C.id))
    for row in rows:
        found[row.trace_id].append(StoredCall(*row))
    return found
