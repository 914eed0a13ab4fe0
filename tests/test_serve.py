"""The sidecar in front of a real (scripted) model server, driven with the official openai client: the fault library's
broken outputs of real BFCL and MCP-Bench calls arrive valid where the rules can recover them, valid calls arrive byte
for byte, streamed or not, and every request is traced into a real collector."""

from __future__ import annotations

import http.client
import json
import random
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from openai import APIError, APIStatusError, OpenAI
from scripted_model import COOKIES, Reply, ScriptedModel, native
from sqlalchemy import select
from sqlalchemy.orm import Session

from tracemill.bfcl import answers_for, ast_match, load_bfcl
from tracemill.examples import example_call
from tracemill.faults import WEAK_PROFILES, corrupt_calls, sample_faults
from tracemill.net import ServerThread
from tracemill.reader import holds_call
from tracemill.store.engine import make_engine
from tracemill.store.tables import SpanRow, ToolCallRow
from tracemill.tools import Tool, load_mcp_bench, tool_index
from tracemill.verify import ToolCall, verify

from support import WEATHER_TOOLS, chat_attributes, export_request, make_span


@dataclass
class FaultCase:
    key: str
    tools: list[dict[str, Any]]  # as the agent sends them (OpenAI shape)
    reference: list[ToolCall]
    reply: Reply
    valid_as_sent: bool
    recoverable: bool


def _openai_tools(tools: list[Tool]) -> list[dict[str, Any]]:
    return [{"type": "function", "function": {"name": t.name, "description": t.description,
                                              "parameters": dict(t.input_schema)}} for t in tools]


def _reply(raw: str, is_native: bool) -> Reply:
    """A native output as the upstream's tool_calls (arguments exactly as written); text as the message content, as a
    server whose parser missed the call returns it."""
    if is_native:
        try:
            value = json.loads(raw)
        except ValueError:
            return Reply(raw)
        calls = value if isinstance(value, list) else [value]
        return Reply(tool_calls=native(calls))
    return Reply(raw)


def _fault_cases() -> list[FaultCase]:
    sources: list[tuple[str, list[Tool], list[ToolCall]]] = []
    for server, tools in list(load_mcp_bench().items())[:14]:
        for tool in tools[:3]:
            call = example_call(tool)
            if call is not None:
                sources.append((f"mcp/{call.name}", tools, [call]))
    sources += [(f"bfcl/{c.id}", list(c.tools), c.reference()) for c in load_bfcl()[::8]]
    cases = []
    for name, tools, reference in sources:
        index = tool_index(tools)
        if not all(verify(c, index).ok for c in reference):
            continue
        for profile in WEAK_PROFILES:
            rng = random.Random(f"serve:{name}:{profile}")
            bad = corrupt_calls(reference, tools, sample_faults(profile, rng, n_calls=len(reference)), rng)
            reply = _reply(bad.raw, bad.native)
            valid = bool(reply.tool_calls) and all(verify(
                {"name": c["function"]["name"], "arguments": c["function"]["arguments"]}, index).ok
                for c in reply.tool_calls or ())
            cases.append(FaultCase(f"{name}/{profile}", _openai_tools(tools), reference, reply, valid,
                                   bad.recoverable and not valid))
    return cases


CASES = _fault_cases()


@pytest.fixture
def model() -> Iterator[tuple[ScriptedModel, ServerThread]]:
    scripted = ScriptedModel()
    for case in CASES:
        scripted.replies[case.key] = case.reply
    server = ServerThread(scripted.app()).start()
    yield scripted, server
    server.stop()


def _client(proxy: ServerThread, **kwargs: Any) -> OpenAI:
    return OpenAI(base_url=proxy.url + "/v1", api_key="test-key", max_retries=0, **kwargs)


