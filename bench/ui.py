"""UI benchmark: the store reads behind each page of `tracemill ui`, timed on SQLite with a million spans.

The store: `tracemill simulate` episodes stored by the collector (the real ingest path), then copied with fresh
trace ids (the first 24 hex digits kept, the last 8 numbering the copy) until `spans` holds --spans rows. Run by hand
(see bench/README.md, "UI"):

    flock /tmp/tracemill-bench.lock .venv/bin/python bench/ui.py --out bench/out/ui.json
"""

from __future__ import annotations

import argparse
import json
import shutil
import sqlite3
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from sqlalchemy import Engine
from sqlalchemy.orm import Session

from tracemill.miner.failures import FailureCounts, failure_report
from tracemill.serving import deployments
from tracemill.settings import Settings
from tracemill.simulate import simulate
from tracemill.store import learning, queries, traces
from tracemill.store.engine import make_engine
from tracemill.store.migrate import upgrade
from tracemill.store.tables import utcnow
from tracemill.ui import decide, queue

from support import CollectorProcess

RECOUNT = 20_000  # the newest ids the Failure modes page counts again on each visit (FailureCounts.update)
_SPAN_COLUMNS = ("trace_id, span_id, parent_span_id, name, kind, start_time_ns, end_time_ns, status_code, "
                 "status_message, service_name, scope_name, attributes, resource, events, links, received_at")


