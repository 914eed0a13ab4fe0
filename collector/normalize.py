"""The tool calls, offered tools and tool executions in one decoded span, whichever convention emitted them:
OpenTelemetry GenAI (`gen_ai.*` messages, `execute_tool` spans), MCP (`tools/call`, `tools/list`), OpenInference
(`llm.*`, `tool.*`), OpenLLMetry's flattened `gen_ai.completion.N.*` and LangSmith's `gen_ai.prompt` and
`gen_ai.completion`.

`ExtractedCall.raw` is the model's own text for the call. A native (structured) call becomes the JSON text
`{"name": ..., "arguments": ...}` with the arguments exactly as emitted: a string stays a JSON string, its text
verbatim even when it is broken JSON, and an object stays an object, so `verify(raw)` reads it exactly as it reads
`call_input`. A call the model wrote as text (`<tool_call>…`, `[TOOL_CALLS]…`, bare JSON, `tool(...)`) keeps that text
as both `raw` and `call_input`, with `name` None (its verdict is the text's as sent: it failed), and the tool it names
and its arguments as the reader recovers them in `read_name` / `read_arguments`, so that it can be counted by tool.
Whether text holds a call at all is decided by the reviser's own reading (`tracemill.reader.holds_call`); where the
span does not list the tools offered, only a marked call that names its tool counts, stored with unknown verdicts.

Tool lists are decoded once per distinct text and shared between spans: treat `Tool` objects as read-only.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import orjson

from tracemill.reader import holds_call, read
from tracemill.spans import SpanRecord
from tracemill.tools import Tool, ToolFormatError, normalize_tool, tool_index

RESULT_LIMIT = 64 * 1024  # characters of a tool result kept

_RELEVANT_PREFIXES = ("gen_ai.", "llm.", "mcp.", "openinference.", "tool.", "tool_call.", "langsmith.", "traceloop.",
                      "langfuse.")
_EVENT_KEYS = ("gen_ai.output.messages", "gen_ai.tool.definitions", "gen_ai.completion")
_MODEL_KEYS = ("gen_ai.response.model", "gen_ai.request.model", "llm.model_name", "llm.response.model",
               "llm.request.model")
_TOOL_LIST_KEYS = ("gen_ai.tool.definitions", "mcp.tools")
_NOT_MODEL_ROLES = frozenset({"user", "system", "developer", "tool", "function", "human"})
_MESSAGE_KEYS = frozenset({"role", "parts", "tool_calls", "content", "additional_kwargs", "function_call"})
_MAX_DEPTH = 8
_TOO_DEEP = "<arguments nested too deeply to store>"

_EXEC_NAME_KEYS = ("gen_ai.tool.name", "mcp.tool.name", "tool.name", "traceloop.entity.name", "langsmith.trace.name")
_EXEC_ID_KEYS = ("gen_ai.tool.call.id", "tool_call.id", "tool.id", "tool.call_id")
# `tool.parameters` is OpenInference's tool *definition*, but some instrumentations put the arguments there: last.
_EXEC_ARGUMENT_KEYS = ("gen_ai.tool.call.arguments", "mcp.request.arguments", "input.value",
                       "tool_call.function.arguments", "gen_ai.prompt", "tool.parameters")
_EXEC_RESULT_KEYS = ("gen_ai.tool.call.result", "mcp.tool.result.content", "output.value", "gen_ai.completion")
# LangChain's `invalid_tool_calls` (arguments that are not JSON), which OpenInference leaves out of the
# flattened output.
_REPORT_MARKERS = ('"status"', '"tool_call_id"', '"isError"', '"is_error"')
_INVALID_CALLS = re.compile(r'"invalid_tool_calls":\s*\[\s*\{')
_MCP_ARGUMENT_PREFIX = "mcp.request.argument."

# Flattened output messages: OpenInference `llm.output_messages.N.message.…`, OpenLLMetry `gen_ai.completion.N.…`.
_OPENINFERENCE_OUTPUT = re.compile(
    r"llm\.output_messages\.(?P<msg>\d+)\.message\.(?:tool_calls\.(?P<call>\d+)\.tool_call\."
    r"(?P<cfield>id|function\.name|function\.arguments)|(?P<ffield>function_call_name|function_call_arguments_json)"
    r"|content)$")
_OPENLLMETRY_OUTPUT = re.compile(
    r"gen_ai\.completion\.(?P<msg>\d+)\.(?:tool_calls\.(?P<call>\d+)\.(?P<cfield>id|name|arguments)"
    r"|function_call\.(?P<ffield>name|arguments)|content)$")
_FIELDS = {"id": "id", "name": "name", "arguments": "arguments", "function.name": "name",
           "function.arguments": "arguments", "function_call_name": "name", "function_call_arguments_json": "arguments"}
# Flattened tool lists: OpenInference `llm.tools.N.tool.*`, OpenLLMetry `llm.request.functions.N.*`.
_FLAT_TOOL = re.compile(r"(?:llm\.tools|llm\.request\.functions)\.(?P<n>\d+)\.(?:tool\.)?"
                        r"(?P<field>json_schema|name|description|parameters)$")



def storable(text: Any) -> Any:
    """A text read out of decoded JSON as the store keeps it, on SQLite as on PostgreSQL (whose `text` refuses NUL):
    a NUL (U+0000) becomes U+FFFD. A request's own strings cannot hold one (`collector.decode` refuses them), but a
    JSON attribute can say `\\u0000`."""
    return text.replace("\x00", "\ufffd") if isinstance(text, str) and "\x00" in text else text


@dataclass(slots=True)
class ExtractedCall:
    """One tool call the model emitted."""

    index: int  # position within the span, in emission order: the same on every re-send of the span
    tool_call_id: str | None
    raw: str
    call_input: str | dict[str, Any]  # what to give `tracemill.verify.verify`
    name: str | None
    tools: list[Tool] | None  # the tools offered in this span; None when the span does not say
    model: str | None
    # A call written as text: the tool it names and its arguments as the reader recovers them (`name` stays None, so
    # that the verdict is the text's as sent).
    read_name: str | None = None
    read_arguments: dict[str, Any] | None = None
    response_id: str | None = None  # of the model's response, read for calls without an id only (`same_call`)

    def __post_init__(self) -> None:
        self.raw = storable(self.raw)
        self.name, self.tool_call_id, self.read_name, self.response_id = map(
            storable, (self.name, self.tool_call_id, self.read_name, self.response_id))
        if isinstance(self.call_input, str):
            self.call_input = storable(self.call_input)
        elif isinstance(self.call_input.get("name"), str) and "\x00" in self.call_input["name"]:
            self.call_input = {**self.call_input, "name": storable(self.call_input["name"])}


@dataclass(slots=True)
class ExtractedExecution:
    """One tool execution: an `execute_tool` span, an MCP `tools/call` span, an OpenInference or LangSmith TOOL span."""

    tool_call_id: str | None
    tool_name: str | None
    arguments: str | None
    ok: bool
    error: str | None
    result: str | None  # at most RESULT_LIMIT characters

    def __post_init__(self) -> None:
        self.tool_call_id, self.tool_name, self.arguments, self.error, self.result = map(
            storable, (self.tool_call_id, self.tool_name, self.arguments, self.error, self.result))


@dataclass(slots=True)
class Extracted:
    calls: list[ExtractedCall]
    executions: list[ExtractedExecution]
    offered_tools: list[Tool] | None  # the tool list the span states (request definitions or a tools/list result)
    harness_version: str | None  # this and declared_domain: read for spans with calls only
    declared_domain: str | None  # the domain the trace states (`tracemill.domain`); `domains.call_domain` decides


@dataclass(slots=True)
class _Native:
    name: str | None
    arguments: Any
    id: str | None


@dataclass(slots=True)
class _Message:
    calls: list[_Native]
    texts: list[str]


def extract(span: SpanRecord) -> Extracted:
    """Everything about tool use in one span. Never raises: what cannot be read is skipped, but a call whose arguments
    are broken is still a call."""
    attrs = span.attributes if isinstance(span.attributes, dict) else {}
    from_events = _event_attributes(span.events)
    if not from_events and not _relevant(attrs):
        return Extracted([], [], None, None, None)
    if from_events:
        attrs = {**from_events, **attrs}
    if "traceloop.span.kind" in attrs or "langfuse.observation.type" in attrs or "traceloop.entity.output" in attrs:
        attrs = _entity_view(attrs)
    tools = _offered_tools(attrs)
    execution = _execution(span, attrs)
    # A tool execution's output is the tool's, not the model's: no calls are read from it.
    calls = _calls(_output_messages(attrs), tools, _first_str(attrs, _MODEL_KEYS)) if execution is None else []
    if not calls:
        return Extracted([], [execution] if execution is not None else [], tools, None, None)
    if calls[0].tool_call_id is None:
        response_id = _response_id(attrs)
        for call in calls:
            call.response_id = response_id
    resource = span.resource if isinstance(span.resource, dict) else {}
    return Extracted(
        calls=calls,
        executions=[],
        offered_tools=tools,
        harness_version=_first_str(resource, ("tracemill.harness.version",))
        or _first_str(attrs, ("tracemill.harness.version", "gen_ai.agent.version"))
        or _first_str(resource, ("gen_ai.agent.version",)),
        declared_domain=_first_str(attrs, ("tracemill.domain",)) or _first_str(resource, ("tracemill.domain",)),
    )


def _entity_view(attrs: dict[str, Any]) -> dict[str, Any]:
    """OpenLLMetry's `traceloop.entity.*` and Langfuse's `langfuse.observation.*` under the names the readers below
    know: a generation's input and output as `gen_ai.prompt` / `gen_ai.completion`, its model, a tool's arguments and
    result, and an MCP `tools/list` result as the tools offered."""
    view = dict(attrs)
    kind = attrs.get("traceloop.span.kind") or attrs.get("langfuse.observation.type")
    entity_input = attrs.get("traceloop.entity.input", attrs.get("langfuse.observation.input"))
    entity_output = attrs.get("traceloop.entity.output", attrs.get("langfuse.observation.output"))
    if kind == "generation":
        view.setdefault("gen_ai.prompt", entity_input)
        view.setdefault("gen_ai.completion", entity_output)
        model = attrs.get("langfuse.observation.model.name")
        if isinstance(model, str) and model:
            view.setdefault("gen_ai.response.model", model)
    elif kind == "tool":
        view["tracemill.tool_span"] = True
        arguments = json_attribute(entity_input)
        if isinstance(arguments, dict):
            if isinstance(arguments.get("arguments"), dict):  # OpenLLMetry MCP: {"tool_name", "arguments"}
                arguments = arguments["arguments"]
            elif isinstance(arguments.get("kwargs"), dict) and not arguments.get("args"):  # a decorated function
                arguments = arguments["kwargs"]
        if arguments is not None:
            view.setdefault("gen_ai.tool.call.arguments", arguments)
        elif entity_input is not None:
            view.setdefault("gen_ai.tool.call.arguments", entity_input)
        if entity_output is not None:
            view.setdefault("gen_ai.tool.call.result", entity_output)
    elif isinstance(decoded := json_attribute(entity_output), dict) and isinstance(decoded.get("tools"), list):
        view.setdefault("mcp.tools", decoded)  # OpenLLMetry MCP's `tools/list.mcp` span: the ListToolsResult
    if attrs.get("langfuse.observation.level") == "ERROR":
        view.setdefault("error.type", "error")
    return view


def _relevant(attrs: dict[Any, Any]) -> bool:
    return any(isinstance(key, str) and key.startswith(_RELEVANT_PREFIXES) for key in attrs)


def _event_attributes(events: Any) -> dict[str, Any]:
    """Messages and tool definitions that older GenAI conventions put on span events rather than on the span."""
    found: dict[str, Any] = {}
    if not isinstance(events, list):
        return found
    for event in events:
        attrs = event.get("attributes") if isinstance(event, dict) else None
        if isinstance(attrs, dict):
            for key in _EVENT_KEYS:
                if key in attrs and key not in found:
                    found[key] = attrs[key]
    return found


# --- small readers ------------------------------------------------------------------------------------------------

def json_attribute(value: Any) -> Any:
    """A JSON attribute as data: strings are parsed (None when they are not JSON), structured values pass through."""
    if isinstance(value, (str, bytes)):
        try:
            return orjson.loads(value)
        except orjson.JSONDecodeError:
            return None
    return value


def _dumps(value: Any) -> str | None:
    """JSON text of decoded data; None for data nested deeper than the encoder goes."""
    try:
        return orjson.dumps(value, default=str, option=orjson.OPT_NON_STR_KEYS).decode()
    except orjson.JSONEncodeError:  # integers over 64 bits, nesting past orjson's limit: the stdlib may still manage
        pass
    try:
        return json.dumps(value, ensure_ascii=False, default=str)
    except RecursionError:
        return None


def _text(value: Any) -> str | None:
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return _dumps(value)


_ID_CHARS = 256


def _as_id(value: Any) -> str | None:
    """An id as stored; one longer than any real id is kept as its digest, alike wherever it is named (PostgreSQL's
    index on the ids holds at most 2,704 bytes an entry: the span would not be stored)."""
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    if not isinstance(value, str) or not value:
        return None
    if len(value) > _ID_CHARS:
        return "sha256:" + hashlib.sha256(value.encode()).hexdigest()
    return storable(value)


def _first_str(attrs: Mapping[str, Any], keys: tuple[str, ...]) -> str | None:
    for key in keys:
        value = attrs.get(key)
        if isinstance(value, str) and value:
            return value
    return None


# --- offered tools ------------------------------------------------------------------------------------------------

def _offered_tools(attrs: dict[str, Any]) -> list[Tool] | None:
    for key in _TOOL_LIST_KEYS:
        if key in attrs:
            tools = _tool_list(attrs[key])
            if tools is not None:
                return tools
    tools = _flat_tools(attrs)
    if tools is not None:
        return tools
    prompt = json_attribute(attrs.get("gen_ai.prompt"))
    if isinstance(prompt, dict):
        for key in ("tools", "functions"):
            if key in prompt:
                tools = _tool_list(prompt[key])
                if tools is not None:
                    return tools
    if attrs.get("mcp.method.name") == "tools/list" and "output.value" in attrs:
        return _tool_list(attrs["output.value"])
    return None


def _tool_list(value: Any) -> list[Tool] | None:
    """A tool list as MCP tools: None when the value is no list or none of its tools can be read."""
    if isinstance(value, str):
        return _tool_list_from_text(value)
    return _read_tool_list(value)


@lru_cache(maxsize=2048)
def _tool_list_from_text(text: str) -> list[Tool] | None:
    """Shared by every span that sends the same definitions (so the writer can know a list it has seen by its
    identity): never mutate what it returns."""
    return _read_tool_list(json_attribute(text))


def _read_tool_list(value: Any) -> list[Tool] | None:
    if isinstance(value, dict) and isinstance(value.get("tools"), list):  # an MCP ListToolsResult
        value = value["tools"]
    if not isinstance(value, list):
        return None
    tools = [tool for tool in map(_read_tool, value) if tool is not None]
    return tools if tools or not value else None


def _read_tool(value: Any) -> Tool | None:
    try:
        return normalize_tool(value)
    except (ToolFormatError, RecursionError):
        return None


@lru_cache(maxsize=4096)
def _tool_from_text(text: str) -> Tool | None:
    return _read_tool(json_attribute(text))


def _flat_tools(attrs: dict[str, Any]) -> list[Tool] | None:
    pieces: dict[int, dict[str, Any]] = {}
    for key, value in attrs.items():
        if isinstance(key, str) and key.startswith("llm.") and (m := _FLAT_TOOL.match(key)):
            pieces.setdefault(int(m["n"]), {})[m["field"]] = value
    if not pieces:
        return None
    tools = []
    for n in sorted(pieces):
        fields = pieces[n]
        schema = fields.get("json_schema")
        if isinstance(schema, str):
            tool = _tool_from_text(schema)
        elif schema is not None:
            tool = _read_tool(schema)
        else:
            parameters = fields.get("parameters")
            tool = _read_tool({"name": fields.get("name"), "description": fields.get("description"),
                               "parameters": json_attribute(parameters) if parameters is not None else None})
        if tool is not None:
            tools.append(tool)
    return tools or None


# --- tool calls ---------------------------------------------------------------------------------------------------

def _output_messages(attrs: dict[str, Any]) -> list[_Message]:
    """The model's output messages from the first convention that has any."""
    if "gen_ai.output.messages" in attrs:
        decoded = json_attribute(attrs["gen_ai.output.messages"])
        if isinstance(decoded, list):  # some SDKs send an array of JSON strings, one per message
            decoded = [json_attribute(item) if isinstance(item, str) else item for item in decoded]
        messages = _walk_messages(decoded)
        if messages:
            return messages
    for prefix, pattern in (("llm.output_messages.", _OPENINFERENCE_OUTPUT),
                            ("gen_ai.completion.", _OPENLLMETRY_OUTPUT)):
        messages = _flat_messages(attrs, prefix, pattern)
        messages += _invalid_calls(attrs, messages) if prefix == "llm.output_messages." else []
        if messages:
            return messages
    if "gen_ai.completion" in attrs:
        completion = attrs["gen_ai.completion"]
        decoded = json_attribute(completion)
        if decoded is None and isinstance(completion, str):
            return [_Message([], [completion])]
        return _walk_messages(decoded)
    return []


