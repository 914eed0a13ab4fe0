"""`tracemill eval`: the yardstick every reviser is measured with.

A case is one model output with the tools it was offered: `{"tools": [...], "raw": "...", "reference": [ToolCall...] |
null, "context": [...] | null}`, optionally with `"id"`, `"accepted"` (BFCL possible answers, one
`{function: {param: [accepted values]}}` per expected call), `"recoverable"` and `"faults"` (from the fault library).

Metrics, per reviser (`none` is the output as sent, i.e. "before"): MCP-Bench's rule-based metrics (JSON validity,
valid tool name rate, input schema compliance), verified-ok rate, agreement with the reference in BFCL's AST manner,
recovery of the cases whose intent survives the faults, confident wrong answers, the share of valid inputs changed
(must be 0) and latency per revision.

Built-in suites (`--cases bfcl|mcp-bench|do-no-harm`): `bfcl` corrupts BFCL v4 ground truth with the seeded fault
library (`tracemill.faults`) under each model profile; `mcp-bench` does the same to one example call per MCP-Bench tool;
`do-no-harm` holds valid calls only.
"""

from __future__ import annotations

import difflib
import json
import random
import re
import statistics
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import click
import json_repair
import orjson

from tracemill.faults import corrupt_calls, sample_faults
from tracemill.repair import Revision, Step, StepKind, name_key, revise, schema_types
from tracemill.tools import Tool, ToolFormatError, load_mcp_bench, normalize_tool, normalize_tools
from tracemill.verify import Stage, ToolCall, Verdict, Violation, parse_call, tool_index, verify

BFCL_CATEGORIES = ("simple_python", "multiple", "parallel", "live_simple")
SUITES = ("bfcl", "mcp-bench", "do-no-harm")
SUITE_PROFILES = ("llama3.1-8b", "gemma3-27b", "qwen3")
DEFAULT_REVISERS = ("none", "json-repair", "rules")

Answer = dict[str, dict[str, list[Any]]]


# --- BFCL -----------------------------------------------------------------------------------------------------------

def _first_accepted(value: Any) -> Any:
    """A concrete value from BFCL's nested accepted-values form (dicts map keys to lists of accepted values)."""
    if isinstance(value, dict):
        return {k: _first_accepted(vs[0]) for k, vs in value.items() if isinstance(vs, list) and vs and vs[0] != ""}
    if isinstance(value, list):
        return [_first_accepted(v) for v in value]
    return value


@dataclass(frozen=True, slots=True)
class BfclCase:
    """One BFCL row: the functions offered, the user's question, and the accepted answers, one
    `{function: {param: [accepted values]}}` per expected call (`""` among the values: the parameter may be left out)."""

    id: str
    tools: tuple[Tool, ...]
    question: str
    answers: tuple[Answer, ...]

    def reference(self) -> list[ToolCall]:
        """The expected calls, each parameter at its first accepted value (left out where that is `""`)."""
        calls = []
        for answer in self.answers:
            (name, params), = answer.items()
            calls.append(ToolCall(name, {p: _first_accepted(values[0]) for p, values in params.items()
                                         if values and values[0] != ""}))
        return calls


def bfcl_tool(function: dict[str, Any]) -> Tool:
    """A BFCL function as a Tool. BFCL's AST checker rejects parameters a function does not declare, so the tool's
    schema says so (`additionalProperties: false`)."""
    tool = normalize_tool(function, where=f"BFCL function {function.get('name')!r}")
    return Tool(tool.name, tool.description, {**tool.input_schema, "additionalProperties": False})


def _jsonl(name: str) -> list[dict[str, Any]]:
    text = resources.files("tracemill").joinpath(f"data/bfcl/{name}").read_bytes()
    return [orjson.loads(line) for line in text.splitlines() if line.strip()]


def load_bfcl(categories: Sequence[str] = BFCL_CATEGORIES) -> list[BfclCase]:
    """The BFCL subset shipped in the package, keeping the cases whose reference calls pass `verify`."""
    cases = []
    for category in categories:
        answers = {row["id"]: row["ground_truth"] for row in _jsonl(f"possible_answer_BFCL_v4_{category}.json")}
        for row in _jsonl(f"BFCL_v4_{category}.json"):
            turns = [m["content"] for turn in row["question"] for m in turn if m.get("role") == "user"]
            case = BfclCase(row["id"], tuple(bfcl_tool(f) for f in row["function"]), "\n".join(turns),
                            tuple(answers[row["id"]]))
            index = tool_index(case.tools)
            if all(verify(call, index).ok for call in case.reference()):
                cases.append(case)
    return cases


