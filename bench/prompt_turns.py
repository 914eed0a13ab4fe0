"""The reviser's prompt on an agent's long context: time per `build_prompt` call where the model output is the newest
turn of an agent loop (one user request, then a tool call and its result per step, each result about 360 characters),
for loops of 10, 100 and 400 steps. Each call of such a loop is given the whole context so far: what a prompt costs
should follow the turns its budget keeps, not the turns the loop has made.

The tools are MCP-Bench's (`tracemill/data`), each context built once and the caches warm; a figure is the median of
`--repeat` runs of one second each.

Run by hand, never in CI (see bench/README.md, "The reviser's prompt on long agent contexts"):

    .venv/bin/python bench/prompt_turns.py --out bench/out/prompt_turns.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

from tracemill.reviser_prompt import PromptSettings, build_prompt
from tracemill.tools import load_mcp_bench, tool_index

from mine import loop_seconds, machine, save

STEPS = (10, 100, 400)
RAW = 'I will search again. {"name": "search_places", "arguments": {"query": "cafes in Oslo", "radius": "500"}}'


def agent_context(steps: int) -> list[dict[str, Any]]:
    context: list[dict[str, Any]] = [{"role": "system", "content": "You are a travel agent with tools."},
                                     {"role": "user", "content": "Find quiet cafes near the Oslo opera house."}]
    for step in range(steps):
        context.append({"role": "assistant", "content": "", "tool_calls": [
            {"id": f"call_{step}", "type": "function",
             "function": {"name": "search_places", "arguments": json.dumps({"query": f"cafes page {step}"})}}]})
        context.append({"role": "tool", "tool_call_id": f"call_{step}",
                        "content": json.dumps([{"name": f"Cafe {step}.{i}", "rating": 4.5} for i in range(12)])})
    return context


def micros_per_prompt(context: list[dict[str, Any]], index: Any, settings: PromptSettings) -> float:
    build_prompt(RAW, index, context, settings)
    n, start = 0, time.perf_counter()
    while time.perf_counter() - start < 1.0:
        build_prompt(RAW, index, context, settings)
        n += 1
    return (time.perf_counter() - start) / n * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--out", type=Path, help="write the figures here as JSON")
    args = parser.parse_args()

    servers = load_mcp_bench()
    index = tool_index(max(servers.values(), key=len))
    settings = PromptSettings()
    loops = []
    for steps in STEPS:
        context = agent_context(steps)
        runs = [micros_per_prompt(context, index, settings) for _ in range(args.repeat)]
        loops.append({"steps": steps, "turns": len(context), "context_chars": len(json.dumps(context)),
                      "median_us": round(statistics.median(runs), 1), "runs_us": [round(r, 1) for r in runs]})
    figures = {"machine": machine(), "loop_seconds": loop_seconds(), "budget_tokens": settings.budget_tokens,
               "loops": loops}
    print(json.dumps(figures, indent=2))
    save(figures, args.out)


if __name__ == "__main__":
    main()
