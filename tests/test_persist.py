"""What one ingest process writes is what the next one reads: each has its own caches, so whatever a request needs
from earlier requests (the tools a trace was offered) must be found in the store too."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable

from opentelemetry.proto.trace.v1.trace_pb2 import Span
from sqlalchemy import select

from tracemill.collector.decode import Limits, decode_protobuf
from tracemill.collector.persist import Prepared, SpanWriter
from tracemill.store.engine import make_engine
from tracemill.store.migrate import upgrade
from tracemill.store.tables import SpanRow, ToolCallRow, ToolExecutionRow

from support import chat_attributes, export_request, make_span, store_as_before

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


def _write(engine, writer: SpanWriter, spans, service: str = "test-agent") -> None:  # type: ignore[no-untyped-def]
    body = export_request(spans, {"service.name": service})
    batch = writer.prepare(decode_protobuf(body, Limits(1 << 20)).spans)
    with engine.begin() as conn:
        writer.write(conn, batch)
    writer.committed()


def _write_in_orders(engine, writer: SpanWriter, spans: Callable[[str], dict[str, Span]],  # type: ignore[no-untyped-def]
                     orders: list[list[list[str]]]) -> None:
    """Each order (batches of span names) written in a trace of its own, a batch a request."""
    for n, batches in enumerate(orders):
        made = spans(f"{n + 1:032x}")
        for batch in batches:
            _write(engine, writer, [made[name] for name in batch])


def test_one_call_seen_by_a_chain_span_another_trace_and_a_tool_span_is_one_full_row(db_url: str) -> None:
    """A chain span repeating the call (no model, no tools), then the chat model's span in the same trace, then the
    same call in another trace (a second instrumentation), each in its own request; the tool span carries no call id."""
    engine = make_engine(db_url)
    upgrade(engine)
    writer = SpanWriter(engine.dialect)
    first, second = "a1" * 16, "b2" * 16
    chain = {"langsmith.span.kind": "chain", "gen_ai.completion": json.dumps({"messages": [
        {"type": "ai", "content": "", "tool_calls": [{"name": "get_weather", "args": {"city": "Paris"},
                                                      "id": "call_q8Zr2LmN4x"}]}]})}
    call = [{"id": "call_q8Zr2LmN4x", "name": "get_weather", "arguments": {"city": "Paris"}}]
    _write(engine, writer, [make_span(first, "01" * 8, "agent", chain)])
    _write(engine, writer, [make_span(first, "02" * 8, "chat", chat_attributes(call), parent="01" * 8)])
    _write(engine, writer, [make_span(second, "03" * 8, "ChatCompletion", chat_attributes(call))])
    tool = {"traceloop.span.kind": "tool", "traceloop.entity.name": "get_weather",
            "traceloop.entity.input": json.dumps({"args": [], "kwargs": {"city": "Paris"}}),
            "traceloop.entity.output": json.dumps("sunny in Paris")}
    _write(engine, writer, [make_span(first, "04" * 8, "get_weather.tool", tool, parent="01" * 8)])

    with engine.connect() as conn:
        rows = conn.execute(select(ToolCallRow)).all()
    engine.dispose()
    assert len(rows) == 1
    [row] = rows
    assert (row.trace_id, row.span_id, row.model) == (first, "01" * 8, "llama3.1-8b")
    assert row.toolset_id is not None and (row.name_valid, row.schema_valid) == (True, True)
    assert (row.execution_status, row.execution_result, row.execution_span_id) == \
        ("success", '"sunny in Paris"', "04" * 8)


def test_a_call_id_in_two_traces_is_two_calls_with_other_content_or_a_numbered_id(sqlite_url: str) -> None:
    engine = make_engine(sqlite_url)
    upgrade(engine)
    writer = SpanWriter(engine.dialect)
    sent = [("a1" * 16, "call_Xk2pQ9rT", "Paris"), ("b2" * 16, "call_Xk2pQ9rT", "Oslo"),  # same id, other content
            ("c3" * 16, "call_0", "Rome"), ("d4" * 16, "call_0", "Rome")]  # a numbered id: the server repeats it
    for trace, call_id, city in sent:
        call = [{"id": call_id, "name": "get_weather", "arguments": {"city": city}}]
        _write(engine, writer, [make_span(trace, "01" * 8, "chat", chat_attributes(call))])
    with engine.connect() as conn:
        cities = sorted(a["city"] for a in conn.execute(select(ToolCallRow.arguments)).scalars())
    engine.dispose()
    assert cities == ["Oslo", "Paris", "Rome", "Rome"]


def test_a_numbered_call_id_repeated_in_the_turns_of_one_trace_is_one_call_per_turn(db_url: str) -> None:
    """A server that numbers its calls (`call_0`) gives each turn's call of one agent loop the same id: each is a row of
    its own with its own execution, the executions coming before or after their calls, while a chain span repeating a
    turn's call is still that call."""
    engine = make_engine(db_url)
    upgrade(engine)
    writer = SpanWriter(engine.dialect)
    trace = "a1" * 16

    def chat(span: str, city: str) -> Span:
        call = [{"id": "call_0", "name": "get_weather", "arguments": {"city": city}}]
        return make_span(trace, span * 8, "chat", chat_attributes(call))

    def tool(span: str, result: str, city: str | None) -> Span:
        attributes = {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "get_weather",
                      "gen_ai.tool.call.id": "call_0", "gen_ai.tool.call.result": result}
        if city is not None:
            attributes["gen_ai.tool.call.arguments"] = json.dumps({"city": city})
        return make_span(trace, span * 8, "execute_tool get_weather", attributes)

    rome = {"name": "get_weather", "args": {"city": "Rome"}, "id": "call_0"}
    said = {"type": "ai", "content": "", "tool_calls": [rome]}
    chain = {"langsmith.span.kind": "chain", "gen_ai.completion": json.dumps({"messages": [said]})}
    for spans in ([chat("01", "Paris")], [chat("03", "Oslo")], [tool("04", "rain in Oslo", "Oslo")],
                  [tool("02", "sunny in Paris", "Paris")], [tool("06", "hot in Rome", None)],
                  [make_span(trace, "07" * 8, "agent", chain), chat("05", "Rome")],
                  [chat("08", "Lima"), tool("09", "mild in Lima", "Lima")]):
        _write(engine, writer, spans)
    with engine.connect() as conn:
        rows = conn.execute(select(ToolCallRow.arguments, ToolCallRow.execution_result, ToolCallRow.stage)
                            .order_by(ToolCallRow.id)).all()
    engine.dispose()
    assert [(r.arguments["city"], r.execution_result, r.stage) for r in rows] == [
        ("Paris", "sunny in Paris", None), ("Oslo", "rain in Oslo", None), ("Rome", "hot in Rome", None),
        ("Lima", "mild in Lima", None)]


