"""One call seen through two instrumentations (two traces, two requests) is one row however the collector's ingest
processes shared the requests out, and however long ago the first sighting was stored: each process's memory of the
calls it stored is only a shortcut, the store is what decides."""

from __future__ import annotations

import json
from typing import Any

import httpx
from sqlalchemy import select

from tracemill.store.engine import make_engine
from tracemill.store.tables import ToolCallRow

from support import chat_attributes, export_request, make_span

PROTOBUF = {"Content-Type": "application/x-protobuf"}
TEXT = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Lima"}}\n</tool_call>'
RESPONSE = "chatcmpl-9fQx2LmN4rT7vWc1Zq81"


def chain_span(trace: str, span: str, call_id: str, city: str) -> Any:
    """LangSmith's chain span repeating a call: no model, no tools offered (so no verdict against them)."""
    completion = {"messages": [{"type": "ai", "content": "", "tool_calls": [
        {"name": "get_weather", "args": {"city": city}, "id": call_id}]}]}
    attributes = {"langsmith.span.kind": "chain", "gen_ai.completion": json.dumps(completion)}
    return make_span(trace, span, "agent", attributes)


def chat_span(trace: str, span: str, call_id: str, city: str) -> Any:
    """The chat model's span of the call: model and tools offered."""
    return make_span(trace, span, "chat", chat_attributes([{"id": call_id, "name": "get_weather",
                                                            "arguments": {"city": city}}]))


def text_span(trace: str, span: str, model: bool) -> Any:
    """A call written as text in response RESPONSE, with or without the model recorded."""
    chat = {**chat_attributes([]), "gen_ai.response.id": RESPONSE,
            "gen_ai.output.messages": json.dumps([{"role": "assistant", "parts": [{"type": "text", "content": TEXT}]}])}
    if not model:
        del chat["gen_ai.request.model"]
    return make_span(trace, span, "chat", chat)


def send(client: httpx.Client, url: str, span: Any, service: str = "demo-agent") -> None:
    """One span, in a request of its own, acknowledged (so committed) before the next is sent."""
    response = client.post(f"{url}/v1/traces", content=export_request([span], {"service.name": service}),
                           headers=PROTOBUF)
    assert response.status_code == 200, response.text


def test_a_call_seen_in_two_requests_is_one_row_with_the_richer_record(db_url: str, start_collector) -> None:  # type: ignore[no-untyped-def]
    # call ids (drawn at random, as OpenAI's) -> the city in their arguments
    calls = {f"call_{n}q8Zr2LmN4x": city for n, city in enumerate(["Paris", "Oslo", "Rome", "Kyiv", "Lagos"])}
    ids = list(calls)
    collector = start_collector(db_url, workers=2)
    with httpx.Client(timeout=30) as client:
        # The poorer sighting first (a chain span, then the chat model's span in another trace), each request taken
        # by either of the two ingest processes; call 1 the other way round.
        for n, call_id in enumerate(ids):
            make = chat_span if n == 1 else chain_span
            send(client, collector.url, make(f"{n + 1:02x}" * 16, "01" * 8, call_id, calls[call_id]))
        for n, call_id in enumerate(ids[:2]):
            make = chain_span if n == 1 else chat_span
            send(client, collector.url, make(f"{n + 1:02x}" * 8 + "b0" * 8, "02" * 8, call_id, calls[call_id]))
        send(client, collector.url, text_span("a0" * 16, "01" * 8, model=False))
        collector.stop()
        # A new collector: new ingest processes, which never saw the first sightings.
        collector = start_collector(db_url, workers=2)
        for n, call_id in enumerate(ids[2:4], start=2):
            send(client, collector.url, chat_span(f"{n + 1:02x}" * 8 + "b0" * 8, "02" * 8, call_id, calls[call_id]))
        send(client, collector.url, text_span("a1" * 16, "01" * 8, model=True))
        # Not twins: the same content under another call id, and the same call id and content from another
        # service (the reviser sidecar's own record of what it relayed).
        send(client, collector.url, chat_span("c0" * 16, "01" * 8, "call_9Lm2xW7pQa", calls[ids[4]]))
        send(client, collector.url, chat_span("c1" * 16, "01" * 8, ids[4], calls[ids[4]]), service="tracemill-serve")
    collector.stop()

    engine = make_engine(db_url)
    with engine.connect() as conn:
        rows = conn.execute(select(ToolCallRow).order_by(ToolCallRow.id)).all()
    engine.dispose()
    by_id: dict[str | None, list[Any]] = {}
    for row in rows:
        by_id.setdefault(row.tool_call_id, []).append(row)
    assert {k: len(v) for k, v in by_id.items()} == {**{i: 1 for i in ids[:4]}, ids[4]: 2, "call_9Lm2xW7pQa": 1,
                                                     None: 1}
    for n, call_id in enumerate(ids[:4]):
        [row] = by_id[call_id]
        # the row first stored, in its own trace, with what the chat span knew: the model, the tools, the verdict
        assert (row.trace_id, row.span_id) == (f"{n + 1:02x}" * 16, "01" * 8)
        assert (row.model, row.name, row.arguments) == ("llama3.1-8b", "get_weather", {"city": calls[call_id]})
        assert row.toolset_id is not None and (row.name_valid, row.schema_valid) == (True, True)
    assert sorted(r.trace_id for r in by_id[ids[4]]) == ["05" * 16, "c1" * 16]
    [written] = by_id[None]
    assert (written.trace_id, written.model, written.name, written.raw) == ("a0" * 16, "llama3.1-8b", "get_weather",
                                                                            TEXT)
    assert written.response_id == RESPONSE
