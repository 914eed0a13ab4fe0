"""The store's read side (`tracemill.store.queries`) on what the collector's writer stored, on SQLite and PostgreSQL:
filters select the calls they name, batches stream every call once, a trace reads back with its large values in
place, and a filter value no call has is said, not read as "nothing there"."""

from __future__ import annotations

import json
import random
import re

import pytest
from click.testing import CliRunner
from sqlalchemy import select

from tracemill.cli import main
from tracemill.collector.decode import Limits, decode_protobuf
from tracemill.collector.persist import SpanWriter
from tracemill.store import queries
from tracemill.store.engine import make_engine
from tracemill.store.migrate import upgrade
from tracemill.store.tables import ToolCallRow

from support import chat_attributes, export_request, make_span, store_as_before, store_sidecar_and_agent

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
    _write(engine, writer, spans)
    return engine


def _write(engine, writer: SpanWriter, spans: list) -> None:  # type: ignore[no-untyped-def,type-arg]
    """Spans stored as the collector stores one request of them."""
    batch = writer.prepare(decode_protobuf(export_request(spans), Limits(1 << 20)).spans)
    with engine.begin() as conn:
        writer.write(conn, batch)
    writer.committed()


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


def _interleaved_store(db_url: str):  # type: ignore[no-untyped-def]
    """40 agent runs stored as a collector stores them: a span at a time, the runs' spans interleaved (a run's turns
    come seconds apart, other runs' in between), 1 to 5 turns a run, 1 to 3 calls a turn, on two models."""
    engine = make_engine(db_url)
    upgrade(engine)
    writer = SpanWriter(engine.dialect)
    rng = random.Random(5)
    turns = [(run, turn) for run in range(40) for turn in range(rng.randint(1, 5))]
    rng.shuffle(turns)
    turns.sort(key=lambda t: t[1] + rng.random() * 3)  # a run's turns in order, runs overlapping
    for run, turn in turns:
        calls = [{"id": f"r{run}t{turn}c{n}", "name": "get_weather", "arguments": {"city": rng.choice(["Oslo", 7])}}
                 for n in range(rng.randint(1, 3))]
        span = make_span(f"{run + 1:032x}", f"{run + 1:08x}{turn + 1:08x}", "chat",
                         chat_attributes(calls, model="qwen3" if run % 3 else "llama3.1-8b"),
                         start_ns=1_700_000_000_000_000_000 + turn * 10**9 + run)
        _write(engine, writer, [span])
    return engine


