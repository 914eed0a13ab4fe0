"""MCP-Bench's rule-based metrics over the stored tool calls (`tracemill stats`).

- valid_tool_name_rate: calls whose name is among the tools offered / calls whose offered tools are known
- input_schema_compliance: valid-name calls whose arguments pass the tool's input schema / valid-name calls
- execution_success_rate: calls that ran successfully / calls whose outcome is known. A call that could not be
  parsed or named a tool that was not offered cannot have run: it counts as a failure.
- valid_call_failure_rate: valid-name calls that failed to run / valid-name calls whose outcome is known (arguments
  that could not be parsed count as a failure, as above)
A rate with nothing to divide by is null; so are both execution rates while no call they count has a known execution
(a store that holds no execution data at all says nothing about executions, not that every call failed).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, replace
from datetime import datetime
from typing import Any

import click
from sqlalchemy import Engine, and_, case, func, or_, select

from tracemill.rates import percent, rate
from tracemill.store.cli import DATE, call_filter_options, database_option, read_store
from tracemill.store.queries import CallFilter
from tracemill.store.tables import ToolCallRow as C

GROUPS = {"model": C.model, "tool": C.name, "harness": C.harness_version, "domain": C.domain,
          "service": C.service_name}


@dataclass(frozen=True, slots=True)
class Metrics:
    valid_tool_name_rate: float | None
    input_schema_compliance: float | None
    execution_success_rate: float | None
    valid_call_failure_rate: float | None
    total_calls: int


def _count(condition: Any) -> Any:
    return func.coalesce(func.sum(case((condition, 1), else_=0)), 0)


_CANNOT_RUN = or_(C.parsed.is_(False), C.name_valid.is_(False))
_OUTCOME_KNOWN = or_(C.execution_status.is_not(None), _CANNOT_RUN)
_COLUMNS = (
    func.count().label("total"),
    _count(C.name_valid.is_not(None)).label("named"),
    _count(C.name_valid.is_(True)).label("valid_name"),
    _count(and_(C.name_valid.is_(True), C.schema_valid.is_(True))).label("compliant"),
    _count(_OUTCOME_KNOWN).label("outcome_known"),
    _count(C.execution_status.is_not(None)).label("executed"),
    _count(C.execution_status == "success").label("succeeded"),
    _count(and_(C.name_valid.is_(True), C.execution_status.is_not(None))).label("valid_executed"),
    _count(and_(C.name_valid.is_(True), _OUTCOME_KNOWN)).label("valid_known"),
    _count(and_(C.name_valid.is_(True), or_(C.execution_status == "error", _CANNOT_RUN))).label("valid_failed"),
)


def _metrics(row: Any) -> Metrics:
    return Metrics(
        valid_tool_name_rate=rate(row.valid_name, row.named),
        input_schema_compliance=rate(row.compliant, row.valid_name),
        execution_success_rate=rate(row.succeeded, row.outcome_known) if row.executed else None,
        valid_call_failure_rate=rate(row.valid_failed, row.valid_known) if row.valid_executed else None,
        total_calls=row.total,
    )


def compute(engine: Engine, by: str | None = None,
            where: CallFilter = CallFilter()) -> tuple[Metrics, dict[str, Metrics]]:
    with engine.connect() as conn:
        overall = _metrics(conn.execute(where.apply(select(*_COLUMNS).select_from(C))).one())
        groups: dict[str, Metrics] = {}
        if by:
            key = GROUPS[by]
            grouped = where.apply(select(key.label("key"), *_COLUMNS)).group_by(key).order_by(key)
            for row in conn.execute(grouped):
                groups["(none)" if row.key is None else str(row.key)] = _metrics(row)
    return overall, groups


@click.command()
@database_option
@click.option("--by", type=click.Choice(sorted(GROUPS)), help="Also give the figures per model, tool, harness "
              "version, domain or service (behind the reviser sidecar: tracemill-serve, the model's answers as sent, "
              "beside the agent's, what it got).")
@call_filter_options
@click.option("--since", type=DATE, help="Only calls stored at or after this date (UTC).")
@click.option("--until", type=DATE, help="Only calls stored before this date (UTC).")
@click.option("--json", "as_json", is_flag=True, help="One JSON object: the five overall figures, plus `groups`.")
def stats(db_url: str | None, by: str | None, where: CallFilter, since: datetime | None, until: datetime | None,
          as_json: bool) -> None:
    """MCP-Bench's rule-based metrics over the stored tool calls.

    valid_tool_name_rate, input_schema_compliance, execution_success_rate, valid_call_failure_rate and total_calls;
    see `tracemill.stats` for how each is counted."""
    where = replace(where, since=since, until=until)
    engine = read_store(db_url, where)
    overall, groups = compute(engine, by, where)
    if as_json:
        click.echo(json.dumps({**asdict(overall), "groups": {k: asdict(v) for k, v in groups.items()}}, indent=2))
        return
    from rich.table import Table

    from tracemill.console import print_table

    table = Table(title="Tool calls (MCP-Bench rule-based metrics)")
    table.add_column("group", no_wrap=True)
    for heading in ("calls", "valid tool name", "schema compliance", "execution success", "valid-call failure"):
        table.add_column(heading, justify="right")
    rows = [("all", overall)] + ([] if not by else [(f"{by}={k}", v) for k, v in groups.items()])
    for label, m in rows:
        table.add_row(label, str(m.total_calls), percent(m.valid_tool_name_rate), percent(m.input_schema_compliance),
                      percent(m.execution_success_rate), percent(m.valid_call_failure_rate))
    print_table(table)