# --- BFCL's AST agreement ------------------------------------------------------------------------------------------

def _standardize(text: str) -> str:
    """BFCL's string normalisation: no spaces or `,./-_*^`, lower case, one kind of quote."""
    return re.sub(r"[ ,./\-_*^]", "", text).lower().replace("'", '"')


def _type_ok(value: Any, schema: Any) -> bool:
    types = schema_types(schema)
    if not types:
        return True
    for t in types:
        if t == "integer" and isinstance(value, int) and not isinstance(value, bool):
            return True
        if t == "number" and isinstance(value, (int, float)) and not isinstance(value, bool):
            return True
        if t == "string" and isinstance(value, str) or t == "boolean" and isinstance(value, bool):
            return True
        if t == "array" and isinstance(value, list) or t == "object" and isinstance(value, dict):
            return True
        if t == "null" and value is None:
            return True
    return False


def _value_matches(value: Any, accepted: Any) -> bool:
    """One value against one accepted value (BFCL nested form for dicts: each key maps to a list of accepted)."""
    if isinstance(accepted, dict):
        if not isinstance(value, dict) or any(k not in accepted for k in value):
            return False
        return all(_any_matches(value[k], vs) if k in value else "" in vs for k, vs in accepted.items())
    if isinstance(accepted, list):
        return isinstance(value, list) and len(value) == len(accepted) and all(
            _value_matches(v, a) for v, a in zip(value, accepted, strict=True))
    if isinstance(accepted, str):
        return isinstance(value, str) and _standardize(value) == _standardize(accepted)
    if isinstance(accepted, bool) or isinstance(value, bool):
        return value is accepted
    if isinstance(accepted, (int, float)):
        return isinstance(value, (int, float)) and float(value) == float(accepted)
    return value == accepted


def _any_matches(value: Any, accepted: list[Any]) -> bool:
    return any(_value_matches(value, a) for a in accepted if a != "" or value == "")


def _call_matches(call: ToolCall, answer: Answer, index: Mapping[str, Tool]) -> bool:
    (name, params), = answer.items()
    if call.name != name or name not in index:
        return False
    schema = index[name].input_schema
    props = schema.get("properties", {}) if isinstance(schema, Mapping) else {}
    required = schema.get("required", []) if isinstance(schema, Mapping) else []
    if any(r not in call.arguments for r in required):
        return False
    for param, value in call.arguments.items():
        if param not in params or not _type_ok(value, props.get(param)) or not _any_matches(value, params[param]):
            return False
    return all("" in accepted for param, accepted in params.items() if param not in call.arguments)


def ast_match(calls: Sequence[ToolCall], answers: Sequence[Answer], tools: Sequence[Tool] | Mapping[str, Tool]) -> bool:
    """BFCL's AST agreement: as many calls as answers, each answer met by a different call (in any order); a call
    meets an answer when the name is right, the required parameters are there, no parameter is unexpected, and every
    value has the right type and is one of the accepted values after BFCL's normalisation."""
    index = tools if isinstance(tools, Mapping) else tool_index(tools)
    if len(calls) != len(answers):
        return False
    fits = [[_call_matches(c, a, index) for c in calls] for a in answers]

    def assign(i: int, used: frozenset[int]) -> bool:
        return i == len(answers) or any(fits[i][j] and j not in used and assign(i + 1, used | {j})
                                        for j in range(len(calls)))

    return assign(0, frozenset())


def _as_accepted(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: [_as_accepted(v)] for k, v in value.items()}
    if isinstance(value, list):
        return [_as_accepted(v) for v in value]
    return value


def answers_for(reference: Sequence[ToolCall]) -> list[Answer]:
    """Reference calls as the one accepted answer each (every value exactly, no other parameter)."""
    return [{c.name: {p: [_as_accepted(v)] for p, v in c.arguments.items()}} for c in reference]


