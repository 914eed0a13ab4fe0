"""A small scripted OpenAI-compatible model server (the model is the only stand-in), vLLM-like where it matters: chat
completions streamed or not, `/v1/models`, and the runtime LoRA endpoints, which it records. `ServerThread` (from
`tracemill.net`) runs it, or any ASGI app, under uvicorn, as `tracemill serve` runs the sidecar."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route


@dataclass
class Reply:
    content: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    status: int = 200
    delay: float = 0.0  # before answering
    chunk_delay: float = 0.0  # between streamed chunks (after the first)
    repeat: int = 1  # streamed: the content this many times (a long answer)
    others: tuple[Reply, ...] = ()  # not streamed: the answers of choices 1, 2, ... (a request with n > 1)
    crlf: bool = False  # streamed: lines end in CRLF, each event in two reads: the last \n comes in the second
    logprobs: bool = False  # streamed: each content chunk with its token's logprob (the chunk's text)
    usage_on_finish: bool = False  # streamed: usage on the finishing chunk, as vLLM's continuous usage stats send it


USAGE = {"prompt_tokens": 11, "completion_tokens": 7, "total_tokens": 18}


def _last_user(body: Mapping[str, Any]) -> str:
    for message in reversed(body.get("messages") or []):
        if message.get("role") == "user":
            return str(message.get("content"))
    return ""


def _last_role(body: Mapping[str, Any]) -> str | None:
    messages = body.get("messages") or [{}]
    return messages[-1].get("role")


def _response_id() -> str:
    """Drawn at random for each response, as model servers do."""
    return f"chatcmpl-{uuid.uuid4().hex}"


def native(calls: list[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """`{"name", "arguments"}` calls (arguments as text, exactly as given) as OpenAI tool_calls."""
    return [{"id": f"call_{i}", "type": "function", "function": {"name": c["name"], "arguments": c["arguments"]}}
            for i, c in enumerate(calls)]


@dataclass
class ScriptedModel:
    """Answers each request with the reply scripted for its last user message."""

    model: str = "scripted-llama"
    weights: str = "tiny-qwen"  # the base model a vLLM server loaded (its `root` in /v1/models)
    replies: dict[str, Reply] = field(default_factory=dict)
    after_tool: Reply | None = None  # the answer to a request whose last message is a tool result (an agent's loop)
    reviser_answers: dict[str, str] = field(default_factory=dict)  # adapter name -> what the reviser answers
    requests: list[dict[str, Any]] = field(default_factory=list)
    sent: dict[str, bytes] = field(default_factory=dict)  # the body sent for each non-streamed request
    lora: list[tuple[str, str, str]] = field(default_factory=list)  # (load | unload, name, path)
    loaded: dict[str, str] = field(default_factory=dict)
    disconnected: list[str] = field(default_factory=list)
    finished: list[str] = field(default_factory=list)

    def app(self) -> Starlette:
        return Starlette(routes=[
            Route("/v1/chat/completions", self.chat, methods=["POST"]),
            Route("/v1/models", self.models, methods=["GET"]),
            Route("/v1/load_lora_adapter", self.load, methods=["POST"]),
            Route("/v1/unload_lora_adapter", self.unload, methods=["POST"]),
            Route("/v1/echo", self.echo, methods=["POST", "GET"]),
            Route("/version", self.version, methods=["GET"]),
        ])

    async def version(self, request: Request) -> Response:
        return JSONResponse({"version": "scripted"})

    async def echo(self, request: Request) -> Response:
        return _with_cookies(JSONResponse({
            "method": request.method, "query": dict(request.query_params), "body": (await request.body()).decode(),
            "auth": request.headers.get("authorization"), "encoding": request.headers.get("accept-encoding"),
            "cookies": request.headers.getlist("cookie")}))

    async def models(self, request: Request) -> Response:
        data = [{"id": self.model, "object": "model", "owned_by": "scripted", "root": self.weights, "parent": None}]
        data += [{"id": name, "object": "model", "parent": self.model, "root": path}
                 for name, path in self.loaded.items()]
        return JSONResponse({"object": "list", "data": data})

    async def load(self, request: Request) -> Response:
        body = await request.json()
        name, path = body["lora_name"], body["lora_path"]
        if name in self.loaded:
            return JSONResponse({"error": {"message": f"The lora adapter '{name}' has already been loaded.",
                                           "type": "InvalidUserInput", "code": 400}}, 400)
        self.lora.append(("load", name, path))
        self.loaded[name] = path
        return Response(f"Success: LoRA adapter '{name}' added successfully.", 200)

    async def unload(self, request: Request) -> Response:
        name = (await request.json())["lora_name"]
        if name not in self.loaded:
            return JSONResponse({"error": {"message": f"The lora adapter '{name}' cannot be found.",
                                           "type": "NotFoundError", "code": 404}}, 404)
        self.lora.append(("unload", name, self.loaded.pop(name)))
        return Response(f"Success: LoRA adapter '{name}' removed successfully.", 200)

    async def chat(self, request: Request) -> Response:
        body = await request.json()
        self.requests.append(body)
        model = body.get("model", "")
        if model != self.model:
            if model not in self.loaded:
                return JSONResponse({"error": {"message": f"The model `{model}` does not exist.",
                                               "type": "NotFoundError", "code": 404}}, 404)
            reply = Reply(self.reviser_answers.get(model, ""))
            key = f"reviser:{model}"
        else:
            key = _last_user(body)
            reply = self.replies.get(key, Reply("I have nothing scripted for that."))
            if self.after_tool is not None and _last_role(body) == "tool":
                reply = self.after_tool
        if reply.delay:
            await asyncio.sleep(reply.delay)
        if reply.status != 200:
            return JSONResponse({"error": {"message": f"scripted failure {reply.status}", "type": "server_error",
                                           "code": reply.status}}, reply.status)
        if body.get("stream"):
            return _with_cookies(StreamingResponse(self._stream(key, reply, body), media_type="text/event-stream"))
        choices = []
        for n, answer in enumerate((reply, *reply.others)):
            message: dict[str, Any] = {"role": "assistant", "content": answer.content}
            if answer.tool_calls:
                message["tool_calls"] = answer.tool_calls
            choices.append({"index": n, "message": message, "logprobs": None,
                            "finish_reason": "tool_calls" if answer.tool_calls else "stop"})
        sent = json.dumps({  # json's spacing, not the proxy's orjson: re-encoding would show
            "id": _response_id(), "object": "chat.completion", "created": 1, "model": self.model,
            "choices": choices, "usage": USAGE}).encode()
        self.sent[key] = sent
        return _with_cookies(Response(sent, media_type="application/json"))

    async def _stream(self, key: str, reply: Reply, body: Mapping[str, Any]):  # type: ignore[no-untyped-def]
        response_id = _response_id()

        def chunk(delta: dict[str, Any], finish: str | None = None, **more: Any) -> bytes:
            logprobs = None
            if reply.logprobs and delta.get("content"):
                logprobs = {"content": [{"token": delta["content"], "logprob": -0.5, "bytes": None,
                                         "top_logprobs": []}], "refusal": None}
            return b"data: " + orjson.dumps({"id": response_id, "object": "chat.completion.chunk", "created": 1,
                                              "model": self.model, "choices": [
                                                  {"index": 0, "delta": delta, "logprobs": logprobs,
                                                   "finish_reason": finish}], **more}) + b"\n\n"

        def events() -> Iterator[bytes]:
            yield chunk({"role": "assistant", "content": ""})
            text = (reply.content or "") * reply.repeat
            for i in range(0, len(text), 7):
                yield chunk({"content": text[i:i + 7]})
            for k, call in enumerate(reply.tool_calls or ()):
                yield chunk({"tool_calls": [{"index": k, "id": call["id"], "type": "function",
                                             "function": {"name": call["function"]["name"], "arguments": ""}}]})
                arguments = call["function"]["arguments"]
                for i in range(0, len(arguments), 5):
                    yield chunk({"tool_calls": [{"index": k, "function": {"arguments": arguments[i:i + 5]}}]})
            yield chunk({}, "tool_calls" if reply.tool_calls else "stop",
                        **({"usage": USAGE} if reply.usage_on_finish else {}))
            if (body.get("stream_options") or {}).get("include_usage"):
                yield b"data: " + orjson.dumps({"id": response_id, "object": "chat.completion.chunk",
                                                 "created": 1, "model": self.model, "choices": [],
                                                 "usage": USAGE}) + b"\n\n"
            yield b"data: [DONE]\n\n"

        try:
            for n, data in enumerate(events()):
                if reply.chunk_delay and n:  # the first (the role) at once
                    await asyncio.sleep(reply.chunk_delay)
                if not reply.crlf:
                    yield data
                    continue
                yield data.replace(b"\n", b"\r\n")[:-1]  # the blank line's \n in the next read
                await asyncio.sleep(0.01)
                yield b"\n"
            self.finished.append(key)
        except (asyncio.CancelledError, GeneratorExit):
            self.disconnected.append(key)
            raise


COOKIES = ["lb=node-2; Path=/", "session=7f3a; Path=/; HttpOnly"]  # a load balancer's, the server's: two Set-Cookie


def _with_cookies(response: Response) -> Response:
    for cookie in COOKIES:
        response.headers.append("set-cookie", cookie)
    return response
