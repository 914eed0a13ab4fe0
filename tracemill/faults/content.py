"""Content faults: what a weak model gets wrong in what a call says (names, parameter names, types, values), one small
function a kind. Each changes the call it is given and says whether the intended call can still be recovered: by rules
from the output alone (`Fault.recoverable`), or only from the conversation and the tools' meaning (`Fault.context`,
with the `hint` the user's request must hold). A context fault is applied only where the call it leaves is invalid
and the rules cannot make it valid, so that rules never turn one into a valid wrong call."""

from __future__ import annotations

import json
import random
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tracemill.faults.kinds import Fault
from tracemill.tools import Tool, base_key, base_name, name_key, schema_types

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
    offered: Mapping[str, Tool]  # every tool offered, by name


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
        same_base = [n for n in t.names if base_key(n) == name_key(variant)]
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


# --- recoverable from the conversation and the tools' meaning, never by rules ---------------------------------------

_SYNONYMS = {
    "city": "location", "location": "place", "place": "location", "query": "search", "q": "search",
    "keyword": "term", "keywords": "terms", "term": "phrase", "search": "lookup", "limit": "max", "max": "limit",
    "count": "number", "number": "count", "num": "count", "name": "title", "title": "heading", "id": "identifier",
    "date": "day", "address": "street", "country": "nation", "symbol": "ticker", "ticker": "symbol", "url": "link",
    "link": "url", "text": "content", "content": "body", "message": "content", "email": "mail", "latitude": "lat",
    "longitude": "lng", "lat": "latitude", "lon": "longitude", "lng": "longitude", "username": "handle",
    "user": "account", "topic": "subject", "subject": "topic", "category": "genre", "sort": "ordering",
    "order": "ordering", "page": "offset", "radius": "distance", "amount": "quantity", "quantity": "amount",
    "start": "begin", "end": "finish", "source": "origin", "origin": "source", "destination": "target",
    "target": "destination", "language": "locale", "lang": "locale", "code": "identifier", "type": "kind",
    "value": "amount", "file": "document", "description": "summary", "gene": "locus", "drug": "medication",
    "disease": "condition", "year": "season", "state": "region", "path": "location", "days": "duration",
}
_MONTHS = ("January", "February", "March", "April", "May", "June", "July", "August", "September", "October",
           "November", "December")
_ISO_DATE = re.compile(r"(\d{4})-(\d{2})-(\d{2})")
_NUMERIC_TEXT = re.compile(r"\s*[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?\s*|\s*(true|false|null|None)\s*", re.IGNORECASE)


def _words(name: str) -> list[str]:
    return [w for w in re.split(r"[_\-\s.]+", _split_camel(name)) if w]


