"""`tracemill cycle` on real stores: simulated traffic over harness versions through a real collector, the decision it
leads to, a whole cycle with the tiny model on SQLite, the gate refusing a worse candidate, real SIGKILLs of a real
cycle process at each step, and the lock between processes (SQLite and PostgreSQL)."""

import json
import signal
import sqlite3
import subprocess
import sys
import time
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest
from click.testing import CliRunner
from sqlalchemy import insert, select
from sqlalchemy.orm import Session

from tracemill.cli import main
from tracemill.collector.decode import Limits, decode_protobuf
from tracemill.collector.persist import SpanWriter
from tracemill.cycle import CycleBusy, CycleError, CycleSettings, Decision, Gate, Mining, run_cycle
from tracemill.cycle.decide import decide, harness_rates
from tracemill.cycle.gate import judge
from tracemill.cycle.lock import LockBusy, StoreLock
from tracemill.cycle.record import Step, history
from tracemill.cycle.settings import load_settings
from tracemill.evaluation import evaluate
from tracemill.revisers import make_reviser, rules_reviser
from tracemill.serving.deployments import deploy, rollback, served
from tracemill.serving.deployments import history as deployment_history
from tracemill.simulate import simulate
from tracemill.simulate.harness import HARNESS_VERSIONS
from tracemill.store.cli import open_store
from tracemill.store.engine import make_engine
from tracemill.store.migrate import upgrade
from tracemill.store.tables import DatasetRow, LockRow, ModelRow
from tracemill.suites import read_cases
from tracemill.trainer.config import ConfigError
from tracemill.trainer.finish import figures
from tracemill.trainer.registry import NewModel, register_model

from support import CollectorProcess, chat_attributes, export_request, make_span

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


def _post(db: str, folder: Path, span) -> None:  # type: ignore[no-untyped-def]
    collector = CollectorProcess(db, folder).start()
    try:
        assert httpx.post(f"{collector.url}/v1/traces", content=export_request([span]),
                          headers={"Content-Type": "application/x-protobuf"}).status_code == 200
    finally:
        collector.stop()


LATE_TRACE = "1a" * 16


def call_not_run_yet(db: str, folder: Path) -> None:
    """A valid call whose tool's execute_tool span has not come yet."""
    chat = chat_attributes([{"id": "late-1", "name": "get_weather", "arguments": {"city": "Oslo"}}])
    _post(db, folder, make_span(LATE_TRACE, "1b" * 8, "chat", chat, start_ns=START_NS + 9 * DAY_NS))


def run_failed(db: str, folder: Path) -> None:
    """`call_not_run_yet`'s execute_tool span, come now: the tool failed."""
    ran = {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "get_weather", "gen_ai.tool.call.id": "late-1",
           "error.type": "upstream_error"}
    _post(db, folder, make_span(LATE_TRACE, "1c" * 8, "execute_tool get_weather", ran, parent="1b" * 8,
                                start_ns=START_NS + 9 * DAY_NS + 1, status_code=2))


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

@pytest.fixture(scope="module")
def plateau(tmp_path_factory):
    """Traffic under prompt-v1..v3 (each change pays) and a cycle on it; then prompt-v4..v6 (the plateau) and another.
    Neither may train: the first because tuning still pays, the second because it needs more failures than exist."""
    folder = tmp_path_factory.mktemp("plateau")
    db = f"sqlite:///{folder / 'traffic.db'}"
    settings = CycleSettings(store=db, work=folder / "cycles", base_model="unused",
                             decision=Decision(min_new_failures=10**6, plateau_window=3, plateau_tolerance=0.01))
    send(db, folder, VERSIONS[:3], traces=120, seed=10)
    first = run_cycle(settings)
    send(db, folder, VERSIONS[3:], traces=120, seed=20, day=3)
    second = run_cycle(settings)
    return {"folder": folder, "db": db, "first": first, "second": second}


def copy_store(db: str, folder: Path) -> str:
    """A copy of a SQLite store (the online backup: the WAL's pages included)."""
    source, target = sqlite3.connect(db.removeprefix("sqlite:///")), sqlite3.connect(folder / "copy.db")
    source.backup(target)
    source.close()
    target.close()
    return f"sqlite:///{folder / 'copy.db'}"


