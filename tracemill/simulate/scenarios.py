"""What simulated agents are asked to do: a user request, the tools offered, and (for BFCL rows) the reference calls.

Sources: MCP-Bench's task scenarios over its servers' tools (default), BFCL rows (the package's subset, and its legal
rows), or a user's tool file (MCP-Bench servers JSON, a JSON list of tools, or BFCL JSON Lines).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import orjson

from tracemill.bfcl import BfclCase, bfcl_tool, cases_from_rows, load_bfcl, package_jsonl, question
from tracemill.sdk.genai import tool_definitions_json
from tracemill.tools import Tool, load_mcp_bench, normalize_tools, tool_index
from tracemill.verify import ToolCall, verify

MEDICAL_SERVERS = frozenset({"Medical Calculator", "BioMCP"})


@dataclass(frozen=True)
class Scenario:
    id: str
    request: str
    tools: tuple[Tool, ...]
    domain: str | None = None  # ground truth, for measuring the collector's classification
    reference: tuple[ToolCall, ...] | None = None  # the calls the request asks for, all in one turn (BFCL)
    tools_json: str = field(default="", compare=False)


def _scenario(id: str, request: str, tools: Sequence[Tool], domain: str | None = None,
              reference: Sequence[ToolCall] | None = None) -> Scenario:
    return Scenario(id, request, tuple(tools), domain, tuple(reference) if reference is not None else None,
                    tool_definitions_json(tools))


def _package_json(path: str) -> Any:
    return orjson.loads(resources.files("tracemill").joinpath(path).read_bytes())


def mcp_bench_scenarios(servers: dict[str, list[Tool]] | None = None) -> list[Scenario]:
    """MCP-Bench's 104 tasks (those whose servers are all in `servers`), each offering the tools of its servers
    (named `Server:tool`, as MCP-Bench does)."""
    servers = servers if servers is not None else load_mcp_bench()
    out = []
    for task in _package_json("data/mcp_bench/tasks.json"):
        if not set(task["servers"]) <= set(servers):
            continue
        tools = [t for s in task["servers"] for t in servers[s]]
        domain = "medical" if MEDICAL_SERVERS & set(task["servers"]) else None
        out.append(_scenario(task["task_id"], task["fuzzy_description"], tools, domain))
    return out


def _bfcl_scenario(case: BfclCase, domain: str | None) -> Scenario | None:
    index = tool_index(case.tools)
    reference = case.reference()
    if not reference or not all(verify(call, index).ok for call in reference):
        return None
    return _scenario(f"bfcl:{case.id}", case.question, case.tools, domain, reference)


def legal_scenarios() -> list[Scenario]:
    """BFCL's legal rows (lawsuits, court cases, statutes, lawyers), shipped in `data/simulate`."""
    answers = {r["id"]: r["ground_truth"] for r in package_jsonl("data/simulate/possible_answer_BFCL_v4_legal.json")}
    cases = cases_from_rows(package_jsonl("data/simulate/BFCL_v4_legal.json"), answers)
    return [s for s in (_bfcl_scenario(c, "legal") for c in cases) if s is not None]


def bfcl_scenarios() -> list[Scenario]:
    """The package's BFCL subset (general functions)."""
    return [s for s in (_bfcl_scenario(c, None) for c in load_bfcl()) if s is not None]


def file_scenarios(path: Path) -> list[Scenario]:
    """Scenarios over a user's tools: MCP-Bench servers JSON (each MCP-Bench task whose servers it has, else every
    request over each server's tools), a JSON list of tools (every MCP-Bench request over them), or BFCL JSON Lines
    (each row, with its answers from the `possible_answer_` file beside it when there is one)."""
    data = path.read_bytes()
    try:
        parsed: Any = orjson.loads(data)
    except orjson.JSONDecodeError:
        parsed = None
    requests = [t["fuzzy_description"] for t in _package_json("data/mcp_bench/tasks.json")]
    if isinstance(parsed, dict) and "servers" in parsed:
        servers = load_mcp_bench(str(path))
        scenarios = mcp_bench_scenarios(servers)
        if scenarios:
            return scenarios
        return [_scenario(f"{name}:{i}", r, tools) for name, tools in servers.items() if tools
                for i, r in enumerate(requests)]
    if isinstance(parsed, list):
        tools = normalize_tools(parsed)
        if not tools:
            raise ValueError(f"{path}: the tool list is empty")
        return [_scenario(f"request:{i}", r, tools) for i, r in enumerate(requests)]
    rows = [orjson.loads(line) for line in data.splitlines() if line.strip()]
    if not rows or not all(isinstance(r, dict) and "function" in r and "question" in r for r in rows):
        raise ValueError(f"{path}: expected MCP-Bench servers JSON, a JSON list of tools, or BFCL JSON Lines")
    answer_file = path.with_name("possible_answer_" + path.name)
    answers = {}
    if answer_file.exists():
        answers = {r["id"]: r["ground_truth"] for r in map(orjson.loads, answer_file.read_bytes().splitlines())}
    scenarios = []
    for row in rows:
        cases = cases_from_rows([row], answers)
        scenario = _bfcl_scenario(cases[0], None) if cases else None
        if scenario is None:  # no usable reference: the agent picks its calls itself
            scenario = _scenario(f"bfcl:{row['id']}", question(row), [bfcl_tool(f) for f in row["function"]])
        scenarios.append(scenario)
    return scenarios