def test_a_numbered_call_id_s_execution_goes_to_the_call_made_last_before_it_ran_whatever_the_arrival_order(
        db_url: str) -> None:
    """A server that numbers every call `0` (TGI): the agent's first call is refused before it runs (a number where
    the schema wants a string), its retry runs, and the execute_tool span says neither arguments nor which turn it
    answered. The execution is the retry's, the call made last before it started, in whatever order the spans
    arrive; the refused call stays not run, even where a second record of the execution (the tool server's span)
    comes too."""
    engine = make_engine(db_url)
    upgrade(engine)
    writer = SpanWriter(engine.dialect)
    second = 1_000_000_000

    def spans(trace: str) -> dict[str, Span]:
        def chat(span: str, city: object, at: int) -> Span:
            call = [{"id": "0", "name": "get_weather", "arguments": {"city": city}}]
            return make_span(trace, span * 8, "chat", chat_attributes(call), start_ns=1_700_000_000 * second + at)

        ran = {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "get_weather", "gen_ai.tool.call.id": "0",
               "gen_ai.tool.call.result": "rain in Oslo"}
        return {"refused": chat("01", 7, 0), "retry": chat("02", "Oslo", 2 * second),
                "ran": make_span(trace, "03" * 8, "execute_tool get_weather", ran,
                                 start_ns=1_700_000_000 * second + 3 * second),
                "again": make_span(trace, "04" * 8, "execute_tool get_weather", ran, parent="03" * 8,
                                   start_ns=1_700_000_000 * second + 3 * second + 1000)}

    orders = [[["refused", "retry", "ran"]], [["refused", "retry"], ["ran"]], [["refused"], ["retry", "ran"]],
              [["ran"], ["refused", "retry"]], [["ran"], ["retry"], ["refused"]], [["retry"], ["ran"], ["refused"]],
              [["refused", "retry", "ran", "again"]], [["again"], ["refused"], ["ran", "retry"]]]
    _write_in_orders(engine, writer, spans, orders)
    with engine.connect() as conn:
        rows = conn.execute(select(ToolCallRow.trace_id, ToolCallRow.arguments, ToolCallRow.execution_result)
                            .order_by(ToolCallRow.trace_id, ToolCallRow.start_time_ns)).all()
    engine.dispose()
    assert [(r.arguments["city"], r.execution_result) for r in rows] == [(7, None), ("Oslo", "rain in Oslo")] * 8