def test_harness_tuning_still_pays_then_plateaus_and_the_decision_follows(plateau):
    first, second = plateau["first"], plateau["second"]
    assert first.status == "done" and first.decision == "harness" and first.model_id is None
    assert [r["version"] for r in first.harness_rates] == VERSIONS[:3]
    rates = [r["rate"] for r in first.harness_rates]
    assert rates[0] > rates[1] > rates[2], rates
    assert "harness tuning still pays" in first.reason and "(prompt-v3), p = " in first.reason
    assert first.top_modes and all(m["count"] > 0 for m in first.top_modes)
    assert first.new_failures > 0 and first.dataset_id is not None

    assert second.decision == "wait" and "stopped paying" in second.reason and second.top_modes == []
    assert second.since_call_id is None  # the first cycle did not train: its calls are still new
    assert second.new_calls > first.new_calls
    engine = open_store(plateau["db"])
    with engine.connect() as conn:
        assert [r.version for r in harness_rates(conn)] == VERSIONS
    assert decide(engine, 10, Decision(min_new_failures=10)).decision == "train"
    assert decide(engine, 10, Decision(min_new_failures=10, plateau_window=5)).decision == "harness"  # v2 -> v3 paid
    assert decide(engine, 9, Decision(min_new_failures=10)).decision == "wait"
    forced = decide(engine, 0, Decision(plateau_window=5), force=True)
    assert forced.decision == "train" and forced.reason.startswith("forced (--force); harness tuning still pays")
    engine.dispose()
    shown = CliRunner().invoke(main, ["cycle", "--history", "--db", plateau["db"]])
    assert shown.exit_code == 0 and "harness" in shown.output and "wait" in shown.output
    listed = json.loads(CliRunner().invoke(main, ["cycle", "--history", "--db", plateau["db"], "--json"]).output)
    assert [c["id"] for c in listed] == [second.id, first.id]
    assert listed[1]["harness_rates"][0]["version"] == "prompt-v1"


def test_calls_that_name_no_harness_version_leave_the_decision_to_the_failures(sqlite_url):
    engine = open_store(sqlite_url)
    enough, short = decide(engine, 5, Decision(min_new_failures=5)), decide(engine, 4, Decision(min_new_failures=5))
    measurable = decide(engine, 5, Decision(min_new_failures=5), held_out_rows=30, held_out_needed=30)
    unmeasurable = decide(engine, 5, Decision(min_new_failures=5), held_out_rows=29, held_out_needed=30)
    engine.dispose()
    assert enough.decision == "train" and "harness tuning cannot be judged" in enough.reason
    assert short.decision == "wait" and "4 new failed call(s)" in short.reason
    assert measurable.decision == "train"
    assert unmeasurable.decision == "wait" and "29 held-out row(s) mined, fewer than the 30" in unmeasurable.reason


def test_a_harness_version_behind_the_sidecar_is_rated_on_the_model_s_answers_as_sent(db_url):
    """Behind the reviser sidecar what the agent got was revised: a version whose answers the sidecar recorded (the
    agent named its version to it) is rated on that record, so that a reviser deployed with the new version does not
    pass for a better harness. Here the model fails half its calls under both versions."""
    engine = make_engine(db_url)
    upgrade(engine)
    writer = SpanWriter(engine.dialect)
    sent = [("prompt-v1", "weather-agent", n % 2 == 0) for n in range(40)]  # no sidecar: the model's own answers
    sent += [("prompt-v2", "tracemill-serve", n % 2 == 0) for n in range(40)]  # the sidecar's record of the answers
    sent += [("prompt-v2", "weather-agent", False) for _ in range(40)]  # what the agent got: revised, valid
    for n, (version, service, broken) in enumerate(sent):
        call = {"id": f"call_{n:04d}Xk2pQ", "name": "get_weather", "arguments": {"city": 7 if broken else "Oslo"}}
        said = {**chat_attributes([call]), "tracemill.harness.version": version}
        span = make_span(f"{n + 1:032x}", "01" * 8, "chat", said)
        with engine.begin() as conn:
            writer.write(conn, writer.prepare(decode_protobuf(export_request([span], {"service.name": service}),
                                                              Limits(1 << 20)).spans))
        writer.committed()
    with engine.connect() as conn:
        rates = harness_rates(conn)
    decision = decide(engine, 40, Decision(min_new_failures=10, plateau_window=2))
    engine.dispose()
    assert [(r.version, r.calls, r.failed, r.service) for r in rates] == [
        ("prompt-v1", 40, 20, None), ("prompt-v2", 40, 20, "tracemill-serve")]
    assert decision.decision == "train" and "harness tuning stopped paying" in decision.reason


