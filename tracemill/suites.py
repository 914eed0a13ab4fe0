"""The cases `tracemill eval` measures revisers on: a case file of your own, or a built-in suite made from real data.

A case is one model output with the tools it was offered: `{"tools": [...], "raw": "...", "reference": [ToolCall...] |
null, "context": [...] | null}`, optionally with `"id"`, `"accepted"` (BFCL possible answers, one
`{function: {param: [accepted values]}}` per expected call), `"recoverable"`, `"context_recoverable"` and `"faults"`
(from the fault library).

Built-in suites: `bfcl` corrupts BFCL v4 ground truth with the seeded fault library (`tracemill.faults`) under each
weak-model profile, each case with BFCL's question as its conversation; `mcp-bench` does the same to one example call
per MCP-Bench tool; `do-no-harm` holds valid calls only. A case with context faults (`tracemill.faults.CONTEXT_KINDS`)
carries what the user said that the output lost, as the last user turn of its `context`.
"""

from __future__ import annotations

import json
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from tracemill.bfcl import Answer, answers_for, load_bfcl
from tracemill.examples import example_call
from tracemill.faults import WEAK_PROFILES, corrupt_calls, sample_faults
from tracemill.tools import Tool, ToolFormatError, load_mcp_bench, normalize_tools
from tracemill.verify import ToolCall, Verdict, parse_call

SUITES = ("bfcl", "mcp-bench", "do-no-harm")


@dataclass(frozen=True, slots=True)
class Case:
    id: str
    tools: tuple[Tool, ...]
    raw: str
    reference: tuple[ToolCall, ...] | None = None
    context: list[Any] | None = None
    accepted: tuple[Answer, ...] | None = None
    recoverable: bool | None = None
    faults: tuple[str, ...] = ()
    context_recoverable: bool | None = None  # rules cannot recover it; a reviser reading the context can

    def answers(self) -> list[Answer] | None:
        if self.accepted is not None:
            return list(self.accepted)
        return answers_for(self.reference) if self.reference is not None else None

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "tools": [t.to_mcp() for t in self.tools], "raw": self.raw,
                "reference": [c.to_dict() for c in self.reference] if self.reference is not None else None,
                "context": self.context, "accepted": list(self.accepted) if self.accepted is not None else None,
                "recoverable": self.recoverable, "faults": list(self.faults),
                "context_recoverable": self.context_recoverable}


class CaseError(ValueError):
    """A case file that cannot be read; the message names the line and the field."""


_JSON_TEXT_FIELDS = ("tools", "reference", "context", "accepted")  # JSON text in a miner's export (Arrow-friendly)


def case_from_dict(obj: Any, where: str) -> Case:
    """One case; `tools`, `reference`, `context` and `accepted` may also be JSON text, as `tracemill mine` writes."""
    if not isinstance(obj, Mapping):
        raise CaseError(f"{where}: expected an object, got {type(obj).__name__}")
    obj = dict(obj)
    for key in _JSON_TEXT_FIELDS:
        if isinstance(obj.get(key), str):
            try:
                obj[key] = json.loads(obj[key])
            except ValueError as exc:
                raise CaseError(f"{where}: {key!r} is text but not JSON ({exc})") from None
    try:
        tools = tuple(normalize_tools(obj.get("tools")))
    except ToolFormatError as exc:
        raise CaseError(f"{where}: {exc}") from None
    raw = obj.get("raw")
    if isinstance(raw, (dict, list)):
        raw = json.dumps(raw, ensure_ascii=False)
    if not isinstance(raw, str):
        raise CaseError(f"{where}: 'raw' must be the model's output as a string")
    reference = obj.get("reference")
    if reference is not None:
        if not isinstance(reference, list):
            raise CaseError(f"{where}: 'reference' must be a list of calls or null")
        calls = []
        for i, item in enumerate(reference):
            parsed = parse_call(item)
            if isinstance(parsed, Verdict):
                raise CaseError(f"{where}: reference[{i}]: {parsed.violations[0].message}")
            calls.append(parsed)
        reference = tuple(calls)
    context = obj.get("context")
    if context is not None and not isinstance(context, list):
        raise CaseError(f"{where}: 'context' must be a list of messages or null")
    accepted = obj.get("accepted")
    if accepted is not None and not (isinstance(accepted, list) and all(
            isinstance(a, dict) and len(a) == 1 for a in accepted)):
        raise CaseError(f"{where}: 'accepted' must be a list of {{function: {{param: [values]}}}}")
    return Case(str(obj.get("id", where)), tools, raw, reference, context,
                tuple(accepted) if accepted is not None else None, obj.get("recoverable"),
                tuple(obj.get("faults") or ()), obj.get("context_recoverable"))