def _ask(client: OpenAI, case: FaultCase, stream: bool) -> tuple[dict[str, Any], str | None, bytes | None]:
    """(the message as the client assembled it, the revision header, the raw body when not streamed)."""
    kwargs = {"model": "scripted-llama", "messages": [{"role": "user", "content": case.key}], "tools": case.tools}
    if not stream:
        raw = client.chat.completions.with_raw_response.create(**kwargs)
        message = raw.parse().choices[0].message
        calls = [{"id": c.id, "name": c.function.name, "arguments": c.function.arguments}
                 for c in message.tool_calls or ()]
        return {"content": message.content, "calls": calls, "extension": getattr(message, "tracemill", None)}, \
            raw.headers.get("x-tracemill-revision"), raw.http_response.content
    text, calls, extension = "", {}, None
    for chunk in client.chat.completions.create(**kwargs, stream=True):
        for choice in chunk.choices:
            text += choice.delta.content or ""
            for tc in choice.delta.tool_calls or ():
                call = calls.setdefault(tc.index, {"id": None, "name": "", "arguments": ""})
                call["id"] = tc.id or call["id"]
                call["name"] += tc.function.name or ""
                call["arguments"] += tc.function.arguments or ""
            extension = getattr(choice, "tracemill", None) or extension
    return {"content": text or None, "calls": [calls[k] for k in sorted(calls)], "extension": extension}, None, None


def _valid(calls: list[dict[str, Any]], case: FaultCase) -> bool:
    index = tool_index(case.tools)
    return bool(calls) and all(verify({"name": c["name"], "arguments": c["arguments"]}, index).ok for c in calls)


def _matches(calls: list[dict[str, Any]], case: FaultCase) -> bool:
    got = [ToolCall(c["name"], json.loads(c["arguments"])) for c in calls]
    return bool(ast_match(got, answers_for(case.reference), tool_index(case.tools)))


def test_the_cases_cover_every_kind_of_outcome() -> None:
    assert len(CASES) > 150
    assert sum(c.valid_as_sent for c in CASES) > 40
    assert sum(c.recoverable and c.reply.tool_calls is not None for c in CASES) > 15  # broken native calls
    assert sum(c.recoverable and c.reply.content is not None for c in CASES) > 15  # calls written in the text
    assert sum(not c.valid_as_sent and not c.recoverable for c in CASES) > 5


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_fault_library_outputs_through_the_proxy(model, start_proxy, stream: bool) -> None:
    scripted, upstream = model
    client = _client(start_proxy(upstream.url + "/v1"))
    refused = 0
    for case in CASES:
        got, header, body = _ask(client, case, stream)
        sent = [{"id": c["id"], "name": c["function"]["name"], "arguments": c["function"]["arguments"]}
                for c in case.reply.tool_calls or ()]
        if case.valid_as_sent:
            assert got["calls"] == sent and got["extension"] is None, case.key
            if not stream:
                assert header == "unchanged" and body == scripted.sent[case.key], case.key
        elif case.recoverable:
            assert _valid(got["calls"], case) and _matches(got["calls"], case), (case.key, got)
            assert not holds_call(got["content"] or "", tool_index(case.tools)), case.key  # the call is not text too
            assert got["extension"]["revision"] == "revised" and got["extension"]["version"] == "rules"
            original = got["extension"]["original"]
            assert original["content"] == case.reply.content and original["tool_calls"] == case.reply.tool_calls
        elif got["extension"] is None or got["extension"]["revision"] == "refused":
            refused += 1  # not recoverable: what the upstream sent, as it sent it
            assert got["calls"] == sent, case.key
            if not stream:
                assert header == "refused" and body == scripted.sent[case.key], case.key
        else:  # revised although the fault library calls it lost: still only ever a valid call
            assert _valid(got["calls"], case), case.key
    assert refused > 5


def _stored(url: str, until: Any) -> tuple[list[SpanRow], list[ToolCallRow]]:
    """The store's spans and calls once `until(spans, calls)` holds (or after 20 s)."""
    engine = make_engine(url)
    deadline = time.monotonic() + 20
    while True:
        with Session(engine) as session:
            spans = list(session.execute(select(SpanRow)).scalars())
            calls = list(session.execute(select(ToolCallRow)).scalars())
        if until(spans, calls) or time.monotonic() > deadline:
            engine.dispose()
            return spans, calls
        time.sleep(0.2)


