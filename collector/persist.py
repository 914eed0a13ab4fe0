"""Turning decoded spans into rows: spans, toolsets, verified tool calls and tool executions, in one transaction.

Writing is two steps so that the store's write lock is held as briefly as possible: `prepare` does everything that
needs no database (extraction, verification, building rows) and `write` does the rest inside the transaction (the
toolset ids, what earlier batches stored, the inserts)."""

from __future__ import annotations

import itertools
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Connection, Dialect, bindparam, select, update

from tracemill.collector import same_call
from tracemill.collector.domains import call_domain
from tracemill.collector.joins import (
    Key,
    awaits_events,
    event_rows,
    lock_traces,
    stored_events,
    stored_spans,
    with_events,
)
from tracemill.collector.logs import LogEvent
from tracemill.collector.normalize import Extracted, ExtractedCall, ExtractedExecution, extract
from tracemill.collector.numbered import NumberedCalls, link_numbered, numbered_keys, stored_sightings
from tracemill.spans import SpanRecord
from tracemill.store.bulk import BulkInsert
from tracemill.store.engine import insert_ignoring_duplicates
from tracemill.store.payloads import CONVERSATIONS, PARTS_MIN_CHARS, PAYLOAD_MIN_CHARS, in_parts, reference
from tracemill.store.queries import trace_spans
from tracemill.store.tables import LogEventRow, PayloadRow, SpanRow, ToolCallRow, ToolExecutionRow, ToolsetRow, utcnow
from tracemill.tools import Tool, tool_index, toolset_hash
from tracemill.verify import verify

_SPANS = SpanRow.__table__
_TOOLSETS = ToolsetRow.__table__
_CALLS = ToolCallRow.__table__
_EXECUTIONS = ToolExecutionRow.__table__
_PAYLOADS = PayloadRow.__table__
_CONVERSATIONS = frozenset(CONVERSATIONS)

_LINK_EXECUTION = (
    update(_CALLS)
    .where(_CALLS.c.trace_id == bindparam("t"), _CALLS.c.tool_call_id == bindparam("c"),
           _CALLS.c.execution_status.is_(None))
    .values(execution_status=bindparam("s"), execution_error=bindparam("e"), execution_result=bindparam("r"),
            execution_span_id=bindparam("x"))
)


class _Bounded(OrderedDict[Any, Any]):
    """A small LRU map for caches that must not grow with traffic."""

    def __init__(self, size: int) -> None:
        super().__init__()
        self.size = size

    def put(self, key: Any, value: Any) -> None:
        self[key] = value
        self.move_to_end(key)
        if len(self) > self.size:
            self.popitem(last=False)


@dataclass(slots=True)
class _Toolset:
    digest: str
    tools: list[Tool]
    index: dict[str, Tool]


@dataclass(slots=True)
class Prepared:
    """A batch's rows, built before its transaction (spans, payloads and executions already as the driver's parameters:
    converting them is most of the Python work of a write); `write` may run more than once on it (a retried
    transaction)."""

    span_params: list[Any]
    payload_params: list[Any]
    payload_digests: list[str]
    execution_params: list[Any]
    calls: list[dict[str, Any]]
    call_toolsets: list[_Toolset | None]  # the toolset of each of `calls`, whose id `write` fills in
    executions: list[dict[str, Any]]
    in_batch: dict[tuple[str, str], list[dict[str, Any]]]  # (trace, tool call id) -> this batch's execution rows
    first_span: dict[tuple[str, str], str]  # (trace, tool call id) -> the first span of this batch showing the call
    # Calls whose trace offered no tools in this batch nor, as far as this writer knows, before: `write` looks for
    # the trace's tools in the store (an earlier request, maybe taken by another ingest process) and verifies again.
    unresolved: list[tuple[int, SpanRecord, Extracted, ExtractedCall]] = field(default_factory=list)
    # Model-call spans with no output of their own: `write` joins them to their stored log events (`collector.joins`).
    awaiting_events: list[SpanRecord] = field(default_factory=list)