def _invalid_calls(attrs: dict[str, Any], messages: list[_Message]) -> list[_Message]:
    """The calls LangChain could not parse, from an OpenInference LLM span's `output.value`: they are not among the
    flattened output messages."""
    output = attrs.get("output.value")
    if not (isinstance(output, str) and _INVALID_CALLS.search(output)):
        return []
    known = {call.id for message in messages for call in message.calls}
    found = [call for message in _walk_messages(json_attribute(output)) for call in message.calls
             if call.id not in known]
    return [_Message(found, [])] if found else []


def _flat_messages(attrs: dict[str, Any], prefix: str, pattern: re.Pattern[str]) -> list[_Message]:
    found: dict[int, tuple[dict[int, dict[str, Any]], list[str]]] = {}
    for key, value in attrs.items():
        if not (isinstance(key, str) and key.startswith(prefix)) or (m := pattern.match(key)) is None:
            continue
        calls, texts = found.setdefault(int(m["msg"]), ({}, []))
        if m["cfield"]:
            calls.setdefault(int(m["call"]), {})[_FIELDS[m["cfield"]]] = value
        elif m["ffield"]:
            calls.setdefault(-1, {})[_FIELDS[m["ffield"]]] = value  # a legacy function_call: one per message
        elif isinstance(value, str):
            texts.append(value)
    return [
        _Message([_native(calls[i].get("name"), calls[i].get("arguments"), calls[i].get("id")) for i in sorted(calls)],
                 texts)
        for calls, texts in (found[n] for n in sorted(found))
    ]


