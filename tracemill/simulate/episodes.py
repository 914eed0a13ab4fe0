"""One simulated agent episode: a user request, model calls written by a weak model (faults from `tracemill.faults`),
tool executions that fail when the call is wrong (strict servers also refuse parameters their schema does not
declare), retries, a final answer. What a context fault loses, the user says in a follow-up turn just before the model
call, so that the output is recoverable from the conversation. Spans go through the SDK's GenAI attribute
builders; every injected fault and the intended call are recorded under `tracemill.sim.*`."""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson
from opentelemetry import trace
from opentelemetry.sdk.trace.id_generator import IdGenerator
from opentelemetry.trace import SpanKind, Status, StatusCode

from tracemill.examples import request_words, sampled_arguments
from tracemill.faults import Corrupted, Profile, corrupt_calls, sample_faults
from tracemill.rates import rate
from tracemill.sdk import genai
from tracemill.simulate.scenarios import MEDICAL_SERVERS, Scenario
from tracemill.tools import Tool
from tracemill.verify import Stage, ToolCall, Verdict, verify

SYSTEM_PROMPT = ("You are a helpful assistant with access to tools. Call a tool when it helps answer the user; reply "
                 "with the final answer when you have what you need.")
MS = 1_000_000


@dataclass
class Summary:
    """What was sent, and the MCP-Bench figures `tracemill stats` should report for it. As in MCP-Bench, every call
    attempt counts: one the model wrote as text has no valid tool name, one with unparsable arguments does not comply
    with the schema and fails as a call, and neither runs."""

    episodes: int = 0
    spans: int = 0
    calls: int = 0
    outputs: int = 0  # model outputs that held at least one call attempt
    text_calls: int = 0  # call attempts written as text, not as native tool calls
    name_valid: int = 0
    schema_valid: int = 0
    valid_outcomes: int = 0  # valid-name calls that ran, or whose arguments could not be parsed
    failed_valid: int = 0
    succeeded: int = 0
    faulty_outputs: int = 0
    retries: int = 0
    faults: Counter[str] = field(default_factory=Counter)
    domains: Counter[str] = field(default_factory=Counter)

    def metrics(self) -> dict[str, float | int | None]:
        return {
            "valid_tool_name_rate": rate(self.name_valid, self.calls),
            "input_schema_compliance": rate(self.schema_valid, self.name_valid),
            "execution_success_rate": rate(self.succeeded, self.calls),
            "valid_call_failure_rate": rate(self.failed_valid, self.valid_outcomes),
            "total_calls": self.calls,
        }

    def to_dict(self) -> dict[str, Any]:
        return {"episodes": self.episodes, "spans": self.spans, "calls": self.calls, "outputs": self.outputs,
                "text_calls": self.text_calls,
                "faulty_outputs": self.faulty_outputs, "retries": self.retries, "faults": dict(self.faults),
                "domains": dict(self.domains), "expected": self.metrics()}


class SeededIds(IdGenerator):
    """Trace and span ids from the current episode's generator, so a seed always yields the same ids."""

    def __init__(self) -> None:
        self.rng = random.Random(0)

    def generate_span_id(self) -> int:
        return self.rng.getrandbits(64) or 1

    def generate_trace_id(self) -> int:
        return self.rng.getrandbits(128) or 1


@dataclass(frozen=True)
class Settings:
    profile: Profile
    provider: str = "vllm"
    tool_error_rate: float = 0.05  # a correct call that fails anyway (upstream outage, no data)
    retry_rate: float = 0.7  # an agent retries a failed step with this probability
    max_retries: int = 2
    parallel_rate: float = 0.1  # a step that asks for two calls at once
    strict_arguments: bool = True  # the MCP servers refuse parameters their schema does not declare


def _domain(scenario: Scenario, tool_name: str) -> str | None:
    if scenario.domain == "legal":
        return "legal"
    server, sep, _ = tool_name.partition(":")
    return "medical" if sep and server in MEDICAL_SERVERS else None


def plan_calls(scenario: Scenario, settings: Settings, rng: random.Random) -> list[list[ToolCall]]:
    """The calls the model means to make, step by step."""
    if scenario.reference is not None:
        return [list(scenario.reference)]
    words = request_words(scenario.request)
    steps = []
    for _ in range(rng.choice((1, 1, 2, 2, 3, 4))):
        n = 2 if rng.random() < settings.parallel_rate else 1
        tools: list[Tool] = rng.sample(list(scenario.tools), min(n, len(scenario.tools)))
        steps.append([ToolCall(t.name, sampled_arguments(t.input_schema, words, rng)) for t in tools])
    return steps


@dataclass
class Emitted:
    """A model output as an OpenAI-compatible server returns it: text, or native tool calls."""

    text: str | None
    natives: list[dict[str, Any]]
    verdicts: list[Verdict]


