"""`tracemill cycle` on real stores: simulated traffic over harness versions through a real collector, the decision it
leads to, a whole cycle with the tiny model on SQLite, the gate refusing a worse candidate, real SIGKILLs of a real
cycle process at each step, and the lock between processes (SQLite and PostgreSQL)."""

import json
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from click.testing import CliRunner
from sqlalchemy import insert
from sqlalchemy.orm import Session

from tracemill.cli import main
from tracemill.cycle import CycleBusy, CycleSettings, Decision, run_cycle
from tracemill.cycle.decide import decide, harness_rates
from tracemill.cycle.lock import LockBusy, StoreLock
from tracemill.cycle.record import history
from tracemill.serving.deployments import served
from tracemill.simulate import simulate
from tracemill.simulate.harness import HARNESS_VERSIONS
from tracemill.store.cli import open_store
from tracemill.store.engine import make_engine
from tracemill.store.migrate import upgrade
from tracemill.store.tables import LockRow

from support import CollectorProcess

VERSIONS = [v.name for v in HARNESS_VERSIONS]  # prompt-v1 .. prompt-v6: four changes that pay, then a plateau
DRIVER = Path(__file__).with_name("cycle_driver.py")
START_NS = 1_780_000_000_000_000_000
DAY_NS = 86_400 * 10**9


def send(db: str, folder: Path, versions, traces: int, seed: int, day: int = 0) -> None:
    """Traffic of the weak model under each harness version in turn, one simulated day apart."""
    collector = CollectorProcess(db, folder).start()
    try:
        for i, version in enumerate(versions):
            simulate(collector.url, traces=traces, seed=seed + i, profile="llama3.1-8b", harness_version=version,
                     start_ns=START_NS + (day + i) * DAY_NS)
    finally:
        collector.stop()


def active(db: str) -> str:
    engine = open_store(db)
    try:
        with Session(engine) as session:
            return served(session).active.name
    finally:
        engine.dispose()


def cycles(db: str):
    engine = open_store(db)
    try:
        with engine.connect() as conn:
            return history(conn)
    finally:
        engine.dispose()


# --- the lock ------------------------------------------------------------------------------------------------------

HOLD = """
import sys, time
from tracemill.cycle.lock import StoreLock
from tracemill.store.cli import open_store
from tracemill.store.engine import make_engine
from tracemill.store.migrate import upgrade
lock = StoreLock(open_store(sys.argv[1]), "cycle", ttl_s=60)
lock.acquire()
print(lock.holder, flush=True)
time.sleep(3600)
"""


def test_the_lock_refuses_a_second_cycle_and_a_killed_holder_blocks_nothing(db_url, tmp_path):
    engine = make_engine(db_url)
    upgrade(engine)  # PostgreSQL is migrated on purpose
    holder = subprocess.Popen([sys.executable, "-c", HOLD, db_url], stdout=subprocess.PIPE, text=True)
    try:
        name = holder.stdout.readline().strip()
        assert name.split(":")[1] == str(holder.pid)
        with pytest.raises(LockBusy, match=name):
            StoreLock(engine, "cycle").acquire()
        settings = CycleSettings(store=db_url, work=tmp_path / "cycles", base_model="unused")
        with pytest.raises(CycleBusy, match="another cycle holds the lock"):
            run_cycle(settings)
        refused = CliRunner().invoke(main, ["cycle", "--db", db_url, "--base", "unused", "--work", str(tmp_path)])
        assert refused.exit_code == 1 and "not starting a second cycle" in refused.output
        assert cycles(db_url) == []  # a refused cycle leaves no row
    finally:
        holder.kill()
        holder.wait()
    lock = StoreLock(engine, "cycle", ttl_s=60)
    lock.acquire()  # its process is gone: taken over at once, not after the minute
    assert lock.took_over == name
    lock.release()
    with engine.begin() as conn:  # a holder on another machine: only its expiry frees the lock
        conn.execute(insert(LockRow).values(name="cycle", holder="elsewhere:1:abc", acquired_at=datetime.now(UTC),
                                            expires_at=datetime.now(UTC) + timedelta(seconds=1.5)))
    with pytest.raises(LockBusy, match="elsewhere:1:abc"):
        StoreLock(engine, "cycle").acquire()
    time.sleep(1.6)
    lock = StoreLock(engine, "cycle", ttl_s=0.6)
    lock.acquire()
    assert lock.took_over == "elsewhere:1:abc"
    time.sleep(1.0)  # longer than its time to live: the holder's thread keeps renewing it
    with pytest.raises(LockBusy):
        StoreLock(engine, "cycle").acquire()
    lock.release()
    StoreLock(engine, "cycle").acquire()
    engine.dispose()


# --- the decision --------------------------------------------------------------------------------------------------

def test_harness_tuning_still_pays_then_plateaus_and_the_decision_follows(tmp_path):
    db = f"sqlite:///{tmp_path / 'traffic.db'}"
    settings = CycleSettings(store=db, work=tmp_path / "cycles", base_model="unused",
                             decision=Decision(min_new_failures=10**6, plateau_window=3, plateau_tolerance=0.01))
    send(db, tmp_path, VERSIONS[:3], traces=120, seed=10)
    first = run_cycle(settings)
    assert first.status == "done" and first.decision == "harness" and first.model_id is None
    assert [r["version"] for r in first.harness_rates] == VERSIONS[:3]
    rates = [r["rate"] for r in first.harness_rates]
    assert rates[0] > rates[1] > rates[2], rates
    assert "harness tuning still pays" in first.reason and "(prompt-v3), p = " in first.reason
    assert first.top_modes and all(m["count"] > 0 for m in first.top_modes)
    assert first.new_failures > 0 and first.dataset_id is not None

    send(db, tmp_path, VERSIONS[3:], traces=120, seed=20, day=3)
    second = run_cycle(settings)
    assert second.decision == "wait" and "stopped paying" in second.reason and second.top_modes == []
    assert second.since_call_id is None  # the first cycle did not train: its calls are still new
    assert second.new_calls > first.new_calls
    engine = open_store(db)
    with engine.connect() as conn:
        assert [r.version for r in harness_rates(conn)] == VERSIONS
    assert decide(engine, 10, Decision(min_new_failures=10, plateau_tolerance=0.01)).decision == "train"
    assert decide(engine, 10, Decision(min_new_failures=10, plateau_tolerance=0.01, plateau_window=5)).decision == \
        "harness"  # over five versions v2 -> v3 -> v4 still paid
    engine.dispose()
    shown = CliRunner().invoke(main, ["cycle", "--history", "--db", db])
    assert shown.exit_code == 0 and "harness" in shown.output and "wait" in shown.output
    listed = json.loads(CliRunner().invoke(main, ["cycle", "--history", "--db", db, "--json"]).output)
    assert [c["id"] for c in listed] == [second.id, first.id] and listed[1]["harness_rates"][0]["version"] == "prompt-v1"