def _walk_messages(value: Any, depth: int = 0) -> list[_Message]:
    """Model messages anywhere in decoded JSON: a GenAI message list, OpenAI choices or Responses output items,
    LangChain generations."""
    if depth > _MAX_DEPTH:
        return []
    if isinstance(value, list):
        return [m for item in value for m in _walk_messages(item, depth + 1)]
    if not isinstance(value, dict):
        return []
    if value.get("type") == "function_call" and "name" in value:  # an OpenAI Responses API output item
        return [_Message([_native(value.get("name"), value.get("arguments"), value.get("call_id"))], [])]
    if _MESSAGE_KEYS.isdisjoint(value):
        return [m for item in value.values() for m in _walk_messages(item, depth + 1)]
    message = _read_message(value)
    return [message] if message is not None else []


def _read_message(msg: dict[str, Any]) -> _Message | None:
    role, kind = msg.get("role"), msg.get("type")
    if (isinstance(role, str) and role in _NOT_MODEL_ROLES) or (isinstance(kind, str) and kind in _NOT_MODEL_ROLES):
        return None
    texts: list[str] = []
    parts = msg.get("parts")
    if isinstance(parts, list):
        calls = [_native(p.get("name"), p.get("arguments"), p.get("id"))
                 for p in parts if isinstance(p, dict) and p.get("type") == "tool_call"]
        texts = [p["content"] for p in parts
                 if isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("content"), str)]
        return _Message(calls, texts)
    content = msg.get("content")
    if isinstance(content, str):
        texts.append(content)
    elif isinstance(content, list):
        texts.extend(b["text"] for b in content if isinstance(b, dict) and isinstance(b.get("text"), str))
    return _Message(_message_calls(msg, content), texts)