class SpanWriter:
    """Prepares and writes batches of spans. Holds caches (toolsets, payloads known to be stored, the tools each recent
    trace was offered): one per writer thread."""

    def __init__(self, dialect: Dialect) -> None:
        self.dialect = dialect.name
        self._insert_spans = BulkInsert(_SPANS, dialect)
        self._insert_calls = BulkInsert(_CALLS, dialect)
        self._insert_executions = BulkInsert(_EXECUTIONS, dialect)
        self._insert_payloads = BulkInsert(_PAYLOADS, dialect)
        self._insert_events = BulkInsert(LogEventRow.__table__, dialect)
        self._payloads: _Bounded = _Bounded(16384)  # digests known to be stored
        self._new_payloads: set[str] = set()
        self._toolsets: _Bounded = _Bounded(4096)  # digest -> _Toolset
        self._toolset_ids: _Bounded = _Bounded(4096)  # digest -> id, once committed
        self._new_toolset_ids: dict[str, int] = {}  # inserted by the open transaction
        self._digests: _Bounded = _Bounded(4096)  # id(tool list) -> (the list, its hash): spans share decoded lists
        self._trace_tools: _Bounded = _Bounded(65536)
        self._recent_calls = same_call.RecentCalls(65536)  # the calls with an id stored last, by content
        self._new_calls: list[tuple[Any, tuple[str, str, int]]] = []

    def prepare(self, spans: list[SpanRecord]) -> Prepared:
        now = utcnow()
        batch = Prepared([], [], [], [], [], [], [], {}, {})
        payload_rows: dict[str, dict[str, Any]] = {}
        extracted: list[tuple[SpanRecord, Extracted]] = []
        span_rows = []
        for span in spans:
            span_rows.append(self._span_row(span, now, payload_rows))
            found = extract(span)
            if found.calls or found.executions or found.offered_tools:
                extracted.append((span, found))
                if found.offered_tools:
                    self._trace_tools.put(span.trace_id, found.offered_tools)
            if not found.calls and awaits_events(span):
                batch.awaiting_events.append(span)
        for span, found in extracted:
            for execution in found.executions:
                row = _execution_row(span, execution)
                batch.executions.append(row)
                if execution.tool_call_id:
                    batch.in_batch.setdefault((span.trace_id, execution.tool_call_id), []).append(row)
        for span, found in extracted:
            for call in found.calls:
                if call.tool_call_id:
                    batch.first_span.setdefault((span.trace_id, call.tool_call_id), span.span_id)
                tools = call.tools if call.tools is not None else self._trace_tools.get(span.trace_id)
                if tools is None:
                    batch.unresolved.append((len(batch.calls), span, found, call))
                row, toolset = self._call_row(span, found, call, tools, now)
                batch.calls.append(row)
                batch.call_toolsets.append(toolset)
        batch.span_params = self._insert_spans.params(span_rows)
        batch.payload_params = self._insert_payloads.params(list(payload_rows.values()))
        batch.payload_digests = list(payload_rows)
        batch.execution_params = self._insert_executions.params(batch.executions)
        return batch

    def write(self, conn: Connection, batch: Prepared) -> None:
        # writers take turns on a trace whose calls or executions they write: each links what the other committed
        lock_traces(conn, self.dialect, itertools.chain((r["trace_id"] for r in batch.calls),
                                                        (r["trace_id"] for r in batch.executions),
                                                        (s.trace_id for s in batch.awaiting_events)))
        rows, toolsets = list(batch.calls), list(batch.call_toolsets)
        looked_up: dict[str, list[Tool] | None] = {}
        for n, span, found, call in batch.unresolved:
            if span.trace_id not in looked_up:
                looked_up[span.trace_id] = self._stored_trace_tools(conn, span.trace_id)
            tools = looked_up[span.trace_id]
            if tools is not None:
                rows[n], toolsets[n] = self._call_row(span, found, call, tools, rows[n]["created_at"])
        first_span = batch.first_span
        if batch.awaiting_events:
            events = stored_events(conn, {(s.trace_id, s.span_id) for s in batch.awaiting_events})
            if events:
                first_span = dict(first_span)
                for span in batch.awaiting_events:
                    if (span.trace_id, span.span_id) in events:
                        self._joined_rows(conn, with_events(span, events[(span.trace_id, span.span_id)]), utcnow(),
                                          rows, toolsets, first_span, looked_up)
        calls, fills, seen_as = self._final_calls(conn, rows, toolsets, first_span)
        linked = _link_executions(conn, calls, batch.in_batch, batch.executions, seen_as)

        self._insert_payloads.execute_params(conn, batch.payload_params)
        self._new_payloads.update(batch.payload_digests)
        self._insert_spans.execute_params(conn, batch.span_params)
        self._insert_calls.execute(conn, calls)
        # An execution whose call is not in this batch may belong to a call stored earlier.
        links = [{"t": r["trace_id"], "c": r["tool_call_id"], "s": same_call.execution_status(r["ok"]),
                  "e": r["error"], "r": r["result"], "x": r["span_id"]}
                 for r in batch.executions if r["tool_call_id"] and not same_call.numbered(r["tool_call_id"])
                 and (r["trace_id"], r["tool_call_id"]) not in linked]
        self._insert_executions.execute_params(conn, batch.execution_params)
        if links:
            conn.execute(_LINK_EXECUTION, links)
        if fills:
            conn.execute(same_call.FILL_STORED, [same_call.fill_params(k, row) for k, row in fills.items()])
        by_content = [r for r in batch.executions if not r["tool_call_id"] and r["tool_name"] and id(r) not in linked]
        if by_content:
            _link_stored_by_content(conn, by_content)
        link_numbered(conn, numbered_keys(calls) | numbered_keys(fills.values()) | numbered_keys(batch.executions))
        self._new_calls = [(r["twin_key"], (r["trace_id"], r["span_id"], r["call_index"]))
                           for r in calls if r["twin_key"] is not None]

    def _one_row_per_call(self, conn: Connection, rows: list[dict[str, Any]], first_span: dict[tuple[str, str], str]
                          ) -> tuple[list[dict[str, Any]], dict[tuple[str, str, int], dict[str, Any]],
                                     dict[int, tuple[str, str]]]:
        """The rows to insert, one per call (`same_call`); the stored rows to fill from the others, by key; and for a
        kept row that another trace showed too, that trace's (trace, call id), where its execution may be. Each row
        gets its `twin_key` (`same_call.recent_key`)."""
        owners = _stored_owners(conn, first_span) if first_span else {}
        numbered = NumberedCalls(stored_sightings(conn, rows))
        recent_calls = self._recent_calls
        # the twins neither this batch nor this writer's recent calls know of, looked for in the store at once
        unknown: set[tuple[Any, ...]] = set()
        call_ids: set[str] = set()
        response_ids: set[str] = set()
        for row in rows:
            row["twin_key"] = content = same_call.recent_key(row)
            if content is not None and content not in recent_calls and content not in unknown:
                unknown.add(content)
                if row["tool_call_id"]:
                    call_ids.add(row["tool_call_id"])
                else:
                    response_ids.add(row["response_id"])
        stored = same_call.stored_twins(conn, call_ids, response_ids) if unknown else {}
        kept: list[dict[str, Any]] = []
        fills: dict[tuple[str, str, int], dict[str, Any]] = {}
        in_trace: dict[tuple[Any, ...], dict[str, Any]] = {}
        by_content: dict[tuple[Any, ...], dict[str, Any]] = {}
        seen_as: dict[int, tuple[str, str]] = {}
        filled: list[dict[str, Any]] = []  # kept rows given another's verdict: their key is their content's now
        for row in rows:
            content = row["twin_key"]
            if not row["tool_call_id"]:
                if content is not None:
                    twin = by_content.get(content)
                    if twin is not None:
                        same_call.fill(twin, row)
                        filled.append(twin)
                        continue
                    recent = recent_calls.get(content) or stored.get(content)
                    if recent is not None:
                        fills[recent] = row
                        continue
                    by_content[content] = row
                kept.append(row)
                continue
            if same_call.numbered(row["tool_call_id"]):  # one call within its trace only, with the same content
                twin, earlier = numbered.sighting(row)
                if twin is not None:
                    same_call.fill(twin, row)
                    filled.append(twin)
                elif earlier is not None:
                    stored_key = (row["trace_id"], earlier.span_id, earlier.call_index)
                    if stored_key in fills:  # a second sighting of it in this request: one fill
                        same_call.fill(fills[stored_key], row)
                    else:
                        fills[stored_key] = row
                else:
                    kept.append(row)
                continue
            key = (row["trace_id"], row["tool_call_id"])
            if key in in_trace:
                same_call.fill(in_trace[key], row)
                filled.append(in_trace[key])
                continue
            owner = owners.get(key)
            if owner is not None and owner[0] != row["span_id"]:
                fills[(row["trace_id"], *owner)] = row
                continue
            twin = by_content.get(content)
            if twin is not None:
                same_call.fill(twin, row)
                filled.append(twin)
                seen_as[id(twin)] = key
                continue
            recent = recent_calls.get(content) or stored.get(content)
            if recent is not None and recent[0] != row["trace_id"]:
                fills[recent] = row
                continue
            in_trace[key] = by_content[content] = row
            kept.append(row)
        for row in filled:
            row["twin_key"] = same_call.recent_key(row)
        return kept, fills, seen_as

    def write_events(self, conn: Connection, events: list[LogEvent]) -> None:
        """Stores GenAI log events and writes the tool_calls rows of the stored spans they complete."""
        if not events:
            return
        now = utcnow()
        keys = {(e.trace_id, e.span_id) for e in events}
        lock_traces(conn, self.dialect, (t for t, _ in keys))
        self._insert_events.execute(conn, event_rows(events, now))
        spans = stored_spans(conn, keys)
        if not spans:
            return
        everything = stored_events(conn, {(s.trace_id, s.span_id) for s in spans})
        rows: list[dict[str, Any]] = []
        toolsets: list[_Toolset | None] = []
        first_span: dict[Key, str] = {}
        looked_up: dict[str, list[Tool] | None] = {}
        for span in spans:
            self._joined_rows(conn, with_events(span, everything[(span.trace_id, span.span_id)]), now, rows, toolsets,
                              first_span, looked_up)
        calls, fills, seen_as = self._final_calls(conn, rows, toolsets, first_span)
        _link_executions(conn, calls, {}, [], seen_as)
        self._insert_calls.execute(conn, calls)
        if fills:
            conn.execute(same_call.FILL_STORED, [same_call.fill_params(k, row) for k, row in fills.items()])
        link_numbered(conn, numbered_keys(calls) | numbered_keys(fills.values()))

    def _joined_rows(self, conn: Connection, span: SpanRecord, now: Any, rows: list[dict[str, Any]],
                     toolsets: list[_Toolset | None], first_span: dict[Key, str],
                     looked_up: dict[str, list[Tool] | None]) -> None:
        """The call rows of a span joined to its events, added to `rows`. `looked_up`: the tools each trace was
        offered, as far as this transaction has looked (most traces of such spans state none: looked up once)."""
        found = extract(span)
        for call in found.calls:
            if call.tool_call_id:
                first_span.setdefault((span.trace_id, call.tool_call_id), span.span_id)
            tools = call.tools
            if tools is None:
                if span.trace_id not in looked_up:
                    looked_up[span.trace_id] = self._stored_trace_tools(conn, span.trace_id)
                tools = looked_up[span.trace_id]
            row, toolset = self._call_row(span, found, call, tools, now)
            rows.append(row)
            toolsets.append(toolset)

    def _final_calls(self, conn: Connection, rows: list[dict[str, Any]], toolsets: list[_Toolset | None],
                     first_span: dict[Key, str]) -> tuple[list[dict[str, Any]], dict[tuple[str, str, int],
                                                                                    dict[str, Any]],
                                                           dict[int, tuple[str, str]]]:
        """The rows with their toolset ids, one per call: see `_one_row_per_call`."""
        calls = [{**row, "toolset_id": self._toolset_id(conn, toolset) if toolset else None}
                 for row, toolset in zip(rows, toolsets, strict=True)]
        return self._one_row_per_call(conn, calls, first_span)

    def _stored_trace_tools(self, conn: Connection, trace_id: str) -> list[Tool] | None:
        """The tools last offered in a trace, from its stored spans."""
        tools = self._trace_tools.get(trace_id)
        if tools is not None:
            return tools
        for span in trace_spans(conn, trace_id):
            tools = extract(span).offered_tools or tools
        if tools is not None:
            self._trace_tools.put(trace_id, tools)
        return tools

    def _call_row(self, span: SpanRecord, found: Extracted, call: ExtractedCall, tools: list[Tool] | None,
                  now: Any) -> tuple[dict[str, Any], _Toolset | None]:
        toolset = self._toolset(tools) if tools is not None else None
        verdict = verify(call.call_input, toolset.index if toolset else None, name=call.name)
        return {
            "trace_id": span.trace_id, "span_id": span.span_id, "call_index": call.index,
            "tool_call_id": call.tool_call_id, "raw": call.raw,
            "name": verdict.call.name if verdict.call else call.name or call.read_name,
            "arguments": verdict.call.arguments if verdict.call else call.read_arguments,
            "toolset_id": None,
            "parsed": verdict.parsed,
            "name_valid": verdict.name_valid if toolset else None,
            "schema_valid": verdict.schema_valid,
            "stage": verdict.stage.value if verdict.stage else None,
            "violations": [v.to_dict() for v in verdict.violations],
            "execution_status": None, "execution_error": None, "execution_result": None, "execution_span_id": None,
            "model": call.model, "harness_version": found.harness_version,
            "domain": call_domain(found.declared_domain, verdict.tool, call.name or call.read_name),
            "repairs_id": None, "start_time_ns": span.start_time_ns, "created_at": now,
            "end_time_ns": span.end_time_ns,  # not a column (the span's): which sightings of a numbered id are one call
            "response_id": call.response_id,
            "service_name": _service(span),
            "moves": False,  # not a column: whether the stored row this one fills takes its place (`same_call.moves`)
        }, toolset

    def _toolset(self, tools: list[Tool]) -> _Toolset:
        known = self._digests.get(id(tools))
        if known is not None and known[0] is tools:
            digest = known[1]
        else:
            digest = toolset_hash(tools)
            self._digests.put(id(tools), (tools, digest))
        toolset = self._toolsets.get(digest)
        if toolset is None:
            toolset = _Toolset(digest, tools, tool_index(tools))
            self._toolsets.put(digest, toolset)
        return toolset

    def _toolset_id(self, conn: Connection, toolset: _Toolset) -> int:
        known = self._toolset_ids.get(toolset.digest) or self._new_toolset_ids.get(toolset.digest)
        if known is None:
            conn.execute(insert_ignoring_duplicates(_TOOLSETS, self.dialect),
                         [{"hash": toolset.digest, "tools": [t.to_mcp() for t in toolset.tools],
                           "tool_count": len(toolset.tools), "created_at": utcnow()}])
            known = conn.execute(select(_TOOLSETS.c.id).where(_TOOLSETS.c.hash == toolset.digest)).scalar_one()
            self._new_toolset_ids[toolset.digest] = known
        return known

    def committed(self) -> None:
        for digest, toolset_id in self._new_toolset_ids.items():
            self._toolset_ids.put(digest, toolset_id)
        for digest in self._new_payloads:
            self._payloads.put(digest, True)
        for content, where in self._new_calls:
            self._recent_calls.put(content, where)
        self._new_toolset_ids.clear()
        self._new_payloads.clear()
        self._new_calls = []

    def rolled_back(self) -> None:
        self._new_toolset_ids.clear()
        self._new_payloads.clear()
        self._new_calls = []

    def _span_row(self, span: SpanRecord, now: Any, payload_rows: dict[str, dict[str, Any]]) -> dict[str, Any]:
        attributes = span.attributes
        large = [k for k, v in attributes.items() if isinstance(v, str) and len(v) >= PAYLOAD_MIN_CHARS]
        if large:
            attributes = dict(attributes)
            for key in large:
                text = attributes[key]
                cut = in_parts(text) if key in _CONVERSATIONS and len(text) >= PARTS_MIN_CHARS else None
                if cut is None:
                    digest, attributes[key] = reference(text)
                    if digest not in self._payloads and digest not in payload_rows:
                        payload_rows[digest] = {"digest": digest, "body": text, "chars": len(text)}
                    continue
                pieces, attributes[key] = cut
                for digest, body in pieces:
                    if digest not in self._payloads and digest not in payload_rows:
                        payload_rows[digest] = {"digest": digest, "body": body, "chars": len(body)}
        return {
            "trace_id": span.trace_id, "span_id": span.span_id, "parent_span_id": span.parent_span_id,
            "name": span.name, "kind": span.kind, "start_time_ns": span.start_time_ns,
            "end_time_ns": span.end_time_ns, "status_code": span.status_code, "status_message": span.status_message,
            "service_name": _service(span), "scope_name": span.scope_name,
            "attributes": attributes, "resource": span.resource, "events": span.events, "links": span.links,
            "received_at": now,
        }


