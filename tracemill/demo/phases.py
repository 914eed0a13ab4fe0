"""What each phase of the demo sent, and the MCP-Bench figures of what the agent got in it, read back from the store.

A phase is a stretch of time: its figures are those of the calls the collector stored between its start and its end
whose spans came from the demo's agent (its service and harness version), not from the sidecar's record."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Engine

from tracemill.rates import percent
from tracemill.stats import Metrics, compute
from tracemill.store.queries import CallFilter

COLUMNS = (("valid_tool_name_rate", "valid tool name"), ("input_schema_compliance", "schema compliance"),
           ("execution_success_rate", "execution success"), ("valid_call_failure_rate", "valid-call failure"))


@dataclass(frozen=True, slots=True)
class Phase:
    name: str  # baseline | rules | model
    served_by: str  # what stood between the agent and the model: "no sidecar", "sidecar: rules", ...
    since: datetime
    until: datetime
    episodes: int
    requests: int
    revised: int  # answers the sidecar revised
    by_model: int  # answers a model reviser wrote
    metrics: Metrics

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "served_by": self.served_by, "since": self.since.isoformat(),
                "until": self.until.isoformat(), "episodes": self.episodes, "requests": self.requests,
                "revised": self.revised, "by_model": self.by_model, "metrics": asdict(self.metrics)}


AGENT_SERVICE = "demo-agent"


def agent_calls(harness_version: str, since: datetime, until: datetime) -> CallFilter:
    return CallFilter(since=since, until=until, harness_version=harness_version, service=AGENT_SERVICE)


def measure(engine: Engine, harness_version: str, since: datetime, until: datetime) -> Metrics:
    return compute(engine, where=agent_calls(harness_version, since, until))[0]


def table(phases: list[Phase]):  # type: ignore[no-untyped-def]
    """The before/after table (a rich Table)."""
    from rich.table import Table

    out = Table(title="What the agent got: MCP-Bench's rule-based metrics over its tool calls, per phase")
    for header in ("phase", "between agent and model", "episodes", "tool calls", "answers revised", "by the model"):
        out.add_column(header, justify="left" if header.startswith(("phase", "between")) else "right",
                       no_wrap=header.startswith("between"))
    for _, label in COLUMNS:
        out.add_column(label, justify="right")
    for p in phases:
        out.add_row(p.name, p.served_by, str(p.episodes), str(p.metrics.total_calls), str(p.revised), str(p.by_model),
                    *(percent(getattr(p.metrics, key)) for key, _ in COLUMNS))
    return out
