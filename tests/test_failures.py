"""`tracemill.miner.failures` and `tracemill failures` on calls the collector's writer stored, on SQLite and
PostgreSQL: modes ranked by count with their shares, trends and splits; counts kept between reads (and the trace
explorer's filter values, kept the same way) that read only new calls; two harness versions compared with a test that
calls a real drop significant and noise not."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Callable

import pytest
from click.testing import CliRunner
from sqlalchemy import event, func, select, update

from tracemill.cli import main
from tracemill.collector.decode import Limits, decode_protobuf
from tracemill.collector.persist import SpanWriter
from tracemill.miner.cli import _trend
from tracemill.miner.failures import (
    FailureCounts,
    compare_harness,
    failure_modes,
    failure_report,
    fisher_exact,
    two_proportion_test,
)
from tracemill.rates import sparkline
from tracemill.store import traces
from tracemill.store.engine import make_engine
from tracemill.store.migrate import upgrade
from tracemill.store.queries import CallFilter
from tracemill.store.tables import ToolCallRow

from support import chat_attributes, export_request, make_span, store_sidecar_and_agent

DAY = 86_400 * 1_000_000_000
START = 1_780_000_000_000_000_000  # 2026-05-28

GOOD = {"name": "get_weather", "arguments": {"city": "Oslo"}}
WRONG_TYPE = {"name": "get_weather", "arguments": {"city": 7}}
BAD_ENUM = {"name": "get_weather", "arguments": {"city": "Oslo", "units": "kelvin"}}
UNKNOWN_TOOL = {"name": "get_wether", "arguments": {"city": "Rome"}}
# a terminal 80 columns wide that draws no colours (Rich reads TTY_COMPATIBLE)
TERMINAL_80 = {"TTY_COMPATIBLE": "1", "TERM": "dumb", "COLUMNS": "80"}


def _store(db_url: str, plan: dict[str, list[tuple[dict, int]]], model: str = "qwen3",  # type: ignore[no-untyped-def]
           first: int = 0, day: Callable[[int], int] = lambda n: n % 2, service: str | None = None):
    """One span per call; `plan`: harness version -> (call, how many); trace and span ids count on from `first`;
    `day`: the n-th call's day after START; `service`: the spans' service name."""
    engine = make_engine(db_url)
    upgrade(engine)
    writer = SpanWriter(engine.dialect)
    n = first
    for harness, calls in plan.items():
        spans = []
        for call, times in calls:
            for _ in range(times):
                n += 1
                attrs = chat_attributes([{"id": f"c{n}", **call}], model=model if n % 3 else "llama3.1-8b")
                spans.append(make_span(f"{n:032x}", f"{n:016x}", "chat", attrs, start_ns=START + day(n) * DAY))
        body = export_request(spans, resource={"tracemill.harness.version": harness,
                                               **({"service.name": service} if service else {})})
        batch = writer.prepare(decode_protobuf(body, Limits(1 << 24)).spans)
        with engine.begin() as conn:
            writer.write(conn, batch)
        writer.committed()
    return engine


def test_modes_are_ranked_with_shares_trends_and_splits(db_url: str) -> None:
    engine = _store(db_url, {"v1": [(GOOD, 60), (WRONG_TYPE, 25), (UNKNOWN_TOOL, 10), (BAD_ENUM, 5)]})
    report = failure_report(engine)
    assert report.total_calls == 100 and report.failed_calls == 40
    assert [m.label for m in report.modes] == ["get_weather · schema · wrong_type · /arguments/city",
                                               "get_wether · tool_name · unknown_tool · /name",
                                               "get_weather · schema · enum · /arguments/units"]
    top = report.modes[0]
    assert (top.count, top.share) == (25, 0.25)
    assert sum(top.by_day.values()) == 25 and list(top.by_day) == ["2026-05-28", "2026-05-29"]
    assert sum(report.calls_by_day.values()) == 100
    assert set(top.by_model) == {"qwen3", "llama3.1-8b"} and sum(top.by_model.values()) == 25
    assert top.by_harness == {"v1": 25}

    by_stage = failure_modes(engine, by=("stage", "kind"))
    assert [(m.label, m.count) for m in by_stage] == [("schema · wrong_type", 25), ("tool_name · unknown_tool", 10),
                                                       ("schema · enum", 5)]
    assert [m.label for m in failure_modes(engine, CallFilter(model="llama3.1-8b"), limit=1)] == [top.label]


def test_counts_kept_between_reads_read_only_new_calls_and_agree_with_a_fresh_report(db_url: str) -> None:
    engine = _store(db_url, {"v1": [(GOOD, 20), (WRONG_TYPE, 5)]})
    counts = FailureCounts().update(engine, window=7, recount=4)
    assert counts.report().failed_calls == 5
    _store(db_url, {"v2": [(GOOD, 10), (UNKNOWN_TOOL, 3)]}, first=1000)
    counts.update(engine, window=7, recount=4)
    assert counts.report().to_dict() == failure_report(engine).to_dict()
    assert counts.report(("stage", "kind")).to_dict() == failure_report(engine, by=("stage", "kind")).to_dict()
    with engine.begin() as conn:  # its execution arrived after the call was counted: it failed when it ran
        newest = conn.execute(select(func.max(ToolCallRow.id)).where(ToolCallRow.stage.is_(None))).scalar()
        conn.execute(update(ToolCallRow).where(ToolCallRow.id == newest)
                     .values(execution_status="error", execution_error="upstream_error: 502"))
    assert counts.update(engine, recount=4).report().to_dict() == failure_report(engine).to_dict()
    assert ("execution · upstream_error", 1) in [(m.label, m.count) for m in counts.report(("stage", "kind")).modes]
    assert counts.report(since_day="2026-06-01").total_calls == 0  # every call was made before that day
    engine.dispose()


def test_counts_stopped_half_way_go_on_from_there_and_count_each_call_once(db_url: str) -> None:
    """A reader with a time limit (a miner agent's) can stop an update at any statement: the windows counted by then
    are kept, and the next update counts on from there, never a call twice."""
    engine = _store(db_url, {"v1": [(GOOD, 30), (WRONG_TYPE, 12), (UNKNOWN_TOOL, 8)]})
    counts, statements = FailureCounts(), []

    def stop_at_the_fifth(conn: object, cursor: object, statement: str, *_: object) -> None:
        statements.append("GROUP BY" in statement)
        if sum(statements) == 5:  # the third window's first count
            raise TimeoutError("the reader's deadline")

    event.listen(engine, "before_cursor_execute", stop_at_the_fifth)
    with engine.connect() as conn, pytest.raises(TimeoutError):
        counts.update(conn, window=7, recount=4)
    event.remove(engine, "before_cursor_execute", stop_at_the_fifth)
    assert counts.settled_id == 14 and counts.report().total_calls == 14, "two windows of seven counted by then"
    assert counts.update(engine, window=7, recount=4).report().to_dict() == failure_report(engine).to_dict()
    engine.dispose()


def test_filter_values_kept_between_reads_read_only_new_calls(db_url: str) -> None:
    engine = _store(db_url, {"v1": [(GOOD, 4), (UNKNOWN_TOOL, 2)]})
    with engine.connect() as conn:
        kept = traces.facets(conn, window=4)
    _store(db_url, {"v2": [(GOOD, 3)]}, first=1000)
    with engine.connect() as conn:
        kept = traces.facets(conn, known=kept, window=4)
        assert kept == traces.facets(conn)
    assert kept.harness_versions == {"v1": 6, "v2": 3} and kept.tools == {"get_weather": 7, "get_wether": 2}
    engine.dispose()


def test_a_harness_version_that_makes_a_mode_rarer_is_significant_and_noise_is_not(db_url: str) -> None:
    engine = _store(db_url, {"v1": [(GOOD, 150), (WRONG_TYPE, 40), (UNKNOWN_TOOL, 10)],
                             "v2": [(GOOD, 179), (WRONG_TYPE, 10), (UNKNOWN_TOOL, 11)]})
    rows = {c.label: c for c in compare_harness(engine, "v1", "v2", by=("stage", "kind"))}
    dropped = rows["schema · wrong_type"]
    assert (dropped.count_a, dropped.calls_a, dropped.count_b, dropped.calls_b) == (40, 200, 10, 200)
    assert dropped.significant and dropped.change == "rarer" and dropped.p_value < 1e-4
    same = rows["tool_name · unknown_tool"]
    assert not same.significant and same.change == "no significant change"


def test_a_version_behind_the_sidecar_is_compared_on_the_model_s_answers_as_sent(db_url: str) -> None:
    """v2 ran behind the reviser sidecar, named to it: the model failed as often as under v1, and the agent got every
    call revised. Compared on the model's answers (the sidecar's record) nothing changed; read from the agent's
    record, as a named service asks, the reviser's work passes for v2's."""
    _store(db_url, {"v1": [(GOOD, 60), (WRONG_TYPE, 40)]}, service="weather-agent").dispose()
    _store(db_url, {"v2": [(GOOD, 60), (WRONG_TYPE, 40)]}, first=1000, service="tracemill-serve").dispose()
    engine = _store(db_url, {"v2": [(GOOD, 100)]}, first=2000, service="weather-agent")
    (row,) = compare_harness(engine, "v1", "v2", by=("stage", "kind"))
    assert (row.count_a, row.calls_a, row.count_b, row.calls_b) == (40, 100, 40, 100) and not row.significant
    (agent,) = compare_harness(engine, "v1", "v2", CallFilter(service="weather-agent"), by=("stage", "kind"))
    assert (agent.count_b, agent.calls_b, agent.change) == (0, 100, "rarer")
    engine.dispose()
    shown = CliRunner().invoke(main, ["failures", "--db", db_url, "--compare", "v1", "v2", "--json"])
    assert shown.exit_code == 0, shown.output
    assert json.loads(shown.output)["sidecar_record"] == ["v2"]
    table = CliRunner().invoke(main, ["failures", "--db", db_url, "--compare", "v1", "v2", "--markdown"])
    assert "v2 read from the reviser sidecar's record" in table.output.splitlines()[0]


def test_two_proportion_test_matches_the_textbook_value() -> None:
    z, p = two_proportion_test(40, 200, 10, 200)  # pooled p = 0.125: z = -0.15 / sqrt(0.125*0.875*0.01) = -4.536
    assert round(z, 3) == -4.536 and 5e-6 < p < 7e-6
    assert two_proportion_test(0, 0, 3, 10) == (0.0, 1.0)


def test_small_counts_are_tested_exactly_not_by_the_normal_approximation() -> None:
    assert abs(fisher_exact(1, 10, 11, 14) - 0.0027594561852200853) < 1e-12  # SciPy's and R's worked example
    assert abs(fisher_exact(8, 10, 1, 6) - 0.034965034965035) < 1e-12
    # none of 1,000 calls against 4 of 1,000: the z-test's p is 0.045, which a rare mode must not be called on
    z, p = two_proportion_test(0, 1000, 4, 1000)
    assert z > 0 and abs(p - 0.1249) < 1e-3
    assert two_proportion_test(0, 3, 3, 3)[1] > 0.05  # three of three against none of three: p 0.1 exactly


def test_a_rare_mode_that_a_few_more_calls_hit_is_not_called_significant(db_url: str) -> None:
    engine = _store(db_url, {"v1": [(GOOD, 1000)], "v2": [(GOOD, 996), (WRONG_TYPE, 4)]})
    (row,) = compare_harness(engine, "v1", "v2", by=("stage", "kind"))
    assert (row.count_a, row.count_b) == (0, 4) and not row.significant and row.change == "no significant change"


def test_days_without_calls_are_gaps_in_the_trend(db_url: str) -> None:
    engine = _store(db_url, {"v1": [(WRONG_TYPE, 2), (GOOD, 2)]}, day=lambda n: 0 if n <= 2 else 20)
    report = failure_report(engine, by=("stage",))
    assert list(report.calls_by_day) == [f"2026-{m:02}-{d:02}" for m, d in [(5, 28), (5, 29), (5, 30), (5, 31)]
                                         + [(6, d) for d in range(1, 18)]]
    assert report.calls_by_day["2026-05-28"] == 2 and report.calls_by_day["2026-06-17"] == 2
    assert sum(report.calls_by_day.values()) == 4
    # two-day bars: the first has the failed calls, the last the good ones, nine bars of no calls between
    assert _trend(report.modes[0].by_day, report.calls_by_day) == "█" + " " * 9 + "▁ 100.0%→0.0%"


def test_names_from_traces_print_as_they_are_in_the_table_and_markdown(sqlite_url: str) -> None:
    odd = [({"name": "x[/y]", "arguments": {}}, 2), ({"name": "a|b\nc", "arguments": {}}, 1), (GOOD, 7)]
    _store(sqlite_url, {"v1": odd})
    runner = CliRunner()
    table = runner.invoke(main, ["failures", "--db", sqlite_url, "--by", "tool"])
    assert table.exit_code == 0, table.output
    assert "x[/y]" in table.output
    markdown = runner.invoke(main, ["failures", "--db", sqlite_url, "--by", "tool", "--markdown"])
    assert markdown.exit_code == 0, markdown.output
    lines = markdown.output.splitlines()
    assert lines[0] == "3 of 10 calls failed; days 2026-05-28 .. 2026-05-29"
    rows = [line for line in lines if line.startswith(("| x[", "| a"))]
    assert [r.split(" | ")[0] for r in rows] == ["| x[/y]", "| a\\|b c"]
    assert all(len(re.findall(r"(?<!\\)\|", r)) == 7 for r in rows)  # six cells: no name adds a column


def test_the_table_written_to_a_pipe_keeps_every_mode_on_one_line(sqlite_url: str) -> None:
    """`tracemill failures | less`, `> report.txt`: no terminal to fit, so no label is folded over several lines."""
    long = {"name": "search_scientific_publications_by_keyword_and_year", "arguments": {"query": "x"}}
    _store(sqlite_url, {"v1": [(long, 2), (WRONG_TYPE, 1), (GOOD, 7)]})
    done = subprocess.run([sys.executable, "-m", "tracemill.cli", "failures", "--db", sqlite_url],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    label = "search_scientific_publications_by_keyword_and_year · tool_name · unknown_tool · /name"
    assert re.search(rf"│ {re.escape(label)} +│ +2 │ 20\.0% │", done.stdout), done.stdout
    assert max(map(len, done.stdout.splitlines())) > 80


def test_a_report_that_mixes_the_sidecar_s_record_with_the_agent_s_says_so(db_url: str) -> None:
    """Behind the reviser sidecar the store holds the model's answer as sent (the sidecar's service) and the call the
    agent got: a report of both says how many are the sidecar's and how to read one record; a report of one does
    not."""
    engine = make_engine(db_url)
    upgrade(engine)
    store_sidecar_and_agent(engine)
    engine.dispose()
    runner = CliRunner()
    mixed = runner.invoke(main, ["failures", "--db", db_url])
    assert mixed.exit_code == 0, mixed.output
    assert "1 of 2 calls failed" in mixed.output
    said = " ".join(mixed.output.split())  # the line as the terminal's width folds it
    assert "1 of the 2 calls are the reviser sidecar's record (service tracemill-serve" in said
    for service in ("tracemill-serve", "weather-agent"):
        one = runner.invoke(main, ["failures", "--db", db_url, "--service", service, "--markdown"])
        assert one.exit_code == 0, one.output
        assert "of 1 calls failed" in one.output and "sidecar's record" not in one.output


def test_a_trend_is_drawn_from_zero_to_the_modes_highest_daily_rate() -> None:
    assert sparkline([0.1, 0.2, None, 0.4]) == "▃▅ █"
    assert sparkline([0.005] * 3) == "███"  # a steady rate is level, its noise not drawn tall
    assert sparkline([0.0, 0.0]) == "▁▁"
    days = {f"2026-06-{d:02}": 10 for d in range(1, 31)}
    rising = {day: n // 3 for n, day in enumerate(days)}  # 0 to 9 failed of 10 calls a day
    assert _trend(rising, days) == "▁▁▁▂▃▃▄▅▅▆▆▇███ 0.0%→90.0%"  # thirty days in fifteen two-day bars


def test_the_command_prints_a_table_json_markdown_and_a_comparison(sqlite_url: str) -> None:
    _store(sqlite_url, {"v1": [(GOOD, 8), (WRONG_TYPE, 2)], "v2": [(GOOD, 9), (UNKNOWN_TOOL, 1)]})
    runner = CliRunner()
    table = runner.invoke(main, ["failures", "--db", sqlite_url], env=TERMINAL_80)
    assert table.exit_code == 0, table.output
    assert "wrong_type" in table.output and "unknown_tool" in table.output
    # at 80 columns the labels and lists fold; each mode's count, share and trend stay whole on its first line
    assert max(map(len, table.output.splitlines())) == 80, table.output
    assert re.search(r"│ +2 │ 10\.0% │ ██ 10\.0%→10\.0% │", table.output), table.output
    assert re.search(r"│ +1 │  5\.0% │  █▁ 10\.0%→0\.0% │", table.output), table.output
    as_json = json.loads(runner.invoke(main, ["failures", "--db", sqlite_url, "--json"]).output)
    assert as_json["total_calls"] == 20 and as_json["modes"][0]["count"] == 2
    markdown = runner.invoke(main, ["failures", "--db", sqlite_url, "--markdown", "--harness", "v1"]).output
    assert markdown.startswith("2 of 10 calls failed; days 2026-05-28 .. 2026-05-29\n\n| mode |")
    assert "unknown_tool" not in markdown
    assert "| get_weather · schema · wrong_type · /arguments/city | 2 | 20.0% | ██ 20.0%→20.0% |" in markdown
    compared = runner.invoke(main, ["failures", "--db", sqlite_url, "--compare", "v1", "v2", "--json"])
    assert {r["label"] for r in json.loads(compared.output)["modes"]} == {
        "get_weather · schema · wrong_type · /arguments/city", "get_wether · tool_name · unknown_tool · /name"}
    unknown = runner.invoke(main, ["failures", "--db", sqlite_url, "--model", "gpt-9"])
    assert unknown.exit_code == 1 and "no stored call has model 'gpt-9'" in unknown.output