def _link_executions(conn: Connection, calls: list[dict[str, Any]], in_batch: dict[tuple[str, str], dict[str, Any]],
                     executions: list[dict[str, Any]], seen_as: dict[int, tuple[str, str]]) -> set[Any]:
    """Attach to each new call its execution: from this batch, else one stored before the call arrived; by the call
    id, else (an execution that carries none) by the tool's name and arguments within the trace. A numbered id's
    execution is found by `numbered.link_numbered` once the batch is stored. Returns the (trace, tool call id) keys of
    this batch's executions that found their call here, and the `id()` of those found by content."""
    linked: set[Any] = set()
    missing: list[dict[str, Any]] = []
    unnamed: dict[str, list[dict[str, Any]]] = {}
    for execution in executions:
        if not execution["tool_call_id"] and execution["tool_name"]:
            unnamed.setdefault(execution["trace_id"], []).append(execution)
    for row in calls:
        key = (row["trace_id"], row["tool_call_id"])
        by_id = bool(row["tool_call_id"]) and not same_call.numbered(row["tool_call_id"])
        hit = _last(in_batch.get(key)) if by_id else None
        if hit is None and id(row) in seen_as:
            hit = _last(in_batch.get(seen_as[id(row)]))
            if hit is not None:
                linked.add(seen_as[id(row)])
        for trace_id in (row["trace_id"], seen_as[id(row)][0]) if id(row) in seen_as else (row["trace_id"],):
            if hit is None and trace_id in unnamed:
                hit = _same_content(row, unnamed[trace_id], linked)
                if hit is not None:
                    linked.add(id(hit))
        if hit is not None:
            linked.add(key)
            _set_execution(row, hit["span_id"], hit["ok"], hit["error"], hit["result"])
        else:
            missing.append(row)
    if missing:
        stored = conn.execute(
            select(_EXECUTIONS.c.trace_id, _EXECUTIONS.c.tool_call_id, _EXECUTIONS.c.span_id, _EXECUTIONS.c.ok,
                   _EXECUTIONS.c.error, _EXECUTIONS.c.result, _EXECUTIONS.c.tool_name, _EXECUTIONS.c.arguments)
            .where(_EXECUTIONS.c.trace_id.in_({r["trace_id"] for r in missing}))
        ).all()
        by_key = {(s.trace_id, s.tool_call_id): s for s in stored if s.tool_call_id}
        stored_unnamed: dict[str, list[dict[str, Any]]] = {}
        for s in stored:
            if not s.tool_call_id and s.tool_name:
                stored_unnamed.setdefault(s.trace_id, []).append(s._asdict())
        for row in missing:
            key = (row["trace_id"], row["tool_call_id"])
            s = by_key.get(key) if row["tool_call_id"] and not same_call.numbered(row["tool_call_id"]) else None
            if s is not None:
                _set_execution(row, s.span_id, s.ok, s.error, s.result)
            elif row["trace_id"] in stored_unnamed:
                found = _same_content(row, stored_unnamed[row["trace_id"]], linked)
                if found is not None:
                    linked.add(id(found))
                    _set_execution(row, found["span_id"], found["ok"], found["error"], found["result"])
    return linked


