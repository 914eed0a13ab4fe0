"""Each proxied request traced with the SDK, in OpenTelemetry GenAI terms, so that the collector verifies it and the
miner mines it like any agent's traffic.

- `chat {model}` (CLIENT): the upstream's answer as it came (its native calls with their arguments exactly as sent,
  and its text), the tools and the conversation; with `tracemill.serving.*`: the version that served the request,
  its role (active, canary, static), the deployment, what the revision did and its steps, and the latencies; and the
  agent's harness version where the request names it (the `X-Tracemill-Harness-Version` header, else the W3C baggage
  entry `tracemill.harness.version`), so that harness versions are compared on the model's answers as sent.
- `revise {version}` (INTERNAL), only when the answer needed revising: what the client got, as the output of the
  model `tracemill-reviser:{version}`, so that `tracemill stats` and `tracemill failures` split by model compare
  versions on the answers they revised (a canary beside the active version). It is the root of a trace of its own,
  linked to the span it revised (an OpenTelemetry link, and `tracemill.serving.revision_of`): it is the reviser's work,
  and the miner, which looks for an agent's own repairs within a trace, must not take it for one.

Both are roots of traces of the sidecar's. A request that carries W3C trace context (`traceparent`) gets its `chat` span
linked to the agent's span, not made its child: within one trace a call id drawn at random is one call
(`collector/same_call.py`), and the model's call as sent would take the place of the revised call the agent got and
ran.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from opentelemetry import baggage, propagate, trace
from opentelemetry.context import Context
from opentelemetry.trace import SpanKind

from tracemill.sdk import core, genai
from tracemill.serving.plan import Serving
from tracemill.serving.revising import UNCHANGED, Revised, combined
from tracemill.serving.toolsets import Toolset

REVISER_MODEL = "tracemill-reviser:"
VERSION = "tracemill.serving.version"
ROLE = "tracemill.serving.role"
DEPLOYMENT = "tracemill.serving.deployment_id"
REVISION = "tracemill.serving.revision"
STEPS = "tracemill.serving.steps"
REVISION_OF = "tracemill.serving.revision_of"
UPSTREAM_MS = "tracemill.serving.upstream_ms"
REVISE_MS = "tracemill.serving.revise_ms"
REVISER_ERROR = "tracemill.serving.reviser_error"
CLIENT_GONE = "client_disconnected"
HARNESS_HEADER = "x-tracemill-harness-version"


@dataclass(slots=True)
class Exchange:
    """One request through the proxy, as it is recorded."""

    headers: Mapping[str, str]
    body: Mapping[str, Any]
    toolset: Toolset | None
    serving: Serving
    conversation_id: str | None
    start_ns: int
    end_ns: int = 0
    upstream_ms: float = 0.0
    revise_ms: float = 0.0
    original: list[dict[str, Any]] = field(default_factory=list)  # one message per choice, as the upstream sent it
    finish_reasons: list[str | None] = field(default_factory=list)
    revised: list[Revised | None] = field(default_factory=list)  # per choice
    response_model: str | None = None
    usage: Mapping[str, Any] | None = None
    error: str | None = None
    error_type: str = "upstream_error"  # or CLIENT_GONE


def _calls(message: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    return [c for c in message.get("tool_calls") or () if isinstance(c, Mapping)]


def _outcome(exchange: Exchange) -> str:
    return combined(r.outcome for r in exchange.revised if r is not None)


def _start(exchange: Exchange, model: str, name: str, kind: SpanKind, context: Any,
           links: Sequence[trace.Link] = ()) -> trace.Span:
    span = core.tracer().start_span(name, context=context, kind=kind, links=links, start_time=exchange.start_ns)
    messages = exchange.body.get("messages")
    core.set_attributes(span, genai.chat_attributes, model,
                        messages=messages if core.capture_messages() and isinstance(messages, list) else None,
                        tools=exchange.toolset.definitions() if exchange.toolset is not None else None,
                        conversation_id=exchange.conversation_id, redactor=core.redactor())
    return span


def _output(span: trace.Span, exchange: Exchange, messages: Sequence[Mapping[str, Any]], model: str | None) -> None:
    first = messages[0] if messages else {}
    usage = exchange.usage or {}
    core.set_attributes(span, genai.chat_output_attributes, first.get("content"), _calls(first),
                        finish_reason=exchange.finish_reasons[0] if exchange.finish_reasons else None,
                        response_model=model, input_tokens=usage.get("prompt_tokens"),
                        output_tokens=usage.get("completion_tokens"), redactor=core.redactor())


def record(exchange: Exchange) -> None:
    """Send the request's spans (see the module docstring). Never raises into the proxy."""
    try:
        _record(exchange)
    except Exception:  # tracing must never break serving
        core.log.warning("tracemill: could not trace a proxied request", exc_info=True)


def _record(exchange: Exchange) -> None:
    model = str(exchange.body.get("model", ""))
    sent = propagate.extract(dict(exchange.headers))
    agent = trace.get_current_span(sent).get_span_context()
    span = _start(exchange, model, f"chat {model}", SpanKind.CLIENT, Context(),
                  [trace.Link(agent)] if agent.is_valid else [])
    harness = exchange.headers.get(HARNESS_HEADER) or baggage.get_baggage(genai.HARNESS_VERSION, sent)
    if harness:
        span.set_attribute(genai.HARNESS_VERSION, str(harness))
    _output(span, exchange, exchange.original, exchange.response_model)
    outcome = _outcome(exchange)
    steps = sorted({s.kind.value for r in exchange.revised if r is not None for s in r.steps})
    failed = next((r.reviser_failed for r in exchange.revised if r is not None and r.reviser_failed), None)
    serving = exchange.serving
    span.set_attributes({VERSION: serving.version, ROLE: serving.role, REVISION: outcome, STEPS: steps,
                         UPSTREAM_MS: exchange.upstream_ms, REVISE_MS: exchange.revise_ms,
                         **({DEPLOYMENT: serving.deployment_id} if serving.deployment_id is not None else {}),
                         **({REVISER_ERROR: failed} if failed else {})})
    if exchange.error:
        core.mark_error(span, exchange.error_type, exchange.error)
    if outcome != UNCHANGED:
        reviser_model = REVISER_MODEL + serving.version
        child = _start(exchange, reviser_model, f"revise {serving.version}", SpanKind.INTERNAL, Context(),
                       [trace.Link(span.get_span_context())])
        served = [{**m, "content": r.content, "tool_calls": r.tool_calls} if r is not None and r.changed else m
                  for m, r in zip(exchange.original, exchange.revised, strict=True)]
        _output(child, exchange, served, reviser_model)
        child.set_attributes({VERSION: serving.version, ROLE: serving.role, REVISION: outcome, STEPS: steps,
                              REVISION_OF: format(span.get_span_context().span_id, "016x")})
        child.end(end_time=exchange.end_ns)
    span.end(end_time=exchange.end_ns)
