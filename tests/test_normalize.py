"""Tool-call extraction from spans as real instrumentations emit them, and domain classification."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tracemill.collector.domains import classify_domain
from tracemill.collector.normalize import RESULT_LIMIT, extract
from tracemill.spans import SpanRecord
from tracemill.tools import Tool, load_mcp_bench
from tracemill.verify import Stage, verify

WEATHER_PARAMS = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
WEATHER_OPENAI = {"type": "function", "function": {"name": "get_weather", "description": "Current weather in a city",
                                                    "parameters": WEATHER_PARAMS}}
# The current GenAI semconv shape: flat, with `type`.
WEATHER_SEMCONV = {"type": "function", "name": "get_weather", "description": "Current weather in a city",
                   "parameters": WEATHER_PARAMS}


def span(attributes: dict[str, Any], *, name: str = "chat gpt-4o", status_code: int = 0, status_message: str = "",
         resource: dict[str, Any] | None = None, events: list[dict[str, Any]] | None = None) -> SpanRecord:
    return SpanRecord(
        trace_id="4bf92f3577b34da6a3ce929d0e0e4736", span_id="00f067aa0ba902b7", parent_span_id=None, name=name,
        kind=3, start_time_ns=1, end_time_ns=2, status_code=status_code, status_message=status_message,
        attributes=attributes, resource=resource if resource is not None else {"service.name": "agent"},
        events=events or [],
    )


def genai_chat(output: Any, tools: Any = None, **extra: Any) -> SpanRecord:
    attributes = {
        "gen_ai.operation.name": "chat", "gen_ai.provider.name": "openai", "gen_ai.request.model": "gpt-4o-mini",
        "gen_ai.response.model": "gpt-4o-mini-2024-07-18",
        "gen_ai.input.messages": json.dumps([{"role": "user", "parts": [{"type": "text", "content": "Paris?"}]}]),
        "gen_ai.output.messages": output, **extra,
    }
    if tools is not None:
        attributes["gen_ai.tool.definitions"] = tools
    return span(attributes)


def assistant(*parts: dict[str, Any]) -> str:
    return json.dumps([{"role": "assistant", "parts": list(parts), "finish_reason": "tool_call"}])


# --- OpenTelemetry GenAI --------------------------------------------------------------------------------------------

def test_genai_valid_call_with_object_arguments() -> None:
    found = extract(genai_chat(
        assistant({"type": "tool_call", "id": "call_1", "name": "get_weather", "arguments": {"city": "Paris"}}),
        json.dumps([WEATHER_SEMCONV])))
    [call] = found.calls
    assert (call.index, call.tool_call_id, call.name) == (0, "call_1", "get_weather")
    assert call.model == "gpt-4o-mini-2024-07-18"
    assert json.loads(call.raw) == {"name": "get_weather", "arguments": {"city": "Paris"}}
    assert call.call_input == {"name": "get_weather", "arguments": {"city": "Paris"}}
    assert [t.name for t in call.tools] == ["get_weather"]
    assert call.tools[0].input_schema == WEATHER_PARAMS
    assert found.offered_tools == call.tools
    assert verify(call.call_input, call.tools).ok and verify(call.raw, call.tools).ok
    assert found.executions == []


def test_genai_broken_json_arguments_are_a_call_kept_verbatim() -> None:
    broken = '{"city": "Paris"'
    found = extract(genai_chat(assistant({"type": "tool_call", "id": "c", "name": "get_weather", "arguments": broken}),
                               json.dumps([WEATHER_SEMCONV])))
    [call] = found.calls
    assert json.loads(call.raw)["arguments"] == broken
    assert call.call_input == {"name": "get_weather", "arguments": broken}
    for given_input in (call.raw, call.call_input):
        verdict = verify(given_input, call.tools)
        assert verdict.stage is Stage.PARSE and verdict.violations[0].pointer == "/arguments"


def test_genai_unknown_tool_is_flagged_by_the_verifier() -> None:
    found = extract(genai_chat(
        assistant({"type": "tool_call", "id": "c", "name": "get_forecast", "arguments": '{"city": "Paris"}'}),
        [WEATHER_OPENAI]))  # already-structured definitions, OpenAI-shaped
    [call] = found.calls
    assert call.name == "get_forecast"
    assert verify(call.raw, call.tools).stage is Stage.TOOL_NAME


def test_genai_several_calls_keep_their_order_and_text_is_not_a_call() -> None:
    output = [{"role": "assistant", "parts": [
        {"type": "text", "content": "Checking both cities."},
        {"type": "tool_call", "id": "a", "name": "get_weather", "arguments": {"city": "Paris"}},
        {"type": "tool_call", "id": "b", "name": "get_weather", "arguments": {"city": "Rome"}},
    ]}]
    mcp_tool = {"name": "get_weather", "description": "d", "inputSchema": WEATHER_PARAMS}
    first, again = extract(genai_chat(output, [mcp_tool])), extract(genai_chat(output, [mcp_tool]))
    assert [(c.index, c.tool_call_id) for c in first.calls] == [(0, "a"), (1, "b")]
    assert [c.raw for c in first.calls] == [c.raw for c in again.calls]
    assert first.calls[1].call_input["arguments"] == {"city": "Rome"}


def test_genai_messages_as_array_of_json_strings_and_missing_arguments() -> None:
    message = json.dumps({"role": "assistant", "parts": [{"type": "tool_call", "id": "x", "name": "list_cities"}]})
    [call] = extract(genai_chat([message])).calls
    assert call.call_input == {"name": "list_cities", "arguments": None}
    assert call.tools is None
    assert verify(call.raw, [{"name": "list_cities"}]).ok


def test_genai_messages_on_a_span_event() -> None:
    event = {"name": "gen_ai.client.inference.operation.details", "time_ns": 2, "attributes": {
        "gen_ai.output.messages": assistant({"type": "tool_call", "id": "e", "name": "get_weather",
                                             "arguments": {"city": "Oslo"}}),
        "gen_ai.tool.definitions": json.dumps([WEATHER_SEMCONV])}}
    found = extract(span({"gen_ai.operation.name": "chat"}, events=[event]))
    assert [c.tool_call_id for c in found.calls] == ["e"]
    assert [t.name for t in found.offered_tools] == ["get_weather"]


def test_text_tool_call_from_a_model_without_native_tool_calling() -> None:
    text = '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}'
    found = extract(genai_chat(assistant({"type": "text", "content": text}), json.dumps([WEATHER_SEMCONV])))
    [call] = found.calls
    assert (call.raw, call.call_input, call.name, call.tool_call_id) == (text, text, None, None)
    assert verify(call.raw, call.tools).stage is Stage.PARSE


def test_bare_json_and_pythonic_text_count_only_when_tools_were_offered() -> None:
    bare = '{"name": "get_weather", "arguments": {"city": "Paris"}}'
    assert extract(genai_chat(assistant({"type": "text", "content": bare}))).calls == []
    [call] = extract(genai_chat(assistant({"type": "text", "content": bare}), [WEATHER_SEMCONV])).calls
    assert verify(call.raw, call.tools).ok
    pythonic = 'get_weather(city="Paris")'
    assert [c.raw for c in extract(genai_chat(assistant({"type": "text", "content": pythonic}),
                                              [WEATHER_SEMCONV])).calls] == [pythonic]
    answer = "It is 18 °C and sunny in Paris."
    assert extract(genai_chat(assistant({"type": "text", "content": answer}), [WEATHER_SEMCONV])).calls == []


def test_a_call_written_as_text_keeps_the_name_and_arguments_the_reader_recovers() -> None:
    text = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    [call] = extract(genai_chat(assistant({"type": "text", "content": text}), [WEATHER_SEMCONV])).calls
    assert (call.name, call.read_name, call.read_arguments) == (None, "get_weather", {"city": "Paris"})
    assert verify(call.raw, call.tools).stage is Stage.PARSE  # as sent, it failed
    # no tool list on the span: still a call, whose verdicts are unknown
    [call] = extract(genai_chat(assistant({"type": "text", "content": text}))).calls
    assert (call.read_name, call.tools) == ("get_weather", None)


def test_execute_tool_span_with_error() -> None:
    found = extract(span({
        "gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "get_weather", "gen_ai.tool.call.id": "call_1",
        "gen_ai.tool.type": "function", "gen_ai.tool.call.arguments": '{"city": "Atlantis"}',
        "error.type": "ValueError"}, name="execute_tool get_weather", status_code=2, status_message="unknown city"))
    assert found.calls == []
    [execution] = found.executions
    assert (execution.tool_call_id, execution.tool_name, execution.arguments) == (
        "call_1", "get_weather", '{"city": "Atlantis"}')
    assert not execution.ok and execution.error == "ValueError: unknown city"


def test_execute_tool_span_success_with_structured_values_and_long_result() -> None:
    found = extract(span({
        "gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "get_weather", "gen_ai.tool.call.id": "c",
        "gen_ai.tool.call.arguments": {"city": "Paris"}, "gen_ai.tool.call.result": "x" * (RESULT_LIMIT + 10)}))
    [execution] = found.executions
    assert execution.ok and execution.error is None
    assert json.loads(execution.arguments) == {"city": "Paris"}
    assert len(execution.result) == RESULT_LIMIT


def test_error_from_status_and_exception_event_without_error_type() -> None:
    exception = {"name": "exception", "time_ns": 2,
                 "attributes": {"exception.type": "TimeoutError", "exception.message": "timed out after 30s"}}
    [execution] = extract(span({"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "slow"},
                               status_code=2, events=[exception])).executions
    assert (execution.ok, execution.error) == (False, "timed out after 30s")


# --- MCP --------------------------------------------------------------------------------------------------------------

def test_mcp_tools_call_client_span_per_semconv() -> None:
    found = extract(span({
        "mcp.method.name": "tools/call", "gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "get-weather",
        "jsonrpc.request.id": "3", "mcp.session.id": "8267461134f24305af708e66b8eda71a",
        "mcp.protocol.version": "2025-06-18", "network.transport": "pipe",
        "gen_ai.tool.call.arguments": {"location": "San Francisco?", "date": "2025-10-01"},
        "gen_ai.tool.call.result": {"temperature_range": {"high": 75, "low": 60}, "conditions": "sunny"}},
        name="tools/call get-weather"))
    [execution] = found.executions  # one execution although the span is both MCP and execute_tool
    assert execution.tool_name == "get-weather" and execution.ok
    assert execution.tool_call_id is None  # a JSON-RPC id is not the model's tool call id
    assert json.loads(execution.arguments) == {"location": "San Francisco?", "date": "2025-10-01"}
    assert json.loads(execution.result)["conditions"] == "sunny"


def test_mcp_tools_call_with_flattened_arguments_and_tool_error() -> None:
    found = extract(span({
        "mcp.method.name": "tools/call", "mcp.tool.name": "weather", "mcp.request.id": "7",
        "mcp.request.argument.location": '"London"', "mcp.request.argument.units": '"metric"',
        "mcp.request.argument.days": "3", "mcp.tool.result.is_error": True,
        "mcp.tool.result.content": "Unknown units"}, name="tools/call weather"))
    [execution] = found.executions
    assert execution.tool_name == "weather"
    assert json.loads(execution.arguments) == {"location": "London", "units": "metric", "days": 3}
    assert (execution.ok, execution.error, execution.result) == (False, "tool_error", "Unknown units")


def test_mcp_tools_list_span_offers_its_tools() -> None:
    result = {"tools": [{"name": "get-weather", "description": "Weather", "inputSchema": WEATHER_PARAMS},
                        {"name": 42}]}
    found = extract(span({"mcp.method.name": "tools/list", "mcp.tools": json.dumps(result)}, name="tools/list"))
    assert found.calls == [] and found.executions == []
    assert [t.name for t in found.offered_tools] == ["get-weather"]  # the unreadable tool is skipped
    assert found.offered_tools[0].input_schema == WEATHER_PARAMS


def test_mcp_tools_list_result_in_output_value() -> None:
    found = extract(span({"mcp.method.name": "tools/list",
                          "output.value": json.dumps({"tools": [{"name": "ping", "inputSchema": {}}]})}))
    assert [t.name for t in found.offered_tools] == ["ping"]


# --- OpenInference ----------------------------------------------------------------------------------------------------

def openinference_llm(arguments: str) -> SpanRecord:
    prefix = "llm.output_messages.0.message"
    return span({
        "openinference.span.kind": "LLM", "llm.model_name": "gpt-4o-2024-08-06", "llm.provider": "openai",
        "llm.system": "openai", "input.value": '{"messages": []}', "input.mime_type": "application/json",
        "llm.input_messages.0.message.role": "user", "llm.input_messages.0.message.content": "Paris?",
        "llm.tools.0.tool.json_schema": json.dumps(WEATHER_OPENAI),
        "llm.tools.1.tool.json_schema": "{not json",
        f"{prefix}.role": "assistant",
        f"{prefix}.tool_calls.0.tool_call.id": "call_abc123",
        f"{prefix}.tool_calls.0.tool_call.function.name": "get_weather",
        f"{prefix}.tool_calls.0.tool_call.function.arguments": arguments,
        f"{prefix}.tool_calls.1.tool_call.id": "call_def456",
        f"{prefix}.tool_calls.1.tool_call.function.name": "get_weather",
        f"{prefix}.tool_calls.1.tool_call.function.arguments": '{"city": "Rome"}',
        "llm.token_count.prompt": 80, "llm.token_count.completion": 20,
    }, name="ChatCompletion")


def test_openinference_llm_span() -> None:
    found = extract(openinference_llm('{"city": "Paris"}'))
    assert [(c.index, c.tool_call_id, c.name) for c in found.calls] == [
        (0, "call_abc123", "get_weather"), (1, "call_def456", "get_weather")]
    assert [t.name for t in found.offered_tools] == ["get_weather"]  # the broken definition is skipped
    assert [(c.model, verify(c.raw, c.tools).ok) for c in found.calls] == [("gpt-4o-2024-08-06", True)] * 2


def test_openinference_llm_span_with_broken_arguments() -> None:
    call = extract(openinference_llm('{"city": Paris}')).calls[0]
    assert json.loads(call.raw)["arguments"] == '{"city": Paris}'
    assert verify(call.raw, call.tools).stage is Stage.PARSE


def test_openinference_flattened_tool_definition_without_json_schema() -> None:
    found = extract(span({"openinference.span.kind": "LLM", "llm.tools.0.tool.name": "get_weather",
                          "llm.tools.0.tool.description": "Weather",
                          "llm.tools.0.tool.parameters": json.dumps(WEATHER_PARAMS)}))
    assert [(t.name, t.input_schema) for t in found.offered_tools] == [("get_weather", WEATHER_PARAMS)]


def test_openinference_tool_span() -> None:
    found = extract(span({
        "openinference.span.kind": "TOOL", "tool.name": "get_weather", "tool.description": "Weather",
        "tool.parameters": json.dumps(WEATHER_PARAMS),  # the definition, not the arguments
        "input.value": '{"city": "Paris"}', "input.mime_type": "application/json",
        "output.value": "18 °C, sunny", "tool_call.id": "call_abc123"}, name="get_weather"))
    [execution] = found.executions
    assert (execution.tool_call_id, execution.tool_name, execution.arguments, execution.result, execution.ok) == (
        "call_abc123", "get_weather", '{"city": "Paris"}', "18 °C, sunny", True)


def test_openinference_tool_span_failed() -> None:
    [execution] = extract(span({"openinference.span.kind": "TOOL", "tool.name": "get_weather", "tool.id": "t1"},
                               status_code=2, status_message="HTTPError: 503")).executions
    assert (execution.tool_call_id, execution.ok, execution.error) == ("t1", False, "HTTPError: 503")


# --- OpenLLMetry and LangSmith ----------------------------------------------------------------------------------------

def test_openllmetry_flattened_completion_and_functions() -> None:
    found = extract(span({
        "llm.request.type": "chat", "gen_ai.system": "openai", "gen_ai.request.model": "gpt-4o",
        "gen_ai.response.model": "gpt-4o-2024-08-06",
        "gen_ai.prompt.0.role": "user", "gen_ai.prompt.0.content": "Weather in Paris and Rome?",
        "llm.request.functions.0.name": "get_weather", "llm.request.functions.0.description": "Weather",
        "llm.request.functions.0.parameters": json.dumps(WEATHER_PARAMS),
        "gen_ai.completion.0.role": "assistant", "gen_ai.completion.0.finish_reason": "tool_calls",
        "gen_ai.completion.0.tool_calls.0.id": "call_1", "gen_ai.completion.0.tool_calls.0.name": "get_weather",
        "gen_ai.completion.0.tool_calls.0.arguments": '{"city": "Paris"}',
        "gen_ai.completion.0.tool_calls.1.id": "call_2", "gen_ai.completion.0.tool_calls.1.name": "get_weather",
        "gen_ai.completion.0.tool_calls.1.arguments": '{"city": 3}',
    }, name="openai.chat"))
    assert [c.tool_call_id for c in found.calls] == ["call_1", "call_2"]
    assert verify(found.calls[0].raw, found.calls[0].tools).ok
    assert verify(found.calls[1].raw, found.calls[1].tools).stage is Stage.SCHEMA


def test_langsmith_langchain_generation_prefers_the_raw_openai_arguments() -> None:
    ai_message = {"lc": 1, "type": "constructor", "id": ["langchain", "schema", "messages", "AIMessage"], "kwargs": {
        "content": "", "type": "ai",
        "additional_kwargs": {"tool_calls": [{"id": "call_9", "type": "function",
                                              "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'}}]},
        "tool_calls": [{"name": "get_weather", "args": {"city": "Paris"}, "id": "call_9", "type": "tool_call"}]}}
    completion = {"generations": [[{"text": "", "type": "ChatGeneration", "message": ai_message}]],
                  "llm_output": {"model_name": "gpt-4o"}}
    prompt = {"messages": [[{"role": "user", "content": "Paris?"}]], "tools": [WEATHER_OPENAI]}
    found = extract(span({"langsmith.span.kind": "llm", "langsmith.trace.name": "ChatOpenAI",
                          "gen_ai.request.model": "gpt-4o", "gen_ai.prompt": json.dumps(prompt),
                          "gen_ai.completion": json.dumps(completion)}))
    [call] = found.calls
    assert call.call_input == {"name": "get_weather", "arguments": '{"city":"Paris"}'}
    assert [t.name for t in call.tools] == ["get_weather"]


def test_langsmith_openai_choices_and_invalid_tool_calls() -> None:
    completion = {"choices": [{"index": 0, "message": {"role": "assistant", "content": None, "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": '}}]}}]}
    [call] = extract(span({"langsmith.span.kind": "llm", "gen_ai.completion": completion})).calls
    assert json.loads(call.raw) == {"name": "get_weather", "arguments": '{"city": '}
    langchain = {"content": "", "type": "ai", "tool_calls": [], "invalid_tool_calls": [
        {"name": "get_weather", "args": '{"city": Paris', "id": "c2", "error": None}]}
    [call] = extract(span({"langsmith.span.kind": "llm", "gen_ai.completion": json.dumps(langchain)})).calls
    assert (call.tool_call_id, call.call_input["arguments"]) == ("c2", '{"city": Paris')


def test_langsmith_openai_responses_output_items() -> None:
    completion = {"id": "resp_1", "output": [
        {"type": "reasoning", "id": "rs_1", "summary": []},
        {"type": "function_call", "id": "fc_1", "call_id": "call_7", "name": "get_weather",
         "arguments": '{"city": "Paris"}', "status": "completed"}]}
    [call] = extract(span({"langsmith.span.kind": "llm", "gen_ai.completion": json.dumps(completion)})).calls
    assert (call.tool_call_id, call.call_input) == ("call_7", {"name": "get_weather", "arguments": '{"city": "Paris"}'})


def test_no_calls_are_read_from_a_tool_execution() -> None:
    found = extract(span({"langsmith.span.kind": "tool", "gen_ai.completion": "<tool_call>{}</tool_call>"}))
    assert found.calls == [] and len(found.executions) == 1


def test_langsmith_tool_run() -> None:
    [execution] = extract(span({"langsmith.span.kind": "tool", "gen_ai.prompt": '{"city": "Paris"}',
                                "gen_ai.completion": '"sunny"'}, name="get_weather")).executions
    assert (execution.tool_name, execution.arguments, execution.result, execution.ok) == (
        "get_weather", '{"city": "Paris"}', '"sunny"', True)


# --- metadata, ordinary spans, garbage --------------------------------------------------------------------------------

def test_harness_version_and_domain() -> None:
    output = assistant({"type": "tool_call", "id": "c", "name": "get_weather", "arguments": {}})
    attributes = {"gen_ai.operation.name": "chat", "gen_ai.output.messages": output, "gen_ai.agent.version": "a-1"}
    found = extract(span(attributes, resource={"tracemill.harness.version": "h-7", "tracemill.domain": "legal"}))
    assert (found.harness_version, found.declared_domain) == ("h-7", "legal")
    found = extract(span({**attributes, "tracemill.domain": "medical"}, resource={"gen_ai.agent.version": 3}))
    assert (found.harness_version, found.declared_domain) == ("a-1", "medical")
    assert (extract(span({"gen_ai.output.messages": output})).harness_version,) == (None,)


def test_ordinary_span_is_empty() -> None:
    found = extract(span({"http.request.method": "GET", "url.full": "https://example.com", "tool.x": None},
                         name="GET", resource={"tracemill.harness.version": "h"}))
    assert found.calls == [] and found.executions == [] and found.offered_tools is None
    found = extract(span({"http.request.method": "GET"}, name="GET", resource={"tracemill.harness.version": "h"}))
    assert (found.calls, found.executions, found.offered_tools, found.harness_version) == ([], [], None, None)


@pytest.mark.parametrize(("output", "nameless_calls"), [
    (42, 0), ("not json", 0), ("[1, 2", 0), ({"role": "assistant"}, 0), ([None, 3, "x"], 0),
    ([{"role": "assistant", "parts": "nope"}], 0),
    ([{"role": ["assistant"], "parts": [None, 1, {"type": "tool_call", "name": 5}]}], 1),
    ([{"role": "user", "parts": [{"type": "tool_call", "name": "x"}]}], 0)])
def test_garbage_output_messages(output: Any, nameless_calls: int) -> None:
    found = extract(genai_chat(output, tools="{{{"))
    assert found.offered_tools is None
    assert [c.name for c in found.calls] == [None] * nameless_calls  # a tool_call part with a non-string name


def test_unreadable_tool_definitions_do_not_drop_the_call() -> None:
    output = assistant({"type": "tool_call", "id": "c", "name": "get_weather", "arguments": {"city": "Paris"}})
    [call] = extract(genai_chat(output, [1, "x", {"name": 3}, {"name": "bad", "parameters": "str"}])).calls
    assert call.tools is None and call.name == "get_weather"
    [call] = extract(genai_chat(output, [1, WEATHER_SEMCONV])).calls
    assert [t.name for t in call.tools] == ["get_weather"]
    [call] = extract(genai_chat(output, "[]")).calls
    assert call.tools == [] and verify(call.raw, call.tools).stage is Stage.TOOL_NAME


def test_wrong_container_types() -> None:
    odd = span({"gen_ai.operation.name": "execute_tool"}, events="nope")  # type: ignore[arg-type]
    odd.attributes = {1: "x", "gen_ai.operation.name": "execute_tool", "error.type": ["a"], "gen_ai.tool.call.id": 7}
    odd.resource = None  # type: ignore[assignment]
    [execution] = extract(odd).executions
    assert (execution.tool_call_id, execution.ok, execution.error) == ("7", False, '["a"]')


def test_arguments_nested_too_deeply_still_make_a_call() -> None:
    deep = '{"a":' * 1000 + "1" + "}" * 1000
    output = '[{"role":"assistant","parts":[{"type":"tool_call","name":"x","arguments":' + deep + "}]}]"
    [call] = extract(genai_chat(output)).calls
    assert call.name == "x" and verify(call.raw, [{"name": "x"}]).stage is Stage.PARSE


_json = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
                     lambda inner: st.lists(inner, max_size=4) | st.dictionaries(
                         st.sampled_from(["role", "parts", "type", "name", "arguments", "id", "content", "tool_calls",
                                          "function", "tools", "args", "additional_kwargs", "inputSchema"]),
                         inner, max_size=5), max_leaves=20)
_keys = st.sampled_from([
    "gen_ai.output.messages", "gen_ai.tool.definitions", "gen_ai.operation.name", "gen_ai.completion",
    "gen_ai.prompt", "mcp.method.name", "mcp.tools", "openinference.span.kind", "langsmith.span.kind",
    "llm.output_messages.0.message.tool_calls.0.tool_call.function.arguments",
    "llm.output_messages.0.message.tool_calls.0.tool_call.function.name", "llm.tools.0.tool.json_schema",
    "gen_ai.completion.0.tool_calls.0.name", "llm.request.functions.0.parameters", "mcp.request.argument.a",
    "gen_ai.tool.call.arguments", "error.type", "output.value"])


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(_keys, _json | _json.map(json.dumps) | st.sampled_from(["execute_tool", "tools/call",
                                                                             "tools/list", "TOOL", "tool"])),
       st.integers(0, 3))
def test_extract_never_raises(attributes: dict[str, Any], status: int) -> None:
    found = extract(span(attributes, status_code=status))
    for call in found.calls:
        assert isinstance(call.raw, str)
        verify(call.call_input, call.tools or [])


# --- domains ----------------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def mcp_bench() -> dict[str, list[Tool]]:
    return load_mcp_bench()


@pytest.mark.parametrize(("server", "domain"), [
    ("Medical Calculator", "medical"), ("BioMCP", "medical"), ("Weather Data", "weather"), ("Google Maps", "maps"),
    ("OKX Exchange", "finance"), ("DEX Paprika", "finance"), ("NASA Data", "science"),
    ("Scientific Computing", "science"), ("Paper Search", "science"), ("Math MCP", "science"),
])
def test_mcp_bench_servers_classify(mcp_bench: dict[str, list[Tool]], server: str, domain: str) -> None:
    assert {classify_domain(tool) for tool in mcp_bench[server]} == {domain}


def test_mcp_bench_general_servers_have_no_domain(mcp_bench: dict[str, list[Tool]]) -> None:
    for server in ("Time MCP", "Reddit", "Wikipedia", "Unit Converter"):
        assert {classify_domain(tool) for tool in mcp_bench[server]} == {None}, server


def test_unqualified_medical_tools_classify_by_their_own_words() -> None:
    tools = {tool.name: tool for tool in load_mcp_bench(qualified=False)["BioMCP"]}
    for name in ("variant_searcher", "gene_getter", "drug_getter", "trial_searcher"):
        assert classify_domain(tools[name]) == "medical", name


def test_classify_by_name_only_and_legal() -> None:
    assert classify_domain(None, "calculate_bmi") == "medical"
    assert classify_domain(None, "generate_report") is None  # "gene" only as a whole word
    assert classify_domain(None, "Contract Review:find_clauses") == "legal"
    review = Tool("review", "Check a contract against the statute and flag compliance risks")
    assert classify_domain(review) == "legal"
    assert classify_domain(review, "Weather Data:review") == "weather"  # the name as called wins over the tool's
    assert classify_domain(None, None) is None


def test_openllmetry_mcp_tools_list_result_and_tool_span_with_the_error_in_its_output() -> None:
    listed = {"name": "get_weather", "description": "Weather", "inputSchema": WEATHER_PARAMS}
    found = extract(span({"traceloop.span.kind": "task", "traceloop.entity.name": "tools/list",
                          "traceloop.entity.input": "{}", "traceloop.entity.output": json.dumps({"tools": [listed]})},
                         name="tools/list.mcp"))
    assert [t.name for t in found.offered_tools or []] == ["get_weather"]
    [execution] = extract(span({
        "traceloop.span.kind": "tool", "traceloop.entity.name": "get_weather",
        "traceloop.entity.input": json.dumps({"tool_name": "get_weather", "arguments": {"city": "Atlantis"}}),
        "traceloop.entity.output": json.dumps({"result": "no station in Atlantis", "is_error": True})},
        name="get_weather.tool")).executions
    assert (execution.tool_name, json.loads(execution.arguments or "")) == ("get_weather", {"city": "Atlantis"})
    assert not execution.ok and "no station in Atlantis" in (execution.error or "")


def test_langfuse_generation_and_tool_observations() -> None:
    found = extract(span({
        "langfuse.observation.type": "generation", "langfuse.observation.model.name": "qwen3",
        "langfuse.observation.input": json.dumps({"tools": [WEATHER_OPENAI], "messages": []}),
        "langfuse.observation.output": json.dumps({"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": 3}'}}]})},
        name="OpenAI-generation"))
    [call] = found.calls
    assert (call.name, call.tool_call_id, call.model, [t.name for t in call.tools or []]) == \
        ("get_weather", "c1", "qwen3", ["get_weather"])
    [execution] = extract(span({"langfuse.observation.type": "tool", "langfuse.observation.level": "ERROR",
                                "langfuse.observation.input": json.dumps({"args": [], "kwargs": {"city": "X"}})},
                               name="get_weather")).executions
    assert (execution.tool_name, execution.arguments, execution.ok) == ("get_weather", '{"city":"X"}', False)


def test_a_tool_error_langchain_handled_is_an_error() -> None:
    message = {"content": "no weather station", "type": "tool", "tool_call_id": "call_9", "status": "error"}
    [langsmith] = extract(span({"langsmith.span.kind": "tool", "gen_ai.operation.name": "execute_tool",
                                "gen_ai.tool.name": "get_weather", "gen_ai.tool.call.id": "call_9",
                                "gen_ai.completion": json.dumps({"output": message})})).executions
    [openinference] = extract(span({"openinference.span.kind": "TOOL", "tool.name": "get_weather",
                                    "input.value": "Atlantis",
                                    "output.value": json.dumps({"type": "tool", "data": message})})).executions
    for execution in (langsmith, openinference):
        assert (execution.tool_call_id, execution.ok) == ("call_9", False)
        assert "no weather station" in (execution.error or "")


def test_openinference_langchain_llm_span_keeps_the_call_langchain_could_not_parse() -> None:
    generation = {"generations": [[{"text": "", "message": {"lc": 1, "kwargs": {
        "content": "", "type": "ai", "tool_calls": [], "invalid_tool_calls": [
            {"type": "invalid_tool_call", "name": "get_weather", "args": '{"city": "Par', "id": "c2",
             "error": None}]}}}]]}
    [call] = extract(span({"openinference.span.kind": "LLM", "llm.model_name": "m",
                           "llm.output_messages.0.message.role": "assistant",
                           "output.value": json.dumps(generation)})).calls
    assert (call.name, call.tool_call_id, json.loads(call.raw)["arguments"]) == ("get_weather", "c2", '{"city": "Par')


@pytest.mark.parametrize("recorded", [
    {"gen_ai.response.id": "chatcmpl-7Hq2"},
    {"output.value": json.dumps({"id": "chatcmpl-7Hq2", "object": "chat.completion", "choices": []})},
    {"output.value": json.dumps({"id": "chatcmpl-7Hq2", "choices": []})},  # OpenInference's streamed completion
    {"output.value": json.dumps({"generations": [[]], "llm_output": {"id": "chatcmpl-7Hq2"}, "type": "LLMResult"})},
])
def test_a_call_written_as_text_keeps_the_response_id_the_span_records(recorded: dict[str, Any]) -> None:
    text = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    [call] = extract(span({"openinference.span.kind": "LLM", "llm.tools.0.tool.json_schema": json.dumps(WEATHER_OPENAI),
                           "llm.output_messages.0.message.role": "assistant",
                           "llm.output_messages.0.message.content": text, **recorded})).calls
    assert (call.read_name, call.response_id) == ("get_weather", "chatcmpl-7Hq2")
    streamed_langchain = {"generations": [[]], "llm_output": None, "type": "LLMResult"}
    [call] = extract(span({"llm.output_messages.0.message.content": text,
                           "output.value": json.dumps(streamed_langchain),
                           "llm.tools.0.tool.json_schema": json.dumps(WEATHER_OPENAI)})).calls
    assert call.response_id is None
