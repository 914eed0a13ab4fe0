"""One tool call seen through several spans is one row: a chain span repeating its chat model's calls (LangSmith,
OpenInference), or two instrumentations of one request (OpenInference's LangChain and OpenAI instrumentations, whose
OpenAI spans start traces of their own). The row kept is the first one stored, filled in with what the others know
and it does not: the model, the tools offered (and so the verdict against them), the harness version, the execution.

Within a trace an id long enough to be drawn at random (`UNIQUE_ID_CHARS`: OpenAI's, vLLM's, Anthropic's, Mistral's
9 characters) is one call. Servers that number their calls (`0`, `call_0`: `numbered`) repeat ids across requests,
and so across the turns of one conversation: within a trace such an id is one call only with the same content (name
and arguments), and an execution goes to the call of its id, or where several share it, to the one whose tool and
arguments it ran. Across traces an id is one call only when its content is the same too, and only a drawn id counts.
Those twins are found in the same request, among the calls this writer stored recently (`RecentCalls`), and for the
rest in the store, whichever ingest process wrote them (`stored_twins`: one indexed query a batch).

A call the model wrote as text has no id: it is one call where the response that holds it is one (its id drawn at
random, `UNIQUE_RESPONSE_ID_CHARS`) and it is the same text at the same place in that response (`response_key`).

Executions that carry no call id (OpenLLMetry's and Langfuse's tool spans) are matched to a call of their trace that
names the same tool with the same arguments (`same_arguments`)."""

from __future__ import annotations

import itertools
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from typing import Any

import orjson
from sqlalchemy import ARRAY, Boolean, Connection, Text, and_, any_, bindparam, case, func, or_, select, update

from tracemill.collector.joins import lock_keys
from tracemill.store.engine import json_text
from tracemill.store.tables import ToolCallRow

_CALLS = ToolCallRow.__table__
VERDICT = ("toolset_id", "name", "arguments", "parsed", "name_valid", "schema_valid", "stage", "violations", "domain")
EXECUTION = ("execution_status", "execution_error", "execution_result", "execution_span_id")
PLACE = ("span_id", "call_index", "start_time_ns")  # where a call was made, as its row says


UNIQUE_ID_CHARS = 9
# Response ids are longer: `chatcmpl-` and at least 11 drawn characters (OpenAI's, vLLM's, llama.cpp's); Ollama's
# `chatcmpl-` and a number under 1000 repeats.
UNIQUE_RESPONSE_ID_CHARS = 20


def numbered(call_id: str) -> bool:
    """An id too short to be drawn at random: one a server numbering its calls gives again."""
    return len(call_id) < UNIQUE_ID_CHARS


def body(row: Mapping[str, Any]) -> bytes:
    """A call's arguments (keys sorted), or what the model wrote where they could not be read."""
    arguments = row["arguments"]
    return json_text(arguments, sort_keys=True).encode() if arguments is not None else row["raw"].encode()


def numbered_key(row: Mapping[str, Any]) -> tuple[str, str, str | None, bytes]:
    """What makes two rows with one numbered id in a trace the same call: the same content too."""
    return row["trace_id"], row["tool_call_id"], row["name"], body(row)


def content_key(row: Mapping[str, Any]) -> tuple[Any, str | None, str | None, bytes]:
    """What makes two rows with one call id the same call in two traces: the same service too, since two
    instrumentations of one agent share its resource, while a proxy that traces what it relayed (the reviser sidecar)
    is a service of its own whose rows are its record, not the agent's."""
    return row["service_name"], row["tool_call_id"], row["name"], body(row)


def response_key(row: Mapping[str, Any]) -> tuple[str, Any, str, int, str] | None:
    """What makes two rows of a call written as text, which has no id, the same call: the same response (an id drawn
    at random) and the same place and text in it, from the same service. Two identical calls in two responses stay
    two."""
    response = row["response_id"]
    if response is None or len(response) < UNIQUE_RESPONSE_ID_CHARS:
        return None
    return "response", row["service_name"], response, row["call_index"], row["raw"]


