"""Trace every chat completion of an `openai` client (`OpenAI`, `AsyncOpenAI`, or any OpenAI-compatible server).

    client = tracemill.sdk.openai.instrument(OpenAI(base_url=...))
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator, Mapping
from typing import Any, Self, TypeVar

from openai.resources.chat.completions import AsyncCompletions
from opentelemetry.trace import Span, SpanKind, use_span

from tracemill.sdk import core, genai

C = TypeVar("C")


def instrument(client: C, *, provider: str = "openai") -> C:
    """Wrap `client.chat.completions.create` so each call records a `chat` span: the tools offered, the messages, the
    raw text and the tool calls of the first choice, usage. Streams are recorded when they have been read."""
    completions: Any = client.chat.completions  # type: ignore[attr-defined]
    create = completions.create
    if getattr(create, "__tracemill__", False):
        return client

    if isinstance(completions, AsyncCompletions):
        async def traced_async(*args: Any, **kwargs: Any) -> Any:
            span = _start(kwargs, provider)
            try:
                with use_span(span, end_on_exit=False):
                    response = await create(*args, **kwargs)
            except BaseException as exc:
                _fail(span, exc)
                raise
            if kwargs.get("stream"):
                return _AsyncStream(response, span)
            _finish(span, response)
            return response
        traced: Any = traced_async
    else:
        def traced_sync(*args: Any, **kwargs: Any) -> Any:
            span = _start(kwargs, provider)
            try:
                with use_span(span, end_on_exit=False):
                    response = create(*args, **kwargs)
            except BaseException as exc:
                _fail(span, exc)
                raise
            if kwargs.get("stream"):
                return _Stream(response, span)
            _finish(span, response)
            return response
        traced = traced_sync
    traced.__tracemill__ = True
    completions.create = traced
    return client


def _start(kwargs: Mapping[str, Any], provider: str) -> Span:
    model = str(kwargs.get("model", ""))
    span = core.tracer().start_span(f"chat {model}", kind=SpanKind.CLIENT)
    messages = [dict(m) for m in kwargs.get("messages") or ()]
    tools = kwargs.get("tools")
    core.set_attributes(span, genai.chat_attributes, model, provider=provider,
                        messages=messages if core.capture_messages() else None,
                        tools=list(tools) if tools else None, redactor=core.redactor())
    return span


def _fail(span: Span, exc: BaseException) -> None:
    core.mark_error(span, exc)
    span.end()


def _calls(tool_calls: Any) -> list[dict[str, Any]]:
    return [{"id": c.id, "name": c.function.name, "arguments": c.function.arguments}
            for c in tool_calls or () if getattr(c, "function", None) is not None]


def _output(response: Any) -> dict[str, Any]:
    choice = response.choices[0] if response.choices else None
    message = choice.message if choice else None
    usage = getattr(response, "usage", None)
    return genai.chat_output_attributes(
        message.content if message else None, _calls(message.tool_calls) if message else [],
        finish_reason=choice.finish_reason if choice else None, response_model=response.model,
        input_tokens=usage.prompt_tokens if usage else None, output_tokens=usage.completion_tokens if usage else None,
        redactor=core.redactor())


def _finish(span: Span, response: Any) -> None:
    core.set_attributes(span, _output, response)
    span.end()


class _Accumulator:
    """Rebuilds the first choice of a streamed completion from its chunks."""

    def __init__(self, span: Span) -> None:
        self.span = span
        self.text: list[str] = []
        self.calls: dict[int, dict[str, Any]] = {}
        self.finish_reason: str | None = None
        self.model: str | None = None
        self.usage: Any = None
        self.done = False

    def add(self, chunk: Any) -> None:
        try:
            self._add(chunk)
        except Exception:  # an unexpected chunk shape must not break the agent's stream
            core.log.warning("tracemill: could not record a stream chunk", exc_info=True)

    def _add(self, chunk: Any) -> None:
        self.model = chunk.model or self.model
        self.usage = getattr(chunk, "usage", None) or self.usage
        for choice in chunk.choices or ():
            if choice.index != 0:
                continue
            delta = choice.delta
            if delta and delta.content:
                self.text.append(delta.content)
            for tc in (delta.tool_calls if delta else None) or ():
                call = self.calls.setdefault(tc.index, {"id": None, "name": "", "arguments": ""})
                call["id"] = tc.id or call["id"]
                if tc.function is not None:
                    call["name"] += tc.function.name or ""
                    call["arguments"] += tc.function.arguments or ""
            self.finish_reason = choice.finish_reason or self.finish_reason

    def end(self, error: BaseException | None = None) -> None:
        if self.done:
            return
        self.done = True
        if error is not None:
            core.mark_error(self.span, error)
        core.set_attributes(self.span, self._output)
        self.span.end()

    def _output(self) -> dict[str, Any]:
        return genai.chat_output_attributes(
            "".join(self.text) or None, [self.calls[i] for i in sorted(self.calls)], finish_reason=self.finish_reason,
            response_model=self.model, input_tokens=self.usage.prompt_tokens if self.usage else None,
            output_tokens=self.usage.completion_tokens if self.usage else None, redactor=core.redactor())


class _Stream:
    def __init__(self, stream: Any, span: Span) -> None:
        self._stream = stream
        self._acc = _Accumulator(span)

    def __iter__(self) -> Iterator[Any]:
        try:
            for chunk in self._stream:
                self._acc.add(chunk)
                yield chunk
        except BaseException as exc:
            self._acc.end(exc)
            raise
        self._acc.end()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._acc.end()
        self._stream.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


class _AsyncStream:
    def __init__(self, stream: Any, span: Span) -> None:
        self._stream = stream
        self._acc = _Accumulator(span)

    async def __aiter__(self) -> AsyncIterator[Any]:
        try:
            async for chunk in self._stream:
                self._acc.add(chunk)
                yield chunk
        except BaseException as exc:
            self._acc.end(exc)
            raise
        self._acc.end()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        self._acc.end()
        await self._stream.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)