def test_traces_land_in_a_real_collector(model, start_proxy, start_collector, sqlite_url: str) -> None:
    import tracemill.sdk as tm

    _, upstream = model
    collector = start_collector(sqlite_url)
    tm.init(collector.url, service_name="tracemill-serve", set_global=False)
    try:
        proxy = start_proxy(upstream.url + "/v1", trace=True)
        client = _client(proxy)
        chosen = [c for c in CASES if c.recoverable][:10] + [c for c in CASES if c.valid_as_sent][:10]
        for i, case in enumerate(chosen):
            _ask(client, case, stream=bool(i % 2))
        time.sleep(0.3)  # spans are recorded after each answer is sent
        assert tm.flush(10)
        assert _span_metrics(proxy) == {"ended": 30.0, "sent": 30.0, "failed": 0.0, "unsent": 0.0}
    finally:
        tm.shutdown()
    spans, calls = _stored(sqlite_url, lambda spans, _: sum(s.name.startswith("chat ") for s in spans) >= len(chosen))
    chats = [s for s in spans if s.name == "chat scripted-llama"]
    revisions = [s for s in spans if s.name == "revise rules"]
    assert len(chats) == len(chosen) and len(revisions) == 10
    by_id = {s.span_id: s for s in chats}
    for span in revisions:
        parent = by_id[span.attributes["tracemill.serving.revision_of"]]
        assert span.trace_id != parent.trace_id and span.parent_span_id is None  # never the agent's own repair
        assert [link["span_id"] for link in span.links] == [parent.span_id]
        assert parent.attributes["tracemill.serving.revision"] == "revised"
        assert parent.attributes["tracemill.serving.version"] == "rules"
        assert parent.attributes["tracemill.serving.upstream_ms"] > 0
    assert sum(s.attributes["tracemill.serving.revision"] == "unchanged" for s in chats) == 10
    originals = [c for c in calls if c.model == "scripted-llama"]
    revised = [c for c in calls if c.model == "tracemill-reviser:rules"]
    assert revised and all(c.stage is None for c in revised)  # what the client got verifies at ingest
    assert any(c.stage is not None for c in originals)  # what the model sent failed, and is kept for mining