def recent_key(row: Mapping[str, Any]) -> tuple[Any, ...] | None:
    """The key under which a stored row is found again from another trace (`RecentCalls`, `stored_twins`), if any."""
    if row["tool_call_id"]:
        return None if numbered(row["tool_call_id"]) else content_key(row)
    return response_key(row)


def stored_twins(conn: Connection, call_ids: set[str], response_ids: set[str]) -> dict[tuple[Any, ...],
                                                                                        tuple[str, str, int]]:
    """`recent_key` -> (trace, span, call index) of the first stored row with one of these tool call ids, or
    (written as text) response ids, whichever process stored it; its service is its span's. On PostgreSQL, a writer
    storing one of these ids at the same moment (the same call exported from two traces, to two ingest processes)
    commits first: its row is found, and the two do not both keep one."""
    found: dict[tuple[Any, ...], tuple[str, str, int]] = {}
    if not call_ids and not response_ids:
        return found
    lock_keys(conn, conn.dialect.name, itertools.chain((f"call {c}" for c in call_ids),
                                                       (f"response {r}" for r in response_ids)))
    sqlite = conn.dialect.name == "sqlite"
    lists = listed_params(sqlite, tool_call_id=call_ids, response_id=response_ids)
    for row in conn.execute(_STORED_TWINS[sqlite], lists):
        key = recent_key(row._mapping)
        if key is not None:
            found.setdefault(key, (row.trace_id, row.span_id, row.call_index))
    return found


def one_of(column: Any, sqlite: bool) -> Any:
    """`column` is one of a list bound as one parameter (a JSON array on SQLite, an array on PostgreSQL; its value from
    `listed_params`): hundreds of ids cost one bound value, not one each."""
    if sqlite:
        values = func.json_each(bindparam(column.key + "_list", type_=Text)).table_valued("value")
        return column.in_(select(values.c.value))
    return column == any_(bindparam(column.key + "_list", type_=ARRAY(column.type)))


def listed_params(sqlite: bool, **lists: Iterable[str]) -> dict[str, Any]:
    """The parameters of `one_of(column)` for each column name given."""
    if sqlite:
        return {name + "_list": orjson.dumps(list(values)).decode() for name, values in lists.items()}
    return {name + "_list": list(values) for name, values in lists.items()}


def _stored_twins(sqlite: bool) -> Any:
    return (
        select(_CALLS.c.trace_id, _CALLS.c.span_id, _CALLS.c.call_index, _CALLS.c.tool_call_id, _CALLS.c.name,
               _CALLS.c.arguments, _CALLS.c.raw, _CALLS.c.response_id, _CALLS.c.service_name)
        .where(or_(one_of(_CALLS.c.tool_call_id, sqlite), one_of(_CALLS.c.response_id, sqlite)))
        .order_by(_CALLS.c.id)
    )


_STORED_TWINS = {sqlite: _stored_twins(sqlite) for sqlite in (True, False)}


def moves(start_ns: int, end_ns: int, other: Mapping[str, Any]) -> bool:
    """Whether the row of a numbered id whose span ran from `start_ns` to `end_ns` takes the place (`PLACE`) of
    `other`, another sighting of its call, on a shorter span inside it: a row first seen on a chain span around the
    whole run (which repeats its turns) goes to the model call that made it, so that its time tells it from the same
    call sent again in a later turn (`numbered.NumberedCalls`), and its span holds its conversation. A row of an id
    drawn at random stays on the span that first showed it."""
    call_id = other["tool_call_id"]
    return (bool(call_id) and numbered(call_id) and start_ns <= other["start_time_ns"]
            and other["end_time_ns"] <= end_ns and other["end_time_ns"] - other["start_time_ns"] < end_ns - start_ns)