def test_traces_come_whole_in_the_order_their_last_call_was_stored(db_url: str) -> None:
    engine = _interleaved_store(db_url)
    with engine.connect() as conn:
        stored = queries.calls(conn)
    rng = random.Random(11)
    for where in (queries.CallFilter(), queries.CallFilter(model="qwen3", failed=True),
                  queries.CallFilter(after_id=stored[len(stored) // 3].id)):
        with engine.connect() as conn:
            selected = queries.calls(conn, where)
        by_trace: dict[str, list[int]] = {}
        for c in selected:
            by_trace.setdefault(c.trace_id, []).append(c.id)
        want = sorted(by_trace, key=lambda t: max(by_trace[t]))  # each trace once, by its last call
        for batch in (1, 2, 5, 17, 1000):
            one = [t for b in queries.iter_traces(engine, where, batch) for t in b]
            assert [t[0].trace_id for t in one] == want
            assert [sorted(c.id for c in t) for t in one] == [by_trace[t] for t in want]
            assert all([(c.start_time_ns, c.call_index) for c in t] == sorted((c.start_time_ns, c.call_index)
                                                                              for c in t) for t in one)
            # readers sharing the store by id ranges give, one after another, what one reader gives
            cuts = sorted(rng.sample(range(stored[0].id, stored[-1].id + 2), 3))
            ranges = list(zip([None, *cuts], [*cuts, None], strict=True))
            shared = [t for ends in ranges for b in queries.iter_traces(engine, where, batch, ends) for t in b]
            assert [[c.id for c in t] for t in shared] == [[c.id for c in t] for t in one]
    engine.dispose()


def test_a_reader_leaves_a_tools_result_unread_when_asked(db_url: str) -> None:
    """The miner reads every call and never a tool's result (up to 64 K characters each): with `unread` it is not
    fetched, in the pages of calls and in the earlier calls of a trace a range reader looks up, and nothing else
    changes."""
    engine = make_engine(db_url)
    upgrade(engine)
    writer = SpanWriter(engine.dialect)
    result = "a page of search results " * 2000  # 50,000 characters: kept whole
    for n in range(3):
        trace, chat_span, tool_span = f"{n + 1:032x}", f"{n + 1:08x}{'c' * 8}", f"{n + 1:08x}{'e' * 8}"
        chat = chat_attributes([{"id": f"w{n}", "name": "get_weather", "arguments": {"city": "Oslo"}},
                                {"id": f"v{n}", "name": "get_weather", "arguments": {"city": 7}}])
        tool = {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "get_weather",
                "gen_ai.tool.call.id": f"w{n}", "gen_ai.tool.call.result": result}
        _write(engine, writer, [make_span(trace, chat_span, "chat", chat, start_ns=1_700_000_000_000_000_000 + n),
                                make_span(trace, tool_span, "execute_tool", tool, parent=chat_span)])
    with engine.connect() as conn:
        stored = queries.calls(conn)
        assert {c.execution_result for c in stored if c.execution_status == "success"} == {result}
        unread = queries.calls(conn, unread=("execution_result",))
        assert [c._replace(execution_result=None) for c in stored] == unread
        with pytest.raises(ValueError, match="not a field of StoredCall: result"):
            queries.calls(conn, unread=("result",))
    middle = (stored[0].id + 1, None)  # the first trace's first call lies before the range: looked up by its trace
    for ends in ((None, None), middle):
        every = [c for b in queries.iter_traces(engine, batch=2, ends=ends) for t in b for c in t]
        left = [c for b in queries.iter_traces(engine, batch=2, ends=ends, unread=("execution_result",))
                for t in b for c in t]
        assert any(c.execution_result == result for c in every)
        assert left == [c._replace(execution_result=None) for c in every]
    engine.dispose()


def test_the_sidecar_s_record_of_an_answer_and_what_the_agent_got_are_told_apart_by_service(db_url: str,
                                                                                              tmp_path) -> None:
    """With the reviser sidecar in front of the model, the store holds the model's answer as sent (the sidecar's
    service, `tracemill-serve`) and the call the agent got once it was revised (the agent's service): `--service`
    reads either, in stats as in an export, and a service no span has is named."""
    engine = make_engine(db_url)
    upgrade(engine)
    store_sidecar_and_agent(engine)
    engine.dispose()

    def stats(*args: str) -> dict:  # type: ignore[type-arg]
        result = CliRunner().invoke(main, ["stats", "--db", db_url, "--json", *args])
        assert result.exit_code == 0, result.output
        return json.loads(result.output)

    assert stats()["total_calls"] == 2
    by_service = stats("--by", "service")["groups"]
    assert {k: (g["total_calls"], g["input_schema_compliance"]) for k, g in by_service.items()} == {
        "tracemill-serve": (1, 0.0), "weather-agent": (1, 1.0)}
    assert (stats("--service", "tracemill-serve")["total_calls"],
            stats("--service", "tracemill-serve")["input_schema_compliance"]) == (1, 0.0)
    assert (stats("--service", "weather-agent")["total_calls"],
            stats("--service", "weather-agent")["input_schema_compliance"]) == (1, 1.0)
    mined = CliRunner().invoke(main, ["mine", "--db", db_url, "--out", str(tmp_path / "sent"), "--service",
                                      "tracemill-serve", "--valid-share", "0"])
    assert mined.exit_code == 0, mined.output
    rows = [json.loads(line) for split in ("train", "eval")
            for line in (tmp_path / "sent" / f"{split}.jsonl").read_text().splitlines()]
    assert [(r["trace_id"], r["failure_class"]) for r in rows] == [("a1" * 16, "schema:wrong_type")]
    unknown = CliRunner().invoke(main, ["failures", "--db", db_url, "--service", "weather-agnt"])
    assert unknown.exit_code == 1
    assert "no stored call has service 'weather-agnt'; known: tracemill-serve, weather-agent" in unknown.output


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


def test_calls_stored_before_they_kept_their_service_are_given_their_span_s(db_url: str) -> None:
    """A store written before the call kept its service (revision 0011: it was read from the span): upgraded, each
    call reads as its span's service, and a span that says none leaves its call with none."""
    engine = make_engine(db_url)
    upgrade(engine, "0011")
    for trace, service in (("a1" * 16, "tracemill-serve"), ("b2" * 16, "weather-agent"), ("c3" * 16, None)):
        call = [{"id": f"call_{trace[:4]}", "name": "get_weather", "arguments": {"city": "Paris"}}]
        body = export_request([make_span(trace, "01" * 8, "chat", chat_attributes(call))],
                              {"service.name": service} if service else {"host.name": "box-1"})
        store_as_before(engine, body, later_columns=("service_name",))
    upgrade(engine)
    with engine.connect() as conn:
        stored = dict(conn.execute(select(ToolCallRow.trace_id, ToolCallRow.service_name)).all())
        sidecar = queries.CallFilter(service="tracemill-serve").apply(select(ToolCallRow.trace_id))
        assert conn.execute(sidecar).scalars().all() == ["a1" * 16]
    engine.dispose()
    assert stored == {"a1" * 16: "tracemill-serve", "b2" * 16: "weather-agent", "c3" * 16: None}
