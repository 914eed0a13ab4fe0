"""Mining speed: `tracemill mine` over a store of a million tool calls, on SQLite and PostgreSQL, timed as a user runs
it (a subprocess), with its peak resident memory. Target: under a minute, under 1 GB.

The store: a base corpus sent by `tracemill simulate` through a real collector (the three weak-model profiles over
MCP-Bench and BFCL, with their faults, retries and failed executions), then copied trace by trace until it holds
`--calls` tool calls. Each copy gets new trace ids, its own user request (so that no copied prompt is a duplicate of
another), and a start time spread over thirty days; its spans, calls, executions and conversations are inserted as
rows, as the collector would have stored them. A store already at the size is reused.

Run by hand, never in CI (see bench/README.md, "Mine"), under the bench lock:

    flock /tmp/tracemill-bench.lock .venv/bin/python bench/mine.py --db sqlite:///bench/out/mine.db \\
        --db postgresql+psycopg://postgres@127.0.0.1:5432/tracemill_bench_mine --out bench/out/mine.json
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import orjson
from sqlalchemy import Engine, func, select, text
from sqlalchemy.engine import make_url

from tracemill.net import free_port
from tracemill.simulate import simulate
from tracemill.store.bulk import BulkInsert
from tracemill.store.engine import make_engine
from tracemill.store.migrate import upgrade
from tracemill.store.payloads import PAYLOAD_MIN_CHARS, assemble, bodies_of, digests, in_parts, is_reference, reference
from tracemill.store.tables import PayloadRow, SpanRow, ToolCallRow, ToolExecutionRow, utcnow

PROFILES = ("llama3.1-8b", "gemma3-27b", "qwen3")
DAY_NS = 86_400 * 1_000_000_000
START_NS = 1_780_000_000_000_000_000


def _create_database(url: str) -> None:
    parsed = make_url(url)
    if parsed.get_backend_name() != "postgresql":
        return
    admin = make_engine(parsed.set(database="postgres").render_as_string(hide_password=False))
    with admin.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        if conn.execute(text("SELECT 1 FROM pg_database WHERE datname = :n"), {"n": parsed.database}).first() is None:
            conn.execute(text(f'CREATE DATABASE "{parsed.database}"'))
    admin.dispose()


def _count(engine: Engine) -> int:
    with engine.connect() as conn:
        return int(conn.execute(select(func.count()).select_from(ToolCallRow)).scalar_one())


@contextmanager
def running_collector(url: str) -> Iterator[str]:
    """`tracemill collector` on the store at `url` while the block runs: its address."""
    port = free_port()
    collector = subprocess.Popen([sys.executable, "-m", "tracemill.cli", "collector", "--port", str(port),
                                  "--grpc-port", "0", "--db", url, "--workers", "1"],
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    address = f"http://127.0.0.1:{port}"
    try:
        for _ in range(200):
            try:
                if httpx.get(f"{address}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.1)
        yield address
    finally:
        collector.terminate()
        collector.wait(30)


def _base_corpus(url: str, episodes: int) -> None:
    with running_collector(url) as address:
        for n, profile in enumerate(PROFILES):
            simulate(address, traces=episodes, seed=n, profile=profile, start_ns=START_NS,
                     harness_version=f"sim-{1 + n % 2}")


def _salted(value: Any, copy: int, payloads: dict[str, str], new_payloads: dict[str, dict[str, Any]]) -> Any:
    """A conversation with the copy's number in its first user request."""
    body = assemble(value, payloads) if is_reference(value) else value
    if not isinstance(body, str):
        return value
    messages = orjson.loads(body)
    for message in messages:
        if message.get("role") == "user" and message.get("parts"):
            message["parts"][0]["content"] = f"{message['parts'][0].get('content', '')} (request {copy})"
            break
    salted = orjson.dumps(messages).decode()
    if len(salted) < PAYLOAD_MIN_CHARS:
        return salted
    cut = in_parts(salted)
    if cut is None:
        key, ref = reference(salted)
        pieces = [(key, salted)]
    else:
        pieces, ref = cut
    new_payloads.update((d, {"digest": d, "body": b, "chars": len(b)}) for d, b in pieces)
    return ref