SECOND = 1_000_000_000
# the same call to a server that numbers every call `0`, as the model sends it and as a chain span's history says it
OSLO = [{"id": "0", "name": "get_weather", "arguments": {"city": "Oslo"}}]
SAID = {"type": "ai", "content": "", "tool_calls": [{"name": "get_weather", "args": {"city": "Oslo"}, "id": "0"}]}


def _oslo_turns(trace: str, parent: str | None = None) -> dict[str, Span]:
    """An agent's two turns, a second apart each: the call (`first`, at 0 s), its execution failing (`failed`), the
    very same call sent again (`again`, at 2 s) and its execution running well (`ran`)."""
    def at(span: str, name: str, attributes: dict, seconds: float, status_code: int = 0) -> Span:
        return make_span(trace, span * 8, name, attributes, parent=parent, status_code=status_code,
                         start_ns=1_700_000_000 * SECOND + int(seconds * SECOND))

    def ran(**more: str) -> dict[str, str]:
        return {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "get_weather",
                "gen_ai.tool.call.id": "0", **more}

    return {"first": at("01", "chat", chat_attributes(OSLO), 0),
            "failed": at("02", "execute_tool get_weather", ran(**{"error.type": "timeout"}), 1, status_code=2),
            "again": at("03", "chat", chat_attributes(OSLO), 2),
            "ran": at("04", "execute_tool get_weather", ran(**{"gen_ai.tool.call.result": "rain in Oslo"}), 3)}


def test_the_same_call_sent_again_under_a_numbered_id_after_its_tool_failed_is_a_call_of_its_own(
        db_url: str) -> None:
    """A server that numbers every call `0`: the agent's call fails when it runs, and the model sends the very same
    call again in its next turn, which runs well. Two calls, each with its execution, in whatever order the spans
    arrive; while a span that repeats a call during the turn that made it (a chain span around the model call) is
    still that one call."""
    engine = make_engine(db_url)
    upgrade(engine)
    writer = SpanWriter(engine.dialect)

    def spans(trace: str) -> dict[str, Span]:
        chain = {"langsmith.span.kind": "chain", "gen_ai.completion": json.dumps({"messages": [SAID]})}
        return {**_oslo_turns(trace),
                "chain": make_span(trace, "05" * 8, "agent", chain, start_ns=1_700_000_000 * SECOND + 2 * SECOND)}

    orders = [[["first", "failed", "again", "chain", "ran"]], [["first"], ["failed"], ["again", "chain"], ["ran"]],
              [["ran"], ["chain"], ["again"], ["failed"], ["first"]], [["again", "ran"], ["first", "failed", "chain"]]]
    _write_in_orders(engine, writer, spans, orders)
    with engine.connect() as conn:
        rows = conn.execute(select(ToolCallRow.trace_id, ToolCallRow.execution_status, ToolCallRow.execution_result)
                            .order_by(ToolCallRow.trace_id, ToolCallRow.start_time_ns)).all()
    engine.dispose()
    assert [(r.execution_status, r.execution_result) for r in rows] == [
        ("error", None), ("success", "rain in Oslo")] * len(orders)