def test_a_cycle_waits_for_the_held_out_rows_its_gate_needs_and_the_next_one_reads_its_calls_again(plateau, tmp_path):
    """Enough new failures and a harness that stopped paying, but too few held-out rows for the gate to measure a
    candidate on: the cycle trains nothing (a model it trained would be refused unmeasured, its calls spent), and the
    next cycle reads the same calls again."""
    db = copy_store(plateau["db"], tmp_path)
    settings = CycleSettings(store=db, work=tmp_path / "cycles", base_model="unused",
                             decision=Decision(min_new_failures=10, plateau_window=3, plateau_tolerance=0.01),
                             mining=Mining(eval_share=0.02), gate=Gate(min_held_out_cases=30))
    first = run_cycle(settings)
    again = run_cycle(settings)
    held_out = sum(r["split"] == "eval" for r in _dataset_rows(db, first.dataset_id))
    assert first.decision == "wait" and first.model_id is None and held_out < 30
    assert "stopped paying" in first.reason and f"{held_out} held-out row(s) mined, fewer than the 30" in first.reason
    assert (again.decision, again.since_call_id, again.new_calls) == ("wait", None, first.new_calls)


def test_the_gate_refuses_a_worse_reviser_on_the_same_held_out_cases(plateau):
    engine = open_store(plateau["db"])
    with engine.connect() as conn:
        (dataset,) = conn.execute(select(DatasetRow.path).where(DatasetRow.id == plateau["second"].dataset_id)).one()
    engine.dispose()
    cases = read_cases(Path(dataset) / "eval.jsonl")
    report = evaluate(cases, {"rules": rules_reviser, "json-repair": make_reviser("json-repair")}, "eval")
    shown = figures(report)
    worse = judge({"eval": {"candidate": shown["json-repair"], "baseline": shown["rules"]}}, Gate(0.0, 0.0))
    assert not worse.passed and "refused: reference match on eval" in worse.reason
    assert [c.passed for c in worse.checks] == [False, False, True]  # no valid call changed: json-repair keeps them
    better = judge({"eval": {"candidate": shown["rules"], "baseline": shown["json-repair"]}}, Gate(0.01, 0.01))
    assert better.passed and better.reason.startswith("passed: reference match")


def held_out(cases: int, candidate: float, baseline: float, valid_changed: float = 0.0) -> dict:
    """The gate's figures for two revisers that differ only in reference match (and the candidate's valid_changed)."""
    pair = {name: {"cases": cases, "reference_match": match, "input_schema_compliance": 1.0, "valid_changed": changed}
            for name, match, changed in (("candidate", candidate, valid_changed), ("baseline", baseline, 0.0))}
    return {"eval": {"cases": cases, **pair}}


def test_the_gate_can_be_passed_against_a_perfect_reviser_and_wants_enough_held_out_cases(tmp_path):
    gate = Gate()  # the defaults: a point of reference match over the active reviser, 30 held-out cases
    matched = judge(held_out(40, 1.0, 1.0), gate)
    assert matched.passed and matched.reason.startswith("passed: reference match 100.0% -> 100.0%")
    harmful = judge(held_out(40, 1.0, 1.0, valid_changed=0.1), gate)
    assert not harmful.passed and "valid changed on eval: 10.0% vs 0.0%" in harmful.reason
    near = judge(held_out(40, 0.995, 0.995), gate)
    assert not near.passed and "needed at least 99.5% + 1.0%, capped at 100.0%" in near.reason
    assert judge(held_out(40, 1.0, 0.995), gate).passed
    assert judge(held_out(40, 0.96, 0.95), gate).passed and not judge(held_out(40, 0.955, 0.95), gate).passed

    one = judge(held_out(1, 1.0, 0.0), gate)  # 0/1 -> 1/1
    assert not one.passed and one.reason.startswith("refused: 1 held-out case(s), at least 30 needed")
    assert not judge(held_out(29, 1.0, 0.0), gate).passed and judge(held_out(30, 1.0, 0.0), gate).passed
    assert judge(held_out(1, 1.0, 0.0), Gate(min_held_out_cases=1)).passed
    path = tmp_path / "cycle.toml"
    path.write_text('[cycle]\nbase = "unused"\nmin_held_out_cases = 0\n')
    with pytest.raises(ConfigError, match=r"cycle.toml: \[cycle\]: gate: min_held_out_cases >= 1"):
        load_settings(path, "sqlite://")
    path.write_text('[cycle]\nbase = "unused"\n[mine]\nwindow_days = 0\n')
    with pytest.raises(ConfigError, match=r"cycle.toml: \[mine\]: window_days must be more than 0, not 0"):
        load_settings(path, "sqlite://")


