"""A span as Tracemill holds it: decoded from OTLP (protobuf or JSON) by the collector, or read back from the store."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(slots=True)
class SpanRecord:
    trace_id: str  # 32 lowercase hex digits
    span_id: str  # 16 lowercase hex digits
    parent_span_id: str | None
    name: str
    kind: int  # OTLP SpanKind number
    start_time_ns: int
    end_time_ns: int
    status_code: int  # 0 unset, 1 ok, 2 error
    status_message: str
    attributes: dict[str, Any]  # OTLP AnyValue decoded: str, bool, int, float, bytes, list, dict
    resource: dict[str, Any]  # resource attributes
    scope_name: str = ""
    scope_version: str = ""
    events: list[dict[str, Any]] = field(default_factory=list)  # {"name", "time_ns", "attributes"}
    links: list[dict[str, Any]] = field(default_factory=list)  # {"trace_id", "span_id", "attributes"}
