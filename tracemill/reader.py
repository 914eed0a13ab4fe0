"""Reading tool calls out of what a model emitted: the first half of the deterministic reviser, and all the collector
needs to tell whether text holds a call (`holds_call`).

    reading = read(raw, index)       # raw: model text, a native call's JSON, a dict, a list, or a ToolCall
    reading.calls                    # each call as read: its name, its arguments decoded to an object (or why not)
    reading.steps                    # how the calls were found (typed Steps); each call has its own decoding steps
    reading.exact                    # the output is exactly one call as the verifier reads it: nothing to read out

Reads plain JSON; OpenAI `tool_calls` (and whole chat completions); wrappers such as `{"function": {...}}`,
`{"tool", "args"}`, `{"name", "parameters"}`, `{"type": "tool_use", "name", "input"}`; the text formats of
`tracemill.regions` (prose, Markdown fences, tool-call tags, Qwen3-Coder's XML calls, LangChain's ReAct text); pythonic
calls (`[f(a=1)]`, `print(f(a=1))`, parsed with `ast`, values read with `ast.literal_eval`, nothing evaluated); several
calls in one string;
broken JSON (missing closing brackets, Python literals, then json-repair); arguments encoded as a string, twice.
An output cut mid-value is refused, never completed. Each piece of text is parsed and scanned at most once.
"""

from __future__ import annotations

import ast
import copy
import json
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from tracemill.jsonish import NOTHING, PYTHON_ERRORS, Piece, Refused, decode, jsonable, scan
from tracemill.names import match_tool
from tracemill.regions import regions
from tracemill.revision import Step, StepKind
from tracemill.tools import Tool, tool_index
from tracemill.verify import ToolCall, Verdict, parse_call, parse_failure, pointer

_JSON = json.JSONDecoder()
_START = re.compile(r"[{\[]|(?<![\w.])[A-Za-z_][\w.]*\(")
_GLUE = re.compile(r"[\s,;]+")  # what may sit between calls written one after another
_NAME_KEYS = ("name", "tool", "tool_name", "function", "function_name", "recipient_name")
_ARG_KEYS = ("arguments", "parameters", "args", "input", "params", "kwargs", "tool_input")
_MAX_UNCLOSED = 3


@dataclass(slots=True)
class ReadCall:
    """One call as read, before any fixing. `arguments` is None when they are not an object or were cut mid-value;
    `problem` then says which. `steps`: how its arguments were decoded."""

    name: Any  # a non-empty str when the output names the tool
    arguments: dict[str, Any] | None
    steps: list[Step] = field(default_factory=list)
    problem: Verdict | None = None


@dataclass(slots=True)
class Reading:
    calls: list[ReadCall]
    refused: list[str]  # why a call that was there could not be read
    steps: list[Step]
    exact: ToolCall | None = None

    def own_arguments(self) -> Reading:
        """This reading with calls whose arguments are copies, for a caller that fixes them in place."""
        calls = [ReadCall(c.name, copy.deepcopy(c.arguments), list(c.steps), c.problem) for c in self.calls]
        return Reading(calls, list(self.refused), list(self.steps), self.exact)


@dataclass(slots=True)
class _Raw:
    name: Any
    arguments: Any


@dataclass(slots=True)
class _TextReading:
    calls: list[_Raw]
    refused: list[str]


def _dotted(node: ast.expr) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = _dotted(node.value)
        return f"{base}.{node.attr}" if base else None
    return None


def _printed(node: ast.expr) -> ast.expr | None:
    """The call inside `print(call)`, as Gemma writes its tool_code; None when the node is not that."""
    if (isinstance(node, ast.Call) and _dotted(node.func) == "print" and len(node.args) == 1 and not node.keywords
            and isinstance(node.args[0], ast.Call)):
        return node.args[0]
    return None


def _pythonic(tree: ast.Expression | None, steps: list[Step]) -> list[_Raw] | None:
    """`f(a=1)`, `[f(a=1), g(b="x")]` or `print(f(a=1))`; None when the parsed text is not that."""
    if tree is None:
        return None
    body = tree.body
    nodes = body.elts if isinstance(body, (ast.List, ast.Tuple)) else [body]
    calls = []
    printed = False
    for node in nodes:
        inner = _printed(node)
        if inner is not None:
            node, printed = inner, True
        if not isinstance(node, ast.Call) or node.args:
            return None
        name = _dotted(node.func)
        if name is None:
            return None
        arguments: dict[str, Any] = {}
        for kw in node.keywords:
            try:
                value = jsonable(ast.literal_eval(kw.value))
            except PYTHON_ERRORS:
                return None
            if kw.arg is None:
                if not isinstance(value, dict):
                    return None
                arguments.update(value)
            else:
                arguments[kw.arg] = value
        calls.append(_Raw(name, arguments))
    if calls and printed:
        steps.append(Step(StepKind.UNWRAP, "read the call inside print(...)"))
    return calls or None