def test_a_cycle_refuses_a_launch_over_several_gpus_it_would_not_do(tmp_path):
    path = tmp_path / "cycle.toml"
    path.write_text('[cycle]\nbase = "unused"\n[launch]\nnum_processes = 4\n')
    with pytest.raises(ConfigError, match=r"cycle.toml: \[launch\]: a cycle trains in its own process, on one "
                                          r"device; num_processes = 4"):
        load_settings(path, "sqlite://")
    path.write_text('[cycle]\nbase = "unused"\n[launch]\nnum_processes = 1\n')
    assert load_settings(path, "sqlite://").train.launch.num_processes == 1


@pytest.mark.postgres
def test_cycles_are_recorded_on_postgresql(postgres_url, tmp_path):
    engine = make_engine(postgres_url)
    upgrade(engine)
    engine.dispose()
    send(postgres_url, tmp_path, VERSIONS[:2], traces=15, seed=30)
    settings = CycleSettings(store=postgres_url, work=tmp_path / "cycles", base_model="unused")
    first = run_cycle(settings)
    assert first.status == "done" and first.decision == "harness" and first.dataset_id is not None
    assert [r["version"] for r in first.harness_rates] == VERSIONS[:2] and "2 harness version(s) seen" in first.reason
    again = run_cycle(settings)
    assert again.since_call_id is None and again.new_calls == first.new_calls  # nothing trained: the same calls
    listed = json.loads(CliRunner().invoke(main, ["cycle", "--history", "--db", postgres_url, "--json"]).output)
    assert [c["id"] for c in listed] == [again.id, first.id] and all(c["status"] == "done" for c in listed)


# --- whole cycles with the tiny model -------------------------------------------------------------------------------

CONFIG = """
device = "cpu"
[cycle]
base = "{base}"
work = "{work}"
min_new_failures = 10
reference_margin = {margin}
schema_margin = 0.0
min_held_out_cases = 5
force = {force}
[mine]
eval_share = {eval_share}
max_tools = 1
budget_tokens = 48
descriptions = false
parameter_descriptions = false
system = false
[model]
kind = "full"
[grpo]
num_generations = 2
per_device_batch_size = 2
max_completion_length = 12
max_steps = 1
[output]
name = "reviser"
save_steps = 100
tensorboard = false
[eval]
suites = ["do-no-harm"]
limit = 8
"""


def config(folder: Path, tiny: Path, force: bool = False, eval_share: float = 0.05) -> Path:
    """Margins of 0: a candidate no worse than the active reviser is deployed (a tiny model trained for a step on the
    CPU is no better than the rules); 5 held-out cases are enough, as these stores are small."""
    path = folder / "cycle.toml"
    path.write_text(CONFIG.format(base=tiny, work=folder / "cycles", margin=0.0, force=str(force).lower(),
                                  eval_share=eval_share))
    return path


