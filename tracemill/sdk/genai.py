"""OpenTelemetry GenAI semantic conventions: the span attributes of a model call and of a tool execution.

Pure functions from Python values to attribute dicts, shared by the SDK's helpers, its integrations and `simulate`.
Messages follow the GenAI JSON shape: `{"role", "parts": [{"type": "text", "content"}, {"type": "tool_call", "id",
"name", "arguments"}, {"type": "tool_call_response", "id", "response"}]}`; OpenAI-style chat messages are converted.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import orjson

from tracemill.sdk.redact import Redactor
from tracemill.tools import normalize_tools

OPERATION = "gen_ai.operation.name"
PROVIDER = "gen_ai.provider.name"
REQUEST_MODEL = "gen_ai.request.model"
RESPONSE_MODEL = "gen_ai.response.model"
INPUT_MESSAGES = "gen_ai.input.messages"
OUTPUT_MESSAGES = "gen_ai.output.messages"
SYSTEM_INSTRUCTIONS = "gen_ai.system_instructions"
TOOL_DEFINITIONS = "gen_ai.tool.definitions"
FINISH_REASONS = "gen_ai.response.finish_reasons"
INPUT_TOKENS = "gen_ai.usage.input_tokens"
OUTPUT_TOKENS = "gen_ai.usage.output_tokens"
CONVERSATION_ID = "gen_ai.conversation.id"
AGENT_NAME = "gen_ai.agent.name"
TOOL_NAME = "gen_ai.tool.name"
TOOL_TYPE = "gen_ai.tool.type"
TOOL_DESCRIPTION = "gen_ai.tool.description"
TOOL_CALL_ID = "gen_ai.tool.call.id"
TOOL_CALL_ARGUMENTS = "gen_ai.tool.call.arguments"
TOOL_CALL_RESULT = "gen_ai.tool.call.result"
ERROR_TYPE = "error.type"
HARNESS_VERSION = "tracemill.harness.version"

_NONE = Redactor()


def dumps(value: Any) -> str:
    return orjson.dumps(value, default=str).decode()


def tool_definitions(tools: Iterable[Any]) -> list[dict[str, Any]]:
    """Tools in any accepted shape (MCP, MCP-Bench, OpenAI, BFCL) as GenAI tool definitions."""
    return [{"type": "function", "name": t.name, "description": t.description, "parameters": dict(t.input_schema)}
            for t in normalize_tools(list(tools))]


def tool_definitions_json(tools: Iterable[Any]) -> str:
    return dumps(tool_definitions(tools))


def tool_call_part(call: Mapping[str, Any], redactor: Redactor = _NONE) -> dict[str, Any]:
    """`{"id", "name", "arguments"}` or OpenAI's `{"id", "type": "function", "function": {"name", "arguments"}}` as a
    GenAI tool_call part. Arguments are kept as the model sent them: a JSON string stays a string, broken or not."""
    function = call.get("function")
    body: Mapping[str, Any] = function if isinstance(function, Mapping) else call
    part: dict[str, Any] = {"type": "tool_call", "name": body.get("name"),
                            "arguments": redactor.value(body.get("arguments"))}
    if call.get("id") is not None:
        part["id"] = call["id"]
    return part


def _content_parts(content: Any, redactor: Redactor) -> list[dict[str, Any]]:
    if content is None or content == "":
        return []
    if isinstance(content, str):
        return [{"type": "text", "content": redactor.text(content)}]
    if isinstance(content, list):
        parts: list[dict[str, Any]] = []
        for item in content:
            if isinstance(item, Mapping) and item.get("type") == "text":
                parts.append({"type": "text", "content": redactor.text(str(item.get("text", item.get("content", ""))))})
            elif isinstance(item, str):
                parts.append({"type": "text", "content": redactor.text(item)})
            else:
                parts.append(redactor.value(dict(item)) if isinstance(item, Mapping) else {"type": "text",
                                                                                        "content": str(item)})
        return parts
    return [{"type": "text", "content": redactor.text(str(content))}]


def message(msg: Mapping[str, Any], redactor: Redactor = _NONE) -> dict[str, Any]:
    """One chat message (GenAI shape, or OpenAI's with `tool_calls` / role `tool`) as a GenAI message."""
    if "parts" in msg:
        return {**msg, "parts": redactor.value(list(msg["parts"]))}
    role = str(msg.get("role", "user"))
    if role == "tool":
        return {"role": "tool", "parts": [{"type": "tool_call_response", "id": msg.get("tool_call_id"),
                                           "response": redactor.value(msg.get("content"))}]}
    parts = _content_parts(msg.get("content"), redactor)
    parts += [tool_call_part(c, redactor) for c in msg.get("tool_calls") or ()]
    return {"role": role, "parts": parts}


def output_message(text: str | None, tool_calls: Sequence[Mapping[str, Any]] = (), finish_reason: str | None = None,
                   redactor: Redactor = _NONE) -> dict[str, Any]:
    """The model's answer: its raw text (tool calls embedded in it included) and its native tool calls."""
    parts = _content_parts(text, redactor) + [tool_call_part(c, redactor) for c in tool_calls]
    reason = finish_reason or ("tool_call" if tool_calls else "stop")
    return {"role": "assistant", "parts": parts, "finish_reason": reason}


def chat_attributes(
    model: str,
    *,
    provider: str | None = None,
    messages: Sequence[Mapping[str, Any]] | None = None,
    system: str | None = None,
    tools: Iterable[Any] | str | None = None,
    conversation_id: str | None = None,
    redactor: Redactor = _NONE,
) -> dict[str, Any]:
    """Attributes known when a model call starts. `tools` may be a ready `tool_definitions_json` string."""
    attrs: dict[str, Any] = {OPERATION: "chat", REQUEST_MODEL: model}
    if provider:
        attrs[PROVIDER] = provider
    if conversation_id:
        attrs[CONVERSATION_ID] = conversation_id
    if system is not None:
        attrs[SYSTEM_INSTRUCTIONS] = dumps([{"type": "text", "content": redactor.text(system)}])
    if messages is not None:
        attrs[INPUT_MESSAGES] = dumps([message(m, redactor) for m in messages])
    if tools is not None:
        attrs[TOOL_DEFINITIONS] = tools if isinstance(tools, str) else tool_definitions_json(tools)
    return attrs


def chat_output_attributes(
    text: str | None,
    tool_calls: Sequence[Mapping[str, Any]] = (),
    *,
    finish_reason: str | None = None,
    response_model: str | None = None,
    input_tokens: int | None = None,
    output_tokens: int | None = None,
    redactor: Redactor = _NONE,
) -> dict[str, Any]:
    out = output_message(text, tool_calls, finish_reason, redactor)
    attrs: dict[str, Any] = {OUTPUT_MESSAGES: dumps([out]), FINISH_REASONS: [out["finish_reason"]]}
    if response_model:
        attrs[RESPONSE_MODEL] = response_model
    if input_tokens is not None:
        attrs[INPUT_TOKENS] = input_tokens
    if output_tokens is not None:
        attrs[OUTPUT_TOKENS] = output_tokens
    return attrs


def tool_attributes(name: str, arguments: Any = None, *, call_id: str | None = None, description: str | None = None,
                    redactor: Redactor = _NONE) -> dict[str, Any]:
    """Attributes of an `execute_tool` span. String arguments are recorded exactly as given."""
    attrs: dict[str, Any] = {OPERATION: "execute_tool", TOOL_NAME: name, TOOL_TYPE: "function"}
    if call_id:
        attrs[TOOL_CALL_ID] = call_id
    if description:
        attrs[TOOL_DESCRIPTION] = description
    if arguments is not None:
        args = redactor.value(arguments)
        attrs[TOOL_CALL_ARGUMENTS] = args if isinstance(args, str) else dumps(args)
    return attrs


def tool_result_attributes(result: Any, redactor: Redactor = _NONE) -> dict[str, Any]:
    value = redactor.value(result)
    return {TOOL_CALL_RESULT: value if isinstance(value, str) else dumps(value)}
