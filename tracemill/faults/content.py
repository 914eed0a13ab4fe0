"""Content faults: what a weak model gets wrong in what a call says (names, parameter names, types, values), one small
function a kind. Each changes the call it is given and says whether the intended call can still be recovered."""

from __future__ import annotations

import json
import random
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tracemill.faults.kinds import Fault
from tracemill.tools import Tool, base_name, name_key, schema_types

_EXTRA_PARAMS: tuple[tuple[str, Any], ...] = (
    ("verbose", True), ("format", "json"), ("api_version", "v1"), ("confirm", True), ("request_id", "req-1"),
    ("include_metadata", False), ("timeout", 30),
)


def _split_camel(s: str) -> str:
    return re.sub(r"(?<=[a-z0-9])([A-Z])", r"_\1", s).lower()


def _camel(s: str) -> str:
    head, *rest = re.split(r"[_\-]+", s)
    return head + "".join(p[:1].upper() + p[1:] for p in rest)


def _unique_key(variant: str, target: str, names: Sequence[str]) -> bool:
    key = name_key(variant)
    return [n for n in names if name_key(n) == key] == [target]


def _case_variant(name: str, rng: random.Random) -> str | None:
    options = [v for v in dict.fromkeys((name.upper(), name.lower(), name[:1].swapcase() + name[1:], name.title()))
               if v != name]
    return rng.choice(options) if options else None


def _separator_variant(name: str, rng: random.Random) -> str | None:
    server, sep, tool = name.rpartition(":")
    seps = [s for s in "_-." if s in tool]
    if seps:
        old = rng.choice(seps)
        new = rng.choice([s for s in "_-." if s != old])
        return server + sep + tool.replace(old, new)
    snake = _split_camel(tool)
    return server + sep + snake if snake != tool else None


def _schema(tool: Tool) -> Mapping[str, Any]:
    return tool.input_schema if isinstance(tool.input_schema, Mapping) else {}


def properties(tool: Tool) -> dict[str, Any]:
    props = _schema(tool).get("properties")
    return dict(props) if isinstance(props, Mapping) else {}


@dataclass(frozen=True, slots=True)
class Target:
    """The call a content fault changes, with what the fault needs to know of the tools offered."""

    name: str
    args: dict[str, Any]
    tool: Tool
    names: list[str]  # of every tool offered
    props: dict[str, Any]  # the tool's declared parameters


_Done = tuple[str, dict[str, Any], Fault]  # the call's new name and arguments, and the fault that made them


def _renamed(kind: str, variant: str | None, t: Target) -> _Done | None:
    """The call under another tool name: recoverable when no other offered tool folds to the same key."""
    if variant is None:
        return None
    return variant, t.args, Fault(kind, _unique_key(variant, t.tool.name, t.names), f"{t.name} -> {variant}")


def _tool_name_case(t: Target, rng: random.Random) -> _Done | None:
    return _renamed("tool_name_case", _case_variant(t.name, rng), t)


def _tool_name_separator(t: Target, rng: random.Random) -> _Done | None:
    return _renamed("tool_name_separator", _separator_variant(t.name, rng), t)


def _tool_name_prefix(t: Target, rng: random.Random) -> _Done | None:
    if ":" in t.name:
        variant = t.name.rpartition(":")[2]
        same_base = [n for n in t.names if name_key(base_name(n)) == name_key(variant)]
        return variant, t.args, Fault("tool_name_prefix", same_base == [t.tool.name], f"{t.name} -> {variant}")
    variant = rng.choice(("functions.", "default_api.", "tools.", "mcp__tools__")) + t.name
    return variant, t.args, Fault("tool_name_prefix", _unique_key(t.name, t.tool.name, t.names),
                                  f"{t.name} -> {variant}")


def _param_name(t: Target, rng: random.Random) -> _Done | None:
    if not t.args:
        return None
    param = rng.choice(list(t.args))
    candidates = (_camel(param), _split_camel(param), param.replace("_", "-"), param[:1].upper() + param[1:],
                  param.upper())
    variants = [v for v in dict.fromkeys(candidates) if v != param and v not in t.args]
    if not variants:
        return None
    variant = rng.choice(variants)
    renamed = {variant if k == param else k: v for k, v in t.args.items()}
    required = _schema(t.tool).get("required")
    noticed = _schema(t.tool).get("additionalProperties") is False or isinstance(required, list) and param in required
    recoverable = noticed and _unique_key(variant, param, list(t.props))
    return t.name, renamed, Fault("param_name", recoverable, f"{param} -> {variant}")


def _enum_case(t: Target, rng: random.Random) -> _Done | None:
    options = [p for p, v in t.args.items() if isinstance(v, str) and isinstance(t.props.get(p), Mapping)
               and isinstance(t.props[p].get("enum"), list) and v in t.props[p]["enum"]]
    if not options:
        return None
    param = rng.choice(options)
    enum = [e for e in t.props[param]["enum"] if isinstance(e, str)]
    value = t.args[param]
    variants = [v for v in dict.fromkeys((value.upper(), value.lower(), value.capitalize())) if v not in enum]
    if not variants:
        return None
    variant = rng.choice(variants)
    unique = [e for e in enum if e.casefold() == variant.casefold()] == [value]
    return t.name, {**t.args, param: variant}, Fault("enum_case", unique, f"{param}: {value!r} -> {variant!r}")


def _typed_params(t: Target, python_types: tuple[type, ...]) -> list[str]:
    """Parameters holding a value of these types whose schema says its type and does not take a string."""
    return [p for p, v in t.args.items() if isinstance(v, python_types) and not isinstance(v, bool)
            and schema_types(t.props.get(p)) and "string" not in schema_types(t.props.get(p))]


def _number_as_string(t: Target, rng: random.Random) -> _Done | None:
    options = _typed_params(t, (int, float))
    if not options:
        return None
    param = rng.choice(options)
    return t.name, {**t.args, param: json.dumps(t.args[param])}, Fault("number_as_string", True, param)


def _array_as_string(t: Target, rng: random.Random) -> _Done | None:
    options = _typed_params(t, (list, dict))
    if not options:
        return None
    param = rng.choice(options)
    return (t.name, {**t.args, param: json.dumps(t.args[param], ensure_ascii=False)},
            Fault("array_as_string", True, param))


def _extra_param(t: Target, rng: random.Random) -> _Done | None:
    keys = {name_key(p) for p in (*t.props, *t.args)}
    options = [(p, v) for p, v in _EXTRA_PARAMS if name_key(p) not in keys]
    if not options:
        return None
    param, value = rng.choice(options)
    forbidden = _schema(t.tool).get("additionalProperties") is False
    return t.name, {**t.args, param: value}, Fault("extra_param", forbidden, param)


def _missing_required(t: Target, rng: random.Random) -> _Done | None:
    required = _schema(t.tool).get("required")
    options = [p for p in t.args if isinstance(required, list) and p in required]
    if not options:
        return None
    param = rng.choice(options)
    return t.name, {k: v for k, v in t.args.items() if k != param}, Fault("missing_required", False, param)


CONTENT_FAULTS: dict[str, Callable[[Target, random.Random], _Done | None]] = {
    "tool_name_case": _tool_name_case, "tool_name_separator": _tool_name_separator,
    "tool_name_prefix": _tool_name_prefix, "param_name": _param_name, "enum_case": _enum_case,
    "number_as_string": _number_as_string, "array_as_string": _array_as_string, "extra_param": _extra_param,
    "missing_required": _missing_required,
}