def _message_calls(msg: dict[str, Any], content: Any) -> list[_Native]:
    """The calls of one OpenAI / LangChain / Anthropic-shaped message, from the most verbatim source it has."""
    kwargs = msg.get("additional_kwargs")
    raw_calls = kwargs.get("tool_calls") if isinstance(kwargs, dict) else None
    if isinstance(raw_calls, list) and raw_calls:
        return _tool_call_list(raw_calls)
    calls = _tool_call_list(msg.get("tool_calls")) + _tool_call_list(msg.get("invalid_tool_calls"))
    if calls:
        return calls
    function_call = msg.get("function_call")
    if isinstance(function_call, dict):
        return [_native(function_call.get("name"), function_call.get("arguments"), None)]
    if isinstance(content, list):
        return [_native(b.get("name"), b.get("input"), b.get("id"))
                for b in content if isinstance(b, dict) and b.get("type") == "tool_use"]
    return []


def _tool_call_list(value: Any) -> list[_Native]:
    if not isinstance(value, list):
        return []
    calls = []
    for item in value:
        if not isinstance(item, dict):
            continue
        function = item.get("function")
        if isinstance(function, dict):
            calls.append(_native(function.get("name"), function.get("arguments"), item.get("id")))
        else:
            arguments = item["args"] if "args" in item else item.get("arguments")
            calls.append(_native(item.get("name"), arguments, item.get("id")))
    return calls


