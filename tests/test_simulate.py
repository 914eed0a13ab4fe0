"""`tracemill simulate` against a real collector: the workload follows its profile, records its ground truth, and a
seed always sends the same spans."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from tracemill.faults import KINDS, PROFILES
from tracemill.simulate import simulate
from tracemill.simulate.harness import factors
from tracemill.simulate.scenarios import mcp_bench_scenarios
from tracemill.store.engine import make_engine
from tracemill.store.payloads import resolve
from tracemill.store.tables import SpanRow
from tracemill.verify import verify

from support import free_port

pytestmark = pytest.mark.timeout(60)

START_NS = 1_780_000_000_000_000_000


def tracemill(*args: str) -> str:
    done = subprocess.run([sys.executable, "-m", "tracemill.cli", *args], capture_output=True, text=True, timeout=50)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def _spans(db_url: str) -> list[Any]:
    engine = make_engine(db_url)
    with engine.connect() as conn:
        rows = [(t, s, name, resolve(conn, attributes)) for t, s, name, attributes in conn.execute(
            select(SpanRow.trace_id, SpanRow.span_id, SpanRow.name, SpanRow.attributes)
            .order_by(SpanRow.trace_id, SpanRow.span_id))]
    engine.dispose()
    return rows


def test_fault_rates_follow_the_profile(start_collector, sqlite_url: str) -> None:
    collector = start_collector(sqlite_url)
    summary = simulate(collector.url, traces=500, seed=3, profile="llama3.1-8b", start_ns=START_NS)
    rates = PROFILES["llama3.1-8b"].rates
    # kinds that apply to every call and that no other kind excludes are drawn at exactly the profile's rate
    for kind in ("python_tag", "pythonic", "prose", "fence"):
        n, p = summary.outputs, rates[kind]
        assert abs(summary.faults[kind] / n - p) < 4 * math.sqrt(p * (1 - p) / n), kind
    assert set(summary.faults) <= set(KINDS)
    assert summary.retries > 0 and summary.domains["legal"] > 0 and summary.domains["medical"] > 0

    spans = _spans(sqlite_url)
    assert len(spans) == summary.spans
    chats = [a for _, _, name, a in spans if name.startswith("chat") and "tracemill.sim.intended" in a]
    assert len(chats) == summary.outputs
    assert sum(len(a["tracemill.sim.faults"]) for a in chats) == sum(summary.faults.values())
    # what a context fault lost, the user said just before the model call: the case is recoverable from the prompt
    hinted = [(a, [f["hint"] for f in json.loads(a["tracemill.sim.fault_details"]) if f["hint"]]) for a in chats]
    hinted = [(a, hints) for a, hints in hinted if hints]
    assert len(hinted) > 20
    for attrs, hints in hinted:
        users = [m for m in json.loads(attrs["gen_ai.input.messages"]) if m["role"] == "user"]
        assert users[-1]["parts"][0]["content"] == " ".join(hints)
    # the recorded intended call is a valid call to a tool the model was offered: the ground truth for repairs
    for attrs in chats[:200]:
        tools = [{"name": t["name"], "inputSchema": t["parameters"]}
                 for t in json.loads(attrs["gen_ai.tool.definitions"])]
        for call in json.loads(attrs["tracemill.sim.intended"]):
            assert verify(call, tools).ok


def test_a_seed_always_sends_the_same_spans(start_collector, tmp_path: Path) -> None:
    dbs = [f"sqlite:///{tmp_path / f'run{run}.db'}" for run in (0, 1)]
    collectors = [start_collector(db) for db in dbs]
    for collector in collectors:
        simulate(collector.url, traces=40, seed=11, start_ns=START_NS)
    first, second = (_spans(db) for db in dbs)
    assert first == second
    # another seed sends other traces: none of them is mistaken for a duplicate
    summary = simulate(collectors[0].url, traces=40, seed=12, start_ns=START_NS)
    assert len(_spans(dbs[0])) == len(first) + summary.spans


def test_generated_arguments_are_valid_for_every_mcp_bench_tool() -> None:
    import random

    from tracemill.examples import request_words, sampled_arguments

    rng = random.Random(5)
    for scenario in mcp_bench_scenarios():
        words = request_words(scenario.request)
        for tool in scenario.tools:
            verdict = verify({"name": tool.name, "arguments": sampled_arguments(tool.input_schema, words, rng)},
                             scenario.tools)
            assert verdict.ok, (tool.name, verdict.violations)


def test_an_unreachable_collector_is_a_clear_error() -> None:
    done = subprocess.run([sys.executable, "-m", "tracemill.cli", "simulate", "--endpoint",
                           f"http://127.0.0.1:{free_port()}", "--traces", "5"], capture_output=True, text=True,
                          timeout=30)
    assert done.returncode == 1
    assert "cannot reach the collector" in done.stderr and "0 spans were delivered" in done.stderr


def test_simulate_over_your_own_tools(start_collector, sqlite_url: str, tmp_path: Path) -> None:
    tools = [{"name": "get_weather", "description": "Current weather.", "inputSchema": {
        "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer", "minimum": 1}},
        "required": ["city"], "additionalProperties": False}}]
    (tmp_path / "tools.json").write_text(json.dumps(tools))
    bfcl = tmp_path / "BFCL_v4_simple_python.json"
    rows = (Path(__file__).parents[1] / "tracemill/data/bfcl" / bfcl.name).read_text().splitlines()[:5]
    bfcl.write_text("\n".join(rows) + "\n")  # no possible_answer file beside it: the agent picks its own calls

    collector = start_collector(sqlite_url)
    mine = simulate(collector.url, traces=30, seed=1, tools_file=tmp_path / "tools.json", start_ns=START_NS)
    theirs = simulate(collector.url, traces=30, seed=1, tools_file=bfcl, start_ns=START_NS)
    offered = {a["gen_ai.tool.definitions"] for _, _, name, a in _spans(sqlite_url) if name.startswith("chat")}
    assert mine.calls > 0 and theirs.calls > 0
    names = {t["name"] for text in offered for t in json.loads(text)}
    assert "get_weather" in names and len(names) > 1


def test_a_harness_change_makes_its_faults_rarer_and_later_versions_plateau(start_collector, sqlite_url: str) -> None:
    collector = start_collector(sqlite_url)
    summaries = {version: simulate(collector.url, traces=400, seed=5, profile="llama3.1-8b", start_ns=START_NS,
                                   harness_version=version)
                 for version in ("prompt-v1", "prompt-v3", "prompt-v5")}

    def share(version: str, kinds: tuple[str, ...]) -> float:
        return sum(summaries[version].faults[k] for k in kinds) / summaries[version].outputs

    names, text = ("tool_name_case", "tool_name_separator", "tool_name_prefix"), ("prose", "fence")
    assert share("prompt-v3", names) < share("prompt-v1", names) / 2  # prompt-v2's change is kept by prompt-v3
    assert share("prompt-v3", text) < share("prompt-v1", text) / 2
    kept = ("missing_required", "truncated", "omitted_value", "swapped_args")  # no harness change is about these
    n = summaries["prompt-v1"].outputs
    assert abs(share("prompt-v5", kept) - share("prompt-v1", kept)) < 4 * math.sqrt(share("prompt-v1", kept) / n)
    assert factors("prompt-v6") == factors("prompt-v4") == factors("prompt-v5")  # the plateau
    assert factors("my-own-harness") == factors("prompt-v1") == {}