def test_a_whole_cycle_trains_measures_and_deploys_then_refuses_a_candidate_no_better(plateau, tiny, tmp_path):
    pytest.importorskip("trl", reason="training needs the train extra")
    db = copy_store(plateau["db"], tmp_path)
    settings = load_settings(config(tmp_path, tiny), db)
    call_not_run_yet(db, tmp_path)
    lines: list[str] = []
    done = run_cycle(settings, lines.append)
    steps = [line.split(":")[0] for line in lines if line.split(":")[0] in {s.value for s in Step}]
    assert list(dict.fromkeys(steps)) == ["mine", "decide", "train", "evaluate", "deploy"]
    assert done.status == "done" and done.step == "done" and done.decision == "train"
    assert "harness tuning stopped paying" in done.reason and done.since_call_id is None
    assert done.new_calls == plateau["second"].new_calls + 1 and done.dataset_id is not None  # + call_not_run_yet
    assert done.baseline == "rules" and done.gate["passed"] and done.deployed
    measured = done.figures["eval"]
    assert measured["cases"] > 0 and measured["candidate"]["cases"] == measured["baseline"]["cases"]
    assert set(done.figures) == {"eval", "do-no-harm"}
    assert all(f["candidate"]["valid_changed"] in (0, None) for f in done.figures.values())
    engine = open_store(db)
    with Session(engine) as session:
        state = served(session)
        (newest,) = deployment_history(session, limit=1)
    engine.dispose()
    assert state.active.model_id == done.model_id and state.deployment_id == done.deployment_id
    assert newest.actor == "tracemill cycle" and newest.justification["note"].startswith(f"cycle {done.id}: gate")
    (model,) = json.loads(CliRunner().invoke(main, ["models", "list", "--db", db, "--json"]).output)
    assert model["id"] == done.model_id and model["evaluation"]["eval"]["model"] == measured["candidate"]
    assert model["name"] == f"reviser-cycle-{done.id:04d}"  # [output] name, each cycle's own
    assert Path(model["path"]).is_relative_to(tmp_path / "cycles" / f"cycle-{done.id:04d}")

    again = run_cycle(settings)  # nothing came in since
    assert again.decision == "wait" and again.since_call_id == done.last_call_id and again.model_id is None

    run_failed(db, tmp_path)  # the tool of a call the cycle read as valid: it failed
    late = run_cycle(settings)
    assert (late.since_call_id, late.new_calls, late.new_failures) == (done.last_call_id, 1, 1)
    assert late.decision == "wait" and "fewer than 10 needed" in late.reason
    engine = open_store(db)
    with engine.connect() as conn:
        path = conn.execute(select(DatasetRow.path).where(DatasetRow.id == late.dataset_id)).scalar_one()
    engine.dispose()
    rows = [json.loads(line) for split in ("train", "eval")
            for line in Path(path, f"{split}.jsonl").read_text().splitlines()]
    assert [(r["trace_id"], r["failure_class"]) for r in rows] == [(LATE_TRACE, "execution:upstream_error")]

    send(db, tmp_path, ["prompt-v6"], traces=20, seed=40, day=9)
    stricter = replace(settings, gate=replace(settings.gate, reference_margin=0.01), force=True,
                       mining=replace(settings.mining, eval_share=0.5))
    refused = run_cycle(stricter)
    assert refused.decision == "train" and refused.model_id not in (None, done.model_id)
    assert refused.since_call_id == done.last_call_id and 0 < refused.new_calls < done.new_calls
    assert refused.baseline == model["name"] and not refused.gate["passed"] and not refused.deployed
    assert model_name(db, refused.model_id) == f"reviser-cycle-{refused.id:04d}"
    assert "refused: reference match on eval" in refused.gate["reason"]
    assert active(db) == model["name"]  # the active model stays
    shown = CliRunner().invoke(main, ["cycle", "--history", "--db", db])
    assert shown.exit_code == 0 and "refused: reference match" in shown.output and model["name"] in shown.output


def _dataset_rows(db: str, dataset_id: int) -> list[dict]:  # type: ignore[type-arg]
    engine = open_store(db)
    with engine.connect() as conn:
        path = conn.execute(select(DatasetRow.path).where(DatasetRow.id == dataset_id)).scalar_one()
    engine.dispose()
    return [{**json.loads(line), "split": split} for split in ("train", "eval")
            for line in Path(path, f"{split}.jsonl").read_text().splitlines()]


