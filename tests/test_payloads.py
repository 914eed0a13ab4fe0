"""Large attribute values (tool definitions resent with every model call) are stored once and read back intact."""

from __future__ import annotations

import json

import httpx
import pytest
from sqlalchemy import select, text

from tracemill.store.engine import make_engine
from tracemill.store.payloads import CONVERSATIONS, PAYLOAD_MIN_CHARS, is_reference, read_payload, resolve, split_parts
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
        key = stored[0]["gen_ai.tool.definitions"]
        assert read_payload(conn, key, offset=10, limit=50) == definitions[10:60]
        assert read_payload(conn, key, offset=len(definitions) - 7) == definitions[-7:]
        whole = trace_spans(conn, "ab" * 16)
        assert [s.attributes["gen_ai.tool.definitions"] for s in whole] == [definitions] * 5
        paged = trace_spans(conn, "ab" * 16, resolved=False)
        assert all(is_reference(s.attributes["gen_ai.tool.definitions"]) for s in paged)
        calls = conn.execute(text("select count(*) from tool_calls where name_valid")).scalar_one()
    engine.dispose()
    assert calls == 5, "the calls were verified against the full definitions"


def _langchain(message: dict[str, str]) -> dict[str, object]:
    """A message as LangChain serializes it (`dumpd`), as LangSmith's export sends a chat model's inputs."""
    kind = {"user": "HumanMessage", "tool": "ToolMessage"}[message["role"]]
    return {"lc": 1, "type": "constructor", "id": ["langchain", "schema", "messages", kind],
            "kwargs": {"content": message["content"], "type": message["role"].replace("user", "human")}}


# how each convention carries a model call's whole conversation: the attribute and the text of its messages
FORMS = {
    "genai": ("gen_ai.input.messages", lambda messages: json.dumps(
        [{"role": m["role"], "parts": [{"type": "text", "content": m["content"]}]} for m in messages])),
    "langsmith": ("gen_ai.prompt", lambda messages: json.dumps(
        {"messages": [[_langchain(m) for m in messages]]}, separators=(",", ":"))),
    "langfuse": ("langfuse.observation.input", lambda messages: json.dumps(
        {"tools": WEATHER_TOOLS, "messages": messages})),  # a generation's input: the request's arguments
}


def _agent_run(trace_id: str, turns: int, form: str) -> list[tuple[str, str]]:
    """An agent's run as its chat spans carry it: the k-th model call sent the whole conversation so far, k messages of
    about 1,500 characters (a pasted document, tool results), and got a call back whose tool name is misspelled. (span
    id, the conversation as sent) of each."""
    messages = [{"role": "user" if k % 2 == 0 else "tool",
                 "content": f"turn {k}: " + "lorem ipsum dolor sit amet " * 55} for k in range(turns)]
    return [(f"{k + 1:016x}", FORMS[form][1](messages[:k + 1])) for k in range(turns)]


@pytest.mark.parametrize("form", FORMS)
def test_a_run_s_growing_conversation_is_stored_once_and_read_back_byte_for_byte(  # type: ignore[no-untyped-def]
        db_url: str, start_collector, tmp_path, form: str) -> None:
    from tracemill.miner.export import MineOptions, mine

    collector = start_collector(db_url)
    trace = "cd" * 16
    run = _agent_run(trace, 30, form)
    attribute = FORMS[form][0]
    spans = []
    for k, (span_id, conversation) in enumerate(run):
        attributes = chat_attributes([{"id": f"call_{k:08d}", "name": "get_wether", "arguments": {"city": f"C{k}"}}])
        attributes = {key: value for key, value in attributes.items() if key not in CONVERSATIONS}
        spans.append(make_span(trace, span_id, "chat", {**attributes, attribute: conversation},
                               start_ns=1_700_000_000_000_000_000 + k * 10**9))
    for start in range(0, len(spans), 7):
        response = httpx.post(f"{collector.url}/v1/traces", content=export_request(spans[start:start + 7]),
                              headers={"Content-Type": "application/x-protobuf"})
        assert response.status_code == 200

    sent = dict(run)
    engine = make_engine(db_url)
    with engine.connect() as conn:
        stored = conn.execute(text("select sum(chars) from payloads")).scalar_one()
        whole = trace_spans(conn, trace)
        refs = {s.span_id: s.attributes[attribute] for s in trace_spans(conn, trace, resolved=False)}
        last = run[-1][0]
        pages = [read_payload(conn, refs[last], offset, 1000) for offset in range(0, len(sent[last]), 1000)]
        middle = read_payload(conn, refs[last], 5000, 7000)
    result = mine(engine, tmp_path / "export", MineOptions(eval_share=0.0))
    engine.dispose()

    sent_in_all = sum(len(c) for c in sent.values())
    assert stored < 1.2 * len(sent[last]) < sent_in_all / 12, "a run's conversations take about the room of its last"
    assert {s.span_id: s.attributes[attribute] for s in whole} == sent
    assert "".join(pages) == sent[last] and middle == sent[last][5000:12000]
    rows = [json.loads(line) for line in (result.path / "train.jsonl").read_text().splitlines()]
    assert len(rows) == 30
    if form == "genai":  # kept as sent; another convention's messages are read as chat messages
        assert {r["context"] for r in rows} == set(sent.values())
    assert all(f"turn {int(json.loads(r['raw'])['arguments']['city'][1:])}:" in r["prompt"][-1]["content"]
               for r in rows), "each prompt holds the newest turn its call answered"


@pytest.mark.parametrize("separators", [(", ", ": "), (",", ":")], ids=["spaced", "compact"])
def test_a_conversation_one_turn_longer_is_cut_alike_and_shares_every_message(separators: tuple[str, str]) -> None:
    messages = [{"role": "user", "content": f"message {k} " + "x" * 2000} for k in range(6)]
    before, after = (json.dumps(messages[:n], separators=separators) for n in (5, 6))
    cut, later = split_parts(before), split_parts(after)
    assert "".join(cut) == before and "".join(later) == after
    assert later[:len(cut) - 1] == cut[:-1] and cut[-1] == later[-1] == "]"
    assert len(later) == 7, "each message a part of its own, and the closing bracket"


def test_langsmith_s_batched_langchain_messages_are_cut_alike_and_share_every_message() -> None:
    messages = [{"role": "user", "content": f"message {k} " + "x" * 2000} for k in range(6)]
    before, after = (FORMS["langsmith"][1](messages[:n]) for n in (5, 6))
    cut, later = split_parts(before), split_parts(after)
    assert "".join(cut) == before and "".join(later) == after
    assert later[:len(cut) - 1] == cut[:-1] and cut[-1] == later[-1] == "]]}"
    assert len(later) == 7, "each message a part of its own, and the brackets that close the batch"
