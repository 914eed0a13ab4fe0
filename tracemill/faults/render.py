"""Rendering faults: how a weak model writes a call (pythonic, wrappers, Python literals, double-encoded arguments, a
missing brace, a cut, tags, fences, prose). Native calls stay `{"name", "arguments"}` with the arguments a JSON
string; text faults make the output assistant text."""

from __future__ import annotations

import json
import random
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tracemill.tools import Tool

_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")


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
class RenderCall:
    name: str
    args: dict[str, Any]
    tool: Tool


def _render_one(call: RenderCall, kinds: set[str], native: bool, last: bool, rng: random.Random) -> str:
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


def _truncate(calls: list[RenderCall], kinds: set[str], native: bool, rng: random.Random,
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


def render(work: list[RenderCall], applied: set[str], native: bool, rng: random.Random) -> tuple[str, dict[str, str]]:
    """The output text of the calls with the rendering faults applied, and details of the faults (where a cut fell)."""

    def _joined() -> str:
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
        body, detail["truncated"] = _truncate(work, applied, native, rng, _joined)
    else:
        body = _joined()
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
    return raw, detail