def _native(name: Any, arguments: Any, call_id: Any) -> _Native:
    return _Native(name if isinstance(name, str) and name else None, arguments, _as_id(call_id))


def _calls(messages: list[_Message], tools: list[Tool] | None, model: str | None) -> list[ExtractedCall]:
    natives = [call for message in messages for call in message.calls]
    if natives:
        calls = []
        for index, native in enumerate(natives):
            call_input = {"name": native.name, "arguments": native.arguments}
            raw = _dumps(call_input)
            if raw is None:  # still a call; its arguments become a string that verify reports as not JSON
                call_input = {"name": native.name, "arguments": _TOO_DEEP}
                raw = json.dumps(call_input, ensure_ascii=False)
            calls.append(ExtractedCall(index, native.id, raw, call_input, native.name, tools, model))
        return calls
    # Text holding a call. Where the span does not list the tools, only a call marked as one (a tag, `[TOOL_CALLS]`)
    # that names its tool counts: bare JSON may be an answer asked for in JSON.
    index = tool_index(tools) if tools else {}
    calls = []
    for text in (text for message in messages for text in message.texts):
        if not holds_call(text, index):
            continue
        reading = read(text, index)
        first = reading.calls[0] if reading.calls else None
        name = first.name if first is not None and isinstance(first.name, str) and first.name else None
        if not tools and (name is None or reading.exact is not None):
            continue
        calls.append(ExtractedCall(len(calls), None, text, text, None, tools, model, name,
                                   first.arguments if first is not None else None))
    return calls


