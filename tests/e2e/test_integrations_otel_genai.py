"""OpenTelemetry's official OpenAI instrumentation (`opentelemetry-instrumentation-openai-v2`), unchanged, sends to a
real collector with the real OTLP exporters, and the calls land as tool_calls rows.

With content captured as events (`EVENT_ONLY`), the instrumentation puts the model's messages in one log event per
call (`gen_ai.client.inference.operation.details`) sent to `/v1/logs`, apart from its span: whichever arrives first,
the rows are the same. With span-only content (`SPAN_ONLY`) the messages are on the span. Either way the
instrumentation does not record the tools offered, so the calls (the one written as text too) are stored with unknown
name and schema verdicts. Where the agent records them beside it (a span with `gen_ai.tool.definitions`), the calls
are mined, and the reviser's prompt holds the conversation whether it came in events or on the span.

openai-v2 2.4b0 runs only with opentelemetry-util-genai 1.0b0 or 1.1b0 (1.2b0 renamed a module it imports), which
always use the latest experimental conventions; the older conventions' `gen_ai.choice` events are read too
(tests/test_log_events.py).
"""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest
import test_integrations as scripted
from click.testing import CliRunner
from test_integrations import ChatCompletionsServer

from tracemill.cli import main

chat_server = scripted.chat_server  # the fixture, used here too

pytestmark = pytest.mark.timeout(90)

OPENAI_V2_AGENT = """
    import json, os
    from openai import OpenAI
    from opentelemetry.instrumentation.openai_v2 import OpenAIInstrumentor
    from opentelemetry.sdk._logs import LoggerProvider
    from opentelemetry.sdk._logs.export import BatchLogRecordProcessor
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    if os.environ["TRANSPORT"] == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc._log_exporter import OTLPLogExporter
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
        span_exporter = OTLPSpanExporter(endpoint=os.environ["GRPC"], insecure=True)
        log_exporter = OTLPLogExporter(endpoint=os.environ["GRPC"], insecure=True)
    else:
        from opentelemetry.exporter.otlp.proto.http._log_exporter import OTLPLogExporter
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        span_exporter = OTLPSpanExporter(os.environ["COLLECTOR"] + "/v1/traces")
        log_exporter = OTLPLogExporter(os.environ["COLLECTOR"] + "/v1/logs")
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(BatchSpanProcessor(span_exporter))
    logger_provider = LoggerProvider()
    logger_provider.add_log_record_processor(BatchLogRecordProcessor(log_exporter))
    OpenAIInstrumentor().instrument(tracer_provider=tracer_provider, logger_provider=logger_provider)

    client = OpenAI(base_url=os.environ["MODEL_URL"], api_key="not-needed")
    tools = json.loads(os.environ["TOOLS"])
    messages = [{"role": "user", "content": "Weather in Paris, then the forecast?"}]
    tracer = tracer_provider.get_tracer("agent")
    with tracer.start_as_current_span("agent"):
        if os.environ.get("OFFER_TOOLS"):  # the tools offered, recorded beside the instrumentation (which does not)
            with tracer.start_as_current_span("tools/list") as listed:
                listed.set_attribute("gen_ai.tool.definitions", os.environ["TOOLS"])
        for turn in range(5):
            if turn == 3:
                for chunk in client.chat.completions.create(model="llama3.1-8b", messages=messages, tools=tools,
                                                            stream=True):
                    pass
            else:
                client.chat.completions.create(model="llama3.1-8b", messages=messages, tools=tools)
    # which signal reaches the collector first
    first, second = ((logger_provider, tracer_provider) if os.environ["FIRST"] == "logs"
                     else (tracer_provider, logger_provider))
    first.shutdown()
    second.shutdown()
    print("done")
"""


def _run(start_collector, sqlite_url: str, tmp_path: Path, server: ChatCompletionsServer, **env: str) -> None:
    collector = start_collector(sqlite_url)
    scripted.run_agent(
        OPENAI_V2_AGENT,
        tmp_path,
        COLLECTOR=collector.url,
        GRPC=collector.grpc_target,
        MODEL_URL=server.url,
        TOOLS=json.dumps([scripted.WEATHER_TOOL, scripted.FORECAST_TOOL]),
        **env,
    )
    assert len(server.requests) == 5


