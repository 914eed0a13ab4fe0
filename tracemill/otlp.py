"""Python values as OTLP protobuf attributes, and what an OTLP/HTTP answer says it rejected: for sending spans without
the OpenTelemetry SDK (replays, benchmarks, tests)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, ArrayValue, KeyValue, KeyValueList


def any_value(value: Any) -> AnyValue:
    if isinstance(value, bool):
        return AnyValue(bool_value=value)
    if isinstance(value, int):
        return AnyValue(int_value=value)
    if isinstance(value, float):
        return AnyValue(double_value=value)
    if isinstance(value, bytes):
        return AnyValue(bytes_value=value)
    if isinstance(value, (list, tuple)):
        return AnyValue(array_value=ArrayValue(values=[any_value(v) for v in value]))
    if isinstance(value, Mapping):
        return AnyValue(kvlist_value=KeyValueList(values=key_values(value)))
    return AnyValue(string_value=str(value))


def key_values(attributes: Mapping[str, Any]) -> list[KeyValue]:
    return [KeyValue(key=k, value=any_value(v)) for k, v in attributes.items()]


@dataclass(frozen=True)
class PartialSuccess:
    rejected_spans: int = 0
    error_message: str = ""


def partial_success(content: bytes, content_type: str) -> PartialSuccess:
    """The `partial_success` of an export answer, protobuf or JSON (none for an empty answer or another type)."""
    if content and "protobuf" in content_type:
        answer = ExportTraceServiceResponse.FromString(content).partial_success
        return PartialSuccess(answer.rejected_spans, answer.error_message)
    if content and "json" in content_type:
        part = orjson.loads(content).get("partialSuccess", {})
        return PartialSuccess(int(part.get("rejectedSpans", 0)), part.get("errorMessage", ""))
    return PartialSuccess()
