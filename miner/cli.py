"""`tracemill failures` and `tracemill mine`: the miner's commands."""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import datetime
from typing import Any

import click

from tracemill.rates import percent
from tracemill.store.cli import DATE, call_filter_options, database_option, resolve_db
from tracemill.store.queries import CallFilter


def open_store(db_url: str | None, where: CallFilter | None = None) -> Any:
    """The store's engine, or a one-line error naming the store when it cannot be read or is no Tracemill store, or
    naming the filter value no stored call has."""
    from sqlalchemy.exc import SQLAlchemyError

    from tracemill.store.engine import make_engine
    from tracemill.store.migrate import current_revision
    from tracemill.store.queries import FilterError, check_filter

    engine = make_engine(resolve_db(db_url))
    shown = engine.url.render_as_string(hide_password=True)
    try:
        revision = current_revision(engine)
        if revision is None:
            raise click.ClickException(f"no Tracemill store at {shown} (start the collector on it, or run "
                                       "`tracemill db upgrade`)")
        if where is not None:
            with engine.connect() as conn:
                check_filter(conn, where)
    except FilterError as exc:
        raise click.ClickException(str(exc)) from None
    except SQLAlchemyError as exc:
        detail = str(getattr(exc, "orig", exc)).strip().splitlines()[0]
        raise click.ClickException(f"cannot read the store at {shown}: {detail}") from None
    return engine


def _split(value: str) -> tuple[str, ...]:
    return tuple(p.strip() for p in value.split(",") if p.strip())


@click.command()
@database_option
@call_filter_options
@click.option("--since", type=DATE, help="Only calls stored at or after this date (UTC).")
@click.option("--until", type=DATE, help="Only calls stored before this date (UTC).")
@click.option("--by", "by", default="tool,stage,kind,pointer", show_default=True,
              help="What a mode is made of: any of tool, stage, kind, pointer (comma-separated).")
@click.option("--limit", type=click.IntRange(min=1), default=30, show_default=True, help="The most frequent modes.")
@click.option("--compare", nargs=2, metavar="A B", help="Two harness versions side by side, with a significance "
              "test of each mode's rate.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object.")
@click.option("--markdown", is_flag=True, help="A Markdown table.")
def failures(db_url: str | None, where: CallFilter, since: datetime | None, until: datetime | None, by: str,
             limit: int, compare: tuple[str, str] | None, as_json: bool, markdown: bool) -> None:
    """Failure modes: failed calls clustered by tool, verifier stage and violation, most frequent first, with their
    share of calls, a trend per day and the split by model and harness version. Which tool description or prompt to
    change first, and (--compare OLD NEW) whether a harness version made a mode rarer."""
    from tracemill.miner.failures import GROUP_FIELDS, compare_harness, failure_report

    fields = _split(by)
    if not fields or set(fields) - set(GROUP_FIELDS):
        raise click.BadParameter(f"use any of {', '.join(GROUP_FIELDS)}", param_hint="--by")
    where = replace(where, since=since, until=until)
    engine = open_store(db_url, replace(where, harness_version=None) if compare else where)
    if compare:
        for version in compare:
            open_store(db_url, replace(where, harness_version=version))
        rows = compare_harness(engine, compare[0], compare[1], where, by=fields)[:limit]
        _print_comparison(rows, compare, as_json, markdown)
        return
    report = failure_report(engine, where, by=fields, limit=limit)
    if as_json:
        click.echo(json.dumps(report.to_dict(), indent=2))
        return
    days = list(report.calls_by_day)
    heads = ["mode", "calls", "share", "trend per day", "models", "harness versions"]
    body = []
    for m in report.modes:
        trend = " ".join(percent(m.by_day.get(d, 0) / n if n else None) for d, n in report.calls_by_day.items())
        body.append([m.label, str(m.count), percent(m.share), trend, _split_counts(m.by_model),
                     _split_counts(m.by_harness)])
    title = (f"{report.failed_calls} of {report.total_calls} calls failed"
             + (f"; days {days[0]} .. {days[-1]}" if days else ""))
    _print_table(title, heads, body, markdown)


def _split_counts(counts: dict[str, int]) -> str:
    return ", ".join(f"{k} {v}" for k, v in list(counts.items())[:4]) + (" ..." if len(counts) > 4 else "")


def _print_comparison(rows: list[Any], versions: tuple[str, str], as_json: bool, markdown: bool) -> None:
    a, b = versions
    if as_json:
        click.echo(json.dumps({"a": a, "b": b, "modes": [r.to_dict() for r in rows]}, indent=2))
        return
    heads = ["mode", f"{a} rate", f"{b} rate", "p-value", "change"]
    body = [[r.label, f"{percent(r.rate_a)} ({r.count_a}/{r.calls_a})", f"{percent(r.rate_b)} ({r.count_b}/{r.calls_b})",
             f"{r.p_value:.2g}", r.change] for r in rows]
    _print_table(f"harness {a} against {b}", heads, body, markdown)


def _print_table(title: str, heads: list[str], body: list[list[str]], markdown: bool) -> None:
    if markdown:
        lines = ["| " + " | ".join(heads) + " |", "| --- |" + " ---: |" * (len(heads) - 1)]
        lines += ["| " + " | ".join(row) + " |" for row in body]
        click.echo("\n".join(lines))
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title)
    for i, head in enumerate(heads):
        table.add_column(head, justify="left" if i == 0 else "right", overflow="fold")
    for row in body:
        table.add_row(*row)
    Console().print(table)

