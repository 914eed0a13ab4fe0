"""The seeded fault library: how a weak open model breaks a tool call, at per-profile rates.

One library for `tracemill simulate` and for `tracemill eval`'s `bfcl` suite.

    rng = random.Random(seed)
    kinds = sample_faults("llama3.1-8b", rng)             # e.g. ["number_as_string", "python_tag"]
    kinds = sample_faults("llama3.1-8b", rng, n_calls=1)  # the output is meant to hold one call
    bad = corrupt(call, tool, tools, kinds, rng)          # Corrupted(raw, native, faults)
    bad = corrupt_calls([c1, c2], tools, kinds, rng)      # several calls in one output

`Corrupted.native` is True when `raw` is a native tool call's JSON, `{"name", "arguments"}` with `arguments` a JSON
string as the OpenAI API sends it (or a JSON array of such calls), and False when `raw` is assistant text content that
holds the call(s). A call is native unless a text-only fault (`TEXT_KINDS`) was applied. Without faults, `raw` is a
valid native call (for several calls, a JSON array of valid native calls).

`Corrupted.faults` lists the faults actually applied, in `KINDS` order; a kind that does not apply to the call (e.g.
`enum_case` on a tool without enums, `missing_required` on one without required parameters) is skipped and not
listed. `Fault.recoverable` says whether the intended call can still be read from the output: a near-miss tool name
is recoverable when no other offered tool shares its folded form (`repair.name_key`, or its base name for server
prefixes); a near-miss parameter name likewise among the parameters, and only when the call is invalid without it
(the schema forbids unknown parameters or the parameter is required; otherwise the call is valid as sent); an unknown
extra parameter when the schema forbids unknown parameters; `missing_required` and `truncated` (cut mid-value) never
are.

Everything is deterministic for a given `random.Random` state; nothing here reads the clock or global randomness.
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from tracemill.tools import Tool, base_name, name_key, schema_types
from tracemill.verify import ToolCall

# Content faults change what the call says; rendering faults change how it is written. Applied in this order.
CONTENT_KINDS: tuple[str, ...] = (
    "tool_name_case", "tool_name_separator", "tool_name_prefix", "param_name", "enum_case", "number_as_string",
    "array_as_string", "extra_param", "missing_required",
)
RENDER_KINDS: tuple[str, ...] = (
    "pythonic", "wrapper", "python_literals", "double_encoded", "concatenated", "missing_brace", "truncated",
    "python_tag", "tool_call_tag", "fence", "prose",
)
KINDS: tuple[str, ...] = CONTENT_KINDS + RENDER_KINDS
TEXT_KINDS: frozenset[str] = frozenset(
    {"pythonic", "wrapper", "concatenated", "python_tag", "tool_call_tag", "fence", "prose"})

# A kind drawn later in KINDS order is dropped when an earlier drawn kind excludes it.
_EXCLUDES: dict[str, frozenset[str]] = {
    "pythonic": frozenset({"wrapper", "python_literals", "double_encoded", "concatenated", "missing_brace"}),
    "double_encoded": frozenset({"truncated"}),
    "missing_brace": frozenset({"truncated"}),
    "python_tag": frozenset({"tool_call_tag"}),
}


@dataclass(frozen=True, slots=True)
class Fault:
    kind: str
    recoverable: bool
    detail: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "recoverable": self.recoverable, "detail": self.detail}


@dataclass(frozen=True, slots=True)
class Corrupted:
    raw: str
    native: bool
    faults: tuple[Fault, ...] = ()

    @property
    def recoverable(self) -> bool:
        return all(f.recoverable for f in self.faults)

    @property
    def kinds(self) -> tuple[str, ...]:
        return tuple(f.kind for f in self.faults)


@dataclass(frozen=True, slots=True)
class Profile:
    name: str
    rates: Mapping[str, float] = field(default_factory=dict)
    description: str = ""


PROFILES: dict[str, Profile] = {
    "clean": Profile("clean", {}, "A model that always emits a valid native tool call."),
    "llama3.1-8b": Profile("llama3.1-8b", {
        "tool_name_case": 0.02, "tool_name_separator": 0.03, "tool_name_prefix": 0.03, "param_name": 0.04,
        "enum_case": 0.05, "number_as_string": 0.08, "array_as_string": 0.06, "extra_param": 0.04,
        "missing_required": 0.04, "pythonic": 0.08, "wrapper": 0.06, "python_literals": 0.03, "double_encoded": 0.04,
        "concatenated": 0.03, "missing_brace": 0.04, "truncated": 0.01, "python_tag": 0.12, "tool_call_tag": 0.02,
        "fence": 0.04, "prose": 0.06,
    }, "Llama 3.1 8B through a generic parser: tool calls leak as text, pythonic calls, loose types."),
    "gemma3-27b": Profile("gemma3-27b", {
        "tool_name_case": 0.01, "tool_name_separator": 0.02, "tool_name_prefix": 0.02, "param_name": 0.02,
        "enum_case": 0.03, "number_as_string": 0.04, "array_as_string": 0.03, "extra_param": 0.02,
        "missing_required": 0.02, "pythonic": 0.10, "wrapper": 0.03, "python_literals": 0.02, "double_encoded": 0.01,
        "concatenated": 0.01, "missing_brace": 0.02, "truncated": 0.005, "tool_call_tag": 0.02, "fence": 0.15,
        "prose": 0.10,
    }, "Gemma 3 27B, no native tool-call format: fenced JSON or code with prose around it."),
    "qwen3": Profile("qwen3", {
        "tool_name_case": 0.005, "tool_name_separator": 0.01, "tool_name_prefix": 0.01, "param_name": 0.01,
        "enum_case": 0.02, "number_as_string": 0.03, "array_as_string": 0.03, "extra_param": 0.01,
        "missing_required": 0.01, "double_encoded": 0.02, "concatenated": 0.01, "missing_brace": 0.01,
        "truncated": 0.005, "tool_call_tag": 0.05, "prose": 0.03,
    }, "Qwen3: mostly native calls; Hermes <tool_call> text leaks when the parser misses, loose types."),
}


WEAK_PROFILES: tuple[str, ...] = ("llama3.1-8b", "gemma3-27b", "qwen3")  # the open models the suites and demo use


def _profile(profile: str | Profile) -> Profile:
    if isinstance(profile, Profile):
        return profile
    try:
        return PROFILES[profile]
    except KeyError:
        raise ValueError(f"unknown model profile {profile!r}; known: {', '.join(sorted(PROFILES))}") from None


def sample_faults(profile: str | Profile, rng: random.Random, n_calls: int | None = None) -> list[str]:
    """Draw each kind independently at the profile's rate, then drop kinds excluded by one drawn earlier. With
    `n_calls=1` (an output known to hold one intended call) `concatenated`, which joins several calls, is not drawn."""
    rates = _profile(profile).rates
    drawn = [k for k in KINDS if rng.random() < rates.get(k, 0.0)]
    if n_calls == 1:
        drawn = [k for k in drawn if k != "concatenated"]
    kept: list[str] = []
    for kind in drawn:
        if not any(kind in _EXCLUDES.get(k, ()) for k in kept):
            kept.append(kind)
    return kept


# --- content faults -------------------------------------------------------------------------------------------------

_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")
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


def _properties(tool: Tool) -> dict[str, Any]:
    props = _schema(tool).get("properties")
    return dict(props) if isinstance(props, Mapping) else {}


@dataclass(frozen=True, slots=True)
class _Target:
    """The call a content fault changes, with what the fault needs to know of the tools offered."""

    name: str
    args: dict[str, Any]
    tool: Tool
    names: list[str]  # of every tool offered
    props: dict[str, Any]  # the tool's declared parameters


_Done = tuple[str, dict[str, Any], Fault]  # the call's new name and arguments, and the fault that made them


def _tool_name_case(t: _Target, rng: random.Random) -> _Done | None:
    variant = _case_variant(t.name, rng)
    if variant is None:
        return None
    return variant, t.args, Fault("tool_name_case", _unique_key(variant, t.tool.name, t.names),
                                  f"{t.name} -> {variant}")


def _tool_name_separator(t: _Target, rng: random.Random) -> _Done | None:
    variant = _separator_variant(t.name, rng)
    if variant is None:
        return None
    return variant, t.args, Fault("tool_name_separator", _unique_key(variant, t.tool.name, t.names),
                                  f"{t.name} -> {variant}")


def _tool_name_prefix(t: _Target, rng: random.Random) -> _Done | None:
    if ":" in t.name:
        variant = t.name.rpartition(":")[2]
        same_base = [n for n in t.names if name_key(base_name(n)) == name_key(variant)]
        return variant, t.args, Fault("tool_name_prefix", same_base == [t.tool.name], f"{t.name} -> {variant}")
    variant = rng.choice(("functions.", "default_api.", "tools.", "mcp__tools__")) + t.name
    return variant, t.args, Fault("tool_name_prefix", _unique_key(t.name, t.tool.name, t.names),
                                  f"{t.name} -> {variant}")


def _param_name(t: _Target, rng: random.Random) -> _Done | None:
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


def _enum_case(t: _Target, rng: random.Random) -> _Done | None:
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


def _typed_params(t: _Target, python_types: tuple[type, ...]) -> list[str]:
    """Parameters holding a value of these types whose schema says its type and does not take a string."""
    return [p for p, v in t.args.items() if isinstance(v, python_types) and not isinstance(v, bool)
            and schema_types(t.props.get(p)) and "string" not in schema_types(t.props.get(p))]


def _number_as_string(t: _Target, rng: random.Random) -> _Done | None:
    options = _typed_params(t, (int, float))
    if not options:
        return None
    param = rng.choice(options)
    return t.name, {**t.args, param: json.dumps(t.args[param])}, Fault("number_as_string", True, param)


def _array_as_string(t: _Target, rng: random.Random) -> _Done | None:
    options = _typed_params(t, (list, dict))
    if not options:
        return None
    param = rng.choice(options)
    return (t.name, {**t.args, param: json.dumps(t.args[param], ensure_ascii=False)},
            Fault("array_as_string", True, param))


def _extra_param(t: _Target, rng: random.Random) -> _Done | None:
    keys = {name_key(p) for p in (*t.props, *t.args)}
    options = [(p, v) for p, v in _EXTRA_PARAMS if name_key(p) not in keys]
    if not options:
        return None
    param, value = rng.choice(options)
    forbidden = _schema(t.tool).get("additionalProperties") is False
    return t.name, {**t.args, param: value}, Fault("extra_param", forbidden, param)


def _missing_required(t: _Target, rng: random.Random) -> _Done | None:
    required = _schema(t.tool).get("required")
    options = [p for p in t.args if isinstance(required, list) and p in required]
    if not options:
        return None
    param = rng.choice(options)
    return t.name, {k: v for k, v in t.args.items() if k != param}, Fault("missing_required", False, param)


_CONTENT_FAULTS: dict[str, Callable[[_Target, random.Random], _Done | None]] = {
    "tool_name_case": _tool_name_case, "tool_name_separator": _tool_name_separator,
    "tool_name_prefix": _tool_name_prefix, "param_name": _param_name, "enum_case": _enum_case,
    "number_as_string": _number_as_string, "array_as_string": _array_as_string, "extra_param": _extra_param,
    "missing_required": _missing_required,
}


# --- rendering ------------------------------------------------------------------------------------------------------

def _py(value: Any) -> str:
    """A Python literal for a JSON value, strings in double quotes as models write them."""
    if isinstance(value, bool) or value is None:
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, list):
        return "[" + ", ".join(_py(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{_py(str(k))}: {_py(v)}" for k, v in value.items()) + "}"
    return _py(str(value))


def _pythonic(name: str, args: Mapping[str, Any]) -> str:
    fn = name if _IDENT.fullmatch(name) else re.sub(r"\W+", "_", name).strip("_") or "call"
    plain = [f"{k}={_py(v)}" for k, v in args.items() if k.isidentifier()]
    odd = {k: v for k, v in args.items() if not k.isidentifier()}
    if odd:
        plain.append("**" + _py(odd))
    return f"{fn}({', '.join(plain)})"


_SENTINEL = "TRACEMILL_TRUNCATE_HERE"
_PROSE_BEFORE = ("Sure! I'll call the tool for that.", "Let me look that up for you.",
                 "To answer this, I need to use a tool:", "I will now call the appropriate function.")
_PROSE_AFTER = ("Let me know if you need anything else.", "I'll wait for the result.", "")


@dataclass(slots=True)
class _Call:
    name: str
    args: dict[str, Any]
    tool: Tool


def _render_one(call: _Call, kinds: set[str], native: bool, last: bool, rng: random.Random) -> str:
    """One call's text: pythonic, or JSON (native: arguments as a JSON string, which `missing_brace` cuts short of its
    last `}`; in text, `missing_brace` drops the output's final `}` or `]`)."""
    if "pythonic" in kinds:
        return _pythonic(call.name, call.args)
    literal = repr if "python_literals" in kinds else (lambda v: json.dumps(v, ensure_ascii=False))
    drop_brace = last and native and "missing_brace" in kinds
    if native:
        arguments: Any = literal(call.args)
        if drop_brace:
            arguments = arguments[:-1]
        if "double_encoded" in kinds:
            arguments = json.dumps(arguments, ensure_ascii=False)
        return json.dumps({"name": call.name, "arguments": arguments}, ensure_ascii=False)
    arguments = json.dumps(json.dumps(call.args, ensure_ascii=False), ensure_ascii=False) \
        if "double_encoded" in kinds else call.args
    if "wrapper" in kinds:
        obj = rng.choice(({"name": call.name, "parameters": arguments}, {"tool": call.name, "args": arguments},
                          {"type": "function", "name": call.name, "parameters": arguments}))
    else:
        obj = {"name": call.name, "arguments": arguments}
    return literal(obj)