def emit(corrupted: Corrupted, tools_index: dict[str, Tool], rng: random.Random) -> Emitted:
    if corrupted.native:
        try:
            parsed = orjson.loads(corrupted.raw)
        except orjson.JSONDecodeError:  # cut short: the server's tool parser fails, the text comes back as content
            parsed = None
        if parsed is not None:
            items = parsed if isinstance(parsed, list) else [parsed]
            natives = [{"id": f"call_{rng.getrandbits(48):012x}", "name": c.get("name"),
                        "arguments": c.get("arguments")} for c in items]
            return Emitted(None, natives, [verify({"name": c["name"], "arguments": c["arguments"]}, tools_index)
                                            for c in natives])
    return Emitted(corrupted.raw, [], [verify(corrupted.raw, tools_index)])


def _undeclared(call: ToolCall, verdict: Verdict) -> list[str]:
    """Parameters the call passes that its tool's schema does not declare (a schema that allows them still gets them
    refused by a strict server: pydantic or zod models that forbid extras)."""
    schema = verdict.tool.input_schema if verdict.tool is not None else {}
    props = schema.get("properties") if isinstance(schema.get("properties"), dict) else {}
    return [p for p in call.arguments if p not in props]


def execution_outcome(verdict: Verdict, settings: Settings, rng: random.Random) -> tuple[str | None, str]:
    """How a simulated MCP server answers a call that parsed: (the error type, None when it ran; what it returned)."""
    call = verdict.call
    assert call is not None
    if verdict.stage == Stage.TOOL_NAME:
        return "unknown_tool", f"Unknown tool: {call.name}"
    if verdict.stage == Stage.SCHEMA:
        return "invalid_arguments", f"Invalid arguments: {verdict.violations[0].message}"
    if settings.strict_arguments and (undeclared := _undeclared(call, verdict)):
        return "invalid_arguments", f"Invalid arguments: unexpected parameter {undeclared[0]!r}"
    if rng.random() < settings.tool_error_rate:
        return "upstream_error", "The upstream service did not answer in time."
    return None, _result(call, rng)


def _result(call: ToolCall, rng: random.Random) -> str:
    base = call.name.rpartition(":")[2]
    return orjson.dumps({"tool": base, "status": "ok", "results": [
        {"id": f"r{rng.randrange(10_000)}", "score": round(rng.random(), 3)} for _ in range(rng.randint(1, 3))]
    }).decode()


