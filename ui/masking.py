"""What a viewer sees of content in a sensitive domain: the shape (keys, lengths, types) without the values."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

MASK = "•••"
# Span attributes that describe a call without its content: shown to everyone.
_OPEN_ATTRIBUTES = frozenset({
    "gen_ai.operation.name", "gen_ai.request.model", "gen_ai.response.model", "gen_ai.provider.name",
    "gen_ai.system", "gen_ai.tool.name", "gen_ai.tool.type", "gen_ai.tool.call.id", "gen_ai.agent.name",
    "gen_ai.usage.input_tokens", "gen_ai.usage.output_tokens", "error.type", "tracemill.harness.version",
    "tracemill.domain", "openinference.span.kind", "llm.model_name", "tool.name",
})


def mask_value(value: Any) -> Any:
    """Every string, number and boolean replaced; keys and nesting kept."""
    if isinstance(value, Mapping):
        return {k: mask_value(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [mask_value(v) for v in value]
    return None if value is None else MASK


def mask_text(text: str | None) -> str | None:
    return None if text is None else f"{MASK} masked: {len(text):,} characters in a sensitive domain"


def mask_attributes(attributes: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v if k in _OPEN_ATTRIBUTES else mask_value(v) for k, v in attributes.items()}
