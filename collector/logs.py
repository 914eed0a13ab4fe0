"""OTLP/HTTP log payloads (protobuf or JSON) read for the GenAI events in them.

Instrumentations that follow OpenTelemetry's GenAI conventions (the official openai-v2 by default) send the model's
messages as log records: events named `gen_ai.*` (`gen_ai.choice`, `gen_ai.user.message`, ...,
`gen_ai.client.inference.operation.details`) that carry the trace and span id of the model call they belong to. Those
are what the collector keeps; any other record is counted as rejected, with a message that says what is kept. Limits
and errors are the trace decoder's (`collector.decode`): a request that cannot be read, or a record with malformed
ids, is refused whole; a record over a limit is rejected alone.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import orjson
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest

from tracemill.collector.decode import (
    Limits,
    SpanError,
    _bad_id,
    _expect,
    _field,
    _json_attributes,
    _json_id,
    _json_int,
    _json_list,
    _json_value,
    _pb_attributes,
    _pb_value,
    _text,
    _time,
    json_request,
    protobuf_request,
)

_EVENT_PREFIX = "gen_ai."
_ZERO_TRACE = "0" * 32
_ZERO_SPAN = "0" * 16


@dataclass(frozen=True, slots=True)
class LogEvent:
    """A GenAI event of one span, as the store keeps it (`log_events`)."""

    trace_id: str
    span_id: str
    event_name: str
    time_ns: int
    attributes: dict[str, Any]
    body: Any

    def digest(self) -> str:
        """The record's identity: a re-sent record is stored once."""
        content = orjson.dumps(
            [self.event_name, self.time_ns, self.attributes, self.body],
            option=orjson.OPT_SORT_KEYS | orjson.OPT_NON_STR_KEYS,
            default=str,
        )
        return hashlib.sha256(content).hexdigest()


@dataclass(slots=True)
class DecodedLogs:
    events: list[LogEvent] = field(default_factory=list)
    rejected: int = 0  # log records
    reasons: list[str] = field(default_factory=list)  # as `Decoded.reasons`
    not_events: int = 0  # records that are no GenAI event of a span (counted in `rejected` too)

    def reject(self, reason: str, records: int = 1) -> None:
        self.rejected += records
        self.reasons.append(reason)

    def finish(self) -> DecodedLogs:
        if self.not_events:
            self.rejected += self.not_events
            self.reasons.insert(
                0,
                f"{self.not_events} log records are not GenAI events of a span: the collector "
                "stores log records named gen_ai.* that carry a trace and span id, and no others",
            )
        return self


def _keep(
    out: DecodedLogs, name: str, trace_id: str, span_id: str, time_ns: int, attributes: dict[str, Any], body: Any
) -> None:
    if (
        not name.startswith(_EVENT_PREFIX)
        or not trace_id
        or not span_id
        or trace_id == _ZERO_TRACE
        or span_id == _ZERO_SPAN
    ):
        out.not_events += 1
        return
    out.events.append(LogEvent(trace_id, span_id, name, time_ns, attributes, body))


def _event_name(name: str, attributes: dict[str, Any]) -> str:
    """The record's event name; SDKs before the `event_name` field put it in the `event.name` attribute."""
    if name:
        return name
    legacy = attributes.get("event.name")
    return legacy if isinstance(legacy, str) else ""


def _pb_id(raw: bytes, size: int, where: str) -> str:
    if not raw:
        return ""
    if len(raw) != size:
        _bad_id(raw, size, where, "")
    return raw.hex()


def decode_logs_protobuf(body: bytes, limits: Limits) -> DecodedLogs:
    out = DecodedLogs()
    request = protobuf_request(ExportLogsServiceRequest, body, out.reasons)
    for i, resource_logs in enumerate(request.resource_logs):
        for j, scope_logs in enumerate(resource_logs.scope_logs):
            for k, record in enumerate(scope_logs.log_records):
                where = f"resourceLogs[{i}].scopeLogs[{j}].logRecords[{k}]"
                trace_id = _pb_id(record.trace_id, 16, f"{where}.traceId")
                span_id = _pb_id(record.span_id, 8, f"{where}.spanId")
                try:
                    attributes = _pb_attributes(record.attributes, limits, where, ".attributes")
                    name = _text(_event_name(record.event_name, attributes), f"{where}.eventName")
                    if not name.startswith(_EVENT_PREFIX):
                        out.not_events += 1
                        continue
                    value = _pb_value(record.body, limits, f"{where}.body") if record.HasField("body") else None
                    time_ns = _time(record.time_unix_nano or record.observed_time_unix_nano, f"{where}.timeUnixNano")
                except SpanError as exc:
                    out.reject(str(exc))
                    continue
                _keep(out, name, trace_id, span_id, time_ns, attributes, value)
    return out.finish()


def decode_logs_json(body: bytes, limits: Limits) -> DecodedLogs:
    out = DecodedLogs()
    request = json_request(body, "ExportLogsServiceRequest", out.reasons)
    for i, rl in enumerate(_json_list(request, "resourceLogs", "resource_logs", "body")):
        rl_where = f"resourceLogs[{i}]"
        _expect(rl, dict, rl_where, "an object")
        for j, sl in enumerate(_json_list(rl, "scopeLogs", "scope_logs", rl_where)):
            sl_where = f"{rl_where}.scopeLogs[{j}]"
            _expect(sl, dict, sl_where, "an object")
            for k, record in enumerate(_json_list(sl, "logRecords", "log_records", sl_where)):
                where = f"{sl_where}.logRecords[{k}]"
                _expect(record, dict, where, "a log record object")
                trace_id = _json_id(_field(record, "traceId", "trace_id"), 16, f"{where}.traceId", optional=True)
                span_id = _json_id(_field(record, "spanId", "span_id"), 8, f"{where}.spanId", optional=True)
                time_ns = _json_int(
                    _field(record, "timeUnixNano", "time_unix_nano"), f"{where}.timeUnixNano"
                ) or _json_int(
                    _field(record, "observedTimeUnixNano", "observed_time_unix_nano"), f"{where}.observedTimeUnixNano"
                )
                try:
                    attributes = _json_attributes(record.get("attributes"), limits, f"{where}.attributes")
                    raw_name = _expect(
                        _field(record, "eventName", "event_name", ""), str, f"{where}.eventName", "a string"
                    )
                    name = _text(_event_name(raw_name, attributes), f"{where}.eventName")
                    if not name.startswith(_EVENT_PREFIX):
                        out.not_events += 1
                        continue
                    value = _json_value(record["body"], limits, f"{where}.body") if record.get("body") else None
                    time_ns = _time(time_ns, f"{where}.timeUnixNano")
                except SpanError as exc:
                    out.reject(str(exc))
                    continue
                _keep(out, name, trace_id or "", span_id or "", time_ns, attributes, value)
    return out.finish()


LOG_DECODERS: dict[str, Callable[[bytes, Limits], DecodedLogs]] = {
    "application/x-protobuf": decode_logs_protobuf,
    "application/protobuf": decode_logs_protobuf,
    "application/json": decode_logs_json,
}
