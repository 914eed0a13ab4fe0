"""The conversation a model call answered, read from its stored span: OpenTelemetry GenAI `gen_ai.input.messages`,
OpenInference's flattened `llm.input_messages.N.message.*`, or LangSmith's `gen_ai.prompt`. Messages are returned as
stored (GenAI `parts`, OpenAI `content`); `tracemill.reviser_prompt.message_text` reads every one of these shapes."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import orjson

_FLAT = re.compile(r"llm\.input_messages\.(\d+)\.message\.(role|content)$")


def _decoded(value: Any) -> Any:
    if isinstance(value, (str, bytes)):
        try:
            return orjson.loads(value)
        except orjson.JSONDecodeError:
            return None
    return value


def _messages(value: Any) -> list[Any] | None:
    decoded = _decoded(value)
    if isinstance(decoded, Mapping) and isinstance(decoded.get("messages"), list):
        decoded = decoded["messages"]
    if not isinstance(decoded, list):
        return None
    return [_decoded(m) if isinstance(m, str) else m for m in decoded if isinstance(m, (Mapping, str))]


GENAI_MESSAGES = "gen_ai.input.messages"
_KEYS = (GENAI_MESSAGES, "gen_ai.prompt", "input.value")


def is_conversation(key: str) -> bool:
    """Whether a span attribute holds (part of) the conversation `span_messages` reads."""
    return key in _KEYS or key.startswith("llm.input_messages.")


def span_messages(attributes: Mapping[str, Any]) -> list[Any]:
    """The input messages of one model-call span (its payloads resolved); [] when the span does not say."""
    for key in _KEYS:
        if key in attributes:
            found = _messages(attributes[key])
            if found:
                return found
    flat: dict[int, dict[str, Any]] = {}
    for key, value in attributes.items():
        if isinstance(key, str) and key.startswith("llm.input_messages.") and (m := _FLAT.match(key)):
            flat.setdefault(int(m[1]), {})[m[2]] = value
    return [flat[n] for n in sorted(flat)]
