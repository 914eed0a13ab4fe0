"""One assistant message checked against the request's tools, and revised where it needs it.

The first look is cheap and runs for every answer: each native tool call verified as sent, and, when there are none,
whether the text holds a call the model wrote there (a model without native tool calling, or a server-side parser
that missed it). Only a message that needs it is revised, each broken native call on its own, or the text as a whole:
the reviser's calls replace the broken ones when valid; otherwise the message goes out as the upstream sent it.
"""

from __future__ import annotations

import json
import logging
import re
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from tracemill.names import match_tool
from tracemill.reader import holds_call
from tracemill.repair import revise
from tracemill.revisers import Reviser
from tracemill.revision import Revision, Step
from tracemill.tools import Tool
from tracemill.verify import ToolCall, verify

log = logging.getLogger("tracemill.serving")

UNCHANGED, REVISED, PARTIAL, REFUSED = "unchanged", "revised", "partial", "refused"

# Where text may start holding a call: tags, fences, JSON, a ReAct action, `name(` (checked against the tools).
_MARKER = re.compile(r"<(?:tool_calls?|tool_code|function|function_call|functioncall|tools)\b|<\|python_start\|>"
                     r"|<\|python_tag\|>|<\|tool_call\|>|```|[{\[]|^[ \t]*Action[ \t]*:", re.MULTILINE)
_CALL = re.compile(r"(?<![\w.])([A-Za-z_][\w.]*)[ \t]*\(")
_PARTIAL = re.compile(r"(?:<[\w|=]*|`{1,2}|[\w.]+[ \t]*)$")  # the end of text that may grow into a marker


def hold_at(text: str, index: Mapping[str, Tool]) -> int | None:
    """Where a call may start in `text`; None when nothing there can."""
    marker = _MARKER.search(text)
    end = marker.start() if marker else len(text)
    for match in _CALL.finditer(text, 0, end):
        name = match.group(1)
        if name == "print" or name in index or match_tool(name, index):
            return match.start()
    return marker.start() if marker else None


def releasable(text: str) -> int:
    """How much of text without a marker can be sent before the next piece arrives."""
    partial = _PARTIAL.search(text)
    return partial.start() if partial else len(text)


@dataclass(slots=True)
class Look:
    calls: list[Mapping[str, Any]]  # the native calls as sent
    broken: list[int]  # which of them do not verify
    text_call: bool  # no native calls, and the text holds one

    @property
    def needed(self) -> bool:
        return bool(self.broken) or self.text_call


def _function(call: Mapping[str, Any]) -> Mapping[str, Any]:
    function = call.get("function")
    return function if isinstance(function, Mapping) else {}


def native_raw(call: Mapping[str, Any]) -> str:
    """A native call as the verifier and the collector read it: its name, and its arguments exactly as sent."""
    function = _function(call)
    return json.dumps({"name": function.get("name"), "arguments": function.get("arguments")}, ensure_ascii=False)


def look(content: Any, calls: Sequence[Any] | None, index: Mapping[str, Tool], text_calls: bool) -> Look:
    """`text_calls`: whether calls written in the text count (not when the request said `tool_choice: none`)."""
    native = [c for c in calls or () if isinstance(c, Mapping)]
    broken = [i for i, c in enumerate(native) if not verify(
        {"name": _function(c).get("name"), "arguments": _function(c).get("arguments")}, index).ok]
    text_call = (not native and text_calls and isinstance(content, str) and bool(content.strip())
                 and holds_call(content, index))
    return Look(native, broken, text_call)


@dataclass(slots=True)
class Revised:
    outcome: str
    content: Any  # what the message's content becomes
    tool_calls: list[dict[str, Any]] | None  # None: no native calls to send
    steps: list[Step] = field(default_factory=list)
    revisions: list[Revision] = field(default_factory=list)
    reviser_failed: str | None = None  # why the model reviser failed, when it did (the rules' answer stood)

    @property
    def changed(self) -> bool:
        return self.outcome in (REVISED, PARTIAL)


def openai_call(call: ToolCall, call_id: str | None = None) -> dict[str, Any]:
    return {"id": call_id or f"call_{uuid.uuid4().hex[:24]}", "type": "function",
            "function": {"name": call.name, "arguments": json.dumps(call.arguments, ensure_ascii=False)}}


def ask(reviser: Reviser, raw: str, index: Mapping[str, Tool],
        context: Sequence[Any] | None) -> tuple[Revision, str | None]:
    """The reviser's revision, and why it failed when it did: then the rules' revision stands, so that a model
    reviser that fails never fails the request."""
    try:
        return reviser(raw, index, context), None
    except Exception as exc:
        failed = f"{type(exc).__name__}: {exc}"
        log.warning("the model reviser failed (%s); the rules' answer stands", failed)
        return revise(raw, index, context), failed


def _ask(reviser: Reviser, raw: str, index: Mapping[str, Tool], context: Sequence[Any] | None,
         out: Revised) -> Revision:
    revision, failed = ask(reviser, raw, index, context)
    out.reviser_failed = failed or out.reviser_failed
    return revision


def revise_message(content: Any, seen: Look, index: Mapping[str, Tool], context: Sequence[Any] | None,
                   reviser: Reviser) -> Revised:
    out = Revised(UNCHANGED, content, [dict(c) for c in seen.calls] or None)
    if seen.text_call:
        revision = _ask(reviser, content, index, context, out)
        out.revisions.append(revision)
        if not revision.ok:
            out.outcome = REFUSED
            return out
        out.steps.extend(revision.steps)
        before = content[: hold_at(content, index) or 0]
        out.content = before if before.strip() else None
        out.tool_calls = [openai_call(c) for c in revision.calls]
        out.outcome = REVISED
        return out
    sent: list[dict[str, Any]] = []
    fixed = refused = 0
    for i, call in enumerate(seen.calls):
        if i not in seen.broken:
            sent.append(dict(call))
            continue
        revision = _ask(reviser, native_raw(call), index, context, out)
        out.revisions.append(revision)
        if not revision.ok:
            refused += 1
            sent.append(dict(call))
            continue
        fixed += 1
        out.steps.extend(revision.steps)
        first_id = call.get("id") if isinstance(call.get("id"), str) else None
        sent.extend(openai_call(c, first_id if k == 0 else None) for k, c in enumerate(revision.calls))
    out.tool_calls = sent
    out.outcome = _outcome(fixed, refused)
    return out


def _outcome(fixed: int, refused: int) -> str:
    return UNCHANGED if not (fixed or refused) else REFUSED if not fixed else PARTIAL if refused else REVISED


def combined(outcomes: Iterable[str]) -> str:
    """The outcome of an answer from its choices' (n > 1): as a message's from its calls', `partial` where one choice
    was revised and another refused."""
    seen = set(outcomes)
    return _outcome(bool(seen & {REVISED, PARTIAL}), bool(seen & {REFUSED, PARTIAL}))