def test_with_a_window_each_candidate_learns_from_every_call_of_its_days(tiny, tmp_path):
    """`[mine] window_days`: a cycle's candidate trains on every call stored in those days, those an earlier candidate
    trained on too, each trace on the side of the split it had; what is new still decides whether to train."""
    pytest.importorskip("trl", reason="training needs the train extra")
    db = f"sqlite:///{tmp_path / 'traffic.db'}"
    send(db, tmp_path, ["prompt-v1"], traces=30, seed=50)
    settings = load_settings(config(tmp_path, tiny, force=True, eval_share=0.3), db)
    settings = replace(settings, mining=replace(settings.mining, window_days=30))
    first = run_cycle(settings)
    send(db, tmp_path, ["prompt-v1"], traces=10, seed=60, day=1)
    lines: list[str] = []
    second = run_cycle(settings, lines.append)
    assert first.model_id is not None and second.model_id is not None
    assert second.since_call_id == first.last_call_id and 0 < second.new_calls < first.new_calls
    assert any(line.startswith("mine: ") and "every call of the last 30 day(s)" in line for line in lines), lines
    before, now = _dataset_rows(db, first.dataset_id), _dataset_rows(db, second.dataset_id)
    sides = {r["trace_id"]: r["split"] for r in now}
    assert {r["trace_id"] for r in before} < set(sides)  # the first cycle's traces, and new ones
    assert all(sides[r["trace_id"]] == r["split"] for r in before)


