"""`init` and the recording helpers: one model call (`chat`), one tool execution (`tool`), one agent run (`agent`).

Recording never raises into the agent: a value that cannot be recorded is logged and skipped. Spans leave through a
batch processor, so a slow or absent collector costs the agent nothing but a warning when a batch is dropped.
"""

from __future__ import annotations

import atexit
import logging
import threading
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.trace import Span, SpanKind, Status, StatusCode

from tracemill.sdk import genai
from tracemill.sdk.batches import MAX_REQUEST_BYTES, SizedExporter
from tracemill.sdk.redact import Redaction, Redactor

log = logging.getLogger("tracemill.sdk")

SCOPE = "tracemill.sdk"


class _Ended(SpanProcessor):
    """Counts the spans ended: ahead of the batch processor, so that a span is counted before it can be sent."""

    def __init__(self) -> None:
        self.count = 0
        self._lock = threading.Lock()  # spans end on any of the agent's threads

    def on_end(self, span: ReadableSpan) -> None:
        with self._lock:
            self.count += 1


@dataclass(frozen=True, slots=True)
class Delivery:
    """What became of the spans recorded since `init`."""

    ended: int
    sent: int  # the collector took them
    failed: int  # their request was refused or could not reach the collector: lost, as the log said

    @property
    def unsent(self) -> int:
        """Spans waiting in the batch processor's queue, or dropped from it: it holds `OTEL_BSP_MAX_QUEUE_SIZE` spans
        (2,048 by default) and drops one for each span ended while it is full. After `flush`, only the dropped."""
        return self.ended - self.sent - self.failed


@dataclass
class _State:
    provider: TracerProvider | None = None
    exporter: SizedExporter | None = None
    ended: _Ended | None = None
    redactor: Redactor = field(default_factory=Redactor)
    capture_messages: bool = True


_state = _State()


def traces_url(endpoint: str) -> str:
    """The collector's base URL (`http://host:4318`) or its full `/v1/traces` URL, as the full URL."""
    endpoint = endpoint.rstrip("/")
    return endpoint if endpoint.endswith("/v1/traces") else endpoint + "/v1/traces"


def init(
    endpoint: str = "http://127.0.0.1:4318",
    service_name: str = "agent",
    api_key: str | None = None,
    harness_version: str | None = None,
    *,
    redact: Redaction = None,
    capture_messages: bool = True,
    export_timeout_s: float = 5.0,
    max_request_bytes: int = MAX_REQUEST_BYTES,
    set_global: bool = True,
) -> TracerProvider:
    """Send this process's spans to a Tracemill collector.

    `redact`: a function applied to every recorded string, or regexes whose matches are masked; it runs here, before
    anything is exported. `capture_messages=False` leaves out the conversation (input messages and tool results);
    tool definitions, model output and tool arguments are always recorded, redacted, because the loop needs them.
    `max_request_bytes`: each export request carries about this much at most (keep it under the collector's
    `max_body_bytes`): a batch of spans with long conversations is sent as several requests.
    With `set_global`, the provider also becomes OpenTelemetry's global one (when none was set), so other
    instrumentation in the process reports to the collector too."""
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    attributes: dict[str, str] = {"service.name": service_name}
    if harness_version:
        attributes[genai.HARNESS_VERSION] = harness_version
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else None
    exporter = SizedExporter(OTLPSpanExporter(endpoint=traces_url(endpoint), headers=headers,
                                              timeout=export_timeout_s), max_request_bytes)
    provider = TracerProvider(resource=Resource.create(attributes), shutdown_on_exit=False)
    ended = _Ended()
    provider.add_span_processor(ended)
    provider.add_span_processor(BatchSpanProcessor(exporter, export_timeout_millis=export_timeout_s * 1000))
    shutdown()
    _state.provider, _state.exporter, _state.ended = provider, exporter, ended
    _state.redactor = Redactor(redact)
    _state.capture_messages = capture_messages
    if set_global and isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider):
        trace.set_tracer_provider(provider)
    return provider


def flush(timeout_s: float = 10.0) -> bool:
    """Export what is buffered; False when it could not all be delivered in time, or when a request since the last
    flush failed (the collector refused it or could not be reached: its spans are lost, as the log said)."""
    if _state.provider is None or _state.exporter is None:
        return True
    done = _state.provider.force_flush(int(timeout_s * 1000))
    return done and _state.exporter.take_failed() == 0


def delivery() -> Delivery | None:
    """Counts of the spans ended, sent and lost since `init` (None before it): a process can show them as metrics,
    as the sidecar does on `/metrics`."""
    if _state.exporter is None or _state.ended is None:
        return None
    sent, failed = _state.exporter.counts()
    return Delivery(_state.ended.count, sent, failed)  # read after: a span is counted ended before it is sent


