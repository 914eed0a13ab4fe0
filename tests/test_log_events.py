"""GenAI log events (`/v1/logs`) joined to their model-call spans, on SQLite and PostgreSQL: the span may come before
or after its events, from one writer or two at once, and the rows come out the same; re-sent events and spans change
nothing; and a logs request is read as carefully as a traces request."""

from __future__ import annotations

import json
import threading
from typing import Any

import orjson
import pytest
from sqlalchemy import func, select

from tracemill.collector.decode import Limits, PayloadError
from tracemill.collector.logs import decode_logs_json, decode_logs_protobuf
from tracemill.collector.worker import WorkerConfig, _Worker
from tracemill.miner.conversation import stored_messages
from tracemill.miner.export import MineOptions, mine
from tracemill.reviser_prompt import conversation
from tracemill.store.engine import make_engine
from tracemill.store.migrate import upgrade
from tracemill.store.tables import LogEventRow, ToolCallRow

from support import CHAT_WITHOUT_OUTPUT as CHAT
from support import WEATHER_TOOLS, export_request, logs_json, logs_request, make_span

LIMITS = Limits(1 << 20)
TOOL_CALLS = [
    {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}},
    {"id": "call_2", "type": "function", "function": {"name": "get_forecast", "arguments": '{"city": "Paris", "days'}},
]
EXECUTION = {
    "gen_ai.operation.name": "execute_tool",
    "gen_ai.tool.name": "get_weather",
    "gen_ai.tool.call.id": "call_1",
    "gen_ai.tool.call.result": "sunny",
}


def _events(trace: str, span: str) -> list[dict[str, Any]]:
    return [
        {"name": "gen_ai.user.message", "body": {"content": "Weather in Paris?"}},
        {
            "name": "gen_ai.choice",
            "body": {
                "index": 0,
                "finish_reason": "tool_calls",
                "message": {"role": "assistant", "tool_calls": TOOL_CALLS},
            },
        },
        {"name": "app.started", "body": "not a GenAI event"},
    ]


class Store:
    """A store and its writers: each `_Worker` is what one ingest process of the collector runs."""

    def __init__(self, db_url: str) -> None:
        self.engine = make_engine(db_url)
        upgrade(self.engine)
        self.url = db_url
        self.workers: list[_Worker] = []

    def writer(self) -> _Worker:
        self.workers.append(_Worker(WorkerConfig(self.url, 1 << 24, 1 << 20)))
        return self.workers[-1]

    def spans(self, writer: _Worker, spans: list[Any]) -> None:
        assert writer.ingest(export_request(spans), "application/x-protobuf", False).rejected == 0

    def events(self, writer: _Worker, body: bytes) -> None:
        writer.ingest_logs(body, "application/x-protobuf", False)

    def close(self) -> None:
        for writer in self.workers:
            writer.close()
        self.engine.dispose()

    def calls(self) -> list[tuple[Any, ...]]:
        with self.engine.connect() as conn:
            return [
                tuple(r)
                for r in conn.execute(
                    select(
                        ToolCallRow.span_id,
                        ToolCallRow.call_index,
                        ToolCallRow.tool_call_id,
                        ToolCallRow.name,
                        ToolCallRow.raw,
                        ToolCallRow.parsed,
                        ToolCallRow.name_valid,
                        ToolCallRow.schema_valid,
                        ToolCallRow.model,
                        ToolCallRow.execution_status,
                        ToolCallRow.execution_result,
                    ).order_by(ToolCallRow.span_id, ToolCallRow.call_index)
                )
            ]

    def count_events(self) -> int:
        with self.engine.connect() as conn:
            return int(conn.execute(select(func.count()).select_from(LogEventRow)).scalar_one())


def _scenario(n: int) -> tuple[str, str, list[Any], bytes]:
    trace, span = f"{n + 1:032x}", f"{n + 1:016x}"
    spans = [
        make_span(trace, span, "chat llama3.1-8b", CHAT),
        make_span(trace, f"{n + 1:08x}{'e' * 8}", "execute_tool get_weather", EXECUTION, parent=span),
    ]
    return trace, span, spans, logs_request(trace, span, _events(trace, span))


EXPECTED = [
    (
        "call_1",
        "get_weather",
        '{"name": "get_weather", "arguments": "{\\"city\\": \\"Paris\\"}"}',
        True,
        None,
        None,
        "llama3.1-8b-instruct",
        "success",
        "sunny",
    ),
    (
        "call_2",
        "get_forecast",
        '{"name": "get_forecast", "arguments": "{\\"city\\": \\"Paris\\", \\"days"}',
        False,
        None,
        None,
        "llama3.1-8b-instruct",
        None,
        None,
    ),
]