# --- cases ----------------------------------------------------------------------------------------------------------

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

    def answers(self) -> list[Answer] | None:
        if self.accepted is not None:
            return list(self.accepted)
        return answers_for(self.reference) if self.reference is not None else None

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "tools": [t.to_mcp() for t in self.tools], "raw": self.raw,
                "reference": [c.to_dict() for c in self.reference] if self.reference is not None else None,
                "context": self.context, "accepted": list(self.accepted) if self.accepted is not None else None,
                "recoverable": self.recoverable, "faults": list(self.faults)}


class CaseError(ValueError):
    """A case file that cannot be read; the message names the line and the field."""


def case_from_dict(obj: Any, where: str) -> Case:
    if not isinstance(obj, Mapping):
        raise CaseError(f"{where}: expected an object, got {type(obj).__name__}")
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
                tuple(obj.get("faults") or ()))


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


def bfcl_suite(seed: int = 0, profiles: Sequence[str] = SUITE_PROFILES) -> list[Case]:
    cases = []
    for case in load_bfcl():
        reference = case.reference()
        for profile in profiles:
            rng = _rng(seed, profile, case.id)
            bad = corrupt_calls(reference, case.tools, sample_faults(profile, rng, n_calls=len(reference)), rng)
            cases.append(Case(f"{case.id}/{profile}", case.tools, bad.raw, tuple(reference), None, case.answers,
                              bad.recoverable, bad.kinds))
    return cases