def _last(executions: list[dict[str, Any]] | None) -> dict[str, Any] | None:
    return executions[-1] if executions else None


def _same_content(row: dict[str, Any], executions: list[dict[str, Any]], taken: set[Any]) -> dict[str, Any] | None:
    """The first execution not taken yet that ran the row's tool with its arguments."""
    if row["name"] is None or row["arguments"] is None:
        return None
    for execution in executions:
        if (id(execution) not in taken and execution["tool_name"] == row["name"]
                and same_call.same_arguments(execution["arguments"], row["arguments"])):
            return execution
    return None


def _link_stored_by_content(conn: Connection, executions: list[dict[str, Any]]) -> None:
    """Executions without a call id, linked to a stored call of their trace (the first made) with the same tool and
    arguments."""
    stored = conn.execute(
        select(_CALLS.c.id, _CALLS.c.trace_id, _CALLS.c.name, _CALLS.c.arguments)
        .where(_CALLS.c.trace_id.in_({e["trace_id"] for e in executions}), _CALLS.c.execution_status.is_(None),
               _CALLS.c.name.in_({e["tool_name"] for e in executions}))
        .order_by(_CALLS.c.id)
    ).all()
    taken: set[int] = set()
    updates = []
    for execution in executions:
        call = next((c for c in stored if c.id not in taken and c.trace_id == execution["trace_id"]
                     and c.name == execution["tool_name"]
                     and same_call.same_arguments(execution["arguments"], c.arguments)), None)
        if call is not None:
            taken.add(call.id)
            updates.append(same_call.execution_params(call.id, execution))
    if updates:
        conn.execute(same_call.SET_EXECUTION, updates)


