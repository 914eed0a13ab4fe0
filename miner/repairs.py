"""The agent's own repairs: which later calls of the same trace fixed a failed one (the miner's `silver` references).

A failed output is repaired by the first later model output that holds, for every tool the failed one meant (its
names as the reviser reads them, near misses resolved by `tracemill.names.match_tool`), a call to that tool that
verified and did not fail when it ran, and whose arguments agree with what the failed output said. Only the run of
outputs that follow it and still call one of those tools is looked at: once the agent has moved on, a later call to
the same tool is another step, not a repair. Arguments agree when no value the failed output gave is contradicted or
left out by the repair (values may move between parameters, change case or type: `"5"` and `5` agree) and at
least one value is shared; an output whose arguments cannot be read at all agrees when most of the repair's values
appear in its text. An output that said no value is linked to nothing: nothing tells its retry from the next step.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from tracemill.names import match_tool
from tracemill.reader import Reading, read
from tracemill.store.queries import StoredCall
from tracemill.tools import Tool, base_key, base_name, name_key


@dataclass(frozen=True, slots=True)
class Repair:
    failed: StoredCall
    calls: tuple[StoredCall, ...]  # one per tool the failed output meant, in its order


@dataclass(frozen=True, slots=True)
class _Meant:
    tools: tuple[str, ...]
    arguments: tuple[dict[str, Any] | None, ...]  # as read from the failed output; None where unreadable


def succeeded(call: StoredCall) -> bool:
    return call.parsed and call.stage is None and call.execution_status != "error"


def _resolve(name: str, index: Mapping[str, Tool]) -> str | None:
    if name in index:
        return name
    match = match_tool(name, index)
    return match[0] if match else None


def meant(call: StoredCall, index: Mapping[str, Tool], reading: Reading | None = None) -> _Meant:
    """The offered tools a failed output meant, with the arguments it gave each (`reading`: its output as read, where
    the caller has it)."""
    tools, arguments = [], []
    for found in (read(call.raw, index) if reading is None else reading).calls:
        hit = _resolve(found.name, index) if isinstance(found.name, str) and found.name else None
        if hit is not None:
            tools.append(hit)
            arguments.append(found.arguments)
    if not tools and call.name and (hit := _resolve(call.name, index)) is not None:
        tools, arguments = [hit], [call.arguments]
    return _Meant(tuple(tools), tuple(arguments))


def _norm(value: Any) -> str:
    if isinstance(value, str):
        text = value.strip()
        if text[:1] in "[{0123456789-tfn":
            try:
                decoded = orjson.loads(text)
            except orjson.JSONDecodeError:
                decoded = text
            if not isinstance(decoded, str):
                return orjson.dumps(decoded, option=orjson.OPT_SORT_KEYS).decode().casefold()
        return text.casefold()
    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS, default=str).decode().casefold()


def _informative(value: Any) -> bool:
    return (isinstance(value, str) and len(value.strip()) >= 3) or (
        isinstance(value, (int, float)) and not isinstance(value, bool))


def agrees(said: dict[str, Any] | None, raw: str, repair: Mapping[str, Any]) -> bool:
    """Whether a repair's arguments agree with what the failed output said (see the module docstring)."""
    values = {_norm(v) for v in repair.values()}
    if said is None:
        shown = [_norm(v) for v in repair.values() if _informative(v)]
        text = raw.casefold()
        return bool(shown) and 2 * sum(v in text for v in shown) >= len(shown)
    by_key = {name_key(k): v for k, v in repair.items()}
    shared = 0
    for key, value in said.items():
        mine = _norm(value)
        if name_key(key) in by_key and _norm(by_key[name_key(key)]) == mine:
            shared += 1
        elif mine in values:
            shared += 1  # moved to another parameter (a synonym, a swap)
        elif name_key(key) in by_key or _informative(value):
            return False  # contradicted, or a value the repair does not have: another call
    return shared > 0


def _outputs(calls: Sequence[StoredCall]) -> list[list[StoredCall]]:
    """A trace's calls grouped by the model output (span) that made them, in order."""
    groups: dict[str, list[StoredCall]] = {}
    for call in calls:
        groups.setdefault(call.span_id, []).append(call)
    return list(groups.values())


def _attempts(output: Sequence[StoredCall], tools: Sequence[str]) -> bool:
    """Whether an output calls (or, as text, names) one of these tools."""
    names = {name_key(t) for t in tools} | {base_key(t) for t in tools}
    for call in output:
        if call.name is not None and (name_key(call.name) in names or base_key(call.name) in names):
            return True
        if call.name is None and any(base_name(t) in call.raw for t in tools):
            return True
    return False


def find_repairs(calls: Sequence[StoredCall], indexes: Mapping[int, Mapping[str, Tool]],
                 reading: Callable[[StoredCall], Reading] | None = None) -> dict[int, Repair]:
    """Failed call id -> its repair, for the calls of one trace in the order they were made (`indexes`: toolset id ->
    tool index; `reading`: a call's output as read, where the caller keeps them)."""
    outputs = _outputs(calls)
    found: dict[int, Repair] = {}
    for n, output in enumerate(outputs):
        for call in output:
            if succeeded(call) or call.toolset_id not in indexes:
                continue
            want = meant(call, indexes[call.toolset_id], reading(call) if reading is not None else None)
            if not want.tools:
                continue
            repair = _first_repair(call, want, outputs[n + 1:])
            if repair is not None:
                found[call.id] = Repair(call, repair)
    return found


def _first_repair(failed: StoredCall, want: _Meant, later: Sequence[list[StoredCall]]) -> tuple[StoredCall, ...] | None:
    for output in later:
        if not _attempts(output, want.tools):
            return None
        chosen: list[StoredCall] = []
        for tool, said in zip(want.tools, want.arguments, strict=True):
            hit = next((c for c in output if c.name == tool and succeeded(c) and c not in chosen
                        and agrees(said, failed.raw, c.arguments or {})), None)
            if hit is None:
                break
            chosen.append(hit)
        else:
            return tuple(chosen)
    return None