def _said(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def _required(t: Target) -> list[str]:
    required = _schema(t.tool).get("required")
    return [r for r in required if isinstance(r, str)] if isinstance(required, list) else []


def _has_default(t: Target, param: str) -> bool:
    return isinstance(t.props.get(param), Mapping) and "default" in t.props[param]


def _scalar(value: Any) -> bool:
    return isinstance(value, (str, int, float)) and not isinstance(value, bool)


def _omitted_value(t: Target, rng: random.Random) -> _Done | None:
    """A required value left out that the user's request states."""
    options = [p for p in t.args if p in _required(t) and _scalar(t.args[p]) and not _has_default(t, p)]
    if not options:
        return None
    param = rng.choice(options)
    hint = f"{' '.join(_words(param)).capitalize()}: {_said(t.args[param])}."
    return (t.name, {k: v for k, v in t.args.items() if k != param},
            Fault("omitted_value", False, param, context=True, hint=hint))


def _synonym(param: str) -> str | None:
    words = _words(param)
    for i, word in enumerate(words):
        if word in _SYNONYMS:
            words[i] = _SYNONYMS[word]
            if "_" in param or "-" in param or param.islower():
                return "_".join(words)
            return _camel("_".join(words))
    return None


def _synonym_param(t: Target, rng: random.Random) -> _Done | None:
    """A required parameter under a synonym (`location` for `city`): not a near miss, so rules cannot map it."""
    taken = {name_key(p) for p in (*t.props, *t.args)}
    options = [(p, s) for p in t.args if p in _required(t) and not _has_default(t, p)
               and (s := _synonym(p)) is not None and name_key(s) not in taken]
    if not options:
        return None
    param, synonym = rng.choice(options)
    renamed = {synonym if k == param else k: v for k, v in t.args.items()}
    return t.name, renamed, Fault("synonym_param", False, f"{param} -> {synonym}", context=True)


def _breaks(value: Any, prop: Any) -> bool:
    """`value` in a parameter of schema `prop` is invalid in a way no rule fixes (not in its enum up to case, or text
    where only a number goes)."""
    if not isinstance(prop, Mapping) or not isinstance(value, str):
        return False
    enum = prop.get("enum")
    if isinstance(enum, list) and enum:
        return value.casefold() not in {str(e).casefold() for e in enum} and value not in map(json.dumps, enum)
    types = schema_types(prop)
    return bool(types) and types <= {"integer", "number"} and not _NUMERIC_TEXT.fullmatch(value)


def _swapped_args(t: Target, rng: random.Random) -> _Done | None:
    """The values of two parameters swapped; the request says which is which."""
    params = [p for p in t.args if _scalar(t.args[p])]
    pairs = [(a, b) for i, a in enumerate(params) for b in params[i + 1:] if t.args[a] != t.args[b]
             and (_breaks(t.args[b], t.props.get(a)) or _breaks(t.args[a], t.props.get(b)))]
    if not pairs:
        return None
    a, b = rng.choice(pairs)
    hint = (f"{' '.join(_words(a)).capitalize()}: {_said(t.args[a])}; "
            f"{' '.join(_words(b))}: {_said(t.args[b])}.")
    return (t.name, {**t.args, a: t.args[b], b: t.args[a]},
            Fault("swapped_args", False, f"{a} <-> {b}", context=True, hint=hint))


def _prose_date(value: str) -> str | None:
    match = _ISO_DATE.match(value)
    if match is None or not 1 <= int(match[2]) <= 12:
        return None
    return f"{_MONTHS[int(match[2]) - 1]} {int(match[3])}, {match[1]}"


def _wrong_format(t: Target, rng: random.Random) -> _Done | None:
    """A value in the wrong format where the schema says the format: an enum written as prose, a date written out."""
    options: list[tuple[str, str]] = []
    for param, value in t.args.items():
        prop = t.props.get(param)
        if not isinstance(value, str) or not isinstance(prop, Mapping):
            continue
        enum = prop.get("enum")
        if isinstance(enum, list) and value in enum:
            prose = f"{' '.join(_words(value))} {' '.join(_words(param))}".strip()
            if prose.casefold() not in {str(e).casefold() for e in enum}:
                options.append((param, prose))
        elif (prose := _prose_date(value)) is not None:
            pattern = prop.get("pattern")
            if prop.get("format") == "date" or (isinstance(pattern, str) and re.search(pattern, prose) is None):
                options.append((param, prose))
    if not options:
        return None
    param, prose = rng.choice(options)
    return (t.name, {**t.args, param: prose},
            Fault("wrong_format", False, f"{param}: {t.args[param]!r} -> {prose!r}", context=True))


def _wrong_tool(t: Target, rng: random.Random) -> _Done | None:
    """Another tool of the same server, with the arguments meant for this one; the request names what is wanted. Only
    a tool that needs a parameter the call lacks (and has no default for it), so that no rule makes the call valid."""
    server = t.tool.name.rpartition(":")[0]
    keys = {name_key(k) for k in t.args}
    options = []
    for other in t.offered.values():
        if other.name == t.tool.name or other.name.rpartition(":")[0] != server:
            continue
        schema = other.input_schema if isinstance(other.input_schema, Mapping) else {}
        props = schema.get("properties") if isinstance(schema.get("properties"), Mapping) else {}
        required = schema.get("required") if isinstance(schema.get("required"), list) else []
        if any(isinstance(r, str) and name_key(r) not in keys
               and not (isinstance(props.get(r), Mapping) and "default" in props[r]) for r in required):
            options.append(other.name)
    if not options:
        return None
    other = rng.choice(sorted(options))
    hint = f"Use {' '.join(_words(base_name(t.tool.name)))} for this."
    return other, t.args, Fault("wrong_tool", False, f"{t.name} -> {other}", context=True, hint=hint)


CONTENT_FAULTS: dict[str, Callable[[Target, random.Random], _Done | None]] = {
    "tool_name_case": _tool_name_case, "tool_name_separator": _tool_name_separator,
    "tool_name_prefix": _tool_name_prefix, "param_name": _param_name, "enum_case": _enum_case,
    "number_as_string": _number_as_string, "array_as_string": _array_as_string, "extra_param": _extra_param,
    "missing_required": _missing_required, "omitted_value": _omitted_value, "synonym_param": _synonym_param,
    "swapped_args": _swapped_args, "wrong_format": _wrong_format, "wrong_tool": _wrong_tool,
}
