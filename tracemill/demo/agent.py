"""The demo's agent: MCP-Bench tasks run by an OpenAI client instrumented with the SDK (`tracemill.sdk.openai`).

Each episode is one task (a user request over its MCP servers' real tool schemas): the agent asks the model, runs the
calls it gets on simulated MCP servers (the simulator's `execution_outcome`: a call with a wrong name or arguments
fails, strict servers refuse undeclared parameters, a few correct calls fail anyway), sends the results back, and
stops at the model's prose answer. Its harness tells the model when a reply held a call it could not read. Every
model call is a `chat` span and every execution an `execute_tool` span, under one `invoke_agent` span: what the agent
got, whether a sidecar stood in between or not."""

from __future__ import annotations

import random
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import tracemill.sdk as tm
from tracemill.demo.weak_model import ERROR
from tracemill.reader import holds_call
from tracemill.revision import StepKind
from tracemill.simulate.episodes import SYSTEM_PROMPT, Settings, execution_outcome
from tracemill.simulate.scenarios import Scenario
from tracemill.tools import tool_index
from tracemill.verify import Stage, verify

STOP = threading.Event()  # set by the demo's SIGINT / SIGTERM handler (tracemill.demo.cli)

MAX_TURNS = 16
UNREAD = f"{ERROR}: no tool call could be parsed from your reply. Call the tool with valid JSON arguments."


@dataclass
class Tally:
    """What one phase's episodes did, as the agent saw it."""

    episodes: int = 0
    requests: int = 0
    revised: int = 0  # answers a sidecar revised (they carry `tracemill`)
    by_model: int = 0  # of those, answers a model reviser wrote (a `model` step)


def run_episodes(base_url: str, model: str, scenarios: Sequence[Scenario], episodes: int, seed: int, settings: Settings,
                 harness_version: str, on_episode: Callable[[int], None] | None = None) -> Tally:
    """Run `episodes` tasks drawn from `scenarios` (fixed by `seed`) against the OpenAI-compatible server at
    `base_url`; the SDK must have been initialised (`tracemill.sdk.init`). Each request names the conversation and the
    harness version to a sidecar in between (which records the version with the model's answers as sent)."""
    from openai import OpenAI

    from tracemill.sdk.openai import instrument

    client = instrument(OpenAI(base_url=base_url, api_key="demo", max_retries=0, timeout=300))
    tally = Tally()
    try:
        for i in range(episodes):
            if STOP.is_set():
                raise KeyboardInterrupt
            rng = random.Random(f"demo:{seed}:{i}")
            headers = {"X-Conversation-Id": f"demo-{seed}-{i}", "X-Tracemill-Harness-Version": harness_version}
            _episode(client, model, rng.choice(scenarios), rng, settings, tally, headers)
            tally.episodes += 1
            if on_episode is not None:
                on_episode(i + 1)
    finally:
        client.close()
    return tally


def _episode(client: Any, model: str, scenario: Scenario, rng: random.Random, settings: Settings, tally: Tally,
             headers: dict[str, str]) -> None:
    index = tool_index(scenario.tools)
    tools = [t.to_openai() for t in scenario.tools]
    messages: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM_PROMPT},
                                      {"role": "user", "content": scenario.request}]
    with tm.agent("demo-agent", conversation_id=headers["X-Conversation-Id"]):
        for _ in range(MAX_TURNS):
            response = client.chat.completions.create(model=model, messages=messages, tools=tools,
                                                      extra_headers=headers)
            tally.requests += 1
            message = response.choices[0].message
            revision = (message.model_extra or {}).get("tracemill") or {}
            tally.revised += bool(revision)
            tally.by_model += any(step.get("kind") == StepKind.MODEL.value for step in revision.get("steps") or ())
            calls = [{"id": c.id, "type": "function", "function": {"name": c.function.name,
                                                                   "arguments": c.function.arguments}}
                     for c in message.tool_calls or ()]
            messages.append({"role": "assistant", "content": message.content, "tool_calls": calls})
            if not calls:
                if message.content and holds_call(message.content, index):
                    messages.append({"role": "user", "content": UNREAD})
                    continue
                return
            for call in calls:
                messages.append({"role": "tool", "tool_call_id": call["id"],
                                 "content": _run_tool(call, index, settings, rng)})


def _run_tool(call: dict[str, Any], index: dict[str, Any], settings: Settings, rng: random.Random) -> str:
    function = call["function"]
    verdict = verify({"name": function["name"], "arguments": function["arguments"]}, index)
    if verdict.stage == Stage.PARSE:
        return f"{ERROR}: invalid tool call: {verdict.violations[0].message}"
    error, answer = execution_outcome(verdict, settings, rng)
    with tm.tool(function["name"], function["arguments"], call_id=call["id"]) as run:
        if error is not None:
            run.fail(error, answer)
            return f"{ERROR}: {answer}"
        run.result(answer)
    return answer
