"""Trace an `mcp` `ClientSession`: `tools/list` (the tool definitions) and `tools/call` (arguments, result, error), in
the OpenTelemetry MCP conventions.

    session = tracemill.sdk.mcp.instrument(session)
    await session.call_tool("get_weather", {"city": "Paris"}, tool_call_id="call_1")   # the id is optional
"""

from __future__ import annotations

from typing import Any, TypeVar

from opentelemetry.trace import SpanKind

from tracemill.sdk import core, genai

S = TypeVar("S")

METHOD = "mcp.method.name"


def _result_text(result: Any) -> str:
    """What the model will read: the text content, else the structured content, else the content blocks as JSON."""
    content = getattr(result, "content", None) or ()
    texts = [c.text for c in content if isinstance(getattr(c, "text", None), str)]
    if texts:
        return "\n".join(texts)
    structured = getattr(result, "structured_content", None)
    if structured is not None:
        return genai.dumps(structured)
    return genai.dumps([c.model_dump(mode="json", exclude_none=True) for c in content])


def instrument(session: S) -> S:
    """Wrap the session's `list_tools` and `call_tool` in place and return it. `call_tool` also takes an optional
    `tool_call_id` (the model's id for the call), recorded so the collector can link the call to the model call."""
    list_tools = session.list_tools  # type: ignore[attr-defined]
    call_tool = session.call_tool  # type: ignore[attr-defined]
    if getattr(call_tool, "__tracemill__", False):
        return session

    async def traced_list_tools(*args: Any, **kwargs: Any) -> Any:
        with core.tracer().start_as_current_span("tools/list", kind=SpanKind.CLIENT, record_exception=False,
                                                 set_status_on_exception=False) as span:
            span.set_attribute(METHOD, "tools/list")
            try:
                result = await list_tools(*args, **kwargs)
            except BaseException as exc:
                core.mark_error(span, exc)
                raise
            tools = [t.model_dump(mode="json", by_alias=True, exclude_none=True) for t in result.tools]
            core.set_attributes(span, lambda: {genai.TOOL_DEFINITIONS: genai.tool_definitions_json(tools)})
            return result

    async def traced_call_tool(name: str, arguments: dict[str, Any] | None = None, *args: Any,
                               tool_call_id: str | None = None, **kwargs: Any) -> Any:
        with core.tracer().start_as_current_span(f"tools/call {name}", kind=SpanKind.CLIENT, record_exception=False,
                                                 set_status_on_exception=False) as span:
            span.set_attribute(METHOD, "tools/call")
            core.set_attributes(span, genai.tool_attributes, name, arguments if arguments is not None else {},
                                call_id=tool_call_id, redactor=core.redactor())
            try:
                result = await call_tool(name, arguments, *args, **kwargs)
            except BaseException as exc:
                core.mark_error(span, exc)
                raise
            text = _result_text(result)
            if getattr(result, "is_error", False):
                core.mark_error(span, "tool_error", text)
            if core.capture_messages():
                core.set_attributes(span, genai.tool_result_attributes, text, core.redactor())
            return result

    traced_call_tool.__tracemill__ = True  # type: ignore[attr-defined]
    session.list_tools = traced_list_tools  # type: ignore[attr-defined]
    session.call_tool = traced_call_tool  # type: ignore[attr-defined]
    return session