def example_value(schema: Any, name: str) -> Any:
    """A plausible value that fits a property schema (for test calls over schemas that come without calls)."""
    if not isinstance(schema, Mapping):
        return None
    for key in ("default", "const"):
        if key in schema and schema[key] is not None:
            return schema[key]
    if isinstance(schema.get("enum"), list) and schema["enum"]:
        return schema["enum"][len(schema["enum"]) // 2]
    if isinstance(schema.get("examples"), list) and schema["examples"]:
        return schema["examples"][0]
    types = schema_types(schema) - {"null"}
    kind = sorted(types)[0] if types else "string"
    if kind == "integer":
        low = schema.get("minimum", 1)
        return int(max(low, min(schema.get("maximum", 12), 12)))
    if kind == "number":
        return float(max(schema.get("minimum", 0.5), min(schema.get("maximum", 2.5), 2.5)))
    if kind == "boolean":
        return True
    if kind == "array":
        item = example_value(schema.get("items"), name)
        return [item] if item is not None else []
    if kind == "object":
        return {}
    words = re.findall(r"[a-z]+", _split_words(name))
    return " ".join(words) or "example"


def _split_words(name: str) -> str:
    return re.sub(r"(?<=[a-z])([A-Z])", r" \1", name).replace("_", " ").lower()


def example_call(tool: Tool) -> ToolCall | None:
    """A valid call to `tool` with every property it can fill (only the required ones if that fails)."""
    props = tool.input_schema.get("properties", {}) if isinstance(tool.input_schema, Mapping) else {}
    required = tool.input_schema.get("required", []) if isinstance(tool.input_schema, Mapping) else []
    full = {p: example_value(s, p) for p, s in props.items()}
    for arguments in (full, {p: v for p, v in full.items() if p in required}):
        call = ToolCall(tool.name, {p: v for p, v in arguments.items() if v is not None})
        if verify(call, [tool]).ok:
            return call
    return None


def _mcp_calls() -> list[tuple[str, tuple[Tool, ...], ToolCall]]:
    out = []
    for server, tools in load_mcp_bench().items():
        for tool in tools:
            call = example_call(tool)
            if call is not None:
                out.append((server, tuple(tools), call))
    return out


def mcp_bench_suite(seed: int = 0, profiles: Sequence[str] = SUITE_PROFILES) -> list[Case]:
    cases = []
    for server, tools, call in _mcp_calls():
        for profile in profiles:
            rng = _rng(seed, profile, call.name)
            bad = corrupt_calls([call], tools, sample_faults(profile, rng, n_calls=1), rng)
            cases.append(Case(f"{call.name}/{profile}", tools, bad.raw, (call,), None, None, bad.recoverable,
                              bad.kinds))
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


# --- revisers -------------------------------------------------------------------------------------------------------

Reviser = Callable[[str, Mapping[str, Tool], Sequence[Any] | None], Revision]


def _strict_calls(value: Any) -> list[ToolCall] | None:
    items = value if isinstance(value, list) else [value]
    calls = [parse_call(item) for item in items]
    if not items or any(isinstance(c, Verdict) for c in calls):
        return None
    return [c for c in calls if isinstance(c, ToolCall)]


def _as_revision(calls: list[ToolCall] | None, index: Mapping[str, Tool], changed: bool) -> Revision:
    if calls is None:
        failure = Violation(Stage.PARSE, "invalid_json", "", "not one call object or a JSON array of them")
        return Revision((), False, changed, (), (Verdict(False, Stage.PARSE, (failure,)),))
    verdicts = tuple(verify(c, index) for c in calls)
    return Revision(tuple(calls), bool(calls) and all(v.ok for v in verdicts), changed, (), verdicts)


def strict_calls(raw: str) -> list[ToolCall] | None:
    """The calls as sent, read strictly: one call object or a JSON array of them; None when that fails."""
    try:
        return _strict_calls(json.loads(raw))
    except (ValueError, RecursionError):
        return None


def no_reviser(raw: str, index: Mapping[str, Tool], context: Sequence[Any] | None = None) -> Revision:
    return _as_revision(strict_calls(raw), index, False)


def json_repair_reviser(raw: str, index: Mapping[str, Tool], context: Sequence[Any] | None = None) -> Revision:
    """json-repair alone: repair the text as JSON, then read it strictly."""
    before = strict_calls(raw)
    if before is not None:
        return _as_revision(before, index, False)
    try:
        repaired = json_repair.loads(raw)
    except Exception:  # a heuristic that gives up is a reviser that found nothing
        return _as_revision(None, index, True)
    return _as_revision(_strict_calls(repaired), index, True)


def rules_reviser(raw: str, index: Mapping[str, Tool], context: Sequence[Any] | None = None) -> Revision:
    return revise(raw, index, context)


def nearest_tools(names: Iterable[str], index: Mapping[str, Tool], k: int = 3) -> list[Tool]:
    """The tools named, or closest to the names, `k` per name: what a model reviser's prompt needs."""
    keys = {name_key(name): tool for name, tool in index.items()}
    chosen: dict[str, Tool] = {}
    for name in names:
        for key in difflib.get_close_matches(name_key(name), list(keys), n=k, cutoff=0.0):
            chosen[keys[key].name] = keys[key]
    return list(chosen.values())


_SYSTEM = ("You repair tool calls. Given the tools and a model's output, reply with only the intended tool call(s) as "
           'JSON: {"name": ..., "arguments": {...}} or a JSON array of them. Use only values found in the output or '
           "the conversation; never make up a value.")


@dataclass(slots=True)
class EndpointReviser:
    """A model reviser behind any OpenAI-compatible chat endpoint, used where the rules cannot make the call valid
    (or always). Its prompt holds only the tools near the ones called, not the whole list."""

    url: str
    model: str = "tracemill-reviser"
    always: bool = False
    timeout: float = 60.0

    @property
    def chat_url(self) -> str:
        url = self.url.rstrip("/")
        return url if url.endswith("/chat/completions") else url + "/chat/completions"

    def __call__(self, raw: str, index: Mapping[str, Tool], context: Sequence[Any] | None = None) -> Revision:
        import httpx

        first = revise(raw, index, context)
        if first.ok and not self.always:
            return first
        names = [c.name for c in first.calls] or re.findall(r"[A-Za-z_][\w.:\-]*", raw)[:20]
        tools = nearest_tools(names, index) or list(index.values())[:3]
        prompt = json.dumps({"tools": [t.to_mcp() for t in tools], "context": context or [], "output": raw},
                            ensure_ascii=False)
        body = {"model": self.model, "temperature": 0,
                "messages": [{"role": "system", "content": _SYSTEM}, {"role": "user", "content": prompt}]}
        response = httpx.post(self.chat_url, json=body, timeout=self.timeout)
        response.raise_for_status()
        message = response.json()["choices"][0]["message"]
        second = revise(message if message.get("tool_calls") else message.get("content") or "", index, context)
        step = Step(StepKind.MODEL, f"the model reviser at {self.url} rewrote the output", None, "", raw,
                    [c.to_dict() for c in second.calls])
        return Revision(second.calls, second.ok, True, (*first.steps, step, *second.steps), second.verdicts)


def make_reviser(spec: str) -> Reviser:
    if spec == "none":
        return no_reviser
    if spec == "json-repair":
        return json_repair_reviser
    if spec == "rules":
        return rules_reviser
    if spec.startswith("endpoint:"):
        return EndpointReviser(spec.removeprefix("endpoint:"))
    if spec.startswith("model:"):
        raise click.UsageError(
            f"{spec}: a local model reviser needs the `train` extra (pip install 'tracemill[train]') and a trained "
            "reviser model, which `tracemill train` does not produce yet; serve one behind an OpenAI-compatible "
            "endpoint and use endpoint:URL")
    raise click.UsageError(f"unknown reviser {spec!r}: use none, json-repair, rules, model:PATH or endpoint:URL")


# --- running and reporting ------------------------------------------------------------------------------------------

@dataclass(slots=True)
class Result:
    case: str
    reviser: str
    ok: bool
    changed: bool
    match: bool | None
    calls: list[dict[str, Any]]
    stages: list[str | None]
    steps: list[str]
    micros: float


@dataclass(slots=True)
class Metrics:
    reviser: str
    cases: int = 0
    json_valid: float | None = None
    valid_tool_name_rate: float | None = None
    input_schema_compliance: float | None = None
    ok_rate: float | None = None
    reference_match: float | None = None
    recovered: float | None = None
    recoverable_cases: int = 0
    wrong_ok: float | None = None
    valid_inputs: int = 0
    valid_changed: float | None = None
    median_us: float | None = None
    p95_us: float | None = None


_ROWS = (
    ("json_valid", "JSON validity", True), ("valid_tool_name_rate", "valid tool name rate", True),
    ("input_schema_compliance", "input schema compliance", True), ("ok_rate", "verified ok", True),
    ("reference_match", "reference match (BFCL AST)", True), ("recovered", "recovered (recoverable faults)", True),
    ("wrong_ok", "ok but wrong (lower is better)", True), ("valid_changed", "valid inputs changed (must be 0)", True),
    ("median_us", "median µs per revision", False), ("p95_us", "p95 µs per revision", False),
)


def _ratio(num: int, den: int) -> float | None:
    """None where nothing was counted (shown as "–")."""
    return num / den if den else None


def _metrics(name: str, cases: Sequence[Case], results: Sequence[Result], valid: Sequence[bool],
             verdicts: Sequence[Sequence[Verdict]]) -> Metrics:
    calls = named = compliant = 0
    for case_verdicts, result in zip(verdicts, results, strict=True):
        parsed = [v for v in case_verdicts if v.parsed]
        calls += len(parsed) or 1
        named += sum(v.name_valid for v in parsed)
        compliant += sum(v.name_valid and v.stage is not Stage.SCHEMA for v in parsed)
    with_answers = [(c, r) for c, r in zip(cases, results, strict=True) if r.match is not None]
    recoverable = [r for c, r in with_answers if c.recoverable and c.faults]
    valid_results = [r for r, v in zip(results, valid, strict=True) if v]
    micros = sorted(r.micros for r in results)
    return Metrics(
        reviser=name, cases=len(results),
        json_valid=_ratio(sum(any(v.parsed for v in vs) for vs in verdicts), len(results)),
        valid_tool_name_rate=_ratio(named, calls), input_schema_compliance=_ratio(compliant, named),
        ok_rate=_ratio(sum(r.ok for r in results), len(results)),
        reference_match=_ratio(sum(bool(r.match) for _, r in with_answers), len(with_answers)),
        recovered=_ratio(sum(bool(r.match) for r in recoverable), len(recoverable)), recoverable_cases=len(recoverable),
        wrong_ok=_ratio(sum(r.ok and r.match is False for _, r in with_answers), len(with_answers)),
        valid_inputs=len(valid_results), valid_changed=_ratio(sum(r.changed for r in valid_results), len(valid_results)),
        median_us=statistics.median(micros) if micros else None,
        p95_us=micros[min(len(micros) - 1, int(len(micros) * 0.95))] if micros else None,
    )


@dataclass(slots=True)
class Report:
    suite: str
    cases: int
    broken: int
    metrics: list[Metrics]
    results: list[Result] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"suite": self.suite, "cases": self.cases, "broken_cases": self.broken,
                "revisers": [asdict(m) for m in self.metrics]}

    def rows(self) -> list[tuple[str, list[str]]]:
        rows = []
        for key, label, percent in _ROWS:
            values = [getattr(m, key) for m in self.metrics]
            rows.append((label, ["–" if v is None else f"{v:.1%}" if percent else f"{v:.0f}" for v in values]))
        return rows

    def markdown(self) -> str:
        head = "| metric | " + " | ".join(m.reviser for m in self.metrics) + " |"
        rule = "| --- |" + " ---: |" * len(self.metrics)
        body = [f"| {label} | " + " | ".join(values) + " |" for label, values in self.rows()]
        return "\n".join([head, rule, *body])