def test_a_cycle_killed_at_each_step_leaves_the_deployment_as_it_was(tiny, tmp_path):
    pytest.importorskip("trl", reason="training needs the train extra")
    db = f"sqlite:///{tmp_path / 'traffic.db'}"
    send(db, tmp_path, ["prompt-v1"], traces=30, seed=50)
    path = config(tmp_path, tiny, force=True, eval_share=0.3)
    killed: dict[int, str] = {}
    previous = None
    for pause, step in (("mine:", "mine"), ("decide:", "decide"), ("train:", "train"), ("evaluate:", "evaluate"),
                        ("deploy: committing", "deploy")):
        process = subprocess.Popen([sys.executable, str(DRIVER), str(path), db, pause], stdout=subprocess.PIPE,
                                   stderr=subprocess.STDOUT, text=True)
        output = []
        for line in process.stdout:
            output.append(line)
            if line.strip() == "PAUSED":
                break
        process.kill()  # SIGKILL: no handler runs, no transaction commits
        process.wait()
        assert output and output[-1].strip() == "PAUSED", "".join(output[-30:])
        if previous is not None:  # the one before was marked by this one, which held the lock after it
            assert f"cycle {previous[0]} was killed at step {previous[1]}" in "".join(output)
        assert active(db) == "rules", pause
        newest = cycles(db)[0]
        assert newest.status == "running" and newest.step == step and not newest.deployed
        killed[newest.id] = step
        previous = (newest.id, step)
    done = subprocess.run([sys.executable, str(DRIVER), str(path), db], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "deployed=True" in done.stdout
    assert f"cycle {previous[0]} was killed at step deploy" in done.stdout
    rows = {r.id: r for r in cycles(db)}
    assert all(rows[i].status == "interrupted" and f"ended at step {s}" in rows[i].error for i, s in killed.items())
    final = rows[max(rows)]
    assert final.status == "done" and final.deployed and active(db) == model_name(db, final.model_id)
    assert final.since_call_id is None  # the killed ones trained nothing that counts: it starts clean
    for cycle_id, step in killed.items():  # their training is gone, but for the one whose model was registered
        assert (tmp_path / "cycles" / f"cycle-{cycle_id:04d}" / "run").exists() == (step == "deploy")
        assert (tmp_path / "cycles" / f"cycle-{cycle_id:04d}" / "dataset").exists() == (step != "mine")


def model_name(db: str, model_id: int) -> str:
    engine = open_store(db)
    with engine.connect() as conn:
        (name,) = conn.execute(select(ModelRow.name).where(ModelRow.id == model_id)).one()
    engine.dispose()
    return name


def every_until_it_waits(*args: str) -> str:
    """`tracemill cycle ARGS --every 1h` until it waits for its next turn, then Ctrl-C; what it printed till then."""
    process = subprocess.Popen([sys.executable, "-m", "tracemill.cli", "cycle", *args, "--every", "1h"],
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    output = []
    for line in process.stdout:
        output.append(line)
        if line.startswith("next cycle in"):
            break
    process.send_signal(signal.SIGINT)
    rest, _ = process.communicate(timeout=60)
    assert process.returncode == 0 and rest.strip().endswith("stopped"), "".join(output) + rest
    return "".join(output)


def test_every_runs_in_the_foreground_and_ctrl_c_stops_it_cleanly(tmp_path):
    db = f"sqlite:///{tmp_path / 'empty.db'}"
    output = every_until_it_waits("--db", db, "--base", "unused", "--work", str(tmp_path / "cycles"))
    assert "decision wait: no new calls" in output and "next cycle in 1.00 h" in output
    assert [c.decision for c in cycles(db)] == ["wait"]
    bad = CliRunner().invoke(main, ["cycle", "--db", db, "--base", "x", "--every", "soon"])
    assert bad.exit_code == 2 and "'soon' is not a period" in bad.output


def test_every_records_a_failed_cycle_and_goes_on_and_a_single_cycle_says_why_in_a_line(plateau, tmp_path):
    pytest.importorskip("trl", reason="a cycle that trains needs the train extra")
    db = copy_store(plateau["db"], tmp_path)
    path = config(tmp_path, tmp_path / "unused", force=True, eval_share=1.0)  # every trace held out: none to train on
    output = every_until_it_waits("--config", str(path), "--db", db)
    failed = cycles(db)[0]
    assert failed.status == "failed" and failed.step == "decide" and failed.model_id is None
    assert failed.error.startswith("at step decide: DatasetError: ") and "no rows to train on" in failed.error
    assert f"cycle: cycle {failed.id} failed {failed.error}\nnext cycle in" in output

    once = CliRunner().invoke(main, ["cycle", "--config", str(path), "--db", db])
    again = cycles(db)[0]
    assert once.exit_code == 1 and again.id == failed.id + 1 and again.status == "failed"
    assert once.output.splitlines()[-1] == f"Error: cycle {again.id} failed {again.error}"

    missing = f"sqlite:///{tmp_path / 'missing' / 'store.db'}"  # a store out of reach: tried again next turn
    output = every_until_it_waits("--db", missing, "--base", "unused", "--work", str(tmp_path / "cycles"))
    assert f"cycle: cannot read the store at {missing}: unable to open database file\nnext cycle in" in output


def test_a_model_name_already_registered_is_refused_before_training(plateau, tiny, tmp_path):
    pytest.importorskip("trl", reason="training needs the train extra")
    db = copy_store(plateau["db"], tmp_path)
    taken = f"reviser-cycle-{len(cycles(db)) + 1:04d}"  # the next cycle's, from [output] name = "reviser"
    engine = open_store(db)
    register_model(engine, NewModel(str(tiny), "full", str(tmp_path / "elsewhere"), None, {}, {}, {}, taken))
    engine.dispose()
    lines: list[str] = []
    with pytest.raises(CycleError, match=f"failed at step decide: a model named {taken} is already registered"):
        run_cycle(load_settings(config(tmp_path, tiny, force=True), db), lines.append)
    assert not any(line.startswith("train:") for line in lines)
    assert cycles(db)[0].status == "failed"


def test_a_cycle_that_fails_or_is_stopped_after_training_removes_its_checkpoints(plateau, tiny, tmp_path):
    pytest.importorskip("trl", reason="training needs the train extra")
    db = copy_store(plateau["db"], tmp_path)
    engine = open_store(db)  # the active model's folder is gone: the cycle fails once it has trained
    register_model(engine, NewModel(str(tiny), "full", str(tmp_path / "gone"), None, {}, {}, {}, "gone"))
    deploy(engine, "gone", "someone")
    path = config(tmp_path, tiny, force=True)
    with pytest.raises(CycleError, match="failed at step train: ReviserSpecError: model:.*gone: not a trained reviser"):
        run_cycle(load_settings(path, db))
    failed = cycles(db)[0]
    assert failed.status == "failed" and active(db) == "gone"

    rollback(engine, "someone")
    engine.dispose()
    process = subprocess.Popen([sys.executable, str(DRIVER), str(path), db, "evaluate:"], stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True)
    output = []
    for line in process.stdout:
        output.append(line)
        if line.strip() == "PAUSED":
            break
    process.send_signal(signal.SIGINT)
    rest, _ = process.communicate(timeout=60)
    assert process.returncode != 0 and "KeyboardInterrupt" in rest, "".join(output) + rest
    stopped = cycles(db)[0]
    assert stopped.status == "interrupted" and stopped.error == "stopped by Ctrl-C at step evaluate"
    for cycle in (failed, stopped):
        folder = tmp_path / "cycles" / f"cycle-{cycle.id:04d}"
        assert (folder / "dataset").is_dir() and not (folder / "run").exists(), cycle
