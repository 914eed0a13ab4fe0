"""The demo's model server: an OpenAI-compatible `/v1/chat/completions` that answers as a weak open model would.

For each conversation it plans the calls the user's request needs over the tools it is offered (the simulator's
`plan_calls`, fixed by the first user message), and writes each step's calls with the fault rates of a profile under
a harness version (`tracemill.faults`): natively, or as text when a text fault hit, as a vLLM server returns them.
Where it is is read from the conversation, as a stateless server must: a step is done once the tool results that
followed it hold no error, or once the model gives up on it (after a failure it tries again with the profile's retry
rate, at most twice). With every step done it answers in prose. A value a context fault leaves out is never said by
the user here, so those calls stay unrecoverable."""

from __future__ import annotations

import itertools
import random
import secrets
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from tracemill.examples import request_words
from tracemill.faults import PROFILES, corrupt_calls, sample_faults
from tracemill.simulate.episodes import Settings, emit, plan_calls
from tracemill.simulate.harness import under_harness
from tracemill.simulate.scenarios import Scenario
from tracemill.tools import Tool, normalize_tools, tool_index, toolset_hash

ERROR = "Error"  # how a tool result or a harness message that reports a failure starts


@dataclass(frozen=True, slots=True)
class Answer:
    content: str | None
    tool_calls: list[dict[str, Any]]


def _content(message: Mapping[str, Any]) -> str:
    return str(message.get("content") or "")


def _failed(after: Sequence[Mapping[str, Any]]) -> bool:
    return any(_content(m).startswith(ERROR) for m in after)


@dataclass
class WeakModel:
    profile: str = "llama3.1-8b"
    harness_version: str = "prompt-v5"
    seed: int = 0
    settings: Settings = field(init=False)
    _ids: itertools.count[int] = field(default_factory=itertools.count, init=False)

    def __post_init__(self) -> None:
        if self.profile not in PROFILES:
            raise ValueError(f"unknown model profile {self.profile!r}; known: {', '.join(sorted(PROFILES))}")
        self.settings = Settings(under_harness(PROFILES[self.profile], self.harness_version))

    def _progress(self, turns: Sequence[tuple[Mapping[str, Any], Sequence[Mapping[str, Any]]]],
                  key: str) -> tuple[int, int]:
        """(the step the conversation is at, the attempts already made at it)."""
        step = attempt = 0
        for assistant, after in turns:
            if assistant.get("tool_calls") and not _failed(after):
                step, attempt = step + 1, 0
                continue
            attempt += 1
            again = random.Random(f"{key}:again:{step}:{attempt}").random() < self.settings.retry_rate
            if attempt > self.settings.max_retries or not again:
                step, attempt = step + 1, 0
        return step, attempt

    def answer(self, messages: Sequence[Mapping[str, Any]], tools: Sequence[Tool]) -> Answer:
        users = [i for i, m in enumerate(messages) if m.get("role") == "user"]
        request = _content(messages[users[0]]) if users else ""
        if not tools or not request:
            return Answer("How can I help?", [])
        key = f"{self.seed}:{self.profile}:{self.harness_version}:{toolset_hash(tools)}:{request}"
        plan = plan_calls(Scenario("", request, tuple(tools)), self.settings, random.Random(key))
        later = messages[users[0] + 1:]
        starts = [i for i, m in enumerate(later) if m.get("role") == "assistant"]
        turns = [(later[i], later[i + 1: j]) for i, j in zip(starts, [*starts[1:], len(later)][:len(starts)],
                                                               strict=True)]
        step, attempt = self._progress(turns, key)
        if step >= len(plan):
            return Answer("Here is what I found: " + " ".join(request_words(request)[:12]) + ".", [])
        rng = random.Random(f"{key}:{step}:{attempt}")
        kinds = sample_faults(self.settings.profile, rng, n_calls=len(plan[step]))
        emitted = emit(corrupt_calls(plan[step], tools, kinds, rng), tool_index(tools), rng)
        # a model server draws each call id at random: the plan's ids repeat wherever a task and its seed do
        calls = [{"id": f"call_{secrets.token_hex(12)}", "type": "function", "function": {
            "name": c["name"], "arguments": c["arguments"] if isinstance(c["arguments"], str)
            else orjson.dumps(c["arguments"]).decode()}} for c in emitted.natives]
        return Answer(emitted.text, calls)

    async def chat(self, request: Request) -> Response:
        try:
            body = orjson.loads(await request.body())
            messages = body["messages"]
            tools = normalize_tools([t for t in body.get("tools") or ()])
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
            return JSONResponse({"error": {"message": f"bad request: {exc}", "type": "invalid_request_error",
                                           "code": 400}}, 400)
        answer = self.answer(messages, tools)
        message: dict[str, Any] = {"role": "assistant", "content": answer.content}
        if answer.tool_calls:
            message["tool_calls"] = answer.tool_calls
        prompt_tokens = sum(len(_content(m)) for m in messages) // 4 + 50 * len(tools)
        completion_tokens = len(orjson.dumps(message)) // 4
        return Response(orjson.dumps({
            "id": f"chatcmpl-{next(self._ids)}", "object": "chat.completion", "created": int(time.time()),
            "model": body.get("model") or self.profile,
            "choices": [{"index": 0, "message": message, "logprobs": None,
                         "finish_reason": "tool_calls" if answer.tool_calls else "stop"}],
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                      "total_tokens": prompt_tokens + completion_tokens}}), media_type="application/json")

    async def models(self, request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [{"id": self.profile, "object": "model", "owned_by": "demo"}]})

    def app(self) -> Starlette:
        return Starlette(routes=[Route("/v1/chat/completions", self.chat, methods=["POST"]),
                                 Route("/v1/models", self.models, methods=["GET"])])
