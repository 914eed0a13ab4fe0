"""The deterministic reviser: recover the tool calls a model meant from what it emitted, and make them valid where the
output holds the answer.

    revision = revise(raw, tools)          # raw: model text, a native call's JSON, a dict, or a ToolCall
    revision.ok, revision.calls            # the calls, each valid against its tool when ok
    revision.changed, revision.steps       # what was changed and why (typed Steps)
    revision.verdicts                      # one Verdict per call: what is still wrong where not ok

Reading: plain JSON; OpenAI `tool_calls` (and whole chat completions); wrappers such as `{"function": {...}}`,
`{"tool", "args"}`, `{"name", "parameters"}`, `{"type": "tool_use", "name", "input"}`; prose and Markdown fences;
`<tool_call>`, `<|python_start|>`, `<|python_tag|>`, `[TOOL_CALLS]`, `<function=name>` and similar tags; pythonic calls
(`[f(a=1)]`, parsed with `ast`, values read with `ast.literal_eval`, nothing evaluated); several calls in one string;
broken JSON (missing closing brackets, Python literals, then json-repair); arguments encoded as a string, twice.

Fixing, driven by the verifier's violations: near-miss tool names (case and separators, server prefixes, then one
clearly closest name), near-miss parameter names (case and separators), schema-guided coercion (numeric and boolean
strings, JSON-encoded arrays and objects, one value where an array is expected), enum case, removal of unknown
parameters where the schema forbids them, schema defaults for missing required parameters where the schema gives one.

Guarantees: a call that already passes `verify` comes back unchanged with no steps; no value is made up (an output cut
mid-value is refused, not completed); of two equally close names none is picked. Where a call cannot be made valid, its
Verdict says what is left. `context` (the conversation) is part of the common reviser signature; the rules read only
the output.
"""

from __future__ import annotations

import ast
import copy
import difflib
import enum
import json
import re
import warnings
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import json_repair

from tracemill.tools import Tool
from tracemill.verify import Stage, ToolCall, Verdict, Violation, pointer, tool_index, verify

_SEPARATORS = re.compile(r"[\s_\-.:/]+")


def name_key(name: str) -> str:
    """A name with case and separators (`_ - . : /`, spaces) folded away: `Get-Weather` and `get_weather` share a key."""
    return _SEPARATORS.sub("", name).casefold()


def schema_types(schema: Any) -> set[str]:
    """The JSON types a schema admits, looking into `anyOf`/`oneOf`; empty when it does not say."""
    if not isinstance(schema, Mapping):
        return set()
    t = schema.get("type")
    found = {t} if isinstance(t, str) else {x for x in t if isinstance(x, str)} if isinstance(t, list) else set()
    for key in ("anyOf", "oneOf"):
        alternatives = schema.get(key)
        if isinstance(alternatives, list):
            for alt in alternatives:
                found |= schema_types(alt)
    return found


class StepKind(str, enum.Enum):
    EXTRACT = "extract"                # the call was found inside text (prose, fences, tags)
    PYTHONIC = "pythonic"              # read from a Python-style call
    PYTHON_LITERAL = "python_literal"  # single quotes, True/None
    CLOSE_BRACKETS = "close_brackets"  # missing closing brackets added
    JSON_REPAIR = "json_repair"        # other broken JSON, repaired by json-repair
    UNWRAP = "unwrap"                  # a wrapper shape read as {"name", "arguments"}
    SPLIT = "split"                    # several calls in one output
    DECODE_ARGUMENTS = "decode_arguments"  # arguments encoded as a string once too often
    TOOL_NAME = "tool_name"
    PARAM_NAME = "param_name"
    COERCE = "coerce"
    ENUM_CASE = "enum_case"
    DROP_UNKNOWN = "drop_unknown"
    DEFAULT = "default"
    MODEL = "model"                    # a model reviser rewrote the call


@dataclass(frozen=True, slots=True)
class Step:
    kind: StepKind
    reason: str
    call: int | None = None
    pointer: str = ""
    before: Any = None
    after: Any = None

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind.value, "reason": self.reason, "call": self.call, "pointer": self.pointer,
                "before": self.before, "after": self.after}