def build(path: Path, episodes: int, spans: int) -> None:
    work = Path(tempfile.mkdtemp(prefix="tracemill-uibench-"))
    seed_db = work / "seed.db"
    collector = CollectorProcess(f"sqlite:///{seed_db}", work).start()
    try:
        simulate(collector.url, traces=episodes // 2, seed=0, harness_version="prompt-v1")
        simulate(collector.url, traces=episodes - episodes // 2, seed=1, profile="qwen3", harness_version="prompt-v2")
    finally:
        collector.stop()
    shutil.copy(seed_db, path)
    db = sqlite3.connect(path)
    top_s, top_c, top_e = (db.execute(f"select max(id) from {t}").fetchone()[0]
                           for t in ("spans", "tool_calls", "tool_executions"))
    copy = 1
    while db.execute("select max(id) from spans").fetchone()[0] < spans:
        tid = f"substr(trace_id, 1, 24) || printf('%08x', {copy})"
        db.execute(f"insert into spans (id, {_SPAN_COLUMNS}) select id + {copy * top_s}, {tid}, "
                   f"{_SPAN_COLUMNS.split(', ', 1)[1]} from spans where id <= {top_s}")
        db.execute(f"insert into tool_calls select id + {copy * top_c}, {tid}, span_id, call_index, tool_call_id, "
                   "raw, name, arguments, toolset_id, parsed, name_valid, schema_valid, stage, violations, "
                   "execution_status, execution_error, execution_result, execution_span_id, model, harness_version, "
                   f"domain, repairs_id + {copy * top_c}, start_time_ns, created_at from tool_calls "
                   f"where id <= {top_c}")
        db.execute(f"insert into tool_executions select id + {copy * top_e}, {tid}, span_id, tool_call_id, tool_name, "
                   f"arguments, ok, error, result from tool_executions where id <= {top_e}")
        db.commit()
        copy += 1
    db.close()
    shutil.rmtree(work)


def timed(fn: Callable[[], Any], repeat: int) -> dict[str, float]:
    """Wall and CPU milliseconds (this process's: SQLite runs in it), median and worst of `repeat` runs."""
    walls, cpus = [], []
    for _ in range(repeat):
        started, cpu = time.perf_counter(), time.process_time()
        fn()
        walls.append((time.perf_counter() - started) * 1000)
        cpus.append((time.process_time() - cpu) * 1000)
    return {"median_ms": round(statistics.median(walls), 1), "max_ms": round(max(walls), 1),
            "median_cpu_ms": round(statistics.median(cpus), 1), "max_cpu_ms": round(max(cpus), 1)}


def failures_visit(engine: Engine, new_calls: int) -> Any:
    """The Failure modes page after `new_calls` calls were stored since its last visit (it keeps its counts)."""
    with engine.connect() as conn:
        top = int(conn.exec_driver_sql("select max(id) from tool_calls").scalar())
    counts = FailureCounts(settled_id=max(0, top - new_calls - RECOUNT)).update(engine, recount=RECOUNT)
    return counts.report(), counts.report(("stage", "kind"),
                                          since_day=(utcnow() - timedelta(days=7)).date().isoformat())


def facets_visit(conn: Any, new_calls: int) -> Any:
    """The Traces page's filter values after `new_calls` calls were stored since its last visit."""
    top = int(conn.exec_driver_sql("select max(id) from tool_calls").scalar())
    return traces.facets(conn, known=traces.Facets({}, {}, {}, {}, (), max(0, top - new_calls)))


def models_page(engine: Engine) -> Any:
    with engine.connect() as conn:
        found = learning.models(conn)
    with Session(engine) as session:
        return found, deployments.served(session), deployments.history(session, limit=200)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--db", type=Path, default=ROOT / "bench" / "out" / "ui.db", help="kept between runs")
    parser.add_argument("--spans", type=int, default=1_000_000)
    parser.add_argument("--episodes", type=int, default=1000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    args.db.parent.mkdir(parents=True, exist_ok=True)
    if not args.db.exists():
        build(args.db, args.episodes, args.spans)
    engine = make_engine(f"sqlite:///{args.db}")
    upgrade(engine)
    rules = queue.QueueRules.from_settings(Settings())
    while queue.scan(engine, rules, budget_s=60).remaining:  # the queue filled once, as visits do over time
        pass
    with engine.connect() as conn:
        sizes = {t: conn.exec_driver_sql(f"select count(*) from {t}").scalar() for t in
                 ("spans", "tool_calls", "review_queue")}
        trace = conn.exec_driver_sql("select trace_id from tool_calls where domain = 'medical' "
                                     "order by id desc limit 1").scalar()
    item = queue.waiting(engine, "bench")[0].call_id
    f = traces.TraceFilter

    def page(reads: Callable[[Any], Any]) -> Callable[[], Any]:
        def run() -> Any:
            with engine.connect() as conn:
                return reads(conn)
        return run

    checks: dict[str, Callable[[], Any]] = {
        "traces: filter values, first visit of a UI process": page(traces.facets),
        "traces: filter values, a visit after 1,000 new calls": page(lambda c: facets_visit(c, 1000)),
        "traces: newest 50": page(lambda c: traces.traces(c)),
        "traces: service": page(lambda c: traces.traces(c, f(service="tracemill-simulate"))),
        "traces: service no trace has": page(lambda c: traces.traces(c, f(service="nobody"))),
        "traces: domain medical": page(lambda c: traces.traces(c, f(queries.CallFilter(domain="medical")))),
        "traces: stage schema + model": page(lambda c: traces.traces(
            c, f(queries.CallFilter(stage="schema", model="qwen3")))),
        "traces: a rare tool": page(lambda c: traces.traces(
            c, f(queries.CallFilter(tool="Medical Calculator:homa_ir")))),
        "traces: free text no call has": page(lambda c: traces.traces(c, f(text="zz-no-such-words"))),
        "traces: page 2 (older)": page(lambda c: traces.traces(c, before=traces.traces(c).before)),
        "trace: spans, calls, toolsets": page(lambda c: (queries.trace_spans(c, trace, resolved=False),
                                                         queries.toolsets(c, [x.toolset_id for x in queries.trace_calls(
                                                             c, [trace])[trace] if x.toolset_id]))),
        "failure modes: first visit of a UI process (failure_report)": lambda: failure_report(engine),
        "failure modes: a visit after 1,000 new calls": lambda: failures_visit(engine, 1000),
        "review: scan of new calls (none)": lambda: queue.scan(engine, rules, budget_s=0.5),
        "review: progress": lambda: queue.progress(engine),
        "review: next waiting": lambda: queue.waiting(engine, "bench"),
        "review: the item": lambda: decide.subject(engine, item),
        "datasets": page(learning.datasets),
        "models and deployments": lambda: models_page(engine),
    }
    results = {name: timed(fn, args.repeat) for name, fn in checks.items()}
    width = max(map(len, results))
    print(f"store: {sizes}")
    for name, r in results.items():
        print(f"{name:<{width}}  median {r['median_ms']:8.1f} ms   max {r['max_ms']:8.1f} ms   "
              f"cpu median {r['median_cpu_ms']:8.1f} ms   max {r['max_cpu_ms']:8.1f} ms")
    if args.out:
        args.out.write_text(json.dumps({"store": sizes, "results": results}, indent=2))


if __name__ == "__main__":
    main()