def test_an_agent_s_trace_context_links_the_sidecar_s_record_and_leaves_the_agent_s_calls_its_own(
        model, start_proxy, start_collector, sqlite_url: str) -> None:
    """An agent whose HTTP client sends W3C trace context (`traceparent`, as OpenTelemetry's httpx instrumentation
    does) gets the sidecar's `chat` span linked to its own span, in a trace of the sidecar's: within one trace a call
    id drawn at random is one call, so the model's broken call there would take the place of the revised call the agent
    got and ran, whichever record arrived first."""
    import tracemill.sdk as tm

    scripted, upstream = model
    sent = {"id": "call_Xk2pQ9rT", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": 7}'}}
    scripted.replies["Weather in 7?"] = Reply(tool_calls=[sent])
    agent_trace, agent_span = "a1" * 16, "01" * 8
    collector = start_collector(sqlite_url)
    tm.init(collector.url, service_name="tracemill-serve", set_global=False)
    try:
        proxy = start_proxy(upstream.url + "/v1", trace=True)
        answer = _client(proxy).chat.completions.create(
            model="scripted-llama", messages=[{"role": "user", "content": "Weather in 7?"}], tools=WEATHER_TOOLS,
            extra_headers={"traceparent": f"00-{agent_trace}-{agent_span}-01"})
        time.sleep(0.3)  # spans are recorded after each answer is sent
        assert tm.flush(10)
    finally:
        tm.shutdown()
    got = [{"id": c.id, "name": c.function.name, "arguments": json.loads(c.function.arguments)}
           for c in answer.choices[0].message.tool_calls or ()]
    assert got == [{"id": "call_Xk2pQ9rT", "name": "get_weather", "arguments": {"city": "7"}}]
    _stored(sqlite_url, lambda spans, calls: len(calls) >= 2)  # the sidecar's record first: the order that merged them
    agent_record = make_span(agent_trace, agent_span, "chat", chat_attributes(got, model="scripted-llama"))
    assert httpx.post(f"{collector.url}/v1/traces", content=export_request([agent_record], {
        "service.name": "weather-agent"}), headers={"Content-Type": "application/x-protobuf"}).status_code == 200
    spans, calls = _stored(sqlite_url, lambda spans, calls: any(s.trace_id == agent_trace for s in spans))
    chat = next(s for s in spans if s.name == "chat scripted-llama")
    assert chat.trace_id != agent_trace and chat.parent_span_id is None
    assert [(link["trace_id"], link["span_id"]) for link in chat.links] == [(agent_trace, agent_span)]
    in_agent_trace = [(c.service_name, c.arguments, c.stage) for c in calls if c.trace_id == agent_trace]
    assert in_agent_trace == [("weather-agent", {"city": "7"}, None)]
    sidecar = [(c.arguments, c.stage) for c in calls if c.trace_id == chat.trace_id]
    assert sidecar == [({"city": 7}, "schema")]  # what the model sent, failed, kept for mining


def test_the_harness_version_an_agent_names_to_the_sidecar_is_recorded_with_the_model_s_answers(
        model, start_proxy, start_collector, sqlite_url: str) -> None:
    """Named by the `X-Tracemill-Harness-Version` header or by W3C baggage (OpenTelemetry's propagators send it), the
    agent's harness version goes with the model's answer as sent, so that harness versions are compared on what the
    model wrote; the sidecar's revision of it carries none."""
    import tracemill.sdk as tm

    scripted, upstream = model
    asked = {"by header": {"X-Tracemill-Harness-Version": "prompt-v4"},
             "by baggage": {"baggage": "tracemill.harness.version=prompt-v5,other=1"}, "unnamed": {}}
    for n, question in enumerate(asked):
        call = {"name": "get_weather", "arguments": json.dumps({"city": n})}  # a number for a string: revised
        drawn = f"call_{n}Xk2pQ9rT"
        scripted.replies[question] = Reply(tool_calls=[{"id": drawn, "type": "function", "function": call}])
    collector = start_collector(sqlite_url)
    tm.init(collector.url, service_name="tracemill-serve", set_global=False)
    try:
        client = _client(start_proxy(upstream.url + "/v1", trace=True))
        for question, headers in asked.items():
            client.chat.completions.create(model="scripted-llama", messages=[{"role": "user", "content": question}],
                                           tools=WEATHER_TOOLS, extra_headers=headers)
        time.sleep(0.3)  # spans are recorded after each answer is sent
        assert tm.flush(10)
    finally:
        tm.shutdown()
    _, calls = _stored(sqlite_url, lambda spans, calls: len(calls) >= 6)
    sent = {c.arguments["city"]: c.harness_version for c in calls if c.model == "scripted-llama"}
    assert sent == {0: "prompt-v4", 1: "prompt-v5", 2: None}
    revised = [c.harness_version for c in calls if c.model == "tracemill-reviser:rules"]
    assert revised == [None, None, None]


def test_streams_are_traced_with_their_text_even_when_the_client_leaves(model, start_proxy, start_collector,
                                                                       sqlite_url: str) -> None:
    import tracemill.sdk as tm

    scripted, upstream = model
    scripted.replies["plain"] = Reply("It is sunny in Paris today.")
    scripted.replies["long"] = Reply("word " * 20, chunk_delay=0.05, repeat=10)  # ~15 s of streaming
    collector = start_collector(sqlite_url)
    tm.init(collector.url, service_name="tracemill-serve", set_global=False)
    try:
        proxy = start_proxy(upstream.url + "/v1", trace=True)
        assert _streamed(_client(proxy), "plain")[0] == "It is sunny in Paris today."  # no tools: nothing held
        body = {"model": "scripted-llama", "stream": True, "messages": [{"role": "user", "content": "long"}]}
        with httpx.stream("POST", proxy.url + "/v1/chat/completions", json=body, timeout=10) as response:
            for i, _ in enumerate(response.iter_bytes()):
                if i == 3:
                    break
        deadline = time.monotonic() + 5
        while "long" not in scripted.disconnected and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.3)  # spans are recorded after each answer ends
        assert tm.flush(10)
    finally:
        tm.shutdown()
    spans, _ = _stored(sqlite_url, lambda spans, _: sum(s.name.startswith("chat ") for s in spans) >= 2)
    chats = [s for s in spans if s.name.startswith("chat ")]
    assert len(chats) == 2
    plain, left = sorted(chats, key=lambda s: "long" in s.attributes["gen_ai.input.messages"])
    assert json.loads(plain.attributes["gen_ai.output.messages"])[0]["parts"] == [
        {"type": "text", "content": "It is sunny in Paris today."}]
    # the answer the client left is recorded as such: no half-written output for the verifier to fail
    assert left.attributes["error.type"] == "client_disconnected" and left.status_code == 2  # OTLP STATUS_CODE_ERROR
    assert json.loads(left.attributes["gen_ai.output.messages"])[0]["parts"] == []