def fill(kept: dict[str, Any], other: dict[str, Any]) -> None:
    """Give `kept` what `other` knows and it does not (and, where it `moves`, its place)."""
    for key in ("model", "harness_version"):
        if kept[key] is None:
            kept[key] = other[key]
    if moves(kept["start_time_ns"], kept["end_time_ns"], other):
        kept.update({key: other[key] for key in (*PLACE, "end_time_ns")})
    if kept["toolset_id"] is None and other["toolset_id"] is not None:
        kept.update({key: other[key] for key in VERDICT})
    if kept["execution_status"] is None and other["execution_status"] is not None:
        kept.update({key: other[key] for key in EXECUTION})


def _new(column: str) -> Any:
    return bindparam("n_" + column, type_=_CALLS.c[column].type)


def _filled(column: str, when_null: str) -> Any:
    return case((_CALLS.c[when_null].is_(None), _new(column)), else_=_CALLS.c[column])


def _moved(column: str) -> Any:
    """`column` of the row's place: the filling row's where the row `moves` (`n_move`)."""
    return case((bindparam("n_move", type_=Boolean), _new(column)), else_=_CALLS.c[column])


# `fill` applied to a stored row (found by its unique key) from a row that is not stored.
FILL_STORED = (
    update(_CALLS)
    .where(and_(_CALLS.c.trace_id == bindparam("k_trace"), _CALLS.c.span_id == bindparam("k_span"),
                _CALLS.c.call_index == bindparam("k_index")))
    .values(
        model=func.coalesce(_CALLS.c.model, _new("model")),
        harness_version=func.coalesce(_CALLS.c.harness_version, _new("harness_version")),
        # every SET reads the stored row, so these conditions see the stored toolset and execution
        **{key: _filled(key, "toolset_id") for key in VERDICT},
        **{key: _filled(key, "execution_status") for key in EXECUTION},
        **{key: _moved(key) for key in PLACE},
    )
)


# a stored call's execution, by the call's id (`execution_params`)
SET_EXECUTION = (
    update(_CALLS).where(_CALLS.c.id == bindparam("i"))
    .values(execution_status=bindparam("s"), execution_error=bindparam("e"), execution_result=bindparam("r"),
            execution_span_id=bindparam("x"))
)


def execution_status(ok: bool) -> str:
    """`tool_calls.execution_status` of a call whose execution ended so."""
    return "success" if ok else "error"


def execution_params(call_id: int, execution: Mapping[str, Any] | None) -> dict[str, Any]:
    """`SET_EXECUTION`'s parameters: the execution row's (`ok`, `error`, `result`, `span_id`), or none."""
    if execution is None:
        return {"i": call_id, "s": None, "e": None, "r": None, "x": None}
    return {"i": call_id, "s": execution_status(execution["ok"]), "e": execution["error"],
            "r": execution["result"], "x": execution["span_id"]}


def fill_params(key: tuple[str, str, int], row: dict[str, Any]) -> dict[str, Any]:
    return {"k_trace": key[0], "k_span": key[1], "k_index": key[2], "n_move": row["moves"],
            **{"n_" + k: row[k] for k in ("model", "harness_version", *VERDICT, *EXECUTION, *PLACE)}}


class RecentCalls(OrderedDict[tuple[Any, ...], tuple[str, str, int]]):
    """content_key -> (trace, span, call index) of the calls with an id this writer stored last, a bounded number."""

    def __init__(self, size: int) -> None:
        super().__init__()
        self.size = size

    def put(self, key: tuple[Any, ...], where: tuple[str, str, int]) -> None:
        self[key] = where
        if len(self) > self.size:
            self.popitem(last=False)


def ran(execution: Mapping[str, Any], name: str | None, arguments: dict[str, Any] | None) -> bool:
    """Whether an execution with a numbered id ran this call of its id, of several: the same tool and arguments, where
    it says."""
    return (execution["tool_name"] in (None, name)
            and (execution["arguments"] is None or arguments is None
                 or same_arguments(execution["arguments"], arguments)))


def same_arguments(execution_arguments: str | None, call_arguments: dict[str, Any] | None) -> bool:
    if execution_arguments is None or call_arguments is None:
        return False
    try:
        return orjson.loads(execution_arguments) == call_arguments
    except orjson.JSONDecodeError:
        return False
