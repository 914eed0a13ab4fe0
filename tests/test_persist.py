"""What one ingest process writes is what the next one reads: each has its own caches, so whatever a request needs
from earlier requests (the tools a trace was offered) must be found in the store too."""

from __future__ import annotations

import json

from sqlalchemy import select

from support import chat_attributes, export_request, make_span
from tracemill.collector.decode import Limits, decode_protobuf
from tracemill.collector.persist import SpanWriter
from tracemill.store.engine import make_engine
from tracemill.store.migrate import upgrade
from tracemill.store.tables import ToolCallRow

WEATHER_MCP = {"name": "get_weather", "description": "Current weather for a city.",
               "inputSchema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"],
                               "additionalProperties": False}}


def test_a_call_is_verified_against_tools_listed_in_a_request_another_process_stored(db_url: str) -> None:
    engine = make_engine(db_url)
    upgrade(engine)
    trace = "cd" * 16
    listed = make_span(trace, "01" * 8, "tools/list",
                       {"mcp.method.name": "tools/list", "mcp.tools": json.dumps({"tools": [WEATHER_MCP]})})
    chat = chat_attributes([{"id": "c1", "name": "get_weather", "arguments": {"city": 7}},
                            {"id": "c2", "name": "get_wether", "arguments": {"city": "Oslo"}}])
    del chat["gen_ai.tool.definitions"]  # the model call does not repeat the tools: they were listed before
    answered = make_span(trace, "02" * 8, "chat", chat, start_ns=1_700_000_001_000_000_000)

    # Two ingest processes: the second never saw the tools/list request.
    for writer, span in ((SpanWriter(engine.dialect), listed), (SpanWriter(engine.dialect), answered)):
        batch = writer.prepare(decode_protobuf(export_request([span]), Limits(1 << 20)).spans)
        with engine.begin() as conn:
            writer.write(conn, batch)
        writer.committed()

    with engine.connect() as conn:
        rows = conn.execute(select(ToolCallRow.name, ToolCallRow.name_valid, ToolCallRow.schema_valid,
                                   ToolCallRow.toolset_id).order_by(ToolCallRow.call_index)).all()
    assert [(r.name, r.name_valid, r.schema_valid) for r in rows] == [("get_weather", True, False),
                                                                       ("get_wether", False, None)]
    assert all(r.toolset_id is not None for r in rows)
    engine.dispose()
