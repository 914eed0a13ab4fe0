"""What the collector answers for OTLP it does not store.

Metrics (`POST /v1/metrics`, gRPC `MetricsService/Export`) are read and dropped, answered with success and a partial
success that counts every data point as rejected and says why. An exporter configured once for all signals (an
`OTEL_EXPORTER_OTLP_ENDPOINT` pointed at Tracemill) keeps working and its log says where its metrics went; a 4xx would
make it log an error on every export. Any other path gets a 404 (405 for a wrong method) whose body names what the
collector takes.
"""

from __future__ import annotations

from typing import Any

import orjson
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)

from tracemill.collector.decode import _expect, _json_list, json_request, protobuf_request

METRICS_DROPPED = (
    "Tracemill stores traces and GenAI log events, not metrics: these data points were not stored "
    "(send metrics to a metrics backend, or only traces and logs to Tracemill)"
)
ROUTES = (
    "the collector takes POST /v1/traces and POST /v1/logs (OTLP, protobuf or JSON, gzip or not; gRPC on its "
    "own port), answers POST /v1/metrics without storing it, and GET /healthz"
)

_PB_KINDS = ("gauge", "sum", "histogram", "exponential_histogram", "summary")
_JSON_KINDS = ("gauge", "sum", "histogram", "exponentialHistogram", "exponential_histogram", "summary")


def count_data_points(body: bytes, protobuf: bool) -> int:
    """The data points in an ExportMetricsServiceRequest; PayloadError when it is not one."""
    if protobuf:
        request = protobuf_request(ExportMetricsServiceRequest, body)
        return sum(
            len(getattr(metric, kind).data_points)
            for rm in request.resource_metrics
            for sm in rm.scope_metrics
            for metric in sm.metrics
            if (kind := metric.WhichOneof("data")) in _PB_KINDS
        )
    request = json_request(body, "ExportMetricsServiceRequest")
    points = 0
    for i, rm in enumerate(_json_list(request, "resourceMetrics", "resource_metrics", "body")):
        _expect(rm, dict, f"resourceMetrics[{i}]", "an object")
        for j, sm in enumerate(_json_list(rm, "scopeMetrics", "scope_metrics", f"resourceMetrics[{i}]")):
            where = f"resourceMetrics[{i}].scopeMetrics[{j}]"
            _expect(sm, dict, where, "an object")
            for metric in _json_list(sm, "metrics", "metrics", where):
                points += _json_points(metric)
    return points


def _json_points(metric: Any) -> int:
    if not isinstance(metric, dict):
        return 0
    for kind in _JSON_KINDS:
        data = metric.get(kind)
        if isinstance(data, dict):
            points = data.get("dataPoints", data.get("data_points"))
            return len(points) if isinstance(points, list) else 0
    return 0


def metrics_response(points: int, json_body: bool) -> bytes:
    if json_body:
        return orjson.dumps({"partialSuccess": {"rejectedDataPoints": str(points), "errorMessage": METRICS_DROPPED}})
    response = ExportMetricsServiceResponse()
    response.partial_success.rejected_data_points = points
    response.partial_success.error_message = METRICS_DROPPED
    return response.SerializeToString()