def _unwrap(obj: Any, steps: list[Step]) -> list[_Raw] | None:
    """The calls in a decoded JSON value; None when it holds none."""
    if isinstance(obj, list):
        found = [_unwrap(item, steps) for item in obj]
        if not obj or any(f is None for f in found):
            return None
        return [c for f in found if f for c in f]
    if not isinstance(obj, Mapping):
        return None
    if isinstance(obj.get("choices"), list) and obj["choices"]:
        choice = obj["choices"][0]
        return _unwrap(choice.get("message", {}) if isinstance(choice, Mapping) else None, steps)
    if isinstance(obj.get("tool_calls"), list):
        return _unwrap(obj["tool_calls"], steps)
    if isinstance(obj.get("function"), Mapping):
        return _unwrap(obj["function"], steps)
    name_at = next((k for k in _NAME_KEYS if isinstance(obj.get(k), str) and obj[k]), None)
    if name_at is None:
        return None
    arg_key = next((k for k in _ARG_KEYS if k in obj), None)
    if arg_key is None:
        rest = {k: v for k, v in obj.items() if k not in (name_at, "type", "id")}
        if name_at != "name" or rest:
            return None
        arguments: Any = {}
    else:
        arguments = obj[arg_key]
    if arg_key is None:
        steps.append(Step(StepKind.UNWRAP, "read a call that gives no arguments as one with none"))
    elif (name_at, arg_key) != ("name", "arguments"):
        steps.append(Step(StepKind.UNWRAP, f"read {{{name_at!r}, {arg_key!r}}} as {{'name', 'arguments'}}"))
    return [_Raw(obj[name_at], arguments)]


# --- where the calls are --------------------------------------------------------------------------------------------

def _read_segment(piece: Piece, steps: list[Step], value: Any = NOTHING) -> list[_Raw] | None:
    """The calls in one segment that starts at an opening bracket or `name(` (`value`: its JSON, when already
    decoded); None when it holds none. Raises Refused when it was cut mid-value."""
    local: list[Step] = []
    if value is NOTHING:
        calls = _pythonic(piece.python(), local)
        if calls is not None:
            steps.append(Step(StepKind.PYTHONIC, "read a Python-style call with ast"))
            steps.extend(local)
            return calls
        state, closers = piece.scan()
        calls = _pythonic(piece.closed_python(), local) if state == "open" else None
        if calls is not None:
            steps.extend([Step(StepKind.CLOSE_BRACKETS, f"added the missing {closers!r}"),
                          Step(StepKind.PYTHONIC, "read a Python-style call with ast"), *local])
            return calls
        try:
            value = decode(piece, local)
        except ValueError:
            return None
    calls = _unwrap(value, local)
    if calls is not None:
        steps.extend(local)
    return calls


def _segments(region: str) -> Iterator[tuple[Piece, bool, Any]]:
    """Candidate segments in a region, in order, as (piece, balanced, its JSON value or NOTHING): from each opening
    bracket or `name(` to its matching closer, or to the end of the region (less trailing prose) when it is never
    closed. Only the first few unclosed ones are tried, so that text full of stray brackets costs linear time. A
    segment not decoded here is not JSON (its start did not decode)."""
    pos = 0
    unclosed = 0
    while unclosed < _MAX_UNCLOSED:
        match = _START.search(region, pos)
        if match is None:
            return
        start = match.start()
        if region[start] in "{[":
            try:
                value, end = _JSON.raw_decode(region, start)
            except (ValueError, RecursionError):
                pass
            else:
                yield Piece(region[start:end]), True, value
                pos = end
                continue
        # A name before `(` holds none of the characters a scan looks at: scanning from the name reads the same.
        end, state, closers = scan(region, start if region[start] in "{[" else match.end() - 1)
        if state == "closed":
            yield Piece(region[start:end], True, ("closed", "")), True, NOTHING
            pos = end
        else:
            unclosed += 1
            rest = region[start:]
            if state == "open":
                yield Piece(rest, True, (state, closers)), False, NOTHING
            else:
                trimmed = _trim_prose(rest)
                yield Piece(trimmed, True, (state, closers) if trimmed == rest else None), False, NOTHING
            pos = start + 1


def _trim_prose(text: str) -> str:
    """An unclosed segment followed by prose: cut where a line of prose starts after the last complete-looking value."""
    for match in reversed(list(re.finditer(r"[}\])\"']\s*(?=[A-Za-z<`])", text))):
        if "\n" in match.group() or text[match.start()] in "}])":
            return text[: match.start() + 1]
    return text