def test_upstream_errors_come_back_with_their_status(model, start_proxy) -> None:
    scripted, upstream = model
    scripted.replies["boom"] = Reply(status=503)
    client = _client(start_proxy(upstream.url + "/v1"))
    for stream in (False, True):
        with pytest.raises(APIStatusError) as failure:
            client.chat.completions.create(model="scripted-llama", messages=[{"role": "user", "content": "boom"}],
                                           tools=WEATHER_TOOLS, stream=stream)
        assert failure.value.status_code == 503 and "scripted failure 503" in str(failure.value)


def test_an_upstream_that_is_down_or_too_slow_gets_a_clear_answer(model, start_proxy) -> None:
    scripted, upstream = model
    scripted.replies["slow"] = Reply("late", delay=5)
    slow = _client(start_proxy(upstream.url + "/v1", timeout=0.5))
    started = time.monotonic()
    with pytest.raises(APIStatusError) as failure:
        slow.chat.completions.create(model="scripted-llama", messages=[{"role": "user", "content": "slow"}])
    assert failure.value.status_code == 504 and "did not answer in time" in failure.value.message
    assert time.monotonic() - started < 3
    down = _client(start_proxy("http://127.0.0.1:9/v1"))
    for stream in (False, True):
        with pytest.raises(APIStatusError) as failure:
            down.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}], stream=stream)
        assert failure.value.status_code == 502 and "could not be reached" in failure.value.message


def test_a_stream_that_stalls_ends_with_an_error_instead_of_hanging(model, start_proxy) -> None:
    scripted, upstream = model
    scripted.replies["stall"] = Reply("thinking " * 4, chunk_delay=3)
    proxy = start_proxy(upstream.url + "/v1", timeout=0.5)
    client = _client(proxy)
    started = time.monotonic()
    with pytest.raises(APIError, match="the stream broke off.*did not answer in time"):
        for _ in client.chat.completions.create(model="scripted-llama", stream=True,
                                                messages=[{"role": "user", "content": "stall"}]):
            pass
    assert time.monotonic() - started < 3
    counted = httpx.get(proxy.url + "/metrics").text  # a timeout, as a dashboard sees it: 504, not 502
    assert 'tracemill_serve_requests_total{route="chat",status="504"} 1.0' in counted


def test_a_client_that_disconnects_cancels_the_upstream_request(model, start_proxy) -> None:
    scripted, upstream = model
    scripted.replies["long"] = Reply("word " * 20, chunk_delay=0.05, repeat=10)  # ~15 s of streaming
    proxy = start_proxy(upstream.url + "/v1")
    body = {"model": "scripted-llama", "stream": True, "messages": [{"role": "user", "content": "long"}]}
    with httpx.stream("POST", proxy.url + "/v1/chat/completions", json=body, timeout=10) as response:
        for i, _ in enumerate(response.iter_bytes()):
            if i == 3:
                break
    deadline = time.monotonic() + 5
    while "long" not in scripted.disconnected and time.monotonic() < deadline:
        time.sleep(0.05)
    assert "long" in scripted.disconnected and "long" not in scripted.finished