def _stored_owners(conn: Connection, first_span: dict[tuple[str, str], str]) -> dict[tuple[str, str], tuple[str, int]]:
    """(trace, tool call id) -> the (span, call index) of the stored row that holds that call."""
    sqlite = conn.dialect.name == "sqlite"
    stored = conn.execute(_STORED_OWNERS[sqlite], same_call.listed_params(sqlite, trace_id={t for t, _ in first_span}))
    return {(r.trace_id, r.tool_call_id): (r.span_id, r.call_index) for r in stored}


_STORED_OWNERS = {
    sqlite: select(_CALLS.c.trace_id, _CALLS.c.tool_call_id, _CALLS.c.span_id, _CALLS.c.call_index)
    .where(same_call.one_of(_CALLS.c.trace_id, sqlite), _CALLS.c.tool_call_id.is_not(None))
    for sqlite in (True, False)
}


def _service(span: SpanRecord) -> str | None:
    service = span.resource.get("service.name")
    return service if isinstance(service, str) else None


def _set_execution(row: dict[str, Any], span_id: str, ok: bool, error: str | None, result: str | None) -> None:
    row.update(execution_status=same_call.execution_status(ok), execution_error=error, execution_result=result,
               execution_span_id=span_id)


def _execution_row(span: SpanRecord, execution: ExtractedExecution) -> dict[str, Any]:
    return {
        "trace_id": span.trace_id, "span_id": span.span_id, "tool_call_id": execution.tool_call_id,
        "tool_name": execution.tool_name, "arguments": execution.arguments, "ok": execution.ok,
        "error": execution.error, "result": execution.result,  # already cut to normalize.RESULT_LIMIT
    }