def _read_text(raw: str, steps: list[Step], index: Mapping[str, Tool]) -> _TextReading:
    found = regions(raw, index)
    why = found.why
    reading = _TextReading([], [])
    used: list[str] = []
    for region in found.regions:
        if region.refused is not None:
            reading.refused.append(region.refused)
            used.append(region.text)
            continue
        if region.name is not None:
            steps.extend(region.steps)
            arguments = region.arguments if region.arguments is not None else region.text.strip() or {}
            reading.calls.append(_Raw(region.name, arguments))
            used.append(region.text)
            continue
        for piece, balanced, value in _segments(region.text):
            try:
                found = _read_segment(piece, steps, value)
            except Refused as exc:
                reading.refused.append(str(exc))
                continue
            if found is None:
                continue
            if piece.text[0] not in "{[" and not all(c.name in index or match_tool(c.name, index) for c in found):
                continue
            reading.calls.extend(found)
            used.append(piece.text)
            if not balanced:
                break
    if why or _GLUE.sub("", raw) != _GLUE.sub("", "".join(used)):
        steps.insert(0, Step(StepKind.EXTRACT, why or "read the call out of the surrounding text"))
    if len(used) > 1:
        steps.append(Step(StepKind.SPLIT, f"{len(used)} calls written one after another"))
    return reading


# --- arguments ------------------------------------------------------------------------------------------------------

def _arguments(value: Any, i: int, steps: list[Step]) -> dict[str, Any] | None:
    """Arguments as an object: decoded from a string (one level is how APIs send them; a second is a fault). None when
    they are not an object. Raises Refused when they were cut mid-value."""
    for level in range(3):
        if value is None:
            return {}
        if isinstance(value, dict):
            return value
        if not isinstance(value, str):
            return None
        if not value.strip():
            return {}
        local: list[Step] = []
        try:
            value = decode(Piece(value.strip()), local)
        except ValueError:
            return None
        steps.extend(Step(s.kind, s.reason, i, "/arguments") for s in local)
        if level == 1:
            steps.append(Step(StepKind.DECODE_ARGUMENTS, "the arguments were a JSON string holding a JSON string", i,
                              "/arguments"))
    return None


def _read_call(raw: _Raw, i: int) -> ReadCall:
    if not isinstance(raw.name, str) or not raw.name:
        return ReadCall(raw.name, None)
    steps: list[Step] = []
    try:
        arguments = _arguments(raw.arguments, i, steps)
    except Refused as exc:
        return ReadCall(raw.name, None, steps, parse_failure("truncated", pointer(i), str(exc)))
    if arguments is None:
        return ReadCall(raw.name, None, steps, parse_failure("arguments_not_object", pointer(i) + "/arguments",
                                                             "the arguments are not an object"))
    return ReadCall(raw.name, arguments, steps)


def _reading(found: _TextReading, steps: list[Step]) -> Reading:
    return Reading([_read_call(raw, i) for i, raw in enumerate(found.calls)], found.refused, steps)


def read(raw: str | bytes | Mapping[str, Any] | Sequence[Any] | ToolCall, index: Mapping[str, Tool]) -> Reading:
    """The calls in a model's output (see the module docstring), against the tools offered (`tool_index`), which
    decide whether a pythonic-looking `name(...)` in prose is a call."""
    steps: list[Step] = []
    if isinstance(raw, bytes):
        raw = raw.decode("utf-8", errors="replace")
    if isinstance(raw, str):
        try:
            value: Any = json.loads(raw)
        except (ValueError, RecursionError):
            return _reading(_read_text(raw, steps, index), steps)
        text = raw
    else:
        value, text = copy.deepcopy(raw), ""
    if isinstance(value, ToolCall):
        value = value.to_dict()
    if not isinstance(value, list):
        exact = parse_call(value)
        if isinstance(exact, ToolCall):
            return Reading([ReadCall(exact.name, exact.arguments)], [], steps, exact)
    calls = _unwrap(value, steps)
    return _reading(_TextReading(calls, []) if calls is not None else _read_text(text, steps, index), steps)


def holds_call(text: str, tools: Sequence[Any] | Mapping[str, Tool]) -> bool:
    """Whether a model's text holds a tool call, read as `revise` reads it: tagged, fenced, JSON or pythonic (naming
    one of `tools`), or one cut off mid-value. Prose that only mentions a tool holds none."""
    index = tools if isinstance(tools, Mapping) else tool_index(tools)
    reading = _read_text(text, [], index)
    return bool(reading.calls or reading.refused)