def _assert_calls(sqlite_url: str) -> None:
    rows = scripted.stored(sqlite_url, lambda rs: len(rs) == 4)
    native = {r.tool_call_id: r for r in rows if r.tool_call_id}
    # the call written as text: its name and arguments recovered, failed as sent, the tools it was offered unknown
    (text,) = [r for r in rows if not r.tool_call_id]
    assert (text.name, text.arguments, text.name_valid) == ("get_forecast", {"city": "Paris", "days": 3}, None)
    assert "<tool_call>" in text.raw
    assert sorted(native) == ["call_1", "call_3", "call_4"]
    weather, broken, streamed = native["call_1"], native["call_3"], native["call_4"]
    assert (weather.name, weather.parsed, weather.arguments) == ("get_weather", True, {"city": "Paris"})
    # the instrumentation does not record the tools offered: the verdicts that need them are unknown, not failed
    assert all(r.name_valid is None and r.schema_valid is None for r in native.values())
    assert broken.name == "get_forecast" and not broken.parsed
    assert json.loads(broken.raw)["arguments"] == '{"city": "Paris", "days": 3'
    assert (streamed.name, streamed.arguments) == ("get_forecast", {"city": "Lyon", "days": 2})
    assert {r.model for r in native.values()} == {"llama3.1-8b-instruct"}


@pytest.mark.parametrize("transport, first", [("grpc", "spans"), ("http", "logs")])
def test_openai_v2_content_in_log_events(
    start_collector, sqlite_url: str, tmp_path: Path, chat_server: ChatCompletionsServer, transport: str, first: str
) -> None:
    _run(
        start_collector,
        sqlite_url,
        tmp_path,
        chat_server,
        TRANSPORT=transport,
        FIRST=first,
        OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT="EVENT_ONLY",
    )
    _assert_calls(sqlite_url)


def test_openai_v2_latest_conventions_content_on_spans(
    start_collector, sqlite_url: str, tmp_path: Path, chat_server: ChatCompletionsServer
) -> None:
    _run(
        start_collector,
        sqlite_url,
        tmp_path,
        chat_server,
        TRANSPORT="http",
        FIRST="spans",
        OTEL_SEMCONV_STABILITY_OPT_IN="gen_ai_latest_experimental",
        OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT="SPAN_ONLY",
    )
    _assert_calls(sqlite_url)


def _mined_prompts(db_url: str, out: Path) -> dict[str, str]:
    """The user message of each failed call's prompt, by the call's raw output."""
    done = CliRunner().invoke(main, ["mine", "--db", db_url, "--out", str(out), "--valid-share", "0", "--json"])
    assert done.exit_code == 0, done.output
    rows = [json.loads(line) for split in ("train", "eval")
            for line in (out / f"{split}.jsonl").read_text().splitlines()]
    return {r["raw"]: r["prompt"][-1]["content"] for r in rows}


def test_the_conversation_reaches_the_reviser_prompt_from_log_events_as_from_spans(
    start_collector, sqlite_url: str, tmp_path: Path
) -> None:
    """An agent whose instrumentation puts the messages in log events is mined with its conversation, as one that puts
    them on the span: the same prompts either way."""
    prompts = []
    for n, content in enumerate(("EVENT_ONLY", "SPAN_ONLY")):
        url = sqlite_url if n == 0 else f"sqlite:///{tmp_path}/spans.db"
        server = ChatCompletionsServer()
        threading.Thread(target=server.serve_forever, daemon=True).start()
        try:
            _run(start_collector, url, tmp_path, server, TRANSPORT="http", FIRST="spans", OFFER_TOOLS="1",
                 OTEL_SEMCONV_STABILITY_OPT_IN="gen_ai_latest_experimental",
                 OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=content)
        finally:
            server.shutdown()
            server.server_close()
        scripted.stored(url, lambda rs: len(rs) == 4 and all(r.toolset_id is not None for r in rs))
        prompts.append(_mined_prompts(url, tmp_path / f"export-{n}"))
    from_events, from_spans = prompts
    assert len(from_events) == 2  # the calls that failed: the one written as text, the one cut short
    broken = next(raw for raw in from_events if "<tool_call>" not in raw)
    assert "<conversation>\nuser: Weather in Paris, then the forecast?\n</conversation>" in from_events[broken]
    assert from_events == from_spans
