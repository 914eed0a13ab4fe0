"""`tracemill simulate`: a realistic agent workload, sent to a collector through the SDK's span encoding.

Episodes are drawn from MCP-Bench's task scenarios (and BFCL's rows, legal ones included), written by a weak open
model whose faults come from `tracemill.faults`, and delivered without loss. Everything but the timestamps is fixed by
the seed, the profile and the harness version, trace and span ids included, so a re-run stores nothing twice.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Sequence
from functools import lru_cache
from pathlib import Path

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider

from tracemill.faults import PROFILES
from tracemill.sdk.genai import HARNESS_VERSION
from tracemill.simulate.delivery import Delivery, DeliveryError
from tracemill.simulate.episodes import Episode, SeededIds, Settings, Summary
from tracemill.simulate.harness import under_harness
from tracemill.simulate.scenarios import Scenario, bfcl_scenarios, file_scenarios, legal_scenarios, mcp_bench_scenarios
from tracemill.tools import tool_index

__all__ = ["DeliveryError", "Summary", "default_sources", "simulate"]

EPISODE_SPACING_MS = 1500  # simulated time between episode starts


@lru_cache(maxsize=1)
def default_sources() -> tuple[tuple[float, tuple[Scenario, ...]], ...]:
    """(share, scenarios): MCP-Bench tasks, BFCL's legal rows, the package's general BFCL rows."""
    return ((0.8, tuple(mcp_bench_scenarios())), (0.1, tuple(legal_scenarios())), (0.1, tuple(bfcl_scenarios())))


def simulate(
    endpoint: str,
    *,
    traces: int = 100,
    seed: int = 0,
    profile: str = "llama3.1-8b",
    tools_file: Path | None = None,
    harness_version: str = "sim-1",
    api_key: str | None = None,
    tool_error_rate: float = 0.05,
    start_ns: int | None = None,
    on_episode: Callable[[int], None] | None = None,
) -> Summary:
    """Send `traces` episodes to the collector at `endpoint` and return once every span is delivered (raises
    `DeliveryError` otherwise). The returned Summary holds the figures `tracemill stats` should then report."""
    if profile not in PROFILES:
        raise ValueError(f"unknown model profile {profile!r}; known: {', '.join(sorted(PROFILES))}")
    chosen = ((1.0, tuple(file_scenarios(tools_file))),) if tools_file is not None else default_sources()
    sources = [(share, scenarios) for share, scenarios in chosen if scenarios]
    if not sources:
        raise ValueError("no scenarios to simulate")
    settings = Settings(under_harness(PROFILES[profile], harness_version), tool_error_rate=tool_error_rate)
    indexes = {id(s): tool_index(s.tools) for _, scenarios in sources for s in scenarios}
    ids = SeededIds()
    delivery = Delivery(endpoint, api_key=api_key)
    provider = TracerProvider(
        resource=Resource.create({"service.name": "tracemill-simulate", HARNESS_VERSION: harness_version,
                                  "tracemill.sim.profile": profile, "tracemill.sim.seed": seed}),
        id_generator=ids, shutdown_on_exit=False)
    provider.add_span_processor(delivery)
    tracer = provider.get_tracer("tracemill.simulate")
    if start_ns is None:
        start_ns = time.time_ns() - traces * EPISODE_SPACING_MS * 1_000_000
    key = f"{seed}:{profile}:{harness_version}:{tools_file.name if tools_file else 'default'}"
    summary = Summary()
    shares = [share for share, _ in sources]
    try:
        for i in range(traces):
            rng = random.Random(f"{key}:{i}")
            ids.rng = random.Random(f"ids:{key}:{i}")
            scenarios: Sequence[Scenario] = rng.choices([s for _, s in sources], weights=shares)[0]
            scenario = rng.choice(scenarios)
            Episode(tracer, scenario, settings, rng, start_ns + i * EPISODE_SPACING_MS * 1_000_000, summary,
                    indexes[id(scenario)]).run(conversation_id=f"sim-{ids.rng.getrandbits(64):016x}")
            if on_episode is not None:
                on_episode(i + 1)
    finally:
        try:
            delivery.close()
        finally:
            provider.shutdown()
    return summary