@dataclass(frozen=True, slots=True)
class Revision:
    """`verdicts` has one Verdict per call; when no call could be read it holds the one parse failure."""

    calls: tuple[ToolCall, ...]
    ok: bool
    changed: bool
    steps: tuple[Step, ...] = ()
    verdicts: tuple[Verdict, ...] = field(default=())

    def to_dict(self) -> dict[str, Any]:
        return {"ok": self.ok, "changed": self.changed, "calls": [c.to_dict() for c in self.calls],
                "steps": [s.to_dict() for s in self.steps], "verdicts": [v.to_dict() for v in self.verdicts]}


_UNREAD = object()
_JSON = json.JSONDecoder()


class _Refused(Exception):
    """The output cannot be read without making something up (e.g. it was cut mid-value)."""


# --- reading --------------------------------------------------------------------------------------------------------

_THINK = re.compile(r"<think>.*?(</think>|$)", re.S)
_TAGS = re.compile(
    r"<\|python_start\|>(?P<a>.*?)(?:<\|python_end\|>|$)"
    r"|<\|python_tag\|>(?P<b>.*?)(?:<\|eom_id\|>|<\|eot_id\|>|$)"
    r"|<(?P<tag>tool_call|tool_calls|tool_code|function_call|functioncall|tools)>(?P<c>.*?)(?:</(?P=tag)>|$)"
    r"|<\|tool_call\|>(?P<d>.*?)(?:<\|/tool_call\|>|<\|end\|>|$)"
    r"|<function=(?P<fn>[^>\s]+)>(?P<e>.*?)(?:</function>|$)"
    r"|\[TOOL_CALLS\](?P<f>.*)",
    re.S,
)
_FENCE = re.compile(r"```[\w-]*[ \t]*\n?(.*?)(?:```|$)", re.S)
_MISTRAL_ARGS = re.compile(r"\s*([\w.:\-]+)\s*\[ARGS\]", re.S)
_START = re.compile(r"[{\[]|(?<![\w.])[A-Za-z_][\w.]*\(")
_NUMBER = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?")
_GLUE = re.compile(r"[\s,;]+")  # what may sit between calls written one after another
_LITERALS = {"true", "false", "null", "True", "False", "None"}
_NAME_KEYS = ("name", "tool", "tool_name", "function", "function_name", "recipient_name")
_ARG_KEYS = ("arguments", "parameters", "args", "input", "params", "kwargs", "tool_input")


@dataclass(slots=True)
class _Raw:
    """A call as read, before any fixing."""

    name: str
    arguments: Any


_SPECIAL = re.compile(r"[\\\"'{}\[\]():,]")
_PAIRS = {"{": "}", "[": "]", "(": ")"}


def _scan(text: str, start: int) -> tuple[int, str, str]:
    """From an opening bracket at `start`: (end, state, closers). state: "closed" (balanced, ends at `end`),
    "open" (text ran out after a complete value; `closers` closes it) or "cut" (text ran out mid-value)."""
    stack: list[str] = []
    object_key: list[bool] = []
    quote = ""
    string_is_key = last_string_key = False
    skip_to = start
    for match in _SPECIAL.finditer(text, start):
        i = match.start()
        if i < skip_to:
            continue
        ch = text[i]
        if quote:
            if ch == "\\":
                skip_to = i + 2
            elif ch == quote:
                quote = ""
                last_string_key = string_is_key
        elif ch in "\"'":
            quote = ch
            string_is_key = bool(stack) and stack[-1] == "}" and object_key[-1]
        elif ch in _PAIRS:
            stack.append(_PAIRS[ch])
            object_key.append(ch == "{")
        elif ch in "}])":
            if not stack or stack[-1] != ch:
                return i, "cut", ""
            stack.pop()
            object_key.pop()
            if not stack:
                return i + 1, "closed", ""
        elif ch == ":" and stack and stack[-1] == "}":
            object_key[-1] = False
        elif ch == "," and stack and stack[-1] == "}":
            object_key[-1] = True
    n = len(text)
    tail = text[start:].rstrip()
    if quote or not tail:
        return n, "cut", ""
    last = tail[-1]
    if last in "}])":
        complete = True
    elif last in "\"'":
        complete = not last_string_key
    else:
        token = re.search(r"[\w.+\-]+$", tail)
        complete = bool(token) and (token.group() in _LITERALS or bool(_NUMBER.fullmatch(token.group())))
    return n, ("open" if complete else "cut"), "".join(reversed(stack))