def evaluate(cases: Sequence[Case], revisers: Mapping[str, Reviser], suite: str = "cases",
             progress: Callable[[int], None] | None = None) -> Report:
    indexes = [tool_index(c.tools) for c in cases]
    valid = []
    for case, index in zip(cases, indexes, strict=True):
        before = strict_calls(case.raw)
        valid.append(before is not None and all(verify(c, index).ok for c in before))
    metrics, results = [], []
    for name, reviser in revisers.items():
        mine, verdicts = [], []
        for case, index in zip(cases, indexes, strict=True):
            start = time.perf_counter()
            revision = reviser(case.raw, index, case.context)
            micros = (time.perf_counter() - start) * 1e6
            answers = case.answers()
            match = ast_match(revision.calls, answers, index) if answers is not None else None
            mine.append(Result(case.id, name, revision.ok, revision.changed, match,
                               [c.to_dict() for c in revision.calls],
                               [v.stage.value if v.stage else None for v in revision.verdicts],
                               [s.kind.value for s in revision.steps], micros))
            verdicts.append(revision.verdicts)
            if progress:
                progress(1)
        metrics.append(_metrics(name, cases, mine, valid, verdicts))
        results.extend(mine)
    return Report(suite, len(cases), sum(not v for v in valid), metrics, results)