def test_a_chain_span_repeating_the_run_s_turns_leaves_each_numbered_call_its_own_model_call(db_url: str) -> None:
    """A LangGraph-style chain span around the whole run, whose output repeats its turns: the call `0` that failed and
    the same call sent again. Whatever order the spans arrive in (the chain first included), each of the two calls is
    one row on the model call that made it, with its model, its verdict and its execution: also where both model calls
    come in one request after the chain."""
    engine = make_engine(db_url)
    upgrade(engine)
    writer = SpanWriter(engine.dialect)
    run = [{"type": "human", "content": "Weather in Oslo?"}, SAID, {"type": "tool", "content": "timeout",
           "tool_call_id": "0"}, SAID, {"type": "tool", "content": "rain in Oslo", "tool_call_id": "0"}]

    def spans(trace: str) -> dict[str, Span]:
        chain = make_span(trace, "05" * 8, "LangGraph", {"langsmith.span.kind": "chain",
                                                         "gen_ai.completion": json.dumps({"messages": run})},
                          start_ns=1_700_000_000 * SECOND)
        chain.end_time_unix_nano = chain.start_time_unix_nano + 4 * SECOND
        return {"chain": chain, **_oslo_turns(trace, parent="05" * 8)}

    turns = ["first", "failed", "again", "ran"]
    orders = [[[*turns, "chain"]], [["chain", *turns]], [["chain"], *[[n] for n in turns]],
              [[n] for n in reversed(["chain", *turns])], [["chain", "first"], ["failed", "again", "ran"]],
              [["chain"], turns]]
    _write_in_orders(engine, writer, spans, orders)
    with engine.connect() as conn:
        rows = conn.execute(select(ToolCallRow).order_by(ToolCallRow.trace_id, ToolCallRow.start_time_ns)).all()
    engine.dispose()
    assert [(r.span_id, r.start_time_ns % (10 * SECOND) // SECOND, r.model, r.name_valid, r.execution_status)
            for r in rows] == [("01" * 8, 0, "llama3.1-8b", True, "error"),
                               ("03" * 8, 2, "llama3.1-8b", True, "success")] * len(orders)


def _written_at_once(engine, first: list[Span], second: list[Span]) -> None:  # type: ignore[no-untyped-def]
    """Two ingest processes on PostgreSQL writing at the same moment: the first writes and holds its transaction open
    while the second writes (neither sees the other's uncommitted rows), then the first commits."""
    writers = [SpanWriter(engine.dialect), SpanWriter(engine.dialect)]
    batches = [w.prepare(decode_protobuf(export_request(spans), Limits(1 << 20)).spans)
               for w, spans in zip(writers, (first, second), strict=True)]
    conn = engine.connect()
    transaction = conn.begin()
    writers[0].write(conn, batches[0])  # not committed yet

    def write(writer: SpanWriter, batch: Prepared) -> None:
        with engine.begin() as other:
            writer.write(other, batch)

    meanwhile = threading.Thread(target=write, args=(writers[1], batches[1]))
    meanwhile.start()
    meanwhile.join(1.0)  # time for the second writer to do all it would without waiting
    transaction.commit()
    conn.close()
    meanwhile.join()


def _emptied(engine) -> None:  # type: ignore[no-untyped-def]
    with engine.begin() as conn:
        for table in (ToolCallRow, ToolExecutionRow, SpanRow):
            conn.execute(table.__table__.delete())


def test_a_call_and_its_execution_written_at_once_by_two_ingest_processes_are_linked(postgres_url: str) -> None:
    """Two ingest processes on PostgreSQL, one writing the agent's call and the other, at the same moment, its
    execution (a second exporter: the tool server's). The second to write waits for the first's commit (a lock per
    trace), so that whichever commits last links the two."""
    engine = make_engine(postgres_url)
    upgrade(engine)
    trace, call_id = "a1" * 16, "call_Xk2pQ9rT"
    chat = make_span(trace, "01" * 8, "chat", chat_attributes(
        [{"id": call_id, "name": "get_weather", "arguments": {"city": "Oslo"}}]))
    ran = make_span(trace, "02" * 8, "execute_tool get_weather", {
        "gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "get_weather", "gen_ai.tool.call.id": call_id,
        "gen_ai.tool.call.result": "rain in Oslo"}, parent="01" * 8)
    for first, second in ((chat, ran), (ran, chat)):
        _emptied(engine)
        _written_at_once(engine, [first], [second])
        with engine.connect() as check:
            assert check.execute(select(ToolCallRow.execution_result)).scalars().all() == ["rain in Oslo"]
    engine.dispose()


def test_one_call_exported_from_two_traces_to_two_ingest_processes_at_once_is_one_row(postgres_url: str) -> None:
    """One call seen by two instrumentations of an agent whose spans start traces of their own, exported at the same
    moment to two ingest processes on PostgreSQL: neither sees the other's row uncommitted, and the second to write
    waits for the first's commit (a lock per call id), so that one row is kept; likewise a call written as text, by
    its response id."""
    engine = make_engine(postgres_url)
    upgrade(engine)
    by_id = [{"id": "call_Xk2pQ9rT", "name": "get_weather", "arguments": {"city": "Oslo"}}]
    text = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>'
    as_text = {**chat_attributes([]), "gen_ai.response.id": "chatcmpl-9fQx2LmN4rT7vWc1",
               "gen_ai.output.messages": json.dumps([{"role": "assistant",
                                                      "parts": [{"type": "text", "content": text}]}])}
    for attributes in (chat_attributes(by_id), as_text):
        _emptied(engine)
        _written_at_once(engine, [make_span("a1" * 16, "01" * 8, "chat", attributes)],
                         [make_span("b2" * 16, "02" * 8, "ChatCompletion", attributes)])
        with engine.connect() as check:
            assert check.execute(select(ToolCallRow.trace_id)).scalars().all() == ["a1" * 16]
    engine.dispose()


def test_the_sidecar_s_record_of_a_call_does_not_take_the_agent_s_row(sqlite_url: str) -> None:
    """The reviser sidecar traces what it relayed as a service of its own, in its own trace (no traceparent): the
    agent's row of that call stays the agent's, while a second instrumentation inside the agent is still one row."""
    engine = make_engine(sqlite_url)
    upgrade(engine)
    writer = SpanWriter(engine.dialect)
    call = [{"id": "call_Xk2pQ9rT", "name": "get_weather", "arguments": {"city": "Paris"}}]
    _write(engine, writer, [make_span("a1" * 16, "01" * 8, "chat", chat_attributes(call))], service="tracemill-serve")
    _write(engine, writer, [make_span("b2" * 16, "02" * 8, "chat", chat_attributes(call))], service="demo-agent")
    _write(engine, writer, [make_span("c3" * 16, "03" * 8, "ChatCompletion", chat_attributes(call))],
           service="demo-agent")
    with engine.connect() as conn:
        traces = sorted(conn.execute(select(ToolCallRow.trace_id)).scalars())
    engine.dispose()
    assert traces == ["a1" * 16, "b2" * 16]


def test_a_call_written_as_text_is_one_call_per_response_whose_id_is_drawn_at_random(sqlite_url: str) -> None:
    """A call written as text has no id: seen in two traces it is one row where both spans record one response id
    drawn at random, and two where the ids differ or are numbers a server repeats (Ollama's `chatcmpl-` and 3
    digits)."""
    engine = make_engine(sqlite_url)
    upgrade(engine)
    writer = SpanWriter(engine.dialect)
    text = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    sent = [("a1" * 16, "chatcmpl-9fQx2LmN4rT7vWc1"), ("b2" * 16, "chatcmpl-9fQx2LmN4rT7vWc1"),  # one response
            ("c3" * 16, "chatcmpl-Zq81pXv0sLk3mNa2"),  # another response, the same text
            ("d4" * 16, "chatcmpl-417"), ("e5" * 16, "chatcmpl-417")]  # a repeated number
    for trace, response_id in sent:
        chat = {**chat_attributes([]), "gen_ai.response.id": response_id,
                "gen_ai.output.messages": json.dumps([{"role": "assistant",
                                                       "parts": [{"type": "text", "content": text}]}])}
        _write(engine, writer, [make_span(trace, "01" * 8, "chat", chat)])
    with engine.connect() as conn:
        rows = conn.execute(select(ToolCallRow.trace_id, ToolCallRow.name, ToolCallRow.raw)).all()
    engine.dispose()
    assert sorted(r.trace_id for r in rows) == ["a1" * 16, "c3" * 16, "d4" * 16, "e5" * 16]
    assert {(r.name, r.raw) for r in rows} == {("get_weather", text)}


def test_a_store_upgraded_to_find_twins_keeps_its_calls_and_finds_them(db_url: str) -> None:
    """A store written before the call id was indexed (revision 0008): upgraded, it keeps its rows, and a second
    sighting of a stored call, in another trace and by an ingest process that never saw the first, fills that row."""
    engine = make_engine(db_url)
    upgrade(engine, "0008")
    call = [{"id": "call_q8Zr2LmN4x", "name": "get_weather", "arguments": {"city": "Paris"}}]
    chat = chat_attributes(call)
    del chat["gen_ai.request.model"]
    body = export_request([make_span("a1" * 16, "01" * 8, "chat", chat)], {"service.name": "test-agent"})
    store_as_before(engine, body, later_columns=("response_id", "service_name"))
    upgrade(engine)
    again = make_span("b2" * 16, "02" * 8, "ChatCompletion", chat_attributes(call))
    _write(engine, SpanWriter(engine.dialect), [again])
    with engine.connect() as conn:
        stored = conn.execute(select(ToolCallRow)).all()
    engine.dispose()
    assert [(r.trace_id, r.model, r.arguments) for r in stored] == [("a1" * 16, "llama3.1-8b", {"city": "Paris"})]


def test_a_call_whose_arguments_json_allows_and_orjson_refuses_is_stored(start_collector, db_url: str) -> None:
    """Arguments with an integer over 64 bits and half an emoji (a lone surrogate escape, as a model that cut a
    string leaves): the span and its call are stored, not rejected; the number exactly, the half character as
    U+FFFD (no database takes a lone surrogate)."""
    import httpx

    from tracemill.otlp import partial_success

    collector = start_collector(db_url)
    arguments = '{"city": "Paris \\ud83d", "days": 123456789012345678901234567890}'
    span = make_span("e5" * 16, "01" * 8, "chat",
                     chat_attributes([{"id": "call_Xk2pQ9rT", "name": "get_weather", "arguments": arguments}]))
    answer = httpx.post(f"{collector.url}/v1/traces", content=export_request([span]),
                        headers={"Content-Type": "application/x-protobuf"})
    assert answer.status_code == 200
    assert partial_success(answer.content, answer.headers["content-type"]).rejected_spans == 0
    engine = make_engine(db_url)
    with engine.connect() as conn:
        (call,) = conn.execute(select(ToolCallRow.name, ToolCallRow.arguments, ToolCallRow.raw)).all()
        spans = conn.execute(select(SpanRow.span_id)).scalars().all()
    engine.dispose()
    assert spans == ["01" * 8] and call.name == "get_weather"
    assert call.arguments["city"] == "Paris \ufffd" and "123456789012345678901234567890" in call.raw
