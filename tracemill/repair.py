"""The deterministic reviser: recover the tool calls a model meant from what it emitted (`tracemill.reader`), and make
them valid where the output holds the answer.

    revision = revise(raw, tools)          # raw: model text, a native call's JSON, a dict, or a ToolCall
    revision.ok, revision.calls            # the calls, each valid against its tool when ok
    revision.changed, revision.steps       # what was changed and why (typed Steps)
    revision.verdicts                      # one Verdict per call: what is still wrong where not ok

Fixing, driven by the verifier's violations: near-miss tool names (`tracemill.names`), near-miss parameter names (case
and separators), schema-guided coercion (numeric and boolean strings, JSON-encoded arrays and objects, one value where
an array is expected), enum case, removal of unknown parameters where the schema forbids them, of optional parameters
sent as null where the schema does not take null, schema defaults for missing required parameters where the schema
gives one. In a call that was not valid as sent (read out of text, unwrapped, or failing the verifier), parameters
the tool does not declare are renamed to the declared one they differ from only in case and separators, else
dropped, unless the schema says it takes undeclared parameters: the reviser is rewriting that call anyway, and what
it returns should be the call the tool declares.

Guarantees: a call that already passes `verify` comes back unchanged with no steps; no value is made up (an output cut
mid-value is refused, not completed); of two equally close names none is picked. Where a call cannot be made valid, its
Verdict says what is left. `context` (the conversation) is part of the common reviser signature (`tracemill.revisers`);
the rules read only the output.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from tracemill.jsonish import NOTHING, NUMBER, literal
from tracemill.names import match_tool
from tracemill.reader import Reading, read
from tracemill.revision import Revision, Step, StepKind
from tracemill.tools import Tool, is_json_type, name_key, schema_types, tool_index
from tracemill.verify import Stage, ToolCall, Verdict, Violation, parse_failure, pointer, verify

__all__ = ["Revision", "Step", "StepKind", "revise"]

_MAX_ROUNDS = 6


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


def _coerce(value: Any, schema: Any) -> Any:
    """The value as the schema's type, when it can be read as one without guessing; NOTHING otherwise."""
    types = schema_types(schema)
    if not types or any(is_json_type(value, t) for t in types):
        return NOTHING
    if isinstance(value, str):
        text = value.strip()
        if "integer" in types and re.fullmatch(r"[+-]?\d+", text):
            return int(text)
        if "number" in types and NUMBER.fullmatch(text):
            number = float(text)
            return int(text) if re.fullmatch(r"[+-]?\d+", text) else number
        if "boolean" in types and text.lower() in ("true", "false"):
            return text.lower() == "true"
        if "null" in types and text in ("null", "None"):
            return None
        if types & {"array", "object"} and text[:1] in "[{":
            try:
                decoded = literal(text)
            except ValueError:
                decoded = None
            if any(is_json_type(decoded, t) for t in types & {"array", "object"}):
                return decoded
    if isinstance(value, float) and "integer" in types and value.is_integer():
        return int(value)
    if isinstance(value, int) and not isinstance(value, bool) and "string" in types:
        return str(value)
    if isinstance(value, list) and len(value) == 1 and "array" not in types:
        inner = value[0]
        return inner if any(is_json_type(inner, t) for t in types) else NOTHING
    if "array" in types and not isinstance(value, (list, dict)):
        items = schema.get("items") if isinstance(schema, Mapping) else None
        item_types = schema_types(items)
        if not item_types or any(is_json_type(value, t) for t in item_types):
            return [value]
    return NOTHING


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
        default = props.get(leaf, {}).get("default", NOTHING) if isinstance(props.get(leaf), Mapping) else NOTHING
        if default is not NOTHING:
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
    if violation.kind in ("wrong_type", "no_match") and isinstance(parent, dict) and isinstance(leaf, str) \
            and leaf in parent and parent[leaf] is None:
        required = here.get("required") if isinstance(here, Mapping) else None
        if not (isinstance(required, list) and leaf in required) and "null" not in schema_types(
                _subschema(schema, path)):
            del parent[leaf]
            steps.append(Step(StepKind.DROP_NULL, "an optional parameter sent as null, which the schema does not "
                              "take: it carries no value", i, violation.pointer, {leaf: None}, None))
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
    if coerced is NOTHING and isinstance(target.get("enum"), list):
        for allowed in target["enum"]:
            if not isinstance(allowed, str) and isinstance(value, str) and value.strip() == json.dumps(allowed):
                coerced = allowed
    if coerced is not NOTHING:
        parent[leaf] = coerced  # type: ignore[index]
        steps.append(Step(StepKind.COERCE, f"read as {'/'.join(sorted(schema_types(target))) or 'the enum'}", i,
                          violation.pointer, value, coerced))
        return True
    return False


