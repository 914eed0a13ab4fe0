"""The store's read side (`tracemill.store.queries`) on what the collector's writer stored, on SQLite and PostgreSQL:
filters select the calls they name, batches stream every call once, a trace reads back with its large values in
place, and a filter value no call has is said, not read as "nothing there"."""

from __future__ import annotations

import json
import re

import pytest
from click.testing import CliRunner

from tracemill.cli import main
from tracemill.collector.decode import Limits, decode_protobuf
from tracemill.collector.persist import SpanWriter
from tracemill.store import queries
from tracemill.store.engine import make_engine
from tracemill.store.migrate import upgrade

from support import chat_attributes, export_request, make_span

LONG_PROMPT = "Plan a trip to Oslo. " * 100  # over PAYLOAD_MIN_CHARS: stored once in `payloads`


def _store(db_url: str):  # type: ignore[no-untyped-def]
    """Six traces: three on each model, each with a valid call, a wrong-typed one and an unknown tool's."""
    engine = make_engine(db_url)
    upgrade(engine)
    writer = SpanWriter(engine.dialect)
    spans = []
    for n in range(6):
        model = "llama3.1-8b" if n % 2 else "qwen3"
        attrs = chat_attributes([{"id": f"a{n}", "name": "get_weather", "arguments": {"city": "Oslo"}},
                                 {"id": f"b{n}", "name": "get_weather", "arguments": {"city": 7}},
                                 {"id": f"c{n}", "name": "get_wether", "arguments": {"city": "Rome"}}], model=model)
        attrs["gen_ai.input.messages"] = json.dumps([{"role": "user", "parts": [{"type": "text",
                                                                                  "content": LONG_PROMPT}]}])
        spans.append(make_span(f"{n + 1:032x}", f"{n + 1:016x}", "chat", attrs, start_ns=1_700_000_000_000_000_000 + n))
    batch = writer.prepare(decode_protobuf(export_request(spans), Limits(1 << 20)).spans)
    with engine.begin() as conn:
        writer.write(conn, batch)
    writer.committed()
    return engine


def test_filters_batches_and_traces(db_url: str) -> None:
    engine = _store(db_url)
    with engine.connect() as conn:
        everything = queries.calls(conn)
        assert len(everything) == 18 and [c.id for c in everything] == sorted(c.id for c in everything)
        failed = queries.calls(conn, queries.CallFilter(failed=True))
        assert {(c.name, c.stage) for c in failed} == {("get_weather", "schema"), ("get_wether", "tool_name")}
        assert len(failed) == 12 and all(c.failed for c in failed)
        assert {c.arguments["city"] for c in queries.calls(conn, queries.CallFilter(failed=False))} == {"Oslo"}
        qwen = queries.CallFilter(model="qwen3", tool="get_weather")
        assert queries.count_calls(conn, qwen) == 6
        assert {c.model for c in queries.calls(conn, qwen)} == {"qwen3"}
        after = queries.calls(conn, queries.CallFilter(after_id=everything[9].id))
        assert [c.id for c in after] == [c.id for c in everything[10:]]

        trace = everything[0].trace_id
        spans = queries.trace_spans(conn, trace)
        assert [s.span_id for s in spans] == [everything[0].span_id]
        assert json.loads(spans[0].attributes["gen_ai.input.messages"])[0]["parts"][0]["content"] == LONG_PROMPT
        unresolved = queries.trace_spans(conn, trace, resolved=False)[0].attributes["gen_ai.input.messages"]
        assert unresolved["chars"] > len(LONG_PROMPT) and set(unresolved) == {"$payload", "chars"}
        tools = queries.toolsets(conn, [everything[0].toolset_id])[everything[0].toolset_id]
        assert [t.name for t in tools] == ["get_weather", "get_forecast"]
        assert [c.tool_call_id for c in queries.trace_calls(conn, [trace])[trace]] == ["a0", "b0", "c0"]

    batches = list(queries.iter_calls(engine, queries.CallFilter(model="llama3.1-8b"), batch=4))
    assert [len(b) for b in batches] == [4, 4, 1]
    streamed = [c.id for b in batches for c in b]
    assert len(set(streamed)) == 9 and streamed == sorted(streamed)
    engine.dispose()


def test_a_filter_value_no_call_has_is_named(db_url: str) -> None:
    engine = _store(db_url)
    with engine.connect() as conn, pytest.raises(queries.FilterError, match="model 'llama-3.1-8b'.*llama3.1-8b"):
        queries.check_filter(conn, queries.CallFilter(model="llama-3.1-8b"))
    engine.dispose()
    result = CliRunner().invoke(main, ["stats", "--db", db_url, "--model", "gpt-7"])
    assert result.exit_code == 1 and "no stored call has model 'gpt-7'" in result.output
    result = CliRunner().invoke(main, ["stats", "--db", db_url, "--model", "qwen3", "--json"])
    assert result.exit_code == 0, result.output
    figures = json.loads(result.output)
    assert figures["total_calls"] == 9 and figures["valid_tool_name_rate"] == pytest.approx(6 / 9)
    assert figures["input_schema_compliance"] == pytest.approx(3 / 6)
    # no call has a known execution: the execution figures are unknown, not 0 % success and 100 % failure
    assert figures["execution_success_rate"] is None and figures["valid_call_failure_rate"] is None
    table = CliRunner().invoke(main, ["stats", "--db", db_url, "--by", "model"], terminal_width=200).output
    assert table.count("unknown") == 6 and not re.search(r"(?<![\d.])(0|100)\.0%", table)
    result = CliRunner().invoke(main, ["stats", "--db", db_url, "--since", "tomorrow"])
    assert result.exit_code == 2 and "'tomorrow' is not a date" in result.output