def read_cases(path: str | Path) -> list[Case]:
    cases = []
    with open(path, "rb") as fh:
        for n, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                obj = orjson.loads(line)
            except orjson.JSONDecodeError as exc:
                raise CaseError(f"{path}:{n}: not valid JSON ({exc})") from None
            cases.append(case_from_dict(obj, f"{path}:{n}"))
    return cases


def _rng(seed: int, *parts: str) -> random.Random:
    return random.Random(":".join((str(seed), *parts)))


def bfcl_suite(seed: int = 0, profiles: Sequence[str] = WEAK_PROFILES) -> list[Case]:
    cases = []
    for case in load_bfcl():
        reference = case.reference()
        for profile in profiles:
            rng = _rng(seed, profile, case.id)
            bad = corrupt_calls(reference, case.tools, sample_faults(profile, rng, n_calls=len(reference)), rng)
            context = [{"role": "user", "content": case.question}]
            if bad.hints:
                context.append({"role": "user", "content": " ".join(bad.hints)})
            cases.append(Case(f"{case.id}/{profile}", case.tools, bad.raw, tuple(reference), context, case.answers,
                              bad.recoverable, bad.kinds, bad.context_recoverable))
    return cases


def _mcp_calls() -> list[tuple[str, tuple[Tool, ...], ToolCall]]:
    out = []
    for server, tools in load_mcp_bench().items():
        for tool in tools:
            call = example_call(tool)
            if call is not None:
                out.append((server, tuple(tools), call))
    return out


def mcp_bench_suite(seed: int = 0, profiles: Sequence[str] = WEAK_PROFILES) -> list[Case]:
    cases = []
    for server, tools, call in _mcp_calls():
        for profile in profiles:
            rng = _rng(seed, profile, call.name)
            bad = corrupt_calls([call], tools, sample_faults(profile, rng, n_calls=1), rng)
            context = [{"role": "user", "content": " ".join(bad.hints)}] if bad.hints else None
            cases.append(Case(f"{call.name}/{profile}", tools, bad.raw, (call,), context, None, bad.recoverable,
                              bad.kinds, bad.context_recoverable))
    return cases


def do_no_harm_suite() -> list[Case]:
    """Valid calls only, as native calls (arguments a JSON string) and as JSON text (arguments an object)."""
    found: list[tuple[str, tuple[Tool, ...], list[ToolCall]]] = [(c.id, c.tools, c.reference()) for c in load_bfcl()]
    found += [(call.name, tools, [call]) for _, tools, call in _mcp_calls()]
    cases = []
    for case_id, tools, calls in found:
        if len(calls) != 1:
            continue
        call = calls[0]
        native = json.dumps({"name": call.name, "arguments": json.dumps(call.arguments, ensure_ascii=False)},
                            ensure_ascii=False)
        cases.append(Case(f"{case_id}/native", tools, native, (call,), recoverable=True))
        cases.append(Case(f"{case_id}/json", tools, json.dumps(call.to_dict(), ensure_ascii=False), (call,),
                          recoverable=True))
    return cases


def load_suite(name: str, seed: int = 0) -> list[Case]:
    if name == "bfcl":
        return bfcl_suite(seed)
    if name == "mcp-bench":
        return mcp_bench_suite(seed)
    if name == "do-no-harm":
        return do_no_harm_suite()
    raise CaseError(f"unknown suite {name!r}; built-in suites: {', '.join(SUITES)}")