def shutdown() -> None:
    if _state.provider is not None:
        _state.provider.shutdown()
        _state.provider, _state.exporter, _state.ended = None, None, None


atexit.register(shutdown)


def tracer() -> trace.Tracer:
    provider = _state.provider or trace.get_tracer_provider()
    return provider.get_tracer(SCOPE)


def redactor() -> Redactor:
    return _state.redactor


def capture_messages() -> bool:
    return _state.capture_messages


def set_attributes(span: Span, build: Any, *args: Any, **kwargs: Any) -> None:
    """`span.set_attributes(build(*args, **kwargs))`, logging instead of raising when a value cannot be recorded."""
    try:
        span.set_attributes(build(*args, **kwargs))
    except Exception:  # recording must never break the agent
        log.warning("tracemill: could not record %s", getattr(build, "__name__", build), exc_info=True)


def mark_error(span: Span, error: BaseException | str, message: str | None = None) -> None:
    error_type = error if isinstance(error, str) else type(error).__qualname__
    span.set_attribute(genai.ERROR_TYPE, error_type)
    span.set_status(Status(StatusCode.ERROR, message if message is not None else (
        None if isinstance(error, str) else str(error))))
    if isinstance(error, BaseException):
        span.record_exception(error)


class ChatCall:
    """The open span of one model call; `output` records what the model answered."""

    def __init__(self, span: Span) -> None:
        self.span = span

    def output(
        self,
        text: str | None = None,
        tool_calls: Sequence[Mapping[str, Any]] = (),
        *,
        finish_reason: str | None = None,
        response_model: str | None = None,
        input_tokens: int | None = None,
        output_tokens: int | None = None,
    ) -> None:
        """`text`: the raw text the model emitted, tool calls written into it included (models without native tool
        calling). `tool_calls`: native calls, `{"id", "name", "arguments"}` or OpenAI's shape; string arguments are
        kept verbatim."""
        set_attributes(self.span, genai.chat_output_attributes, text, tool_calls, finish_reason=finish_reason,
                       response_model=response_model, input_tokens=input_tokens, output_tokens=output_tokens,
                       redactor=_state.redactor)


class ToolExecution:
    """The open span of one tool execution; `result` or `fail` records its outcome."""

    def __init__(self, span: Span) -> None:
        self.span = span

    def result(self, value: Any) -> None:
        if _state.capture_messages:
            set_attributes(self.span, genai.tool_result_attributes, value, _state.redactor)

    def fail(self, error_type: str, message: str | None = None) -> None:
        """A failed execution that raised nothing (e.g. an MCP result with `isError`)."""
        mark_error(self.span, error_type, message)
        if message is not None:
            self.result(message)


@contextmanager
def _span(name: str, kind: SpanKind) -> Iterator[Span]:
    with tracer().start_as_current_span(name, kind=kind, record_exception=False,
                                        set_status_on_exception=False) as span:
        try:
            yield span
        except BaseException as exc:
            mark_error(span, exc)
            raise


@contextmanager
def chat(
    model: str,
    *,
    messages: Sequence[Mapping[str, Any]] | None = None,
    tools: Sequence[Any] | None = None,
    system: str | None = None,
    provider: str | None = None,
    conversation_id: str | None = None,
) -> Iterator[ChatCall]:
    """Record one model call: the tools offered, the conversation so far, and (via `ChatCall.output`) the answer."""
    with _span(f"chat {model}", SpanKind.CLIENT) as span:
        set_attributes(span, genai.chat_attributes, model, provider=provider,
                       messages=messages if _state.capture_messages else None,
                       system=system if _state.capture_messages else None, tools=tools,
                       conversation_id=conversation_id, redactor=_state.redactor)
        yield ChatCall(span)


@contextmanager
def tool(name: str, arguments: Any = None, *, call_id: str | None = None,
         description: str | None = None) -> Iterator[ToolExecution]:
    """Record one tool execution. An exception raised inside marks it failed (`error.type`) and propagates."""
    with _span(f"execute_tool {name}", SpanKind.INTERNAL) as span:
        set_attributes(span, genai.tool_attributes, name, arguments, call_id=call_id, description=description,
                       redactor=_state.redactor)
        yield ToolExecution(span)


@contextmanager
def agent(name: str, *, conversation_id: str | None = None) -> Iterator[Span]:
    """Group one agent run (its model calls and tool executions) under an `invoke_agent` span."""
    with _span(f"invoke_agent {name}", SpanKind.INTERNAL) as span:
        span.set_attribute(genai.OPERATION, "invoke_agent")
        span.set_attribute(genai.AGENT_NAME, name)
        if conversation_id:
            span.set_attribute(genai.CONVERSATION_ID, conversation_id)
        yield span
