"""`tracemill failures` and `tracemill mine`: the miner's commands."""

from __future__ import annotations

import json
import os
from dataclasses import replace
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
from sqlalchemy import Engine, func, select

from tracemill.rates import percent, rate, sparkline
from tracemill.store.cli import DATE, call_filter_options, database_option, read_store
from tracemill.store.queries import SIDECAR_SERVICE, CallFilter

if TYPE_CHECKING:
    import openai

TREND_BARS = 15  # a month in two-day bars: an 80-column terminal keeps the counts and rates beside them


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
    from tracemill.miner.failures import GROUP_FIELDS, compare_harness, failure_report, sidecar_versions

    fields = _split(by)
    if not fields or set(fields) - set(GROUP_FIELDS):
        raise click.BadParameter(f"use any of {', '.join(GROUP_FIELDS)}", param_hint="--by")
    where = replace(where, since=since, until=until)
    engine = read_store(db_url, replace(where, harness_version=None) if compare else where)
    if compare:
        for version in compare:
            read_store(db_url, replace(where, harness_version=version))
        behind = sidecar_versions(engine, compare, where)
        rows = compare_harness(engine, compare[0], compare[1], where, by=fields, behind=behind)[:limit]
        _print_comparison(rows, compare, sorted(behind), as_json, markdown)
        return
    report = failure_report(engine, where, by=fields, limit=limit)
    if as_json:
        click.echo(json.dumps(report.to_dict(), indent=2))
        return
    days = list(report.calls_by_day)
    heads = ["mode", "calls", "share", "trend per day", "models", "harness versions"]
    body = [[m.label, str(m.count), percent(m.share), _trend(m.by_day, report.calls_by_day),
             _split_counts(m.by_model), _split_counts(m.by_harness)] for m in report.modes]
    title = (f"{report.failed_calls} of {report.total_calls} calls failed"
             + (f"; days {days[0]} .. {days[-1]}" if days else ""))
    _print_table(title, heads, body, markdown, folding={0, 4, 5})
    sidecar = _sidecar_calls(engine, where)
    if 0 < sidecar < report.total_calls:
        click.echo(f"\n{sidecar} of the {report.total_calls} calls are the reviser sidecar's record (service "
                   f"{SIDECAR_SERVICE}: the model's answers as sent, and its revisions as the model "
                   "tracemill-reviser:VERSION), beside what the agent got; --service picks one record.")


def _sidecar_calls(engine: Engine, where: CallFilter) -> int:
    """Of the calls `where` selects, the reviser sidecar's (none where it selects a service)."""
    if where.service is not None:
        return 0
    with engine.connect() as conn:
        return int(conn.execute(replace(where, service=SIDECAR_SERVICE).apply(select(func.count()))).scalar_one())


