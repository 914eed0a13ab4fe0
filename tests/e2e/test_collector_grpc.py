"""The collector's OTLP/gRPC receiver and the OTLP it answers without storing, against a real collector process: the
OpenTelemetry SDK's own gRPC exporter gets its spans acknowledged only once they are stored; refusals carry the
gRPC code OTLP/HTTP puts in its Status; logs over HTTP are answered after their commit; metrics and unknown paths
get an answer that says what the collector takes."""

from __future__ import annotations

import json
import socket

import grpc
import httpx
import pytest
from click.testing import CliRunner
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceResponse
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult
from sqlalchemy import func, select

from tracemill.cli import main
from tracemill.collector.keys import create_key
from tracemill.store.cli import open_store
from tracemill.store.engine import make_engine
from tracemill.store.tables import LogEventRow, SpanRow, ToolCallRow

from support import CHAT_WITHOUT_OUTPUT as CHAT
from support import chat_attributes, export_request, logs_json, logs_request, make_span

pytestmark = pytest.mark.timeout(90)

_TRACES = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"
_LOGS = "/opentelemetry.proto.collector.logs.v1.LogsService/Export"
_METRICS = "/opentelemetry.proto.collector.metrics.v1.MetricsService/Export"


def _count(db_url: str, table: type) -> int:
    engine = make_engine(db_url)
    with engine.connect() as conn:
        n = int(conn.execute(select(func.count()).select_from(table)).scalar_one())
    engine.dispose()
    return n


class _StoredAtAck(SpanExporter):
    """The real gRPC exporter; at each acknowledgement, what the store holds."""

    def __init__(self, target: str, db_url: str) -> None:
        self.inner = OTLPSpanExporter(endpoint=target, insecure=True)
        self.db_url = db_url
        self.seen: list[tuple[SpanExportResult, int, int]] = []

    def export(self, spans):  # type: ignore[no-untyped-def]
        result = self.inner.export(spans)
        self.seen.append((result, _count(self.db_url, SpanRow), _count(self.db_url, ToolCallRow)))
        return result

    def shutdown(self) -> None:
        self.inner.shutdown()


def test_the_otel_grpc_exporter_is_acknowledged_once_spans_are_stored(start_collector, sqlite_url: str) -> None:
    collector = start_collector(sqlite_url)
    exporter = _StoredAtAck(collector.grpc_target, sqlite_url)
    provider = TracerProvider(resource=Resource.create({"service.name": "grpc-agent"}))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("tests")
    calls = [
        {"id": "call_1", "name": "get_weather", "arguments": {"city": "Oslo"}},
        {"id": "call_2", "name": "get_weather", "arguments": {"city": 7}},
    ]
    with (
        tracer.start_as_current_span("agent"),
        tracer.start_as_current_span("chat llama3.1-8b", attributes=chat_attributes(calls)),
    ):
        pass
    provider.shutdown()
    # the chat span ends first: its export is acknowledged with it and its two calls stored; then the agent span's
    assert exporter.seen == [(SpanExportResult.SUCCESS, 1, 2), (SpanExportResult.SUCCESS, 2, 2)]


