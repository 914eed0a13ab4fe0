"""Large attribute values (tool definitions resent with every model call) are stored once and read back intact."""

from __future__ import annotations

import json

import httpx
from sqlalchemy import select, text

from tracemill.store.engine import make_engine
from tracemill.store.payloads import PAYLOAD_MIN_CHARS, is_reference, read_payload, resolve
from tracemill.store.queries import trace_spans
from tracemill.store.tables import SpanRow

from support import WEATHER_TOOLS, chat_attributes, export_request, make_span

BIG_TOOLS = WEATHER_TOOLS + [
    {"type": "function", "function": {"name": f"tool_{i}", "description": "A tool. " * 20,
                                      "parameters": {"type": "object", "properties": {"q": {"type": "string"}}}}}
    for i in range(10)
]


def test_large_values_are_stored_once_and_read_back(db_url: str, start_collector) -> None:  # type: ignore[no-untyped-def]
    collector = start_collector(db_url)
    definitions = json.dumps(BIG_TOOLS)
    assert len(definitions) >= PAYLOAD_MIN_CHARS
    spans = [make_span("ab" * 16, f"{i + 1:016x}", "chat",
                       chat_attributes([{"id": f"c{i}", "name": "get_weather", "arguments": {"city": "Rome"}}],
                                       tools=BIG_TOOLS))
             for i in range(5)]
    for body in (export_request(spans[:3]), export_request(spans[3:])):
        response = httpx.post(f"{collector.url}/v1/traces", content=body,
                              headers={"Content-Type": "application/x-protobuf"})
        assert response.status_code == 200

    engine = make_engine(db_url)
    with engine.connect() as conn:
        assert conn.execute(text("select count(*) from payloads")).scalar_one() == 1
        stored = conn.execute(select(SpanRow.attributes).order_by(SpanRow.span_id)).scalars().all()
        assert len(stored) == 5
        for attributes in stored:
            reference = attributes["gen_ai.tool.definitions"]
            assert is_reference(reference) and reference["chars"] == len(definitions)
            assert not is_reference(attributes["gen_ai.operation.name"])
            assert resolve(conn, attributes)["gen_ai.tool.definitions"] == definitions
        key = stored[0]["gen_ai.tool.definitions"]["$payload"]
        assert read_payload(conn, key, offset=10, limit=50) == definitions[10:60]
        assert read_payload(conn, key, offset=len(definitions) - 7) == definitions[-7:]
        whole = trace_spans(conn, "ab" * 16)
        assert [s.attributes["gen_ai.tool.definitions"] for s in whole] == [definitions] * 5
        paged = trace_spans(conn, "ab" * 16, resolved=False)
        assert all(is_reference(s.attributes["gen_ai.tool.definitions"]) for s in paged)
        calls = conn.execute(text("select count(*) from tool_calls where name_valid")).scalar_one()
    engine.dispose()
    assert calls == 5, "the calls were verified against the full definitions"
