"""The sidecar: an OpenAI-compatible proxy that checks every answer's tool calls against the request's tools and
revises the broken ones before the agent sees them.

Routes: `POST /v1/chat/completions` (streamed or not), `GET /v1/models` (the upstream's, less the reviser adapters
this sidecar loaded), `POST /v1/revise` (`{"raw", "tools", "context"}` -> the revision), `GET /healthz`,
`GET /metrics` (Prometheus); everything else goes to the upstream as it came.

A revised answer carries the upstream's original in `choices[i].message.tracemill.original` (the finish chunk's
`choices[i].tracemill` when streamed), and the headers `x-tracemill-revision` (unchanged | revised | partial |
refused; not for streams, whose finish chunk says it), `x-tracemill-version` and `x-tracemill-role`. An answer that
needs nothing goes out byte for byte as the upstream sent it.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

import aiohttp
import anyio
import orjson
from starlette.applications import Starlette
from starlette.background import BackgroundTask
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from tracemill.revisers import make_reviser
from tracemill.serving.adapters import PREFIX, Adapters
from tracemill.serving.follow import Follower
from tracemill.serving.metrics import Metrics
from tracemill.serving.plan import Serving, conversation_of
from tracemill.serving.revising import UNCHANGED, Look, Revised, ask, combined, look, revise_message
from tracemill.serving.stream import DONE, EventSplitter, Streamer, event
from tracemill.serving.toolsets import Toolset, Toolsets
from tracemill.serving.tracing import CLIENT_GONE, Exchange, record
from tracemill.serving.upstream import ClientGone, Upstream, UpstreamError, error_body, error_response, until_disconnect
from tracemill.tools import ToolFormatError

_T = TypeVar("_T")


@dataclass(frozen=True, slots=True)
class ServeConfig:
    upstream: str  # the model server's OpenAI base URL, e.g. http://127.0.0.1:8001/v1
    reviser: str = "rules"  # what serves until a deployment says otherwise
    db_url: str | None = None  # the store whose deployments to follow
    vllm: str | None = None  # the vLLM server that serves deployed versions as LoRA adapters
    poll_seconds: float = 1.0
    timeout: float = 300.0
    trace: bool = False  # record each request with the SDK (tracemill.sdk.init first)


def _refusal(status: int, body: bytes) -> str:
    return f"the upstream answered {status}: {body[:500].decode(errors='replace')}"


def _extension(revised: Revised, serving: Serving, original: Mapping[str, Any]) -> dict[str, Any]:
    return {"revision": revised.outcome, "version": serving.version, "role": serving.role,
            "original": {"content": original.get("content"), "tool_calls": original.get("tool_calls")},
            "steps": [s.to_dict() for s in revised.steps]}


@dataclass(slots=True)
class _Call:
    """What a chat completion request says, read once."""

    raw: bytes
    body: dict[str, Any]
    toolset: Toolset | None
    serving: Serving
    text_calls: bool
    exchange: Exchange


class Proxy:
    def __init__(self, config: ServeConfig) -> None:
        self.config = config
        self.upstream = Upstream(config.upstream, config.timeout)
        self.metrics = Metrics(traced=config.trace)
        self.toolsets = Toolsets()
        static = config.reviser
        reviser = make_reviser(static)
        adapters = Adapters(config.vllm, lambda: self.upstream.session) if config.vllm else None
        self.follower = Follower(config.db_url, Serving(static, reviser, in_process=static in ("rules", "none",
                                                                                               "json-repair")),
                                 adapters, config.poll_seconds, self.metrics.plan)
        self.metrics.plan(self.follower.plan)
        self._task: asyncio.Task[None] | None = None

    @contextlib.asynccontextmanager
    async def lifespan(self, app: Starlette) -> AsyncIterator[None]:
        await self.follower.check()
        self._task = asyncio.create_task(self.follower.run())
        try:
            yield
        finally:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self.follower.close()
            await self.upstream.aclose()
            if self.config.trace:  # now: uvicorn re-raises SIGTERM after shutdown, so atexit handlers never run
                from tracemill.sdk import core

                await asyncio.to_thread(core.flush, 10.0)

    # --- chat completions ---------------------------------------------------------------------------------------

    def _read(self, request: Request, raw: bytes) -> _Call | Response:
        try:
            body = orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            return error_response(400, f"the request body is not JSON: {exc}", "invalid_request_error")
        if not isinstance(body, dict):
            return error_response(400, "the request body must be a JSON object", "invalid_request_error")
        tools = body.get("tools")
        toolset = None
        if isinstance(tools, list) and tools:
            try:
                toolset = self.toolsets.get(tools)
            except ToolFormatError:
                toolset = None  # tools this proxy cannot read (e.g. a hosted API's built-in ones): not checked
        plan = self.follower.plan
        serving = plan.pick(conversation_of(request.headers, body) if plan.canary else None)
        conversation_id = request.headers.get("x-conversation-id")
        exchange = Exchange(request.headers, body, toolset, serving, conversation_id, time.time_ns())
        return _Call(raw, body, toolset, serving, toolset is not None and body.get("tool_choice") != "none", exchange)

    async def _revise(self, call: _Call, content: Any, seen: Look) -> Revised:
        context = call.body.get("messages") if isinstance(call.body.get("messages"), list) else None
        assert call.toolset is not None
        args = (content, seen, call.toolset.index, context, call.serving.reviser)
        started = time.perf_counter()
        if call.serving.in_process:
            revised = revise_message(*args)
        else:
            revised = await anyio.to_thread.run_sync(revise_message, *args)
        took = time.perf_counter() - started
        call.exchange.revise_ms += took * 1000
        self.metrics.revise_seconds.observe(took)
        self.metrics.revised(revised, call.serving.version)
        return revised

    def _headers(self, call: _Call, outcome: str | None) -> dict[str, str]:
        found = {"x-tracemill-version": call.serving.version, "x-tracemill-role": call.serving.role}
        if outcome is not None:
            found["x-tracemill-revision"] = outcome
        return found

    def _finish(self, call: _Call, status: int) -> BackgroundTask | None:
        call.exchange.end_ns = time.time_ns()
        self.metrics.requests.labels("chat", str(status)).inc()
        return BackgroundTask(record, call.exchange) if self.config.trace else None

    async def chat(self, request: Request) -> Response:
        call = self._read(request, await request.body())
        if isinstance(call, Response):
            self.metrics.requests.labels("chat", str(call.status_code)).inc()
            return call
        if call.body.get("stream"):
            return await self._stream(request, call)
        started = time.perf_counter()
        answer = await self._reach(request, call, self.upstream.fetch("POST", "/v1/chat/completions", request,
                                                                      call.raw))
        if isinstance(answer, Response):
            return answer
        call.exchange.upstream_ms = (time.perf_counter() - started) * 1000
        self.metrics.upstream_seconds.observe(call.exchange.upstream_ms / 1000)
        if answer.status != 200:
            call.exchange.error = _refusal(answer.status, answer.body)
            return self._with(Response(answer.body, answer.status, answer.headers), call, None)
        try:
            data = orjson.loads(answer.body)
            choices = [c for c in data["choices"] if isinstance(c, dict)]
        except (orjson.JSONDecodeError, KeyError, TypeError):
            return self._with(Response(answer.body, 200, answer.headers), call, "unread")
        outcome = await self._check(call, data, choices)
        changed = any(r is not None and r.changed for r in call.exchange.revised)
        content = orjson.dumps(data) if changed else answer.body
        return self._with(Response(content, 200, answer.headers), call, outcome)

    async def _reach(self, request: Request, call: _Call, opening: Awaitable[_T]) -> _T | Response:
        """The upstream's answer, or the response that says why there is none (the client left, the upstream failed)."""
        try:
            return await until_disconnect(request, opening)
        except ClientGone:
            call.exchange.error_type, call.exchange.error = CLIENT_GONE, "the client left before the upstream answered"
            return self._with(Response(status_code=499), call, None)
        except UpstreamError as exc:
            failed = self.upstream.error(exc)
            call.exchange.error = failed.body.decode()
            return self._with(failed, call, None)

    def _with(self, response: Response, call: _Call, outcome: str | None) -> Response:
        response.headers.update(self._headers(call, outcome))
        response.background = self._finish(call, response.status_code)
        return response

    async def _check(self, call: _Call, data: dict[str, Any], choices: list[dict[str, Any]]) -> str | None:
        """Check (and revise in place) each choice's message; the outcome, or None when there were no tools."""
        exchange = call.exchange
        exchange.response_model = data.get("model")
        exchange.usage = data.get("usage") if isinstance(data.get("usage"), dict) else None
        outcomes = []
        for choice in choices:
            message = choice.get("message") if isinstance(choice.get("message"), dict) else {}
            exchange.original.append(dict(message))
            exchange.finish_reasons.append(choice.get("finish_reason"))
            revised = None
            if call.toolset is not None:
                seen = look(message.get("content"), message.get("tool_calls"), call.toolset.index, call.text_calls)
                if seen.needed:
                    revised = await self._revise(call, message.get("content"), seen)
                    outcomes.append(revised.outcome)
            exchange.revised.append(revised)
            if revised is not None and revised.changed:
                original = dict(message)
                message["content"] = revised.content
                message["tool_calls"] = revised.tool_calls
                message["tracemill"] = _extension(revised, call.serving, original)
                if not original.get("tool_calls"):
                    choice["finish_reason"] = "tool_calls"
        return combined(outcomes) if call.toolset is not None else None

    async def _stream(self, request: Request, call: _Call) -> Response:
        started = time.perf_counter()
        response = await self._reach(request, call, self.upstream.open("POST", "/v1/chat/completions", request,
                                                                       call.raw))
        if isinstance(response, Response):
            return response
        returned = self.upstream.returned(response)
        if response.status != 200 or "text/event-stream" not in response.headers.get("content-type", ""):
            try:
                body = await response.read()
            except UpstreamError as exc:
                self.upstream.close(response, finished=False)
                return self._with(self.upstream.error(exc), call, None)
            self.upstream.close(response, finished=True)
            if response.status != 200:
                call.exchange.error = _refusal(response.status, body)
            return self._with(Response(body, response.status, returned), call, None)
        call.exchange.upstream_ms = (time.perf_counter() - started) * 1000
        returned.update(self._headers(call, None))
        return StreamingResponse(self._events(call, response, started), 200, returned,
                                 media_type="text/event-stream")

    async def _events(self, call: _Call, response: aiohttp.ClientResponse, started: float) -> AsyncIterator[bytes]:
        streamer = Streamer(call.toolset.index if call.toolset is not None else {}, call.text_calls)
        splitter = EventSplitter()
        status = 200
        finished = False
        try:
            async for data in self.upstream.chunks(response):
                for raw in splitter.feed(data):
                    for out in streamer.feed(raw):
                        yield out
                    for at in streamer.finished():
                        for out in await self._close(call, streamer, at):
                            yield out
            finished = True
            for raw in filter(None, [splitter.rest()]):
                for out in streamer.feed(raw):
                    yield out
            ends = streamer.finished()
            for at in ends + [a for a in streamer.unfinished() if a not in ends]:
                for out in await self._close(call, streamer, at):
                    yield out
            if streamer.done:
                yield DONE
        except UpstreamError as exc:
            failed = self.upstream.error(exc)
            status = failed.status_code  # 504 where it stalled, 502 where it broke
            call.exchange.error = failed.body.decode()
            yield event(error_body(failed.status_code, f"the stream broke off: {call.exchange.error}",
                                   "upstream_error"))
        except (asyncio.CancelledError, GeneratorExit):  # the client left: traced, its unfinished choices unrecorded
            status = 499
            call.exchange.error_type, call.exchange.error = CLIENT_GONE, "the client left before the answer ended"
            raise
        finally:
            self.upstream.close(response, finished)
            call.exchange.upstream_ms = (time.perf_counter() - started) * 1000 - call.exchange.revise_ms
            call.exchange.response_model = streamer.template.get("model")
            call.exchange.usage = streamer.usage if isinstance(streamer.usage, dict) else None
            background = self._finish(call, status)
            if background is not None:
                with anyio.CancelScope(shield=True):  # a client that left cancels the stream: its trace is kept
                    await background()

    async def _close(self, call: _Call, streamer: Streamer, at: int) -> list[bytes]:
        original = streamer.original(at)
        call.exchange.original.append(original)
        call.exchange.finish_reasons.append((streamer.choices[at].finish or {}).get("finish_reason"))
        seen = streamer.look(at) if call.toolset is not None else None
        revised = await self._revise(call, original["content"], seen) if seen is not None and seen.needed else None
        call.exchange.revised.append(revised)
        extension = _extension(revised, call.serving, original) if revised and revised.outcome != UNCHANGED else None
        return streamer.close(at, revised, extension)

    # --- the rest -----------------------------------------------------------------------------------------------

    async def models(self, request: Request) -> Response:
        try:
            answer = await self.upstream.fetch("GET", "/v1/models", request, None)
        except UpstreamError as exc:
            return self.upstream.error(exc)
        try:
            data = orjson.loads(answer.body)
            data["data"] = [m for m in data["data"] if not str(m.get("id", "")).startswith(PREFIX)]
        except (orjson.JSONDecodeError, KeyError, TypeError, AttributeError):
            return Response(answer.body, answer.status, answer.headers)
        return Response(orjson.dumps(data), answer.status, answer.headers)

    async def revise(self, request: Request) -> Response:
        try:
            body = orjson.loads(await request.body())
        except orjson.JSONDecodeError as exc:
            return error_response(400, f"the request body is not JSON: {exc}", "invalid_request_error")
        if not isinstance(body, dict):
            return error_response(400, 'expected {"raw", "tools", "context"}', "invalid_request_error")
        raw, tools, context = body.get("raw"), body.get("tools"), body.get("context")
        if isinstance(raw, (dict, list)):
            raw = orjson.dumps(raw).decode()
        problem = ("'raw' must be the model's output as a string" if not isinstance(raw, str) else
                   "'tools' must be a non-empty list of tools" if not isinstance(tools, list) or not tools else
                   "'context' must be a list of messages or null" if context is not None and not isinstance(
                       context, list) else None)
        if problem:
            return error_response(400, problem, "invalid_request_error")
        try:
            index = self.toolsets.get(tools).index
        except ToolFormatError as exc:
            return error_response(400, str(exc), "invalid_request_error")
        plan = self.follower.plan
        serving = plan.pick(conversation_of(request.headers, {"messages": context or []}) if plan.canary else None)
        if serving.in_process:
            revision, failed = ask(serving.reviser, raw, index, context)
        else:
            revision, failed = await anyio.to_thread.run_sync(ask, serving.reviser, raw, index, context)
        self.metrics.requests.labels("revise", "200").inc()
        return JSONResponse({**revision.to_dict(), "version": serving.version, "role": serving.role,
                             "reviser_error": failed})

    async def healthz(self, request: Request) -> Response:
        plan = self.follower.plan
        return JSONResponse({"status": "ok", "upstream": self.upstream.base, "version": plan.active.version,
                             "role": plan.active.role, "deployment_id": self.follower.applied,
                             "canary": ({"version": plan.canary.version, "percent": plan.canary_percent}
                                        if plan.canary else None), "deployment_error": self.follower.last_error})

    async def metrics_endpoint(self, request: Request) -> Response:
        return Response(self.metrics.exposition(), media_type="text/plain; version=0.0.4; charset=utf-8")

    async def passthrough(self, request: Request) -> Response:
        body = await request.body()
        try:
            response = await self.upstream.open(request.method, request.url.path, request, body or None,
                                                identity=False)
        except UpstreamError as exc:
            return self.upstream.error(exc)

        async def relay() -> AsyncIterator[bytes]:
            finished = False
            try:
                async for data in self.upstream.chunks(response):
                    yield data
                finished = True
            finally:
                self.upstream.close(response, finished)

        return StreamingResponse(relay(), response.status, self.upstream.returned(response))


_METHODS = ["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"]


def create_app(config: ServeConfig) -> Starlette:
    """Raises ReviserSpecError for a `reviser` spec that names no reviser, ValueError for an unusable upstream."""
    proxy = Proxy(config)
    routes = [
        Route("/v1/chat/completions", proxy.chat, methods=["POST"]),
        Route("/v1/models", proxy.models, methods=["GET"]),
        Route("/v1/revise", proxy.revise, methods=["POST"]),
        Route("/healthz", proxy.healthz, methods=["GET"]),
        Route("/metrics", proxy.metrics_endpoint, methods=["GET"]),
        Route("/{path:path}", proxy.passthrough, methods=_METHODS),
    ]
    app = Starlette(routes=routes, lifespan=proxy.lifespan)
    app.state.proxy = proxy
    return app