def _copy(engine: Engine, target_calls: int) -> None:
    """Copy the base corpus trace by trace until the store holds `target_calls` calls."""
    with engine.connect() as conn:
        # in id order: every backend gives the copies the same ids (valid calls are sampled by id)
        spans = [dict(r._mapping) for r in conn.execute(select(SpanRow).order_by(SpanRow.id))]
        calls = [dict(r._mapping) for r in conn.execute(select(ToolCallRow).order_by(ToolCallRow.id))]
        executions = [dict(r._mapping) for r in conn.execute(select(ToolExecutionRow).order_by(ToolExecutionRow.id))]
        payloads = bodies_of(conn, (d for s in spans for k, v in s["attributes"].items()
                                    if k == "gen_ai.input.messages" and is_reference(v) for d in digests(v)))
    for rows in (spans, calls, executions):
        for row in rows:
            row.pop("id", None)
    inserts = {t: BulkInsert(t.__table__, engine.dialect) for t in (SpanRow, ToolCallRow, ToolExecutionRow, PayloadRow)}
    base, have, copy = len(calls), _count(engine), 0
    started = time.perf_counter()
    while have < target_calls:
        copy += 1
        take = min(base, target_calls - have)
        traces = sorted({c["trace_id"] for c in calls})
        chosen = set(traces) if take == base else set(_prefix(calls, take))
        new_id = {t: hashlib.blake2b(f"{t}:{copy}".encode(), digest_size=16).hexdigest() for t in chosen}
        shift = (copy % 30) * DAY_NS + copy * 1_000_000
        now = utcnow()
        new_payloads: dict[str, dict[str, Any]] = {}
        span_rows = []
        for s in spans:
            if s["trace_id"] not in new_id:
                continue
            attributes = s["attributes"]
            if "gen_ai.input.messages" in attributes:
                attributes = {**attributes, "gen_ai.input.messages": _salted(
                    attributes["gen_ai.input.messages"], copy, payloads, new_payloads)}
            span_rows.append({**s, "trace_id": new_id[s["trace_id"]], "attributes": attributes,
                              "start_time_ns": s["start_time_ns"] + shift, "end_time_ns": s["end_time_ns"] + shift,
                              "received_at": now})
        call_rows = [{**c, "trace_id": new_id[c["trace_id"]], "start_time_ns": c["start_time_ns"] + shift,
                      "repairs_id": None, "created_at": now} for c in calls if c["trace_id"] in new_id]
        execution_rows = [{**e, "trace_id": new_id[e["trace_id"]]} for e in executions if e["trace_id"] in new_id]
        with engine.begin() as conn:
            inserts[PayloadRow].execute(conn, list(new_payloads.values()))
            inserts[SpanRow].execute(conn, span_rows)
            inserts[ToolCallRow].execute(conn, call_rows)
            inserts[ToolExecutionRow].execute(conn, execution_rows)
        have += len(call_rows)
        print(f"  copy {copy}: {have} calls ({time.perf_counter() - started:.0f} s)", file=sys.stderr)


def _prefix(calls: list[dict[str, Any]], take: int) -> list[str]:
    """Whole traces, in order, holding about `take` calls."""
    chosen: list[str] = []
    for taken, c in enumerate(sorted(calls, key=lambda c: c["trace_id"])):
        if not chosen or chosen[-1] != c["trace_id"]:
            if taken >= take:
                break
            chosen.append(c["trace_id"])
    return chosen


def build(url: str, calls: int, episodes: int) -> dict[str, Any]:
    _create_database(url)
    engine = make_engine(url)
    upgrade(engine)
    started = time.perf_counter()
    if _count(engine) == 0:
        _base_corpus(url, episodes)
    base = _count(engine)
    if base < calls:
        _copy(engine, calls)
    if engine.dialect.name == "postgresql":  # statistics, as autovacuum keeps them for a store filled over time
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.execute(text("ANALYZE"))
    with engine.connect() as conn:
        failed = conn.execute(select(func.count()).select_from(ToolCallRow).where(
            (ToolCallRow.stage.is_not(None)) | (ToolCallRow.execution_status == "error"))).scalar_one()
        spans = conn.execute(select(func.count()).select_from(SpanRow)).scalar_one()
    total = _count(engine)
    engine.dispose()
    return {"calls": total, "failed_calls": failed, "spans": spans, "base_calls": base,
            "build_seconds": round(time.perf_counter() - started, 1)}