def _parse(text: str) -> ast.Expression:
    """Parse model text as a Python expression, quietly (its odd escapes are not our warnings). Never evaluated."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return ast.parse(text.strip(), mode="eval")


def _literal(text: str) -> Any:
    """JSON, else a Python literal (read with ast.literal_eval, never evaluated). Raises ValueError."""
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        pass
    try:
        value = ast.literal_eval(_parse(text))
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError) as exc:
        raise ValueError(str(exc)) from None
    return _jsonable(value)


def _jsonable(value: Any) -> Any:
    if isinstance(value, (tuple, list, set, frozenset)):
        return [_jsonable(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    raise ValueError(f"not a JSON value: {type(value).__name__}")


def _dotted(node: ast.expr) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = _dotted(node.value)
        return f"{base}.{node.attr}" if base else None
    return None


def _pythonic(text: str) -> list[_Raw] | None:
    """`f(a=1)` or `[f(a=1), g(b="x")]`, read with ast; None when it is not that."""
    try:
        tree = _parse(text).body
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        return None
    nodes = tree.elts if isinstance(tree, (ast.List, ast.Tuple)) else [tree]
    calls = []
    for node in nodes:
        if not isinstance(node, ast.Call) or node.args:
            return None
        name = _dotted(node.func)
        if name is None:
            return None
        arguments: dict[str, Any] = {}
        for kw in node.keywords:
            try:
                value = _jsonable(ast.literal_eval(kw.value))
            except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
                return None
            if kw.arg is None:
                if not isinstance(value, dict):
                    return None
                arguments.update(value)
            else:
                arguments[kw.arg] = value
        calls.append(_Raw(name, arguments))
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
    name_key_ = next((k for k in _NAME_KEYS if isinstance(obj.get(k), str) and obj[k]), None)
    if name_key_ is None:
        return None
    arg_key = next((k for k in _ARG_KEYS if k in obj), None)
    if arg_key is None:
        rest = {k: v for k, v in obj.items() if k not in (name_key_, "type", "id")}
        if name_key_ != "name" or rest:
            return None
        arguments: Any = {}
    else:
        arguments = obj[arg_key]
    if arg_key is None:
        steps.append(Step(StepKind.UNWRAP, "read a call that gives no arguments as one with none"))
    elif (name_key_, arg_key) != ("name", "arguments"):
        steps.append(Step(StepKind.UNWRAP, f"read {{{name_key_!r}, {arg_key!r}}} as {{'name', 'arguments'}}"))
    return [_Raw(obj[name_key_], arguments)]


def _decode(text: str, steps: list[Step]) -> Any:
    """A JSON value from JSON-ish text: JSON, Python literals, missing closing brackets, then json-repair. Raises
    _Refused when the text was cut mid-value, ValueError when it is not a value."""
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        pass
    try:
        value = _literal(text)
        steps.append(Step(StepKind.PYTHON_LITERAL, "read Python literals (quotes, True/None)"))
        return value
    except ValueError:
        pass
    _, state, closers = _scan(text, 0)
    if state == "cut":
        raise _Refused("the output ends in the middle of a value")
    if state == "open":
        try:
            value = _literal(text + closers)
            steps.append(Step(StepKind.CLOSE_BRACKETS, f"added the missing {closers!r}"))
            return value
        except ValueError:
            pass
    try:
        repaired = json_repair.loads(text)
    except Exception:  # json-repair is a heuristic; whatever it cannot handle is simply not repairable
        repaired = None
    if isinstance(repaired, (dict, list)) and repaired:
        steps.append(Step(StepKind.JSON_REPAIR, "repaired broken JSON with json-repair"))
        return repaired
    raise ValueError("not a JSON value")


def _read_segment(text: str, steps: list[Step], value: Any = _UNREAD) -> list[_Raw] | None:
    """The calls in one segment that starts at an opening bracket or `name(` (`value`: its JSON, when already
    decoded); None when it holds none. Raises _Refused when it was cut mid-value."""
    local: list[Step] = []
    if value is _UNREAD:
        calls = _pythonic(text)
        if calls is not None:
            steps.append(Step(StepKind.PYTHONIC, "read a Python-style call with ast"))
            return calls
        _, state, closers = _scan(text, 0)
        calls = _pythonic(text + closers) if state == "open" else None
        if calls is not None:
            steps.extend([Step(StepKind.CLOSE_BRACKETS, f"added the missing {closers!r}"),
                          Step(StepKind.PYTHONIC, "read a Python-style call with ast")])
            return calls
        try:
            value = _decode(text, local)
        except ValueError:
            return None
    calls = _unwrap(value, local)
    if calls is not None:
        steps.extend(local)
    return calls


def _segments(region: str) -> Iterator[tuple[str, bool, Any]]:
    """Candidate segments in a region, in order, as (text, balanced, its JSON value or _UNREAD): from each opening
    bracket or `name(` to its matching closer, or to the end of the region (less trailing prose) when it is never
    closed. Only the first few unclosed ones are tried, so that text full of stray brackets costs linear time."""
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
                yield region[start:end], True, value
                pos = end
                continue
        end, state, _ = _scan(region, start if region[start] in "{[" else match.end() - 1)
        if state == "closed":
            yield region[start:end], True, _UNREAD
            pos = end
        else:
            unclosed += 1
            rest = region[start:]
            yield (rest if _scan(rest, 0)[1] == "open" else _trim_prose(rest)), False, _UNREAD
            pos = start + 1


_MAX_UNCLOSED = 3


def _trim_prose(text: str) -> str:
    """An unclosed segment followed by prose: cut where a line of prose starts after the last complete-looking value."""
    for match in reversed(list(re.finditer(r"[}\])\"']\s*(?=[A-Za-z<`])", text))):
        if "\n" in match.group() or text[match.start()] in "}])":
            return text[: match.start() + 1]
    return text


def _regions(text: str) -> tuple[list[tuple[str, str | None]], str | None]:
    """Where calls may be, as (text, tool name given by the tag): tagged regions, else fenced blocks, else the whole
    text; and why the call had to be extracted."""
    if "<think>" in text:
        text = _THINK.sub("", text)
    tagged: list[tuple[str, str | None]] = []
    for m in _TAGS.finditer(text):
        if m.group("fn") is not None:
            tagged.append((m.group("e"), m.group("fn")))
        elif m.group("f") is not None:
            body = m.group("f")
            mistral = _MISTRAL_ARGS.match(body)
            tagged.append((body[mistral.end():], mistral.group(1)) if mistral else (body, None))
        else:
            tagged.append((next(g for g in (m.group("a"), m.group("b"), m.group("c"), m.group("d")) if g is not None),
                           None))
    if tagged:
        return tagged, "read the call from between tool-call tags"
    fenced = [(m.group(1), None) for m in _FENCE.finditer(text)]
    if fenced:
        return fenced, "read the call from a Markdown code block"
    return [(text, None)], None


@dataclass(slots=True)
class _Reading:
    calls: list[_Raw]
    refused: list[str]


def _read_text(raw: str, steps: list[Step], index: Mapping[str, Tool]) -> _Reading:
    regions, why = _regions(raw)
    reading = _Reading([], [])
    used: list[str] = []
    for region, tag_name in regions:
        if tag_name is not None:
            reading.calls.append(_Raw(tag_name, region.strip() or {}))
            used.append(region)
            continue
        for segment, balanced, value in _segments(region):
            try:
                found = _read_segment(segment, steps, value)
            except _Refused as exc:
                reading.refused.append(str(exc))
                continue
            if found is None:
                continue
            if segment[0] not in "{[" and not all(c.name in index or _match_tool(c.name, index) for c in found):
                continue
            reading.calls.extend(found)
            used.append(segment)
            if not balanced:
                break
    if why or _GLUE.sub("", raw) != _GLUE.sub("", "".join(used)):
        steps.insert(0, Step(StepKind.EXTRACT, why or "read the call out of the surrounding text"))
    if len(used) > 1:
        steps.append(Step(StepKind.SPLIT, f"{len(used)} calls written one after another"))
    return reading


# --- names ----------------------------------------------------------------------------------------------------------

def _bases(name: str) -> set[str]:
    """Keys of a name and of every suffix after a server or namespace separator (`:`, `.`, `/`, `__`)."""
    parts = re.split(r"[:./]|__", name)
    return {name_key("".join(parts[i:])) for i in range(len(parts))} - {""}


def _unique_closest(name: str, candidates: Sequence[str], cutoff: float) -> str | None:
    """The one candidate clearly closest to `name`; None when none is close or two are equally close."""
    key = name_key(name)
    scored = []
    for c in candidates:
        matcher = difflib.SequenceMatcher(None, key, name_key(c), autojunk=False)
        if matcher.real_quick_ratio() >= cutoff and matcher.quick_ratio() >= cutoff:
            scored.append((matcher.ratio(), c))
    scored.sort(reverse=True)
    if not scored or scored[0][0] < cutoff or (len(scored) > 1 and scored[1][0] >= scored[0][0] - 0.02):
        return None
    return scored[0][1]


def _last_key(name: str) -> str:
    return name_key(re.split(r"[:./]|__", name)[-1])


def _match_tool(name: str, index: Mapping[str, Tool]) -> tuple[str, str] | None:
    """(tool name, why) for a near-miss of exactly one offered tool; None when there is none or it is ambiguous."""
    key = name_key(name)
    same = [t for t in index if name_key(t) == key]
    if same:
        return (same[0], "same tool name up to case and separators") if len(same) == 1 else None
    bases = _bases(name)
    for tier in ((lambda t: name_key(t) in bases or key in _bases(t)),
                 (lambda t: _last_key(t) == _last_key(name))):
        found = [t for t in index if tier(t)]
        if found:
            return (found[0], "same tool name up to a server or namespace prefix") if len(found) == 1 else None
    close = _unique_closest(name, list(index), 0.85)
    return (close, "the one clearly closest tool name") if close else None


# --- fixing ---------------------------------------------------------------------------------------------------------

_NOTHING = object()


def _resolve(schema: Any, root: Mapping[str, Any]) -> Any:
    ref = schema.get("$ref") if isinstance(schema, Mapping) else None
    if isinstance(ref, str) and ref.startswith("#/"):
        node: Any = root
        for part in ref[2:].split("/"):
            node = node.get(part.replace("~1", "/").replace("~0", "~")) if isinstance(node, Mapping) else None
        return node if isinstance(node, Mapping) else schema
    return schema


def _subschema(schema: Mapping[str, Any], path: Sequence[str | int]) -> Any:
    node: Any = schema
    for part in path:
        node = _resolve(node, schema)
        if not isinstance(node, Mapping):
            return None
        if isinstance(part, int):
            items = node.get("items")
            node = items[part] if isinstance(items, list) and part < len(items) else items
        else:
            props = node.get("properties")
            if isinstance(props, Mapping) and part in props:
                node = props[part]
            elif isinstance(node.get("additionalProperties"), Mapping):
                node = node["additionalProperties"]
            else:
                return None
    return _resolve(node, schema)


def _is_type(value: Any, t: str) -> bool:
    if t == "string":
        return isinstance(value, str)
    if t == "integer":
        return isinstance(value, int) and not isinstance(value, bool)
    if t == "number":
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if t == "boolean":
        return isinstance(value, bool)
    if t == "array":
        return isinstance(value, list)
    if t == "object":
        return isinstance(value, dict)
    return t == "null" and value is None


def _coerce(value: Any, schema: Any) -> Any:
    """The value as the schema's type, when it can be read as one without guessing; _NOTHING otherwise."""
    types = schema_types(schema)
    if not types or any(_is_type(value, t) for t in types):
        return _NOTHING
    if isinstance(value, str):
        text = value.strip()
        if "integer" in types and re.fullmatch(r"[+-]?\d+", text):
            return int(text)
        if "number" in types and _NUMBER.fullmatch(text):
            number = float(text)
            return int(text) if re.fullmatch(r"[+-]?\d+", text) else number
        if "boolean" in types and text.lower() in ("true", "false"):
            return text.lower() == "true"
        if "null" in types and text in ("null", "None"):
            return None
        if types & {"array", "object"} and text[:1] in "[{":
            try:
                decoded = _literal(text)
            except ValueError:
                decoded = None
            if any(_is_type(decoded, t) for t in types & {"array", "object"}):
                return decoded
    if isinstance(value, float) and "integer" in types and value.is_integer():
        return int(value)
    if isinstance(value, int) and not isinstance(value, bool) and "string" in types:
        return str(value)
    if isinstance(value, list) and len(value) == 1 and "array" not in types:
        inner = value[0]
        return inner if any(_is_type(inner, t) for t in types) else _NOTHING
    if "array" in types and not isinstance(value, (list, dict)):
        items = schema.get("items") if isinstance(schema, Mapping) else None
        item_types = schema_types(items)
        if not item_types or any(_is_type(value, t) for t in item_types):
            return [value]
    return _NOTHING