def test_grpc_refusals_and_partial_success(start_collector, sqlite_url: str) -> None:
    open_store(sqlite_url).dispose()
    key = create_key(open_store(sqlite_url), "agent")[1]
    collector = start_collector(sqlite_url, TRACEMILL_MAX_BODY_BYTES="200000")
    with grpc.insecure_channel(collector.grpc_target) as channel:
        traces = channel.unary_unary(_TRACES, response_deserializer=ExportTraceServiceResponse.FromString)
        auth = (("authorization", f"Bearer {key}"),)
        good = export_request(
            [
                make_span(
                    "ab" * 16,
                    "cd" * 8,
                    "chat",
                    chat_attributes([{"id": "c1", "name": "get_weather", "arguments": {"city": "Oslo"}}]),
                )
            ]
        )

        with pytest.raises(grpc.RpcError) as refused:
            traces(good, timeout=10)
        assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED

        with pytest.raises(grpc.RpcError) as refused:
            traces(b"\xff\xff\xff", metadata=auth, timeout=10)
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "not a protobuf ExportTraceServiceRequest" in (refused.value.details() or "")

        with pytest.raises(grpc.RpcError) as refused:
            traces(
                export_request([make_span("ab" * 16, "ef" * 8, "big", {"x": "y" * 300_000})]), metadata=auth, timeout=10
            )
        assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED

        backwards = make_span("ab" * 16, "01" * 8, "backwards", {})
        backwards.end_time_unix_nano = backwards.start_time_unix_nano - 1
        request = export_request([make_span("ab" * 16, "cd" * 8, "chat", {}), backwards])
        answer = traces(good, metadata=auth, timeout=10)
        assert answer.partial_success.rejected_spans == 0
        answer = traces(request, metadata=auth, timeout=10)
        assert answer.partial_success.rejected_spans == 1
        assert (
            "ends" in answer.partial_success.error_message
            and "before it starts" in answer.partial_success.error_message
        )

        logs = channel.unary_unary(_LOGS, response_deserializer=ExportLogsServiceResponse.FromString)
        trace, span = "12" * 16, "34" * 8
        choice = [
            {
                "name": "gen_ai.choice",
                "body": {
                    "index": 0,
                    "message": {
                        "role": "assistant",
                        "tool_calls": [
                            {
                                "id": "c9",
                                "type": "function",
                                "function": {"name": "get_weather", "arguments": '{"city": "Rome"}'},
                            }
                        ],
                    },
                },
            }
        ]
        assert (
            logs(logs_request(trace, span, choice), metadata=auth, timeout=10).partial_success.rejected_log_records == 0
        )
        traces(export_request([make_span(trace, span, "chat", CHAT)]), metadata=auth, timeout=10)

        metrics = channel.unary_unary(_METRICS, response_deserializer=ExportMetricsServiceResponse.FromString)
        answer = metrics(_metrics_request(), metadata=auth, timeout=10)
        assert answer.partial_success.rejected_data_points == 3
        assert "not metrics" in answer.partial_success.error_message

    engine = make_engine(sqlite_url)
    with engine.connect() as conn:
        names = dict(conn.execute(select(ToolCallRow.tool_call_id, ToolCallRow.name)).all())
    engine.dispose()
    assert names == {"c1": "get_weather", "c9": "get_weather"}  # the span and its events, joined


def _metrics_request() -> bytes:
    request = ExportMetricsServiceRequest()
    metrics = request.resource_metrics.add().scope_metrics.add().metrics
    counter = metrics.add(name="gen_ai.client.token.usage")
    counter.sum.data_points.add(as_int=7)
    counter.sum.data_points.add(as_int=9)
    metrics.add(name="gen_ai.client.operation.duration").histogram.data_points.add(count=1, sum=0.2)
    return request.SerializeToString()


def test_http_logs_metrics_and_other_paths(start_collector, sqlite_url: str) -> None:
    collector = start_collector(sqlite_url)
    trace, span = "56" * 16, "78" * 8
    events = [
        {
            "name": "gen_ai.choice",
            "body": {
                "index": 0,
                "message": {
                    "role": "assistant",
                    "tool_calls": [
                        {
                            "id": "c5",
                            "type": "function",
                            "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'},
                        }
                    ],
                },
            },
        },
        {"name": "app.ready", "body": "not a GenAI event"},
    ]
    answer = httpx.post(
        f"{collector.url}/v1/logs", content=logs_json(trace, span, events), headers={"content-type": "application/json"}
    )
    assert answer.status_code == 200
    partial = answer.json()["partialSuccess"]
    assert partial["rejectedLogRecords"] == "1" and "gen_ai.*" in partial["errorMessage"]
    assert _count(sqlite_url, LogEventRow) == 1  # stored before the answer

    answer = httpx.post(
        f"{collector.url}/v1/traces",
        content=export_request([make_span(trace, span, "chat", CHAT)]),
        headers={"content-type": "application/x-protobuf"},
    )
    assert answer.status_code == 200 and _count(sqlite_url, ToolCallRow) == 1

    answer = httpx.post(f"{collector.url}/v1/logs", content=b"{", headers={"content-type": "application/json"})
    assert answer.status_code == 400 and "not valid JSON" in answer.json()["message"]

    answer = httpx.post(
        f"{collector.url}/v1/metrics", content=_metrics_request(), headers={"content-type": "application/x-protobuf"}
    )
    assert answer.status_code == 200
    response = ExportMetricsServiceResponse.FromString(answer.content)
    assert (
        response.partial_success.rejected_data_points == 3 and "not metrics" in response.partial_success.error_message
    )

    for method, path, status in (("POST", "/v1/profiles", 404), ("GET", "/v1/traces", 405), ("GET", "/", 404)):
        answer = httpx.request(method, f"{collector.url}{path}")
        assert answer.status_code == status
        assert "POST /v1/traces and POST /v1/logs" in json.loads(answer.content)["message"]


def test_a_taken_grpc_port_is_said_before_the_collector_starts(sqlite_url: str) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = CliRunner().invoke(main, ["collector", "--db", sqlite_url, "--port", "0", "--grpc-port", str(port)])
    assert result.exit_code == 1
    assert f"cannot listen for OTLP/gRPC on 127.0.0.1:{port}" in result.output and "--grpc-port 0" in result.output