def _without_span(rows: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    return [(r[2], r[3], json.dumps(json.loads(r[4])), *r[5:]) for r in rows]


def test_the_span_before_or_after_its_events_gives_the_same_rows(db_url: str) -> None:
    store = Store(db_url)
    writer = store.writer()
    _, _, spans, events = _scenario(0)
    store.spans(writer, spans)
    assert store.calls() == []  # the span alone holds no call: it waits for its events
    store.events(writer, events)
    span_first = store.calls()

    _, _, spans, events = _scenario(1)
    store.events(store.writer(), events)  # other writers: nothing cached
    store.spans(store.writer(), spans)
    events_first = [r for r in store.calls() if r not in span_first]

    assert [(r[1], *r[2:]) for r in span_first] == [(r[1], *r[2:]) for r in events_first]
    assert _without_span(span_first) == [(c, n, json.dumps(json.loads(raw)), *rest) for c, n, raw, *rest in EXPECTED]

    # everything again, in either order: stored once
    for n in (0, 1):
        _, _, spans, events = _scenario(n)
        store.events(writer, events)
        store.spans(writer, spans)
    assert len(store.calls()) == 4 and store.count_events() == 4  # two GenAI events a span; the app's own skipped
    store.close()


@pytest.mark.timeout(120)
def test_a_span_and_its_events_written_at_once_by_two_writers_are_joined(db_url: str) -> None:
    store = Store(db_url)
    span_writer, event_writer = store.writer(), store.writer()
    for n in range(12):
        _, _, spans, events = _scenario(100 + n)
        start = threading.Barrier(2)
        errors: list[BaseException] = []

        def run(start: threading.Barrier, errors: list[BaseException], write: Any, *args: Any) -> None:
            start.wait()
            try:
                write(*args)
            except BaseException as exc:  # reported below
                errors.append(exc)

        threads = [
            threading.Thread(target=run, args=(start, errors, store.spans, span_writer, spans)),
            threading.Thread(target=run, args=(start, errors, store.events, event_writer, events)),
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert not errors, errors
        assert len([r for r in store.calls() if r[0] == f"{101 + n:016x}"]) == 2, f"trial {n}"
    store.close()


def test_a_span_whose_messages_came_as_events_is_mined_with_its_conversation(db_url: str, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The earlier GenAI conventions' events: one per input message (its role in the event's name), the answer in
    `gen_ai.choice`. The reviser's prompt shows the conversation from them, as from a span that carries it."""
    store = Store(db_url)
    writer = store.writer()
    trace, span = "ab" * 16, "cd" * 8
    store.spans(writer, [make_span(trace, span, "chat llama3.1-8b",
                                   {**CHAT, "gen_ai.tool.definitions": json.dumps(WEATHER_TOOLS)})])
    store.events(writer, logs_request(trace, span, [
        {"name": "gen_ai.system.message", "body": {"content": "You are a weather assistant."}},
        {"name": "gen_ai.user.message", "body": {"content": "Weather in Paris, then the forecast for three days?"}},
        *[e for e in _events(trace, span) if e["name"] == "gen_ai.choice"],
    ]))
    exported = mine(store.engine, tmp_path / "export", MineOptions(valid_share=0.0, workers=1))
    with store.engine.connect() as conn:  # what the review queue shows a reviewer
        shown = conversation(stored_messages(conn, trace, span), 600)
    store.close()
    assert shown == ["user: Weather in Paris, then the forecast for three days?"]
    rows = [orjson.loads(line) for split in ("train", "eval")
            for line in (exported.path / f"{split}.jsonl").read_bytes().splitlines()]
    (row,) = rows  # the forecast cut short
    assert row["call_id"] and '"days' in row["raw"]
    prompt = row["prompt"][-1]["content"]
    assert "<conversation>\nuser: Weather in Paris, then the forecast for three days?\n</conversation>" in prompt
    assert [m["role"] for m in orjson.loads(row["context"])] == ["system", "user"]


def test_logs_requests_in_protobuf_and_json_read_the_same() -> None:
    trace, span = "ab" * 16, "cd" * 8
    events = _events(trace, span)
    pb = decode_logs_protobuf(logs_request(trace, span, events), LIMITS)
    js = decode_logs_json(logs_json(trace, span, events), LIMITS)
    assert pb.events == js.events and len(pb.events) == 2
    assert pb.events[1].body["message"]["tool_calls"][0]["id"] == "call_1"
    assert (pb.rejected, js.rejected) == (1, 1) and "gen_ai.*" in pb.reasons[0]


def test_a_bad_logs_request_is_refused_saying_where() -> None:
    body = orjson.dumps(
        {
            "resourceLogs": [
                {"scopeLogs": [{"logRecords": [{"traceId": "xyz", "spanId": "cd" * 8, "eventName": "gen_ai.choice"}]}]}
            ]
        }
    )
    with pytest.raises(PayloadError, match=r"resourceLogs\[0\].scopeLogs\[0\].logRecords\[0\].traceId"):
        decode_logs_json(body, LIMITS)
    with pytest.raises(PayloadError, match="not a protobuf ExportLogsServiceRequest"):
        decode_logs_protobuf(b"\xff\xff\xff", LIMITS)
    huge = decode_logs_json(
        logs_json("ab" * 16, "cd" * 8, [{"name": "gen_ai.choice", "body": "x" * 2000}]), Limits(1000)
    )
    assert huge.events == [] and huge.rejected == 1 and "over the limit of 1000" in huge.reasons[0]
    no_span = decode_logs_json(logs_json("00" * 16, "00" * 8, [{"name": "gen_ai.choice", "body": "x"}]), LIMITS)
    assert no_span.events == [] and no_span.rejected == 1