def _truncate(calls: list[_Call], kinds: set[str], native: bool, rng: random.Random,
              render: Any) -> tuple[str, str]:
    """Render, cut inside one string value of the last call, or inside its name when it has no string values: an
    output that visibly stops mid-value (a number cut short would look complete)."""
    last = calls[-1]
    strings = [p for p, v in last.args.items() if isinstance(v, str)]
    if not strings:
        full = render()
        at = full.rfind(last.name)
        return full[: at + rng.randint(1, max(1, len(last.name) - 1))], "name"
    param = rng.choice(strings)
    value = last.args[param]
    last.args[param] = _SENTINEL
    full = render()
    last.args[param] = value
    if "pythonic" in kinds:
        shown = _py(value)
    elif "python_literals" in kinds:
        shown = repr(value)
    else:
        shown = json.dumps(value, ensure_ascii=False)
    if native:
        shown = json.dumps(shown, ensure_ascii=False)[1:-1]
    at = re.search(r"\\?[\"']" + _SENTINEL, full)
    assert at is not None, "the sentinel is rendered as a quoted string"
    quote = 2 if native else 1
    return full[: at.start()] + shown[: rng.randint(quote, max(quote, len(shown) - quote))], param


def corrupt_calls(calls: Sequence[ToolCall], tools: Sequence[Tool], kinds: Sequence[str],
                  rng: random.Random) -> Corrupted:
    """Write `calls` (each naming one of `tools`) as a model with the given fault kinds would. Content faults hit one
    call drawn at random; `concatenated` with a single call writes it twice."""
    index = {t.name: t for t in tools}
    strangers = [c.name for c in calls if c.name not in index]
    if strangers:
        raise ValueError(f"calls name tools that were not offered: {', '.join(strangers)}")
    work = [_Call(c.name, dict(c.arguments), index[c.name]) for c in calls]
    wanted = set(kinds)
    unknown = wanted - set(KINDS)
    if unknown:
        raise ValueError(f"unknown fault kind(s): {', '.join(sorted(unknown))}")
    names = [t.name for t in tools]
    faults: list[Fault] = []
    for kind in CONTENT_KINDS:
        if kind in wanted and work:
            target = rng.choice(work)
            done = _CONTENT_FAULTS[kind](
                _Target(target.name, target.args, target.tool, names, _properties(target.tool)), rng)
            if done is not None:
                target.name, target.args, fault = done
                faults.append(fault)
    applied = {k for k in RENDER_KINDS if k in wanted}
    if "concatenated" in applied and len(work) == 1:
        work = [work[0], _Call(work[0].name, dict(work[0].args), work[0].tool)]
    native = not (applied & TEXT_KINDS)
    if native and work and not work[-1].args:
        applied.discard("missing_brace")  # "{" alone would read as cut short, not as a missing brace

    def render() -> str:
        parts = [_render_one(c, applied, native, i == len(work) - 1, rng) for i, c in enumerate(work)]
        if "pythonic" in applied:
            return "[" + ", ".join(parts) + "]"
        if len(parts) == 1:
            return parts[0]
        if "concatenated" in applied:
            return rng.choice(("", "\n", " ")).join(parts)
        return "[" + ", ".join(parts) + "]"

    detail: dict[str, str] = {}
    if "truncated" in applied and work:
        body, detail["truncated"] = _truncate(work, applied, native, rng, render)
    else:
        body = render()
        if "missing_brace" in applied and not native and body.endswith(("}", "]")):
            body = body[:-1]
    truncated = "truncated" in applied
    prefix = suffix = ""
    if "python_tag" in applied:
        prefix, suffix = "<|python_start|>", "<|python_end|>"
    elif "tool_call_tag" in applied:
        prefix, suffix = "<tool_call>\n", "\n</tool_call>"
    if "fence" in applied:
        lang = "python" if "pythonic" in applied else rng.choice(("json", "", "tool_code"))
        prefix, suffix = f"```{lang}\n{prefix}", f"{suffix}\n```"
    if "prose" in applied:
        prefix = rng.choice(_PROSE_BEFORE) + "\n\n" + prefix
        after = rng.choice(_PROSE_AFTER)
        suffix = suffix + ("\n\n" + after if after else "")
    raw = prefix + body + ("" if truncated else suffix)
    for kind in RENDER_KINDS:
        if kind in applied:
            faults.append(Fault(kind, kind != "truncated", detail.get(kind, "")))
    return Corrupted(raw=raw, native=native, faults=tuple(faults))


def corrupt(call: ToolCall, tool: Tool, tools: Sequence[Tool], kinds: Sequence[str],
            rng: random.Random) -> Corrupted:
    """Write one call to `tool` (one of `tools`, the tools the model was offered) with the given fault kinds."""
    if tool.name not in {t.name for t in tools}:
        tools = [*tools, tool]
    return corrupt_calls([call], tools, kinds, rng)