def _response_id(attrs: dict[str, Any]) -> str | None:
    """The id of the response the span records: GenAI's `gen_ai.response.id`, else from OpenInference's
    `output.value`, an OpenAI chat completion (streamed or not) or LangChain's LLMResult (which has none when
    streamed)."""
    found = attrs.get("gen_ai.response.id")
    if isinstance(found, str):
        return _as_id(found)
    output = json_attribute(attrs.get("output.value"))
    if not isinstance(output, dict):
        return None
    if "choices" in output:
        return _as_id(output.get("id"))
    llm_output = output.get("llm_output")
    return _as_id(llm_output.get("id")) if isinstance(llm_output, dict) else None


# --- executions ---------------------------------------------------------------------------------------------------

def _execution(span: SpanRecord, attrs: dict[str, Any]) -> ExtractedExecution | None:
    kind = attrs.get("openinference.span.kind")
    langsmith_kind = attrs.get("langsmith.span.kind")
    is_langsmith_tool = isinstance(langsmith_kind, str) and langsmith_kind.lower() == "tool"
    tool_span = attrs.get("tracemill.tool_span") is True
    if not (attrs.get("gen_ai.operation.name") == "execute_tool" or attrs.get("mcp.method.name") == "tools/call"
            or (isinstance(kind, str) and kind.upper() == "TOOL") or is_langsmith_tool or tool_span):
        return None
    name = _first_str(attrs, _EXEC_NAME_KEYS)
    if name is None and (is_langsmith_tool or tool_span) and isinstance(span.name, str) and span.name:
        name = span.name
    call_id = next((i for i in map(_as_id, (attrs.get(k) for k in _EXEC_ID_KEYS)) if i is not None), None)
    arguments = next((_text(attrs[k]) for k in _EXEC_ARGUMENT_KEYS if attrs.get(k) is not None), None)
    if arguments is None:
        arguments = _mcp_arguments(attrs)
    raw_result = next((attrs[k] for k in _EXEC_RESULT_KEYS if attrs.get(k) is not None), None)
    reported = _reported_outcome(raw_result)
    if call_id is None and reported is not None:
        call_id = reported.call_id
    result = _text(raw_result)
    error = _error(span, attrs)
    if error is None and reported is not None and reported.error is not None:
        error = reported.error
    return ExtractedExecution(call_id, name, arguments, error is None, error,
                              result[:RESULT_LIMIT] if result is not None else None)