@click.command("eval")
@click.option("--cases", "source", default="bfcl", show_default=True,
              help="A JSONL file of cases, or a built-in suite: bfcl, mcp-bench, do-no-harm.")
@click.option("--reviser", "specs", multiple=True,
              help="none | json-repair | rules | model:PATH | endpoint:URL. Repeat (or comma-separate) to compare "
                   "side by side. Default: none, json-repair, rules.")
@click.option("--seed", default=0, show_default=True, help="Seed of the built-in suites' faults.")
@click.option("--limit", type=int, help="Only the first N cases.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@click.option("--out", type=click.Path(file_okay=False, path_type=Path),
              help="Write report.json, table.md, cases.jsonl and results.jsonl here.")
def eval_command(source: str, specs: tuple[str, ...], seed: int, limit: int | None, as_json: bool,
                 out: Path | None) -> None:
    """Measure revisers on a case file or a built-in suite."""
    from rich.console import Console
    from rich.progress import Progress
    from rich.table import Table

    names = [s.strip() for spec in (specs or DEFAULT_REVISERS) for s in spec.split(",") if s.strip()]
    revisers = {name: make_reviser(name) for name in names}
    try:
        cases = load_suite(source, seed) if source in SUITES else read_cases(source)
    except (CaseError, OSError) as exc:
        raise click.ClickException(str(exc)) from None
    cases = cases[:limit] if limit is not None else cases
    err = Console(stderr=True)
    with Progress(console=err, transient=True) as bar:
        task = bar.add_task(f"eval {source}", total=len(cases) * len(revisers))
        report = evaluate(cases, revisers, source, progress=lambda n: bar.advance(task, n))
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        (out / "report.json").write_bytes(orjson.dumps(report.to_dict(), option=orjson.OPT_INDENT_2))
        (out / "table.md").write_text(report.markdown() + "\n")
        (out / "cases.jsonl").write_bytes(b"".join(orjson.dumps(c.to_dict()) + b"\n" for c in cases))
        (out / "results.jsonl").write_bytes(b"".join(orjson.dumps(asdict(r)) + b"\n" for r in report.results))
    if as_json:
        click.echo(json.dumps(report.to_dict(), indent=2))
        return
    table = Table(title=f"{source}: {report.cases} cases, {report.broken} not valid as sent")
    table.add_column("metric")
    for m in report.metrics:
        table.add_column(m.reviser, justify="right")
    for label, values in report.rows():
        table.add_row(label, *values)
    Console().print(table)