def _undeclared(arguments: dict[str, Any], schema: Mapping[str, Any], i: int, steps: list[Step]) -> bool:
    """In a call the reviser rewrites anyway: each parameter the tool does not declare is renamed to the one declared
    parameter it differs from only in case and separators, else dropped, unless the schema says it takes parameters
    it does not declare (`additionalProperties` true or a schema) or declares none (no `properties`; `{}` declares
    that there are none). Whether anything changed."""
    root = _resolve(schema, schema)
    props = root.get("properties") if isinstance(root, Mapping) else None
    if not isinstance(props, Mapping):  # a schema that declares no properties at all says nothing of them
        return False
    extra = root.get("additionalProperties", False)
    takes_others = extra is not False
    changed = False
    for key in [k for k in arguments if k not in props]:
        near = [p for p in props if p not in arguments and name_key(p) == name_key(key)]
        if len(near) == 1:
            _rename(arguments, key, near[0])
            steps.append(Step(StepKind.PARAM_NAME, "same parameter name up to case and separators", i,
                              pointer("arguments", key), key, near[0]))
        elif not takes_others:
            steps.append(Step(StepKind.DROP_UNKNOWN, "not a parameter of the tool, in a call that was not valid as "
                              "sent (a call valid as sent keeps it)", i, pointer("arguments", key),
                              {key: arguments.pop(key)}, None))
        else:
            continue
        changed = True
    return changed


def _fix_call(name: str, arguments: dict[str, Any], i: int, index: Mapping[str, Tool], steps: list[Step],
              known: Verdict | None = None, as_sent: bool = False) -> tuple[ToolCall, Verdict]:
    """Make one call valid where the output holds the answer. `known`: the verdict of the call as read, if any;
    `as_sent`: the call was read with no step (not out of text, not unwrapped, not decoded twice)."""
    read_name = name
    if name not in index:
        match = match_tool(name, index)
        if match is not None:
            steps.append(Step(StepKind.TOOL_NAME, match[1], i, "/name", name, match[0]))
            name = match[0]
    call = ToolCall(name, arguments)
    verdict = known if known is not None and name == read_name else verify(call, index)
    if verdict.ok and as_sent and name == read_name:
        return call, verdict
    if name in index and _undeclared(arguments, index[name].input_schema, i, steps):
        verdict = verify(call, index)
    for _ in range(_MAX_ROUNDS):
        if verdict.ok or verdict.stage is not Stage.SCHEMA:
            break
        schema = index[name].input_schema
        fixed = [_fix(v, arguments, schema, i, steps) for v in verdict.violations]
        if not any(fixed):
            break
        verdict = verify(call, index)
    return call, verdict


def revise(raw: str | bytes | Mapping[str, Any] | Sequence[Any] | ToolCall, tools: Sequence[Any] | Mapping[str, Tool],
           context: Sequence[Any] | None = None, reading: Reading | None = None) -> Revision:
    """Recover and fix the tool calls in `raw` (see the module docstring). `tools`: the tools the model was offered, in
    any accepted shape, or a ready `tool_index`; `reading`: `read(raw, index)` where the caller has it already (it is
    left as it was)."""
    index = tools if isinstance(tools, Mapping) else tool_index(tools)
    reading = read(raw, index) if reading is None else reading.own_arguments()
    if reading.exact is None:
        return _revise(reading, index)
    known = verify(reading.exact, index)
    if known.ok:
        return Revision((reading.exact,), True, False, (), (known,))
    return _revise(reading, index, known)


def _revise(reading: Reading, index: Mapping[str, Tool], known: Verdict | None = None) -> Revision:
    steps = list(reading.steps)
    calls: list[ToolCall] = []
    verdicts: list[Verdict] = []
    problems: list[Verdict] = []
    for i, found in enumerate(reading.calls):
        if not isinstance(found.name, str) or not found.name:
            problems.append(parse_failure("missing_name", pointer(i, "name"), "the call has no tool name string"))
            continue
        steps.extend(found.steps)
        if found.arguments is None:
            assert found.problem is not None
            problems.append(found.problem)
            continue
        call, verdict = _fix_call(found.name, found.arguments, i, index, steps, known,
                                  as_sent=not reading.steps and not found.steps)
        calls.append(call)
        verdicts.append(verdict)
    problems.extend(parse_failure("truncated", "", reason) for reason in reading.refused)
    if not reading.calls and not problems:
        problems.append(parse_failure("no_call", "", "no tool call found in the output"))
    ok = bool(calls) and not problems and all(v.ok for v in verdicts)
    return Revision(tuple(calls), ok, bool(steps), tuple(steps), tuple(verdicts + problems))