@dataclass(slots=True)
class _Reported:
    call_id: str | None
    error: str | None


def _reported_outcome(result: Any) -> _Reported | None:
    """What a tool's result says about its run: a LangChain ToolMessage (alone, under `output` or `data`, or the
    only message of a `messages` list) carries the call id and `status: error` for an error the agent handled; an MCP
    CallToolResult carries `isError` (OpenLLMetry: `is_error`)."""
    if isinstance(result, str):
        if result[:1] != "{" or not any(marker in result for marker in _REPORT_MARKERS):  # most results: no decoding
            return None
    elif not isinstance(result, dict):
        return None
    value = json_attribute(result)
    for key in ("output", "data"):
        if isinstance(value, dict) and isinstance(value.get(key), dict):
            value = value[key]
    if isinstance(value, dict) and isinstance(value.get("messages"), list) and len(value["messages"]) == 1:
        value = value["messages"][0]
        if isinstance(value, dict) and isinstance(value.get("data"), dict):
            value = value["data"]
    if not isinstance(value, dict):
        return None
    if value.get("isError") is True or value.get("is_error") is True:
        message = _text(value.get("result", value.get("content")))
        return _Reported(None, f"tool_error: {message}" if message else "tool_error")
    if "tool_call_id" not in value and "status" not in value:
        return None
    content = value.get("content")
    error = None
    if value.get("status") == "error":
        error = f"tool_error: {_text(content)}" if content else "tool_error"
    return _Reported(_as_id(value.get("tool_call_id")), error)


def _mcp_arguments(attrs: dict[str, Any]) -> str | None:
    """`mcp.request.argument.<name>` attributes (each value usually JSON-encoded) as one JSON object."""
    arguments = {}
    for key, value in attrs.items():
        if isinstance(key, str) and key.startswith(_MCP_ARGUMENT_PREFIX):
            decoded = json_attribute(value)
            arguments[key[len(_MCP_ARGUMENT_PREFIX):]] = value if decoded is None else decoded
    return _dumps(arguments) if arguments else None


def _error(span: SpanRecord, attrs: dict[str, Any]) -> str | None:
    error_type = attrs.get("error.type")
    kind = _text(error_type) if error_type not in (None, "") else None
    is_error = attrs.get("mcp.tool.result.is_error")
    if kind is None and (is_error is True or is_error == "true"):
        kind = "tool_error"
    if kind is None and span.status_code != 2:
        return None
    message = span.status_message if isinstance(span.status_message, str) and span.status_message else None
    if message is None:
        message = _exception_message(span.events)
    return ": ".join(p for p in (kind, message) if p) or "error"


def _exception_message(events: Any) -> str | None:
    if not isinstance(events, list):
        return None
    for event in events:
        if isinstance(event, dict) and event.get("name") == "exception" and isinstance(event.get("attributes"), dict):
            message = event["attributes"].get("exception.message")
            if isinstance(message, str) and message:
                return message
    return None