def test_each_of_several_choices_is_revised_or_left_alone_on_its_own(model, start_proxy) -> None:
    """n=2: the first choice calls a tool nobody offered (refused: nothing to fix it with), the second has a broken
    call the rules fix. The second arrives fixed whichever comes first."""
    scripted, upstream = model
    refused = Reply(tool_calls=native([{"name": "book_flight", "arguments": '{"to": "Oslo"}'}]))
    fixable = Reply(tool_calls=native([{"name": "get_weather", "arguments": '{"city": "Paris"'}]))
    scripted.replies["first refused"] = Reply(tool_calls=refused.tool_calls, others=(fixable,))
    scripted.replies["first fixable"] = Reply(tool_calls=fixable.tool_calls, others=(refused,))
    client = _client(start_proxy(upstream.url + "/v1"))
    for key, fixed_at in (("first refused", 1), ("first fixable", 0)):
        raw = client.chat.completions.with_raw_response.create(
            model="scripted-llama", messages=[{"role": "user", "content": key}], tools=WEATHER_TOOLS, n=2)
        choices = raw.parse().choices
        assert raw.headers["x-tracemill-revision"] == "partial"
        fixed, left = choices[fixed_at].message.tool_calls[0], choices[1 - fixed_at].message.tool_calls[0]
        assert (fixed.function.name, json.loads(fixed.function.arguments)) == ("get_weather", {"city": "Paris"})
        assert (left.function.name, left.function.arguments) == ("book_flight", '{"to": "Oslo"}')


def _streamed(client: OpenAI, key: str, **kwargs: Any) -> tuple[str, list[dict[str, Any]], list[Any]]:
    """(the text, the calls, the chunks) of a streamed answer as the openai client reads it."""
    chunks = list(client.chat.completions.create(model="scripted-llama", messages=[{"role": "user", "content": key}],
                                                 stream=True, **kwargs))
    text, calls = "", {}
    for chunk in chunks:
        for choice in chunk.choices:
            text += choice.delta.content or ""
            for tc in choice.delta.tool_calls or ():
                call = calls.setdefault(tc.index, {"name": "", "arguments": ""})
                call["name"] += tc.function.name or ""
                call["arguments"] += tc.function.arguments or ""
    return text, [calls[k] for k in sorted(calls)], chunks


def test_a_stream_with_crlf_lines_cut_between_reads_is_read_whole(model, start_proxy) -> None:
    """sse-starlette (llama-cpp-python) ends lines in CRLF; a read can end between the \r and the \n."""
    scripted, upstream = model
    scripted.replies["crlf"] = Reply('get_weather(city="Paris", units="METRIC")', crlf=True)
    client = _client(start_proxy(upstream.url + "/v1"))
    text, calls, chunks = _streamed(client, "crlf", tools=WEATHER_TOOLS)
    assert text == "" and [(c["name"], json.loads(c["arguments"])) for c in calls] == [
        ("get_weather", {"city": "Paris", "units": "metric"})]
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["tool_calls"]


def test_usage_sent_with_the_finish_reaches_the_client(model, start_proxy) -> None:
    scripted, upstream = model
    scripted.replies["usage"] = Reply("It is sunny in Paris.", usage_on_finish=True)
    scripted.replies["usage, a call"] = Reply('get_weather(city="Paris")', usage_on_finish=True)
    client = _client(start_proxy(upstream.url + "/v1"))
    for key, tools in (("usage", None), ("usage", WEATHER_TOOLS), ("usage, a call", WEATHER_TOOLS)):
        _, _, chunks = _streamed(client, key, **({"tools": tools} if tools else {}))
        finish = [c for c in chunks if c.choices and c.choices[0].finish_reason]
        assert len(finish) == 1 and finish[0].usage is not None and finish[0].usage.total_tokens == 18, key


