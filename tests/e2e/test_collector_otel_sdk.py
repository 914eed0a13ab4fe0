"""An agent instrumented with the official OpenTelemetry SDK and OTLP/HTTP exporter (protobuf and JSON) sends tool
calls to a collector process; `tracemill stats --json` reports MCP-Bench's figures over them."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from opentelemetry.exporter.otlp.json.http.trace_exporter import OTLPSpanExporter as JSONSpanExporter
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as ProtobufSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.trace import Status, StatusCode
from sqlalchemy import text

from tracemill.store.engine import make_engine

from support import WEATHER_TOOLS, chat_attributes

EXPORTERS = {"protobuf": ProtobufSpanExporter, "json": JSONSpanExporter}

CALLS = [
    {"id": "c1", "name": "get_weather", "arguments": {"city": "Paris"}},  # valid, runs
    {"id": "c2", "name": "get_weather", "arguments": '{"city": "Paris"'},  # broken JSON: never runs
    {"id": "c3", "name": "get_wether", "arguments": {"city": "Paris"}},  # unknown tool
    {"id": "c4", "name": "get_forecast", "arguments": {"city": "Oslo"}},  # schema violation, fails when run
    {"id": "c5", "name": "get_forecast", "arguments": {"city": "Oslo", "days": 3}},  # valid, runs
]


def run_agent(endpoint: str, exporter: str) -> None:
    provider = TracerProvider(resource=Resource.create({"service.name": "weather-agent",
                                                        "tracemill.harness.version": "prompt-v7"}))
    provider.add_span_processor(BatchSpanProcessor(EXPORTERS[exporter](endpoint=f"{endpoint}/v1/traces")))
    tracer = provider.get_tracer("weather-agent")
    with tracer.start_as_current_span("invoke_agent weather"):
        with tracer.start_as_current_span("chat llama3.1-8b") as chat:
            for key, value in chat_attributes(CALLS).items():
                chat.set_attribute(key, value)
        for call_id, name, error in [("c1", "get_weather", None), ("c4", "get_forecast", "missing 'days'"),
                                     ("c5", "get_forecast", None)]:
            with tracer.start_as_current_span(f"execute_tool {name}") as span:
                span.set_attribute("gen_ai.operation.name", "execute_tool")
                span.set_attribute("gen_ai.tool.name", name)
                span.set_attribute("gen_ai.tool.call.id", call_id)
                if error:
                    span.set_attribute("error.type", "ToolError")
                    span.set_status(Status(StatusCode.ERROR, error))
                else:
                    span.set_attribute("gen_ai.tool.call.result", '{"temperature": 12}')
    assert provider.force_flush(30_000)
    provider.shutdown()


def stats(db_url: str, *args: str) -> dict:
    out = subprocess.run([sys.executable, "-m", "tracemill.cli", "stats", "--db", db_url, "--json", *args],
                         check=True, capture_output=True, text=True)
    return json.loads(out.stdout)


@pytest.mark.parametrize("exporter", sorted(EXPORTERS))
def test_stats_over_an_instrumented_agent(db_url: str, exporter: str, start_collector) -> None:
    collector = start_collector(db_url)
    run_agent(collector.url, exporter)

    figures = stats(db_url)
    assert set(figures) == {"valid_tool_name_rate", "input_schema_compliance", "execution_success_rate",
                            "valid_call_failure_rate", "total_calls", "groups"}
    assert figures["total_calls"] == 5
    assert figures["valid_tool_name_rate"] == pytest.approx(4 / 5)  # c3 names no offered tool
    assert figures["input_schema_compliance"] == pytest.approx(2 / 4)  # c2 unreadable, c4 misses 'days'
    assert figures["execution_success_rate"] == pytest.approx(2 / 5)  # c1, c5 ran; c2, c3 could not; c4 failed
    assert figures["valid_call_failure_rate"] == pytest.approx(2 / 4)  # c2 and c4 among c1, c2, c4, c5

    by_model = stats(db_url, "--by", "model")["groups"]
    assert set(by_model) == {"llama3.1-8b"} and by_model["llama3.1-8b"]["total_calls"] == 5
    by_harness = stats(db_url, "--by", "harness")["groups"]
    assert set(by_harness) == {"prompt-v7"}

    engine = make_engine(db_url)
    with engine.connect() as conn:
        rows = {r.tool_call_id: r for r in conn.execute(text(
            "select tool_call_id, raw, stage, violations, execution_status, toolset_id from tool_calls"))}
        toolsets = conn.execute(text("select tool_count from toolsets")).scalars().all()
    engine.dispose()
    assert rows["c2"].stage == "parse" and '"{\\"city\\": \\"Paris\\""' in rows["c2"].raw
    assert rows["c3"].stage == "tool_name"
    violations = rows["c4"].violations if isinstance(rows["c4"].violations, list) else json.loads(rows["c4"].violations)
    assert [(v["kind"], v["pointer"]) for v in violations] == [("missing_required", "/arguments/days")]
    assert rows["c1"].execution_status == "success" and rows["c4"].execution_status == "error"
    assert toolsets == [len(WEATHER_TOOLS)]
