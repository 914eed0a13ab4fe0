"""`tracemill simulate` against a running collector yields `tracemill stats` figures that match what it injected, on
SQLite and PostgreSQL."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from sqlalchemy import func, select

from tracemill.store.engine import make_engine
from tracemill.store.tables import SpanRow

pytestmark = pytest.mark.timeout(60)

METRICS = ("valid_tool_name_rate", "input_schema_compliance", "execution_success_rate", "valid_call_failure_rate")


def tracemill(*args: str) -> str:
    done = subprocess.run([sys.executable, "-m", "tracemill.cli", *args], capture_output=True, text=True, timeout=50)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def _span_count(db_url: str) -> int:
    engine = make_engine(db_url)
    with engine.connect() as conn:
        count = conn.execute(select(func.count()).select_from(SpanRow)).scalar_one()
    engine.dispose()
    return count


def test_stats_report_what_was_injected(start_collector, db_url: str) -> None:
    collector = start_collector(db_url)
    sent = json.loads(tracemill("simulate", "--endpoint", collector.url, "--traces", "300", "--seed", "7",
                                "--model-profile", "qwen3", "--json"))
    assert sent["calls"] > 600 and sent["faulty_outputs"] > 50
    stats = json.loads(tracemill("stats", "--db", db_url, "--json"))
    assert stats["total_calls"] == sent["calls"]
    for metric in METRICS:
        assert stats[metric] == pytest.approx(sent["expected"][metric], abs=1e-9), metric

    # the same seed again: the same ids, so nothing is stored twice
    assert _span_count(db_url) == sent["spans"]
    tracemill("simulate", "--endpoint", collector.url, "--traces", "300", "--seed", "7", "--model-profile", "qwen3")
    assert _span_count(db_url) == sent["spans"]


def test_stats_report_what_was_injected_for_a_model_that_writes_calls_as_text(start_collector,
                                                                              sqlite_url: str) -> None:
    collector = start_collector(sqlite_url)
    sent = json.loads(tracemill("simulate", "--endpoint", collector.url, "--traces", "300", "--seed", "7",
                                "--model-profile", "llama3.1-8b", "--json"))
    stats = json.loads(tracemill("stats", "--db", sqlite_url, "--json"))
    assert stats["total_calls"] == sent["calls"]
    for metric in METRICS:
        assert stats[metric] == pytest.approx(sent["expected"][metric], abs=0.005), metric
