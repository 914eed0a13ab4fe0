"""`tracemill demo` end to end, in reduced size, as a user runs it: the printed before/after table is the store's
figures for each phase, the sidecar's revisions were traced, `tracemill cycle` trained and registered a model, and it
was deployed or refused with the gate's reasons. Ctrl-C stops every process the demo started and leaves the store
whole."""

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from dataclasses import asdict
from datetime import datetime

import psutil
import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session

from tracemill.demo.phases import measure
from tracemill.store.engine import make_engine
from tracemill.store.tables import DeploymentRow, ModelRow, ToolCallRow

pytest.importorskip("trl", reason="the demo trains a reviser: the train extra")

HARNESS = "prompt-v5"


def _demo(folder, *args):
    return [sys.executable, "-m", "tracemill.cli", "demo", "--dir", str(folder), *args]


def _left_behind(folder):
    """Processes still running whose command line names the demo's folder."""
    found = []
    for proc in psutil.process_iter(["pid", "cmdline"]):
        if str(folder) in " ".join(proc.info["cmdline"] or ()):
            found.append(proc.info)
    return found


def test_the_demo_runs_the_whole_loop_and_prints_the_stores_figures(tmp_path):
    folder = tmp_path / "demo"
    # the default number of episodes: the fewest whose held-out rows the gate measures on (at least 30, nearly always)
    done = subprocess.run(_demo(folder, "--warmup-steps", "4", "--steps", "2"),
                          check=False, capture_output=True, text=True, timeout=280,
                          env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    out = done.stdout
    summary = json.loads((folder / "demo.json").read_text())
    phases = summary["phases"]
    assert [p["name"] for p in phases[:2]] == ["baseline", "rules"] and len(phases) == 3
    assert f"tracemill ui --db sqlite:///{folder / 'store.db'}" in out
    assert "tiny CPU model" in out and "Qwen3-4B-Instruct" in out
    # read through a pipe, as `make demo | tee` is: a step's title is whole, however long
    assert "─ 3. tracemill cycle --force: mine, decide, train the tiny reviser (GRPO, CPU), evaluate ─" in out

    engine = make_engine(f"sqlite:///{folder / 'store.db'}")
    table = out[out.index("before and after"):]
    for phase in phases:
        since, until = (datetime.fromisoformat(phase[k]) for k in ("since", "until"))
        stored = measure(engine, HARNESS, since, until)
        assert asdict(stored) == phase["metrics"] and stored.total_calls > 0, phase
        assert phase["episodes"] == 120
        row = next(line for line in table.splitlines() if phase["served_by"] in line)
        assert f"{stored.input_schema_compliance:.1%}" in row and f" {stored.total_calls} " in row, row
    baseline, rules = phases[0]["metrics"], phases[1]["metrics"]
    assert phases[0]["revised"] == 0 and phases[1]["revised"] > 0
    assert rules["input_schema_compliance"] > baseline["input_schema_compliance"]  # the same episodes, revised

    with Session(engine) as session:
        models = {m.name: m for m in session.scalars(select(ModelRow))}
        deployments = list(session.scalars(select(DeploymentRow).order_by(DeploymentRow.id)))
        revisers = set(session.scalars(select(ToolCallRow.model).where(ToolCallRow.model.like("tracemill-reviser:%"))))
    engine.dispose()
    assert "tracemill-reviser:rules" in revisers  # the sidecar traced its own revisions
    cycle, candidate = summary["cycle"], summary["candidate"]
    assert (cycle["status"], cycle["decision"], cycle["forced"]) == ("done", "train", True)
    # the agent named its harness version to the sidecar: the version is rated on the model's answers as sent
    assert [(r["version"], r["service"]) for r in cycle["harness_rates"]] == [(HARNESS, "tracemill-serve")]
    assert list(models) == [candidate] and models[candidate].id == cycle["model_id"]
    # the gate measured both revisers on the held-out rows (it did not refuse for want of them), and the demo showed it
    card = json.loads(next(folder.glob("cycles/*/dataset/dataset.json")).read_text())
    checks = cycle["gate"]["checks"]
    assert card["splits"]["eval"]["rows"] >= 30 and checks, cycle["gate"]
    gate_table = out[out.index("the cycle's gate:"):out.index("phase 2")]
    assert all(check["name"].replace("_", " ") in gate_table for check in checks), gate_table
    if cycle["deployed"]:
        assert summary["deployed"] == candidate and phases[2]["served_by"] == f"sidecar: {candidate}"
        assert [(d.action, d.model_id, d.id) for d in deployments] == [
            ("deploy", models[candidate].id, cycle["deployment_id"])]
        assert f"the sidecar serves {candidate}" in out
        assert phases[2]["revised"] == 0 or f"tracemill-reviser:{candidate}" in revisers
    else:
        assert summary["deployed"] is None and deployments == []
        assert not all(check["passed"] for check in checks)
        assert f"the gate refused {candidate}" in out
        assert phases[2]["served_by"] == f"sidecar: rules ({candidate} refused)"
    assert _left_behind(folder) == []


def test_ctrl_c_stops_every_process_the_demo_started_and_keeps_the_store(tmp_path):
    folder = tmp_path / "demo"
    proc = subprocess.Popen(_demo(folder, "--episodes", "60"), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"}, start_new_session=True)
    lines = []
    deadline = time.monotonic() + 120
    for line in proc.stdout:  # wait for the first phase to end: the second one is running
        lines.append(line)
        if line.startswith("baseline (no sidecar)") or time.monotonic() > deadline:
            break
    assert lines and lines[-1].startswith("baseline"), "".join(lines)
    assert len(_left_behind(folder)) >= 3  # the collector (and its worker), the sidecar, the tiny model's build
    os.killpg(proc.pid, signal.SIGINT)  # as the terminal sends it: to the demo's process group
    rest, _ = proc.communicate(timeout=90)
    assert proc.returncode == 130, "".join(lines) + rest
    assert "stopped" in rest and "every process the demo started is stopped" in rest
    assert _left_behind(folder) == []
    with sqlite3.connect(folder / "store.db") as conn:
        assert conn.execute("PRAGMA integrity_check").fetchone() == ("ok",)
        assert conn.execute("SELECT count(*) FROM tool_calls WHERE harness_version = ?", (HARNESS,)).fetchone()[0] > 0


def test_a_folder_the_demo_did_not_make_is_left_alone(tmp_path):
    from click.testing import CliRunner

    from tracemill.cli import main

    (tmp_path / "notes.txt").write_text("mine")
    result = CliRunner().invoke(main, ["demo", "--dir", str(tmp_path)])
    assert result.exit_code == 2 and "holds something other than an earlier demo" in result.output
    assert [p.name for p in tmp_path.iterdir()] == ["notes.txt"]