def _get(container: Any, path: Sequence[str | int]) -> Any:
    for part in path:
        container = container[part]
    return container


def _path(ptr: str) -> list[str | int]:
    parts: list[str | int] = []
    for token in ptr.split("/")[2:]:
        token = token.replace("~1", "/").replace("~0", "~")
        parts.append(int(token) if token.isdigit() else token)
    return parts


def _rename(arguments: dict[str, Any], old: str, new: str) -> None:
    """Rename a parameter in place, keeping the order the model wrote them in."""
    items = [(new if k == old else k, v) for k, v in arguments.items()]
    arguments.clear()
    arguments.update(items)


def _fix(violation: Violation, arguments: dict[str, Any], schema: Mapping[str, Any], i: int,
         steps: list[Step]) -> bool:
    """Fix one schema violation in place where the output holds the answer; whether anything changed."""
    path = _path(violation.pointer)
    if not path and violation.kind not in ("missing_required", "unknown_param"):
        return False
    try:
        parent = _get(arguments, path[:-1]) if path else arguments
    except (KeyError, IndexError, TypeError):
        return False
    here = _subschema(schema, path[:-1])
    props = here.get("properties", {}) if isinstance(here, Mapping) else {}
    leaf = path[-1] if path else None
    if violation.kind == "missing_required" and isinstance(parent, dict) and isinstance(leaf, str):
        key = name_key(leaf)
        near = [k for k in parent if k not in props and name_key(k) == key]
        if len(near) == 1:
            _rename(parent, near[0], leaf)
            steps.append(Step(StepKind.PARAM_NAME, "same parameter name up to case and separators", i,
                              violation.pointer, near[0], leaf))
            return True
        default = props.get(leaf, {}).get("default", _NOTHING) if isinstance(props.get(leaf), Mapping) else _NOTHING
        if default is not _NOTHING:
            parent[leaf] = default
            steps.append(Step(StepKind.DEFAULT, "the schema's default for a missing required parameter", i,
                              violation.pointer, None, default))
            return True
        return False
    if violation.kind == "unknown_param" and isinstance(parent, dict) and isinstance(leaf, str) and leaf in parent:
        key = name_key(leaf)
        near = [p for p in props if p not in parent and name_key(p) == key]
        if len(near) == 1:
            _rename(parent, leaf, near[0])
            steps.append(Step(StepKind.PARAM_NAME, "same parameter name up to case and separators", i,
                              violation.pointer, leaf, near[0]))
        else:
            steps.append(Step(StepKind.DROP_UNKNOWN, "the schema forbids parameters it does not declare", i,
                              violation.pointer, {leaf: parent.pop(leaf)}, None))
        return True
    if not isinstance(parent, (dict, list)) or leaf is None:
        return False
    try:
        value = parent[leaf]  # type: ignore[index]
    except (KeyError, IndexError, TypeError):
        return False
    target = _subschema(schema, path)
    if not isinstance(target, Mapping):
        return False
    if violation.kind == "enum" and isinstance(value, str) and isinstance(target.get("enum"), list):
        same = [e for e in target["enum"] if isinstance(e, str) and e.casefold() == value.casefold()]
        if len(same) == 1:
            parent[leaf] = same[0]  # type: ignore[index]
            steps.append(Step(StepKind.ENUM_CASE, "the one allowed value that differs only in case", i,
                              violation.pointer, value, same[0]))
            return True
    coerced = _coerce(value, target)
    if coerced is _NOTHING and isinstance(target.get("enum"), list):
        for allowed in target["enum"]:
            if not isinstance(allowed, str) and isinstance(value, str) and value.strip() == json.dumps(allowed):
                coerced = allowed
    if coerced is not _NOTHING:
        parent[leaf] = coerced  # type: ignore[index]
        steps.append(Step(StepKind.COERCE, f"read as {'/'.join(sorted(schema_types(target))) or 'the enum'}", i,
                          violation.pointer, value, coerced))
        return True
    return False