def _trend(by_day: dict[str, int], calls_by_day: dict[str, int], bars: int = TREND_BARS) -> str:
    """A mode's rate day by day as a sparkline (consecutive days grouped where there are more than `bars`), then its
    rate on the first and on the last of them; every day's count is in --json."""
    days = list(calls_by_day)
    if not days:
        return ""
    size = -(-len(days) // bars)
    runs = [days[i:i + size] for i in range(0, len(days), size)]
    rates = [rate(sum(by_day.get(d, 0) for d in run), sum(calls_by_day[d] for d in run)) for run in runs]
    return f"{sparkline(rates)} {percent(rates[0])}→{percent(rates[-1])}"


def _split_counts(counts: dict[str, int]) -> str:
    return ", ".join(f"{k} {v}" for k, v in list(counts.items())[:4]) + (" ..." if len(counts) > 4 else "")


def _print_comparison(rows: list[Any], versions: tuple[str, str], behind: list[str], as_json: bool,
                      markdown: bool) -> None:
    """`behind`: the versions read from the reviser sidecar's record (`failures.sidecar_versions`)."""
    a, b = versions
    if as_json:
        click.echo(json.dumps({"a": a, "b": b, "sidecar_record": behind, "modes": [r.to_dict() for r in rows]},
                              indent=2))
        return
    heads = ["mode", f"{a} rate", f"{b} rate", "p-value", "change"]
    body = [[r.label, f"{percent(r.rate_a)} ({r.count_a}/{r.calls_a})",
             f"{percent(r.rate_b)} ({r.count_b}/{r.calls_b})", f"{r.p_value:.2g}", r.change] for r in rows]
    read = (f"; {' and '.join(behind)} read from the reviser sidecar's record (the model's answers as sent)"
            if behind else "")
    _print_table(f"harness {a} against {b}{read}", heads, body, markdown, folding={0})


def _print_table(title: str, heads: list[str], body: list[list[str]], markdown: bool, folding: set[int]) -> None:
    """A rich table, or Markdown; the columns in `folding` (labels, lists) fold where the terminal is narrow, the
    others (counts, rates, trends) are kept whole."""
    if markdown:
        lines = [_cell(title), "", "| " + " | ".join(map(_cell, heads)) + " |",
                 "| " + " | ".join("---" if i in folding else "---:" for i in range(len(heads))) + " |"]
        lines += ["| " + " | ".join(map(_cell, row)) + " |" for row in body]
        click.echo("\n".join(lines))
        return
    from rich.markup import escape
    from rich.table import Table

    from tracemill.console import print_table

    table = Table(title=escape(title))  # tool, model and harness names come from traces: `[/x]` is not markup
    for i, head in enumerate(heads):
        table.add_column(escape(head), justify="left" if i in folding else "right", no_wrap=i not in folding,
                         overflow="fold")
    for row in body:
        table.add_row(*map(escape, row))
    print_table(table)


def _cell(text: str) -> str:
    """Text as one Markdown table cell: a `|` escaped, line breaks made spaces (names come from traces)."""
    return " ".join(text.replace("\\", "\\\\").replace("|", "\\|").split())



class SinceType(click.ParamType):
    """`last` (what is new since the previous export) or a date."""

    name = "last|DATE"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> str | datetime:
        if value == "last" or isinstance(value, datetime):
            return value
        return DATE.convert(value, param, ctx)


@click.command()
@database_option
@click.option("--out", type=click.Path(path_type=Path), required=True,
              help="The export folder (train.jsonl, eval.jsonl, Parquet beside them, dataset.json).")
@click.option("--since", type=SinceType(), help="`last`: only calls stored since the previous export read; or a date.")
@call_filter_options
@click.option("--eval-after", type=DATE, help="Eval is the traces that began at or after this date (UTC); "
              "default: a hashed share of the traces.")
@click.option("--eval-share", type=click.FloatRange(0, 1), default=0.1, show_default=True,
              help="Share of traces in eval (without --eval-after).")
@click.option("--valid-share", type=click.FloatRange(0, 1), default=0.2, show_default=True,
              help="Share of the rows that are valid calls, labelled valid.")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the split and the valid sample.")
@click.option("--max-tools", type=click.IntRange(min=1), default=4, show_default=True,
              help="Tools a prompt shows: those the output names, then their nearest neighbours.")
@click.option("--budget-tokens", type=click.IntRange(min=16), default=1024, show_default=True,
              help="Tokens of conversation a prompt keeps (newest turns, the user's last request always).")
@click.option("--workers", type=click.IntRange(min=1), default=lambda: min(os.cpu_count() or 1, 8),
              show_default="one per core, up to 8", help="Processes, each mining a share of the traces (the "
              "export is the same for any number).")
@click.option("--json", "as_json", is_flag=True, help="Print the card as JSON.")
def mine(db_url: str | None, out: Path, since: str | datetime | None, where: CallFilter,
         eval_after: datetime | None, eval_share: float, valid_share: float, seed: int, max_tools: int,
         budget_tokens: int, workers: int, as_json: bool) -> None:
    """Export failed tool calls (and a share of valid ones) as RL prompts for the reviser's GRPO training.

    Each row has the reviser's prompt, the call's verdict and failure class, and a reference with its provenance
    (gold: a reviewer; silver: the agent's own later repair; bronze: the deterministic reviser). Train and eval never
    share a trace. The export is recorded in the store's `datasets` table."""
    from rich.progress import Progress

    from tracemill.miner.export import ExportError, MineOptions, check_out
    from tracemill.miner.export import mine as run
    from tracemill.reviser_prompt import PromptSettings
    from tracemill.store.queries import StoreBusyError, count_calls

    try:
        check_out(out)
    except ExportError as exc:
        raise click.ClickException(str(exc)) from None
    if isinstance(since, datetime):
        where = replace(where, since=since)
    engine = read_store(db_url, where)
    options = MineOptions(where=where, since_last=since == "last", eval_after=eval_after, eval_share=eval_share,
                          valid_share=valid_share, seed=seed, workers=workers,
                          prompt=PromptSettings(max_tools=max_tools, budget_tokens=budget_tokens))
    with engine.connect() as conn:
        total = count_calls(conn, where)
    with Progress(transient=True, disable=as_json) as bar:
        task = bar.add_task("mining", total=total)
        try:
            result = run(engine, out, options, progress=lambda n: bar.advance(task, n))
        except (ExportError, StoreBusyError) as exc:
            raise click.ClickException(str(exc)) from None
    card = result.card
    if as_json:
        click.echo(json.dumps(card, indent=2))
        return
    provenance = ", ".join(f"{k} {v}" for k, v in card["counts"]["provenance"].items())
    click.echo(f"{result.path}: {result.rows['train']} train and {result.rows['eval']} eval rows from "
               f"{card['calls_read']} calls (dataset {result.dataset_id}; references: {provenance or 'none'}; "
               f"{card['duplicates_dropped']} duplicates dropped)")


@click.command("mine-agent")
@database_option
@click.option("--base-url", required=True, help="The model's OpenAI-compatible endpoint (vLLM, Ollama, a hosted "
              "API), e.g. http://127.0.0.1:8000/v1. Its key: TRACEMILL_MINER_API_KEY.")
@click.option("--model", "model_name", required=True, help="The model's name at that endpoint.")
@click.option("--reader-db", metavar="URL", help="PostgreSQL: a URL that logs in as a read-only role. Default: the "
              "role tracemill_reader, made (or refreshed) with the --db role.")
@click.option("--task", default=None, help="What to investigate (default: the general brief).")
@click.option("--max-steps", type=click.IntRange(min=2), default=40, show_default=True)
@click.option("--expire-after-days", type=click.IntRange(min=1), default=14, show_default=True,
              help="Findings not seen again within this many days expire.")
@click.option("--json", "as_json", is_flag=True, help="Print what the run did as JSON.")
def mine_agent(db_url: str | None, base_url: str, model_name: str, reader_db: str | None, task: str | None,
               max_steps: int, expire_after_days: int, as_json: bool) -> None:
    """An LLM agent that investigates the store through read-only tools (one SELECT at a time, text search, paged
    traces and spans, the failure clusters) and records findings rules cannot label, consolidated by key."""
    from datetime import timedelta

    import openai
    from langchain_openai import ChatOpenAI

    from tracemill.miner.agent import TASK, run_agent
    from tracemill.miner.findings import list_findings
    from tracemill.miner.readonly import QueryRefused, open_reader
    from tracemill.settings import get_settings

    engine = read_store(db_url)
    try:
        reader = open_reader(engine, reader_db)
    except QueryRefused as exc:
        raise click.ClickException(str(exc)) from None
    model = ChatOpenAI(model=model_name, base_url=base_url, api_key=get_settings().miner_api_key or "EMPTY",
                       temperature=0)
    try:
        run = run_agent(model, reader, engine, task=task or TASK, max_steps=max_steps,
                        expire_after=timedelta(days=expire_after_days))
    except openai.APIError as exc:
        raise click.ClickException(_endpoint_error(base_url, model_name, exc)) from None
    if as_json:
        click.echo(json.dumps({"recorded": run.recorded, "merged": run.merged, "refused": run.refused,
                               "expired": run.expired, "steps": run.steps, "answer": run.answer,
                               "open_findings": [f.to_dict() for f in list_findings(engine)]}, indent=2, default=str))
        return
    click.echo(f"{run.steps} steps; findings recorded: {len(run.recorded)}, merged: {len(run.merged)}, "
               f"expired: {run.expired}; tool requests refused: {len(run.refused)}")
    for finding in list_findings(engine):
        click.echo(f"  [{finding.seen}x] {finding.key}: {finding.hypothesis}")


def _endpoint_error(base_url: str, model_name: str, error: openai.APIError) -> str:
    """One line on why the model endpoint failed the agent (`error`: the OpenAI client's): what the endpoint said, or
    why it could not be reached. Findings recorded before it stay recorded."""
    import openai

    if isinstance(error, openai.APIStatusError):
        body = error.body.get("message", error.body) if isinstance(error.body, dict) else error.body
        said = str(body or error.message).strip().splitlines()[0]
        return f"the model endpoint {base_url} answered {error.status_code} for model {model_name!r}: {said}"
    cause = f" ({error.__cause__})" if error.__cause__ is not None else ""
    return f"cannot reach the model endpoint {base_url}: {error.message}{cause}"
