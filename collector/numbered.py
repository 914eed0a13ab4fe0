"""Calls whose ids the model server numbers (`same_call.numbered`: TGI's `0`, `call_0`): one such id stands for every
turn's call in a trace, so the id alone tells neither which sightings are one call nor which call an execution ran.

Sightings (`NumberedCalls`): two rows with one numbered id and the same content are one call when their spans overlap
in time (a chain span around the model call that made it, a second instrumentation of that call); the same call sent
again in a later turn, after its tool failed, is a call of its own. A row first seen on a span around the whole run (a
LangGraph chain whose output repeats every turn) takes the place of the model call's span inside it when that arrives
(`same_call.moves`), so that the retry's model call finds the row of its own turn, not the one the first turn filled.

Executions (`link_numbered`): an execute_tool span seldom says its arguments (they are opt-in in the GenAI
conventions), but an agent's loop tells: a call, its execution, the next call. An execution ran the call made last
before it started, of the calls with its id whose tool and arguments it fits (`same_call.ran`); executions that say
their arguments are placed first, and of calls made at the same moment the first stored. A call refused before it ran
and retried under the same id keeps no execution, and a second record of an execution (a client's span and a
server's) takes no older call. The links of every (trace, id) a batch touches are worked out again from all that is
stored of it, so that the store holds the same links in whatever order the spans arrive.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, NamedTuple

from sqlalchemy import Connection, and_, select

from tracemill.collector import same_call
from tracemill.store.tables import SpanRow, ToolCallRow, ToolExecutionRow

_SPANS = SpanRow.__table__
_CALLS = ToolCallRow.__table__
_EXECUTIONS = ToolExecutionRow.__table__

Key = tuple[str, str]  # (trace id, tool call id)


def numbered_keys(rows: Iterable[dict[str, Any]]) -> set[Key]:
    """The (trace, numbered call id) of these call or execution rows."""
    return {(r["trace_id"], r["tool_call_id"]) for r in rows if r["tool_call_id"] and same_call.numbered(
        r["tool_call_id"])}


def link_numbered(conn: Connection, keys: set[Key]) -> None:
    """Link the stored calls with these keys to the stored executions with the same keys, as the module says; a call
    linked otherwise (to an execution that carried no id) is left as it is."""
    if not keys:
        return
    sqlite = conn.dialect.name == "sqlite"
    params = same_call.listed_params(sqlite, trace_id={t for t, _ in keys}, tool_call_id={c for _, c in keys})
    calls: dict[Key, list[Any]] = {}
    for call in conn.execute(_CALLS_OF[sqlite], params):
        calls.setdefault((call.trace_id, call.tool_call_id), []).append(call)
    executions: dict[Key, list[dict[str, Any]]] = {}
    for execution in conn.execute(_EXECUTIONS_OF[sqlite], params):
        executions.setdefault((execution.trace_id, execution.tool_call_id), []).append(execution._asdict())
    changes = []
    for key in keys & calls.keys():
        ran = executions.get(key, [])
        theirs = {e["span_id"] for e in ran}
        free = [c for c in calls[key] if c.execution_span_id is None or c.execution_span_id in theirs]
        linked = _assign(free, ran)
        for call in free:
            execution = linked.get(call.id)
            if (execution["span_id"] if execution is not None else None) != call.execution_span_id:
                changes.append(same_call.execution_params(call.id, execution))
    if changes:
        conn.execute(same_call.SET_EXECUTION, changes)


def _assign(calls: Sequence[Any], executions: Sequence[dict[str, Any]]) -> dict[int, dict[str, Any]]:
    """Call id -> the execution that ran it (`calls` in the order stored)."""
    linked: dict[int, dict[str, Any]] = {}
    for execution in sorted(executions, key=_placed):
        fitting = [c for c in calls if same_call.ran(execution, c.name, c.arguments)] if len(calls) > 1 \
            else list(calls)  # the id used once in the trace: its call, whatever the execution records of it
        call = _made_last_before(execution, fitting, linked)
        if call is not None:
            linked[call.id] = execution
    return linked


def _placed(execution: dict[str, Any]) -> tuple[Any, ...]:
    """The order executions choose their calls in: those that say their arguments first, then by when they ran."""
    started = execution["start_time_ns"]
    return execution["arguments"] is None, started is None, started or 0, execution["span_id"]


def _made_last_before(execution: dict[str, Any], fitting: Sequence[Any], linked: dict[int, Any]) -> Any | None:
    started = execution["start_time_ns"]
    before = [c for c in fitting if started is not None and c.start_time_ns <= started]
    if not before:  # no call made before it: clocks that disagree (the tool's host behind the agent's)
        return next((c for c in fitting if c.id not in linked), None)
    last = max(c.start_time_ns for c in before)
    return next((c for c in before if c.start_time_ns == last and c.id not in linked), None)


_CALLS_OF = {
    sqlite: select(_CALLS.c.id, _CALLS.c.trace_id, _CALLS.c.tool_call_id, _CALLS.c.name, _CALLS.c.arguments,
                   _CALLS.c.start_time_ns, _CALLS.c.execution_span_id)
    .where(same_call.one_of(_CALLS.c.trace_id, sqlite), same_call.one_of(_CALLS.c.tool_call_id, sqlite))
    .order_by(_CALLS.c.id)
    for sqlite in (True, False)
}
_EXECUTIONS_OF = {
    sqlite: select(_EXECUTIONS.c.trace_id, _EXECUTIONS.c.tool_call_id, _EXECUTIONS.c.span_id,
                   _EXECUTIONS.c.tool_name, _EXECUTIONS.c.arguments, _EXECUTIONS.c.ok, _EXECUTIONS.c.error,
                   _EXECUTIONS.c.result, _SPANS.c.start_time_ns)
    .outerjoin(_SPANS, and_(_SPANS.c.trace_id == _EXECUTIONS.c.trace_id, _SPANS.c.span_id == _EXECUTIONS.c.span_id))
    .where(same_call.one_of(_EXECUTIONS.c.trace_id, sqlite), same_call.one_of(_EXECUTIONS.c.tool_call_id, sqlite))
    for sqlite in (True, False)
}


class _Sighting(NamedTuple):
    """A stored row of a numbered call id (found by its span and index), with its span's times (or, once a row of
    this request moves it, that row's)."""

    span_id: str
    call_index: int
    start_time_ns: int
    end_time_ns: int