def test_held_text_keeps_its_tokens_logprobs(model, start_proxy) -> None:
    """Text that may start a call is held until the choice ends; when it goes out as text, each token's logprob goes
    with it, none lost and none out of order."""
    scripted, upstream = model
    said = 'The answer: {"temperature": 21} in Paris today.'
    scripted.replies["logprobs"] = Reply(said, logprobs=True)
    client = _client(start_proxy(upstream.url + "/v1"))
    text, calls, chunks = _streamed(client, "logprobs", tools=WEATHER_TOOLS, logprobs=True)
    tokens = [t.token for c in chunks for choice in c.choices if choice.logprobs and choice.logprobs.content
              for t in choice.logprobs.content]
    assert text == said and not calls and "".join(tokens) == said


def test_text_streams_through_as_it_comes(model, start_proxy) -> None:
    scripted, upstream = model
    scripted.replies["prose"] = Reply("The weather in Paris is mild today, around twenty degrees. " * 3)
    client = _client(start_proxy(upstream.url + "/v1"))
    pieces = [c.choices[0].delta.content for c in client.chat.completions.create(
        model="scripted-llama", messages=[{"role": "user", "content": "prose"}], tools=WEATHER_TOOLS, stream=True)
        if c.choices and c.choices[0].delta.content]
    assert len(pieces) > 10 and "".join(pieces) == scripted.replies["prose"].content


def test_tool_choice_none_leaves_text_alone(model, start_proxy) -> None:
    scripted, upstream = model
    text = '{"name": "get_weather", "arguments": {"city": "Paris"}}'
    scripted.replies["json text"] = Reply(text)
    client = _client(start_proxy(upstream.url + "/v1"))
    for choice, calls in (("auto", 1), ("none", 0)):
        message = client.chat.completions.create(
            model="scripted-llama", messages=[{"role": "user", "content": "json text"}], tools=WEATHER_TOOLS,
            tool_choice=choice).choices[0].message
        assert len(message.tool_calls or ()) == calls
        assert (message.content == text) == (calls == 0)


def test_everything_else_passes_through(model, start_proxy) -> None:
    scripted, upstream = model
    scripted.loaded["tracemill-reviser-0001"] = "/adapters/1"
    proxy = start_proxy(upstream.url + "/v1")
    echo = httpx.post(proxy.url + "/v1/echo?x=1", content=b"hello", headers={"Authorization": "Bearer k",
                                                                            "Accept-Encoding": "gzip"}).json()
    assert echo == {"method": "POST", "query": {"x": "1"}, "body": "hello", "auth": "Bearer k", "encoding": "gzip",
                    "cookies": []}
    # a client that names no encoding (curl without --compressed) must not get one it cannot read
    plain = http.client.HTTPConnection(proxy.url.removeprefix("http://"), timeout=10)
    plain.putrequest("GET", "/v1/echo", skip_accept_encoding=True)
    plain.endheaders()
    answer = plain.getresponse()
    assert answer.getheader("content-encoding") is None and json.loads(answer.read())["encoding"] == "identity"
    plain.close()
    assert httpx.get(proxy.url + "/version").json() == {"version": "scripted"}
    models = [m.id for m in _client(proxy).models.list()]
    assert models == ["scripted-llama"]  # the reviser's own adapters are not the agent's business


def test_a_header_sent_twice_travels_twice(model, start_proxy) -> None:
    """A load balancer's cookie and the server's own are two Set-Cookie headers: both reach the client, on a checked
    answer, a stream and a relayed route alike; and a client's two Cookie headers both reach the upstream."""
    _, upstream = model
    proxy = start_proxy(upstream.url + "/v1")
    case = CASES[0]
    asked = {"model": "scripted-llama", "messages": [{"role": "user", "content": case.key}], "tools": case.tools}
    for stream in (False, True):
        answer = httpx.post(proxy.url + "/v1/chat/completions", json={**asked, "stream": stream}, timeout=30)
        assert answer.status_code == 200 and answer.headers.get_list("set-cookie") == COOKIES
    relayed = httpx.get(proxy.url + "/v1/echo", headers=[("Cookie", "a=1"), ("Cookie", "b=2")])
    assert relayed.headers.get_list("set-cookie") == COOKIES and relayed.json()["cookies"] == ["a=1", "b=2"]