def _arguments(value: Any, i: int, steps: list[Step]) -> dict[str, Any] | None:
    """Arguments as an object: decoded from a string (one level is how APIs send them; a second is a fault). None when
    they are not an object. Raises _Refused when they were cut mid-value."""
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
            value = _decode(value.strip(), local)
        except ValueError:
            return None
        steps.extend(Step(s.kind, s.reason, i, "/arguments") for s in local)
        if level == 1:
            steps.append(Step(StepKind.DECODE_ARGUMENTS, "the arguments were a JSON string holding a JSON string", i,
                              "/arguments"))
    return None


def _fix_call(raw: _Raw, i: int, index: Mapping[str, Tool], steps: list[Step],
              known: Verdict | None = None) -> tuple[ToolCall | None, Verdict]:
    """Make one call valid where the output holds the answer. `known`: the verdict of the call as read, if any."""
    where = pointer(i)
    try:
        arguments = _arguments(raw.arguments, i, steps)
    except _Refused as exc:
        return None, _failure("truncated", where, str(exc))
    if arguments is None:
        return None, _failure("arguments_not_object", where + "/arguments", "the arguments are not an object")
    name = raw.name
    if name not in index:
        match = _match_tool(name, index)
        if match is not None:
            steps.append(Step(StepKind.TOOL_NAME, match[1], i, "/name", name, match[0]))
            name = match[0]
    call = ToolCall(name, arguments)
    verdict = known if known is not None and name == raw.name else verify(call, index)
    for _ in range(_MAX_ROUNDS):
        if verdict.ok or verdict.stage is not Stage.SCHEMA:
            break
        schema = index[name].input_schema
        fixed = [_fix(v, arguments, schema, i, steps) for v in verdict.violations]
        if not any(fixed):
            break
        verdict = verify(call, index)
    return call, verdict


