"""`tracemill eval`: the yardstick every reviser is measured with, on the cases of `tracemill.suites`.

Metrics, per reviser (`none` is the output as sent, i.e. "before"): MCP-Bench's rule-based metrics (JSON validity,
valid tool name rate, input schema compliance), verified-ok rate, agreement with the reference in BFCL's AST manner,
recovery of the cases whose intent survives the faults (and of those only the conversation can recover), confident
wrong answers, the share of valid inputs changed
(must be 0) and latency per revision.
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import click
import orjson

from tracemill.bfcl import ast_match
from tracemill.rates import UNKNOWN, percent, rate
from tracemill.revisers import Reviser, ReviserSpecError, ReviserUnavailable, make_reviser, strict_calls
from tracemill.suites import SUITES, Case, CaseError, load_suite, read_cases
from tracemill.tools import tool_index
from tracemill.verify import Stage, Verdict, verify

DEFAULT_REVISERS = ("none", "json-repair", "rules")


@dataclass(slots=True)
class Result:
    case: str
    reviser: str
    ok: bool
    changed: bool
    match: bool | None
    calls: list[dict[str, Any]]
    stages: list[str | None]
    steps: list[str]
    micros: float


@dataclass(slots=True)
class Metrics:
    reviser: str
    cases: int = 0
    json_valid: float | None = None
    valid_tool_name_rate: float | None = None
    input_schema_compliance: float | None = None
    ok_rate: float | None = None
    reference_match: float | None = None
    recovered: float | None = None
    recoverable_cases: int = 0
    recovered_from_context: float | None = None
    context_cases: int = 0
    wrong_ok: float | None = None
    valid_inputs: int = 0
    valid_changed: float | None = None
    median_us: float | None = None
    p95_us: float | None = None


_ROWS = (
    ("json_valid", "JSON validity", True), ("valid_tool_name_rate", "valid tool name rate", True),
    ("input_schema_compliance", "input schema compliance", True), ("ok_rate", "verified ok", True),
    ("reference_match", "reference match (BFCL AST)", True), ("recovered", "recovered (recoverable faults)", True),
    ("recovered_from_context", "recovered (context-recoverable faults)", True),
    ("wrong_ok", "ok but wrong (lower is better)", True), ("valid_changed", "valid inputs changed (must be 0)", True),
    ("median_us", "median µs per revision", False), ("p95_us", "p95 µs per revision", False),
)


def _metrics(name: str, cases: Sequence[Case], results: Sequence[Result], valid: Sequence[bool],
             verdicts: Sequence[Sequence[Verdict]]) -> Metrics:
    calls = named = compliant = 0
    for case_verdicts, result in zip(verdicts, results, strict=True):
        parsed = [v for v in case_verdicts if v.parsed]
        calls += len(parsed) or 1
        named += sum(v.name_valid for v in parsed)
        compliant += sum(v.name_valid and v.stage is not Stage.SCHEMA for v in parsed)
    with_answers = [(c, r) for c, r in zip(cases, results, strict=True) if r.match is not None]
    recoverable = [r for c, r in with_answers if c.recoverable and c.faults]
    from_context = [r for c, r in with_answers if c.context_recoverable]
    valid_results = [r for r, v in zip(results, valid, strict=True) if v]
    micros = sorted(r.micros for r in results)
    return Metrics(
        reviser=name, cases=len(results),
        json_valid=rate(sum(any(v.parsed for v in vs) for vs in verdicts), len(results)),
        valid_tool_name_rate=rate(named, calls), input_schema_compliance=rate(compliant, named),
        ok_rate=rate(sum(r.ok for r in results), len(results)),
        reference_match=rate(sum(bool(r.match) for _, r in with_answers), len(with_answers)),
        recovered=rate(sum(bool(r.match) for r in recoverable), len(recoverable)), recoverable_cases=len(recoverable),
        recovered_from_context=rate(sum(bool(r.match) for r in from_context), len(from_context)),
        context_cases=len(from_context),
        wrong_ok=rate(sum(r.ok and r.match is False for _, r in with_answers), len(with_answers)),
        valid_inputs=len(valid_results), valid_changed=rate(sum(r.changed for r in valid_results), len(valid_results)),
        median_us=statistics.median(micros) if micros else None,
        p95_us=micros[min(len(micros) - 1, int(len(micros) * 0.95))] if micros else None,
    )


def _micros(value: float | None) -> str:
    return UNKNOWN if value is None else f"{value:.0f}"


@dataclass(slots=True)
class Report:
    suite: str
    cases: int
    broken: int
    metrics: list[Metrics]
    results: list[Result] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"suite": self.suite, "cases": self.cases, "broken_cases": self.broken,
                "revisers": [asdict(m) for m in self.metrics]}

    def rows(self) -> list[tuple[str, list[str]]]:
        rows = []
        for key, label, as_percent in _ROWS:
            values = [getattr(m, key) for m in self.metrics]
            rows.append((label, [percent(v) if as_percent else _micros(v) for v in values]))
        return rows

    def markdown(self) -> str:
        head = "| metric | " + " | ".join(m.reviser for m in self.metrics) + " |"
        rule = "| --- |" + " ---: |" * len(self.metrics)
        body = [f"| {label} | " + " | ".join(values) + " |" for label, values in self.rows()]
        return "\n".join([head, rule, *body])


def evaluate(cases: Sequence[Case], revisers: Mapping[str, Reviser], suite: str = "cases",
             progress: Callable[[int], None] | None = None) -> Report:
    indexes = [tool_index(c.tools) for c in cases]
    valid = []
    for case, index in zip(cases, indexes, strict=True):
        before = strict_calls(case.raw)
        valid.append(before is not None and all(verify(c, index).ok for c in before))
    metrics, results = [], []
    for name, reviser in revisers.items():
        mine, verdicts = [], []
        for case, index in zip(cases, indexes, strict=True):
            start = time.perf_counter()
            revision = reviser(case.raw, index, case.context)
            micros = (time.perf_counter() - start) * 1e6
            answers = case.answers()
            match = ast_match(revision.calls, answers, index) if answers is not None else None
            mine.append(Result(case.id, name, revision.ok, revision.changed, match,
                               [c.to_dict() for c in revision.calls],
                               [v.stage.value if v.stage else None for v in revision.verdicts],
                               [s.kind.value for s in revision.steps], micros))
            verdicts.append(revision.verdicts)
            if progress:
                progress(1)
        metrics.append(_metrics(name, cases, mine, valid, verdicts))
        results.extend(mine)
    return Report(suite, len(cases), sum(not v for v in valid), metrics, results)


@click.command("eval")
@click.option("--cases", "source", default="bfcl", show_default=True,
              help="A JSONL file of cases, or a built-in suite: bfcl, mcp-bench, do-no-harm.")
@click.option("--reviser", "specs", multiple=True,
              help="none | json-repair | rules | endpoint:URL | model:PATH (the train extra). Repeat (or "
                   "comma-separate) to compare side by side. Default: none, json-repair, rules.")
@click.option("--seed", default=0, show_default=True, help="Seed of the built-in suites' faults.")
@click.option("--limit", type=int, help="Only the first N cases.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@click.option("--out", type=click.Path(file_okay=False, path_type=Path),
              help="Write report.json, table.md, cases.jsonl and results.jsonl here.")
def eval_command(source: str, specs: tuple[str, ...], seed: int, limit: int | None, as_json: bool,
                 out: Path | None) -> None:
    """Measure revisers on a case file or a built-in suite."""
    from rich.console import Console
    from rich.progress import Progress
    from rich.table import Table

    from tracemill.console import print_table

    names = [s.strip() for spec in (specs or DEFAULT_REVISERS) for s in spec.split(",") if s.strip()]
    try:
        revisers = {name: make_reviser(name) for name in names}
    except ReviserSpecError as exc:
        raise click.UsageError(str(exc)) from None
    try:
        cases = load_suite(source, seed) if source in SUITES else read_cases(source)
    except (CaseError, OSError) as exc:
        raise click.ClickException(str(exc)) from None
    cases = cases[:limit] if limit is not None else cases
    err = Console(stderr=True)
    with Progress(console=err, transient=True) as bar:
        task = bar.add_task(f"eval {source}", total=len(cases) * len(revisers))
        try:
            report = evaluate(cases, revisers, source, progress=lambda n: bar.advance(task, n))
        except ReviserUnavailable as exc:
            raise click.ClickException(str(exc)) from None
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        (out / "report.json").write_bytes(orjson.dumps(report.to_dict(), option=orjson.OPT_INDENT_2))
        (out / "table.md").write_text(report.markdown() + "\n")
        (out / "cases.jsonl").write_bytes(b"".join(orjson.dumps(c.to_dict()) + b"\n" for c in cases))
        (out / "results.jsonl").write_bytes(b"".join(orjson.dumps(asdict(r)) + b"\n" for r in report.results))
    if as_json:
        click.echo(json.dumps(report.to_dict(), indent=2))
        return
    table = Table(title=f"{source}: {report.cases} cases, {report.broken} not valid as sent")
    table.add_column("metric")
    for m in report.metrics:
        table.add_column(m.reviser, justify="right")
    for label, values in report.rows():
        table.add_row(label, *values)
    print_table(table)