def loop_seconds() -> float:
    """CPU seconds of a 10-million-step empty loop, the best of five: how fast this machine runs Python, so that runs on
    machines of one kind (which have differed by eleven times on it) can be compared."""
    best = float("inf")
    for _ in range(5):
        started = time.process_time()
        for _ in range(10_000_000):
            pass
        best = min(best, time.process_time() - started)
    return round(best, 3)


def run_mine(url: str, out: Path) -> dict[str, Any]:
    """`tracemill mine` as a user runs it; resident memory is that of its whole process tree (it and its workers),
    sampled every 0.1 s, CPU that of the tree."""
    import psutil

    shutil.rmtree(out, ignore_errors=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    with open(out.with_suffix(".stdout"), "w+") as stdout, open(out.with_suffix(".stderr"), "w+") as stderr:
        child = subprocess.Popen([sys.executable, "-m", "tracemill.cli", "mine", "--db", url, "--out", str(out),
                                  "--json"], stdout=stdout, stderr=stderr)
        tree, peak, cpu = psutil.Process(child.pid), 0, {}
        while child.poll() is None:
            total = 0
            for proc in [tree, *tree.children(recursive=True)]:
                try:
                    total += proc.memory_info().rss
                    times = proc.cpu_times()
                    cpu[proc.pid] = times.user + times.system
                except psutil.Error:
                    pass
            peak = max(peak, total)
            time.sleep(0.1)
        seconds = time.perf_counter() - started
        stdout.seek(0)
        stderr.seek(0)
        if child.returncode != 0:
            raise SystemExit(stderr.read()[-3000:])
        card = json.loads(stdout.read())
    return {"seconds": round(seconds, 1), "peak_rss_mb": round(peak / 2**20),
            "cpu_seconds": round(sum(cpu.values()), 1),
            "calls_read": card["calls_read"], "rows": card["counts"]["rows"],
            "train_rows": card["splits"]["train"]["rows"], "eval_rows": card["splits"]["eval"]["rows"],
            "provenance": card["counts"]["provenance"], "duplicates_dropped": card["duplicates_dropped"],
            "repairs_linked": card["repairs_linked"]}


def machine() -> dict[str, Any]:
    return {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform()}


def measure(url: str, store: dict[str, Any], out: Path) -> dict[str, Any]:
    """A built store (`store`: what `build` said of it) mined by `run_mine` into `out`, with how fast the machine ran
    Python before and after (`loop_seconds`); printed as it comes."""
    backend = make_url(url).get_backend_name()
    print(f"{backend}: mining", file=sys.stderr)
    before = loop_seconds()
    figures = {"store": store, "mine": run_mine(url, out), "loop_seconds": [before, loop_seconds()]}
    print(json.dumps({backend: figures}, indent=2))
    return figures


def save(figures: dict[str, Any], path: Path | None) -> None:
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(figures, indent=2) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--db", action="append", required=True, help="a store URL (repeat for several)")
    parser.add_argument("--calls", type=int, default=1_000_000)
    parser.add_argument("--episodes", type=int, default=3000, help="base corpus: episodes per profile")
    parser.add_argument("--out", type=Path, help="write the figures here as JSON")
    args = parser.parse_args()
    figures: dict[str, Any] = {"machine": machine(), "stores": {}}
    for url in args.db:
        backend = make_url(url).get_backend_name()
        print(f"{backend}: building {args.calls} calls", file=sys.stderr)
        store = build(url, args.calls, args.episodes)
        figures["stores"][backend] = measure(url, store, Path(f"bench/out/mine-{backend}"))
    save(figures, args.out)


if __name__ == "__main__":
    main()