_MAX_ROUNDS = 6


def _failure(kind: str, where: str, message: str) -> Verdict:
    return Verdict(ok=False, stage=Stage.PARSE, violations=(Violation(Stage.PARSE, kind, where, message),))


def _read_value(value: Any, raw: str, steps: list[Step], index: Mapping[str, Tool]) -> _Reading:
    calls = _unwrap(value, steps)
    return _Reading(calls, []) if calls is not None else _read_text(raw, steps, index)


def holds_call(text: str, tools: Sequence[Any] | Mapping[str, Tool]) -> bool:
    """Whether a model's text holds a tool call, read as `revise` reads it: tagged, fenced, JSON or pythonic (naming
    one of `tools`), or one cut off mid-value. Prose that only mentions a tool holds none."""
    index = tools if isinstance(tools, Mapping) else tool_index(tools)
    reading = _read_text(text, [], index)
    return bool(reading.calls or reading.refused)


def revise(raw: str | bytes | Mapping[str, Any] | Sequence[Any] | ToolCall, tools: Sequence[Any] | Mapping[str, Tool],
           context: Sequence[Any] | None = None) -> Revision:
    """Recover and fix the tool calls in `raw` (see the module docstring). `tools`: the tools the model was offered, in
    any accepted shape, or a ready `tool_index`."""
    index = tools if isinstance(tools, Mapping) else tool_index(tools)
    steps: list[Step] = []
    if isinstance(raw, bytes):
        raw = raw.decode("utf-8", errors="replace")
    if isinstance(raw, str):
        try:
            value: Any = json.loads(raw)
        except (ValueError, RecursionError):
            return _revise(_read_text(raw, steps, index), index, steps)
        text = raw
    else:
        value, text = copy.deepcopy(raw), ""
    if isinstance(value, ToolCall):
        value = value.to_dict()
    if isinstance(value, list):
        return _revise(_read_value(value, text, steps, index), index, steps)
    known = verify(value, index)
    if known.ok and known.call is not None:
        return Revision((known.call,), True, False, (), (known,))
    if known.call is not None:
        return _revise(_Reading([_Raw(known.call.name, known.call.arguments)], []), index, steps, known)
    return _revise(_read_value(value, text, steps, index), index, steps)


def _revise(reading: _Reading, index: Mapping[str, Tool], steps: list[Step], known: Verdict | None = None) -> Revision:
    calls: list[ToolCall] = []
    verdicts: list[Verdict] = []
    problems: list[Verdict] = []
    for i, found in enumerate(reading.calls):
        if not isinstance(found.name, str) or not found.name:
            problems.append(_failure("missing_name", pointer(i, "name"), "the call has no tool name string"))
            continue
        call, verdict = _fix_call(found, i, index, steps, known)
        if call is None:
            problems.append(verdict)
        else:
            calls.append(call)
            verdicts.append(verdict)
    problems.extend(_failure("truncated", "", reason) for reason in reading.refused)
    if not reading.calls and not problems:
        problems.append(_failure("no_call", "", "no tool call found in the output"))
    ok = bool(calls) and not problems and all(v.ok for v in verdicts)
    return Revision(tuple(calls), ok, bool(steps), tuple(steps), tuple(verdicts + problems))
