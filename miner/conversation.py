"""The conversation a model call answered, read from its stored span: OpenTelemetry GenAI `gen_ai.input.messages`,
OpenInference's `input.value` or flattened `llm.input_messages.N.message.*` (the earlier OpenLLMetry's
`gen_ai.prompt.N.*` alike, tool calls included), LangSmith's `gen_ai.prompt`, a Langfuse or OpenLLMetry generation's
entity input; or, where the instrumentation sent the messages as log events (OpenTelemetry's openai-v2), from the
span's stored events. Messages are returned as stored (GenAI `parts`, OpenAI `content`; LangChain's as chat messages);
`tracemill.reviser_prompt.message_text` reads every one of these shapes."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson
from sqlalchemy import Connection

from tracemill.collector.joins import stored_events
from tracemill.collector.logs import LogEvent
from tracemill.collector.normalize import json_attribute
from tracemill.store.payloads import CONVERSATIONS
from tracemill.store.queries import span

# a conversation flattened into one attribute per value: OpenInference's `llm.input_messages.N.message.*` and the
# earlier OpenLLMetry's `gen_ai.prompt.N.*`, each message's role, text and tool calls
_FLAT = re.compile(r"(?:llm\.input_messages\.(\d+)\.message|gen_ai\.prompt\.(\d+))\.(role|content|tool_call_id)$")
_FLAT_CALL = re.compile(r"(?:llm\.input_messages\.(\d+)\.message\.tool_calls\.(\d+)\.tool_call\.function"
                        r"|gen_ai\.prompt\.(\d+)\.tool_calls\.(\d+))\.(name|arguments)$")
_FLAT_PART = re.compile(r"llm\.input_messages\.(\d+)\.message\.contents\.(\d+)\.message_content\.(type|text)$")


@dataclass(frozen=True, slots=True)
class Conversation:
    """A model call's input messages; `text`: the JSON they were stored as, where it is exactly these messages (a
    dataset keeps the conversation as sent, not decoded and encoded again)."""

    messages: list[Any] = field(default_factory=list)
    text: str | None = None

    def to_json(self) -> str:
        return self.text if self.text is not None else orjson.dumps(self.messages, default=str).decode()


def _messages(value: Any) -> list[Any] | None:
    decoded = json_attribute(value)
    if isinstance(decoded, Mapping) and isinstance(decoded.get("messages"), list):
        decoded = decoded["messages"]
    if not isinstance(decoded, list):
        return None
    if decoded and all(isinstance(m, list) for m in decoded):  # LangChain's chat model inputs: a list per prompt
        decoded = decoded[0]
    return [_langchain_as_chat(m if type(m) is dict else json_attribute(m) if isinstance(m, str) else m)
            for m in decoded if type(m) is dict or isinstance(m, (Mapping, str))]


# LangChain's message types, as the roles of the chat messages a served model is sent (the reviser's prompt names them)
_LANGCHAIN_ROLES = {"human": "user", "ai": "assistant", "system": "system", "tool": "tool", "function": "tool"}


def _langchain_as_chat(message: Any) -> Any:
    """A LangChain message, serialized (`{"lc": 1, "id": [..., "HumanMessage"], "kwargs": {...}}`, as LangSmith sends a
    chat model's inputs) or as its dict (`{"type": "human", "content": ...}`), as a chat message with a role; any
    other message as it is."""
    if not isinstance(message, Mapping):
        return message
    if message.get("lc") == 1 and isinstance(message.get("kwargs"), Mapping):
        path = message.get("id")
        kind = str(path[-1]).removesuffix("Chunk").removesuffix("Message").lower() if isinstance(path, list) else ""
        message = {"type": kind, **message["kwargs"]}
    role = _LANGCHAIN_ROLES.get(str(message.get("type")))
    if role is None or "role" in message:
        return message
    return {"role": role, **message}


GENAI_MESSAGES = CONVERSATIONS[0]


def genai_conversation(stored: str) -> Conversation:
    """The conversation of a span's `gen_ai.input.messages`, from the text stored; a JSON array of message objects
    keeps its text."""
    value = json_attribute(stored)
    if type(value) is list and value and all(type(m) is dict for m in value):
        return Conversation(value, stored)
    return Conversation(_messages(value) or [])


def is_conversation(key: str) -> bool:
    """Whether a span attribute holds (part of) the conversation `span_messages` reads."""
    return key in CONVERSATIONS or key.startswith(("llm.input_messages.", "gen_ai.prompt."))


def span_messages(attributes: Mapping[str, Any]) -> list[Any]:
    """The input messages of one model-call span (its payloads resolved); [] when the span does not say."""
    for key in CONVERSATIONS:
        if key in attributes:
            found = _messages(attributes[key])
            if found:
                return found
    flat: dict[int, dict[str, Any]] = {}
    calls: dict[tuple[int, int], dict[str, Any]] = {}
    parts: dict[tuple[int, int], dict[str, Any]] = {}  # a message whose content is a list (text, images)
    for key, value in attributes.items():
        if not isinstance(key, str) or not is_conversation(key):
            continue
        if m := _FLAT.match(key):
            flat.setdefault(int(m[1] or m[2]), {})[m[3]] = value
        elif m := _FLAT_CALL.match(key):
            calls.setdefault((int(m[1] or m[3]), int(m[2] or m[4])), {})[m[5]] = value
        elif m := _FLAT_PART.match(key):
            parts.setdefault((int(m[1]), int(m[2])), {})[m[3]] = value
    for (n, _), call in sorted(calls.items()):
        flat.setdefault(n, {}).setdefault("tool_calls", []).append(call)
    for (n, _), part in sorted(parts.items()):
        flat.setdefault(n, {}).setdefault("content", []).append(part)
    for message in flat.values():
        content = message.get("content")
        if isinstance(content, str) and content.startswith("[") and _parts(decoded := json_attribute(content)):
            message["content"] = decoded  # a list of parts written as JSON text, as OpenLLMetry writes one
    return [flat[n] for n in sorted(flat)]


def _parts(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(isinstance(p, Mapping) and "type" in p for p in value)


# the earlier GenAI conventions: one event per input message, its role in the event's name
_MESSAGE_EVENTS = {"gen_ai.system.message": "system", "gen_ai.user.message": "user",
                   "gen_ai.assistant.message": "assistant", "gen_ai.tool.message": "tool"}


def event_messages(events: Sequence[LogEvent]) -> list[Any]:
    """The input messages of a model call sent as its span's log events: the latest conventions' one event per call
    (`gen_ai.client.inference.operation.details`, whose `gen_ai.input.messages` holds them), or the earlier
    conventions' one event per message (`gen_ai.user.message`, ...: the body is the message, the role the event's
    unless the body says another), in the order they were made; [] when the events do not say."""
    ordered = sorted(events, key=lambda e: e.time_ns)
    for event in ordered:
        found = _messages(event.attributes.get(GENAI_MESSAGES)) if GENAI_MESSAGES in event.attributes else None
        if found:
            return found
    messages: list[Any] = []
    for event in ordered:
        role = _MESSAGE_EVENTS.get(event.event_name)
        if role is None:
            continue
        if isinstance(event.body, Mapping):
            messages.append({"role": role, **event.body})
        elif isinstance(event.body, str):
            messages.append({"role": role, "content": event.body})
    return messages


def stored_messages(conn: Connection, trace_id: str, span_id: str) -> list[Any]:
    """The input messages of one stored model-call span: from its attributes, else from its log events."""
    found = span(conn, trace_id, span_id)
    messages = span_messages(found.attributes) if found is not None else []
    if messages:
        return messages
    return event_messages(stored_events(conn, {(trace_id, span_id)}).get((trace_id, span_id), []))
