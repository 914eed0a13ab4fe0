"""A LangChain callback handler that records model calls (with the tools bound), tool calls and tool results.

    agent.invoke(inputs, config={"callbacks": [tracemill.sdk.langchain.TracemillCallbackHandler()]})
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from typing import Any
from uuid import UUID

from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.messages import BaseMessage
from langchain_core.outputs import LLMResult
from opentelemetry import trace
from opentelemetry.trace import Span, SpanKind

from tracemill.sdk import core, genai

_ROLES = {"human": "user", "ai": "assistant", "system": "system", "tool": "tool", "AIMessageChunk": "assistant"}


def _raw_calls(message: Any) -> list[dict[str, Any]]:
    """The message's tool calls as the model sent them: the provider's raw arguments string when LangChain kept it,
    else the parsed calls plus the ones LangChain could not parse (`invalid_tool_calls`, arguments verbatim)."""
    raw = (getattr(message, "additional_kwargs", None) or {}).get("tool_calls")
    if raw:
        return [dict(c) for c in raw]
    calls = [{"id": c.get("id"), "name": c.get("name"), "arguments": c.get("args")}
             for c in getattr(message, "tool_calls", None) or ()]
    calls += [{"id": c.get("id"), "name": c.get("name"), "arguments": c.get("args")}
              for c in getattr(message, "invalid_tool_calls", None) or ()]
    return calls


def _message(m: BaseMessage) -> dict[str, Any]:
    role = _ROLES.get(m.type, m.type)
    if role == "tool":
        return {"role": "tool", "tool_call_id": getattr(m, "tool_call_id", None), "content": m.content}
    return {"role": role, "content": m.content, "tool_calls": _raw_calls(m) if role == "assistant" else None}


class TracemillCallbackHandler(BaseCallbackHandler):
    """Top-level chain runs become `invoke_agent` spans; chat model runs `chat` spans; tool runs `execute_tool`
    spans, linked to the model's call by its tool call id."""

    raise_error = False

    def __init__(self, agent_name: str = "langchain") -> None:
        self.agent_name = agent_name
        self._spans: dict[UUID, Span] = {}
        self._parent: dict[UUID, UUID | None] = {}
        self._lock = threading.Lock()

    def _context_of(self, parent_run_id: UUID | None) -> Any:
        with self._lock:
            while parent_run_id is not None and parent_run_id not in self._spans:
                parent_run_id = self._parent.get(parent_run_id)
            span = self._spans.get(parent_run_id) if parent_run_id is not None else None
        return trace.set_span_in_context(span) if span is not None else None

    def _open(self, run_id: UUID, parent_run_id: UUID | None, name: str, kind: SpanKind) -> Span:
        span = core.tracer().start_span(name, context=self._context_of(parent_run_id), kind=kind)
        with self._lock:
            self._spans[run_id] = span
            self._parent[run_id] = parent_run_id
        return span

    def _close(self, run_id: UUID, error: BaseException | None = None) -> None:
        with self._lock:
            span = self._spans.pop(run_id, None)
            self._parent.pop(run_id, None)
        if span is not None:
            if error is not None:
                core.mark_error(span, error)
            span.end()

    def on_chain_start(self, serialized: dict[str, Any] | None, inputs: Any, *, run_id: UUID,
                       parent_run_id: UUID | None = None, **kwargs: Any) -> None:
        if parent_run_id is None:
            span = self._open(run_id, None, f"invoke_agent {self.agent_name}", SpanKind.INTERNAL)
            span.set_attributes({genai.OPERATION: "invoke_agent", genai.AGENT_NAME: self.agent_name})
        else:
            with self._lock:
                self._parent[run_id] = parent_run_id

    def on_chain_end(self, outputs: Any, *, run_id: UUID, **kwargs: Any) -> None:
        self._close(run_id)

    def on_chain_error(self, error: BaseException, *, run_id: UUID, **kwargs: Any) -> None:
        self._close(run_id, error)

    def on_chat_model_start(self, serialized: dict[str, Any] | None, messages: list[list[BaseMessage]], *,
                            run_id: UUID, parent_run_id: UUID | None = None,
                            metadata: dict[str, Any] | None = None, **kwargs: Any) -> None:
        params: Mapping[str, Any] = kwargs.get("invocation_params") or {}
        metadata = metadata or {}
        model = str(metadata.get("ls_model_name") or params.get("model") or params.get("model_name")
                    or (serialized or {}).get("name") or params.get("_type") or "unknown")
        span = self._open(run_id, parent_run_id, f"chat {model}", SpanKind.CLIENT)
        tools: Sequence[Any] | None = params.get("tools") or params.get("functions")
        core.set_attributes(span, genai.chat_attributes, model, provider=metadata.get("ls_provider"),
                            messages=[_message(m) for m in messages[0]] if messages and core.capture_messages()
                            else None,
                            tools=list(tools) if tools else None, redactor=core.redactor())

    def on_llm_end(self, response: LLMResult, *, run_id: UUID, **kwargs: Any) -> None:
        with self._lock:
            span = self._spans.get(run_id)
        generation = response.generations[0][0] if response.generations and response.generations[0] else None
        message = getattr(generation, "message", None)
        if span is not None and generation is not None:
            text = message.content if message is not None else generation.text
            info = generation.generation_info or {}
            core.set_attributes(span, genai.chat_output_attributes,
                                text if isinstance(text, str) else genai.dumps(text),
                                _raw_calls(message) if message is not None else [],
                                finish_reason=info.get("finish_reason"), redactor=core.redactor())
        self._close(run_id)

    def on_llm_error(self, error: BaseException, *, run_id: UUID, **kwargs: Any) -> None:
        self._close(run_id, error)

    def on_tool_start(self, serialized: dict[str, Any] | None, input_str: str, *, run_id: UUID,
                      parent_run_id: UUID | None = None, inputs: dict[str, Any] | None = None,
                      **kwargs: Any) -> None:
        serialized = serialized or {}
        name = str(kwargs.get("name") or serialized.get("name") or "tool")
        span = self._open(run_id, parent_run_id, f"execute_tool {name}", SpanKind.INTERNAL)
        core.set_attributes(span, genai.tool_attributes, name, inputs if inputs is not None else input_str,
                            call_id=kwargs.get("tool_call_id"), description=serialized.get("description"),
                            redactor=core.redactor())

    def on_tool_end(self, output: Any, *, run_id: UUID, **kwargs: Any) -> None:
        with self._lock:
            span = self._spans.get(run_id)
        if span is not None:
            if getattr(output, "status", None) == "error":
                core.mark_error(span, "tool_error", str(getattr(output, "content", output)))
            if core.capture_messages():
                core.set_attributes(span, genai.tool_result_attributes, getattr(output, "content", output),
                                    core.redactor())
        self._close(run_id)

    def on_tool_error(self, error: BaseException, *, run_id: UUID, **kwargs: Any) -> None:
        self._close(run_id, error)