class Episode:
    def __init__(self, tracer: trace.Tracer, scenario: Scenario, settings: Settings, rng: random.Random,
                 start_ns: int, summary: Summary, index: dict[str, Tool]) -> None:
        self.tracer, self.scenario, self.settings, self.rng = tracer, scenario, settings, rng
        self.t = start_ns
        self.summary = summary
        self.index = index
        self.model = settings.profile.name
        self.messages: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM_PROMPT},
                                                {"role": "user", "content": scenario.request}]

    def _advance(self, low_ms: int, high_ms: int) -> int:
        self.t += self.rng.randint(low_ms, high_ms) * MS
        return self.t

    def run(self, conversation_id: str) -> None:
        self.summary.episodes += 1
        root = self.tracer.start_span("invoke_agent simulated-agent", kind=SpanKind.INTERNAL, start_time=self.t,
                                      attributes={genai.OPERATION: "invoke_agent",
                                                  genai.AGENT_NAME: "simulated-agent",
                                                  genai.CONVERSATION_ID: conversation_id,
                                                  "tracemill.sim.scenario": self.scenario.id})
        context = trace.set_span_in_context(root)
        for step in plan_calls(self.scenario, self.settings, self.rng):
            for attempt in range(self.settings.max_retries + 1):
                if self._step(step, attempt, context, conversation_id):
                    break
                if attempt == self.settings.max_retries or self.rng.random() >= self.settings.retry_rate:
                    break
                self.summary.retries += 1
        self._final_answer(context, conversation_id)
        root.end(end_time=self._advance(1, 20))
        self.summary.spans += 1

    def _chat_span(self, context: Any, conversation_id: str, attributes: dict[str, Any]) -> Any:
        span = self.tracer.start_span(f"chat {self.model}", context=context, kind=SpanKind.CLIENT,
                                      start_time=self._advance(5, 50))
        span.set_attributes(genai.chat_attributes(self.model, provider=self.settings.provider,
                                                  messages=self.messages, tools=self.scenario.tools_json,
                                                  conversation_id=conversation_id))
        span.set_attributes(attributes)
        return span

    def _step(self, intended: list[ToolCall], attempt: int, context: Any, conversation_id: str) -> bool:
        """One model call and the executions it leads to; True when every intended call ran successfully."""
        kinds = sample_faults(self.settings.profile, self.rng, n_calls=len(intended))
        corrupted = corrupt_calls(intended, self.scenario.tools, kinds, self.rng)
        if corrupted.hints:  # what the model got wrong, the user had said: the request's details, as a follow-up
            self.messages.append({"role": "user", "content": " ".join(corrupted.hints)})
        emitted = emit(corrupted, self.index, self.rng)
        domains = sorted({d for c in intended if (d := _domain(self.scenario, c.name))})
        sim: dict[str, Any] = {
            "tracemill.sim.faults": list(corrupted.kinds),
            "tracemill.sim.fault_details": orjson.dumps([f.to_dict() for f in corrupted.faults]).decode(),
            "tracemill.sim.recoverable": corrupted.recoverable,
            "tracemill.sim.context_recoverable": corrupted.context_recoverable,
            "tracemill.sim.intended": orjson.dumps([c.to_dict() for c in intended]).decode(),
            "tracemill.sim.attempt": attempt,
            "tracemill.sim.scenario": self.scenario.id,
        }
        if domains:
            sim["tracemill.sim.domain"] = domains
        span = self._chat_span(context, conversation_id, sim)
        n_out = self.rng.randint(20, 80) + len(corrupted.raw) // 4
        span.set_attributes(genai.chat_output_attributes(
            emitted.text, emitted.natives, response_model=self.model,
            input_tokens=sum(len(str(m.get("content") or "")) for m in self.messages) // 4 + 50 * len(self.index),
            output_tokens=n_out))
        span.end(end_time=self._advance(200 + 15 * n_out, 600 + 30 * n_out))
        self._count(corrupted, emitted, intended)
        assistant: dict[str, Any] = {"role": "assistant", "content": emitted.text, "tool_calls": [
            {"id": c["id"], "type": "function", "function": {"name": c["name"], "arguments": c["arguments"]}}
            for c in emitted.natives]}
        self.messages.append(assistant)
        if not emitted.natives:
            self.messages.append({"role": "user", "content": "Error: no tool call could be parsed from your reply. "
                                                             "Call the tool with valid JSON arguments."})
            return False
        ok = True
        for native, verdict in zip(emitted.natives, emitted.verdicts, strict=True):
            if verdict.stage == Stage.PARSE:
                ok = False
                self.messages.append({"role": "tool", "tool_call_id": native["id"],
                                      "content": f"Error: invalid tool call: {verdict.violations[0].message}"})
                continue
            ok = self._execute(native, verdict, context, domains) and ok
        return ok

    def _execute(self, native: dict[str, Any], verdict: Verdict, context: Any, domains: list[str]) -> bool:
        call = verdict.call
        assert call is not None
        attrs = genai.tool_attributes(call.name, native["arguments"], call_id=native["id"])
        span = self.tracer.start_span(f"execute_tool {call.name}", context=context, kind=SpanKind.INTERNAL,
                                      start_time=self._advance(1, 10), attributes=attrs)
        error, message = execution_outcome(verdict, self.settings, self.rng)
        span.set_attribute("tracemill.sim.execution", error or "ok")
        if domains:
            span.set_attribute("tracemill.sim.domain", domains)
        span.set_attributes(genai.tool_result_attributes(message))
        if error is not None:
            span.set_attribute(genai.ERROR_TYPE, error)
            span.set_status(Status(StatusCode.ERROR, message))
        span.end(end_time=self._advance(40, 1500))
        self.summary.spans += 1
        if verdict.stage != Stage.TOOL_NAME:
            self.summary.valid_outcomes += 1
            self.summary.failed_valid += error is not None
        self.summary.succeeded += error is None
        self.messages.append({"role": "tool", "tool_call_id": native["id"], "content": message})
        return error is None

    def _count(self, corrupted: Corrupted, emitted: Emitted, intended: Sequence[ToolCall]) -> None:
        s = self.summary
        s.spans += 1
        s.outputs += 1
        s.faulty_outputs += bool(corrupted.faults)
        s.faults.update(corrupted.kinds)
        for c in intended:
            s.domains[_domain(self.scenario, c.name) or "none"] += 1
        s.calls += len(emitted.verdicts)
        if not emitted.natives:
            s.text_calls += 1
            return
        for native, verdict in zip(emitted.natives, emitted.verdicts, strict=True):
            if native["name"] in self.index:
                s.name_valid += 1
                s.schema_valid += verdict.ok
                if verdict.stage == Stage.PARSE:  # never runs: a failed valid-name call
                    s.valid_outcomes += 1
                    s.failed_valid += 1

    def _final_answer(self, context: Any, conversation_id: str) -> None:
        span = self._chat_span(context, conversation_id, {"tracemill.sim.scenario": self.scenario.id})
        text = "Here is what I found: " + " ".join(request_words(self.scenario.request)[:12]) + "."
        span.set_attributes(genai.chat_output_attributes(text, response_model=self.model, output_tokens=len(text) // 4))
        span.end(end_time=self._advance(300, 2500))
        self.summary.spans += 1