def stored_sightings(conn: Connection, rows: list[dict[str, Any]]) -> dict[tuple[Any, ...], list[_Sighting]]:
    """`same_call.numbered_key` -> the stored rows with that key, for the numbered ids of these rows."""
    numbered = numbered_keys(rows)
    if not numbered:
        return {}
    sqlite = conn.dialect.name == "sqlite"
    stored = conn.execute(_SIGHTINGS[sqlite], same_call.listed_params(
        sqlite, trace_id={t for t, _ in numbered}, tool_call_id={c for _, c in numbered}))
    found: dict[tuple[Any, ...], list[_Sighting]] = {}
    for r in stored:
        found.setdefault(same_call.numbered_key(r._mapping), []).append(
            _Sighting(r.span_id, r.call_index, r.start_time_ns, r.end_time_ns))
    return found


_SIGHTINGS = {
    sqlite: select(_CALLS.c.trace_id, _CALLS.c.tool_call_id, _CALLS.c.name, _CALLS.c.arguments, _CALLS.c.raw,
                   _CALLS.c.span_id, _CALLS.c.call_index, _SPANS.c.start_time_ns, _SPANS.c.end_time_ns)
    .join(_SPANS, and_(_SPANS.c.trace_id == _CALLS.c.trace_id, _SPANS.c.span_id == _CALLS.c.span_id))
    .where(same_call.one_of(_CALLS.c.trace_id, sqlite), same_call.one_of(_CALLS.c.tool_call_id, sqlite))
    .order_by(_CALLS.c.id)
    for sqlite in (True, False)
}


class NumberedCalls:
    """The calls of numbered ids a request's rows are sightings of. Two sightings with one numbered id and the same
    content are one call when their spans overlap in time (a chain span around the model call that made it, a second
    instrumentation of that call); the same call sent again in a later turn, after its tool failed, is a call of its
    own. A span's sightings are each another call: of several calls it shows with one content, each takes its own."""

    def __init__(self, stored: dict[tuple[Any, ...], list[_Sighting]]) -> None:
        self.stored = stored
        self.kept: dict[tuple[Any, ...], list[dict[str, Any]]] = {}  # this request's rows with each key, kept
        self.taken: set[tuple[str, int]] = set()  # (span of a sighting, id of the call it was taken as)

    def sighting(self, row: dict[str, Any]) -> tuple[dict[str, Any] | None, _Sighting | None]:
        """The kept row of this request, else the stored row, that `row` is a sighting of; (None, None) for a call not
        seen before, which is kept. A stored row that `row` moves to its span (`same_call.moves`) is said so
        (`row["moves"]`), and is compared with the later rows of this request at its new time."""
        key = same_call.numbered_key(row)
        for kept in self.kept.get(key, ()):
            if self._takes(row, kept, kept["start_time_ns"], kept["end_time_ns"]):
                return kept, None
        stored = self.stored.get(key, [])
        if all(s.span_id != row["span_id"] for s in stored):  # else the span sent again: its own row
            for n, sighting in enumerate(stored):
                if self._takes(row, sighting, sighting.start_time_ns, sighting.end_time_ns):
                    if same_call.moves(sighting.start_time_ns, sighting.end_time_ns, row):
                        row["moves"] = True
                        stored[n] = sighting._replace(start_time_ns=row["start_time_ns"],
                                                      end_time_ns=row["end_time_ns"])
                        self.taken.add((row["span_id"], id(stored[n])))
                    return None, sighting
        self.kept.setdefault(key, []).append(row)
        self.taken.add((row["span_id"], id(row)))
        return None, None

    def _takes(self, row: dict[str, Any], call: Any, start: int, end: int) -> bool:
        overlap = start <= row["end_time_ns"] and row["start_time_ns"] <= end
        if not overlap or (row["span_id"], id(call)) in self.taken:
            return False
        self.taken.add((row["span_id"], id(call)))
        return True