def _span_metrics(proxy: ServerThread) -> dict[str, float]:
    """The sidecar's span figures from `/metrics`, as a dashboard scrapes them."""
    shown = dict(line.rsplit(" ", 1) for line in httpx.get(proxy.url + "/metrics").text.splitlines()
                 if line.startswith("tracemill_serve_spans_"))
    return {"ended": float(shown["tracemill_serve_spans_ended_total"]),
            "sent": float(shown['tracemill_serve_spans_exported_total{result="sent"}']),
            "failed": float(shown['tracemill_serve_spans_exported_total{result="failed"}']),
            "unsent": float(shown["tracemill_serve_spans_unsent"])}


def test_metrics_show_the_spans_a_stalled_collector_lost(model, start_proxy, monkeypatch) -> None:
    """A collector that takes connections and never answers: each export waits out its timeout, the SDK's queue (4
    spans here) fills and drops spans. `/metrics` counts both losses: the failed requests' spans and the dropped."""
    import socket

    import tracemill.sdk as tm

    _, upstream = model
    monkeypatch.setenv("OTEL_BSP_MAX_QUEUE_SIZE", "4")
    monkeypatch.setenv("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", "2")
    with socket.socket() as stalled:
        stalled.bind(("127.0.0.1", 0))
        stalled.listen(64)
        tm.init(f"http://127.0.0.1:{stalled.getsockname()[1]}", service_name="tracemill-serve", set_global=False,
                export_timeout_s=1.0)
        try:
            proxy = start_proxy(upstream.url + "/v1", trace=True)
            client = _client(proxy)
            for case in [c for c in CASES if c.valid_as_sent][:20]:
                _ask(client, case, stream=False)
            time.sleep(0.3)  # spans are recorded after each answer is sent
            assert not tm.flush(10)
            figures = _span_metrics(proxy)
        finally:
            tm.shutdown()
    assert figures["ended"] == 20 and figures["sent"] == 0
    assert figures["failed"] > 0 and figures["unsent"] > 0  # some were tried and refused, the rest dropped
    assert figures["failed"] + figures["unsent"] == 20


def test_revise_endpoint_health_and_metrics(model, start_proxy) -> None:
    scripted, upstream = model
    proxy = start_proxy(upstream.url + "/v1")
    answer = httpx.post(proxy.url + "/v1/revise", json={
        "raw": 'get_weather(city="Paris", units="METRIC")', "tools": WEATHER_TOOLS, "context": None}).json()
    assert answer["ok"] and answer["calls"] == [{"name": "get_weather", "arguments": {"city": "Paris",
                                                                                     "units": "metric"}}]
    assert answer["version"] == "rules"
    bad = httpx.post(proxy.url + "/v1/revise", json={"raw": 3, "tools": WEATHER_TOOLS})
    assert bad.status_code == 400 and "'raw'" in bad.json()["error"]["message"]
    health = httpx.get(proxy.url + "/healthz").json()
    assert health["status"] == "ok" and health["version"] == "rules" and health["canary"] is None
    scripted.replies["broken"] = Reply(tool_calls=native([{"name": "get_weather", "arguments": '{"city": "Paris"'}]))
    _client(proxy).chat.completions.create(model="scripted-llama", tools=WEATHER_TOOLS,
                                           messages=[{"role": "user", "content": "broken"}])
    metrics = httpx.get(proxy.url + "/metrics").text
    assert 'tracemill_serve_revisions_total{outcome="revised",version="rules"} 1.0' in metrics
    assert 'tracemill_serve_revision_steps_total{kind="close_brackets"} 1.0' in metrics
    assert "tracemill_serve_upstream_seconds_bucket" in metrics
    assert "tracemill_serve_revise_seconds_count 1.0" in metrics


def test_bad_requests_get_a_clear_error(model, start_proxy) -> None:
    _, upstream = model
    proxy = start_proxy(upstream.url + "/v1")
    response = httpx.post(proxy.url + "/v1/chat/completions", content=b"{not json")
    assert response.status_code == 400 and "not JSON" in response.json()["error"]["message"]
