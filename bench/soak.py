"""Soak: the collector under mixed load for a long time, with faults injected on a schedule, on a PostgreSQL store.
Reports spans acknowledged, spans stored, answers by status and peak resident memory; at the end every acknowledged
span must be stored, and nothing else.

Run by hand, never in CI (see bench/README.md, "Soak"):

    flock /tmp/tracemill-bench.lock .venv/bin/python bench/soak.py --out bench/out/soak.json

Load: --exporters threads, each exporting a batch every --interval seconds as the SDK's BatchSpanProcessor does (at
once when the last answer took longer). Batches, in turn: OpenTelemetry GenAI agent traces (bench/ingest.py's bodies)
of 512 spans, gzip; of 64 spans, plain protobuf; 20 spans of OTLP/JSON. Every --poison-every-th batch also carries two
poison spans (a time past 2^63 ns, a NUL character, or a tool call whose arguments the store refuses), which the
collector must refuse alone. An exporter resends a batch after 503, 429 or a connection error until it is
acknowledged.

Faults, one every --fault-every seconds, in turn:
  slow clients  four uploads trickling a byte every 0.5 s (two chunked, two announcing 8 MB): each must get 408
  worker kill   SIGKILL of one ingest process
  backend loss  pg_terminate_backend of every connection to the store
  outage        the store refuses connections for --outage seconds (and its connections are terminated)
"""

from __future__ import annotations

import argparse
import gzip
import itertools
import json
import signal
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import orjson
import psutil
from opentelemetry.proto.trace.v1.trace_pb2 import Span
from sqlalchemy import Engine, create_engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import SQLAlchemyError

from ingest import Bodies, machine

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from tracemill.otlp import PartialSuccess, partial_success
from tracemill.store.engine import make_engine
from tracemill.store.migrate import upgrade

from support import CollectorProcess, SlowUpload, chat_attributes, export_request, make_span, refused_connections

ADMIN_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/test"
POISON_PER_BATCH = 2
MB = 1024 * 1024


# ---------------------------------------------------------------------------------------------------- batches


@dataclass(frozen=True)
class Batch:
    body: bytes
    content_type: str
    gzipped: bool
    spans: int
    poison: int  # spans the collector must refuse


def _poison(seq: int, kind: int) -> list[Span]:
    """POISON_PER_BATCH spans no store can keep, of kind 0, 1 or 2, with ids of their own."""
    trace = f"{0xF0000000 + seq:032x}"
    ids = [f"{seq:08x}{n + 1:08x}" for n in range(POISON_PER_BATCH)]
    if kind == 0:
        return [make_span(trace, i, "chat", {}, start_ns=2**63) for i in ids]
    if kind == 1:
        return [make_span(trace, i, "chat", {"gen_ai.prompt": "a\x00b"}) for i in ids]
    calls = [{"id": "big", "name": "get_weather", "arguments": '{"city": 123456789012345678901234567890}'}]
    return [make_span(trace, i, "chat", chat_attributes(calls)) for i in ids]


def _json_batch(seq: int, spans: int) -> bytes:
    trace, now = f"{0xE0000000 + seq:032x}", time.time_ns()
    return orjson.dumps({"resourceSpans": [{
        "resource": {"attributes": [{"key": "service.name", "value": {"stringValue": "soak-json"}}]},
        "scopeSpans": [{"scope": {"name": "soak"}, "spans": [
            {"traceId": trace, "spanId": f"{n + 1:016x}", "name": "chat", "kind": 3,
             "startTimeUnixNano": str(now - 1_000_000_000), "endTimeUnixNano": str(now),
             "attributes": [{"key": "gen_ai.operation.name", "value": {"stringValue": "chat"}}]}
            for n in range(spans)]}]}]})


class Batches:
    """The batches of the load, each with ids of its own (from one sequence number)."""

    def __init__(self, poison_every: int, seed: int) -> None:
        self.large = Bodies(4, 512, seed)
        self.small = Bodies(4, 64, seed + 1)
        self.poison_every = poison_every
        self._seqs = itertools.count(1)
        self._poisoned = itertools.count()
        self._lock = threading.Lock()

    def next(self) -> Batch:
        with self._lock:
            seq = next(self._seqs)
            if seq % 3 == 2:
                return Batch(_json_batch(seq, 20), "application/json", False, 20, 0)
            poisoned = next(self._poisoned) if seq % self.poison_every == 0 else None
        poison = 0 if poisoned is None else POISON_PER_BATCH
        # Serialized protobuf messages concatenated are one message with their repeated fields joined.
        body = bytes((self.large if seq % 3 == 0 else self.small).body(seq)) + (
            b"" if poisoned is None else export_request(_poison(seq, poisoned % 3)))
        spans = (512 if seq % 3 == 0 else 64) + poison
        if seq % 3 == 0:
            return Batch(gzip.compress(body, 1), "application/x-protobuf", True, spans, poison)
        return Batch(body, "application/x-protobuf", False, spans, poison)


# ---------------------------------------------------------------------------------------------------- load


@dataclass
class Tally:
    """What the exporters and the faults saw."""

    acked_spans: int = 0
    acked_requests: int = 0
    rejected_spans: int = 0
    unexpected_rejections: list[str] = field(default_factory=list)  # answers whose partial_success was not the poison
    statuses: Counter[str] = field(default_factory=Counter)  # per attempt
    given_up: int = 0  # batches never acknowledged (a final answer, or the drain ran out)
    slow_uploads: Counter[str] = field(default_factory=Counter)
    faults: list[tuple[float, str]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)


class Exporter(threading.Thread):
    def __init__(self, url: str, batches: Batches, interval_s: float, tally: Tally, stop: threading.Event,
                 give_up: threading.Event) -> None:
        super().__init__(daemon=True)
        self.url, self.batches, self.interval_s, self.tally = url, batches, interval_s, tally
        self.stop, self.give_up = stop, give_up

    def run(self) -> None:
        with httpx.Client(timeout=120) as client:
            while not self.stop.is_set():
                started = time.monotonic()
                self.deliver(client, self.batches.next())
                self.stop.wait(max(0.0, self.interval_s - (time.monotonic() - started)))

    def deliver(self, client: httpx.Client, batch: Batch) -> None:
        headers = {"Content-Type": batch.content_type, **({"Content-Encoding": "gzip"} if batch.gzipped else {})}
        while True:
            try:
                answer = client.post(f"{self.url}/v1/traces", content=batch.body, headers=headers)
                status, retry_after = str(answer.status_code), answer.headers.get("Retry-After", "")
            except httpx.TransportError:
                answer, status, retry_after = None, "connection error", ""
            with self.tally.lock:
                self.tally.statuses[status] += 1
            if answer is not None and status == "200":
                self.acknowledged(batch, partial_success(answer.content, answer.headers.get("Content-Type", "")))
                return
            if status not in ("503", "429", "connection error") or self.give_up.is_set():
                with self.tally.lock:
                    self.tally.given_up += 1
                return
            time.sleep(float(retry_after) if retry_after.isdigit() else 1.0)

    def acknowledged(self, batch: Batch, partial: PartialSuccess) -> None:
        with self.tally.lock:
            self.tally.acked_requests += 1
            self.tally.acked_spans += batch.spans - partial.rejected_spans
            self.tally.rejected_spans += partial.rejected_spans
            if partial.rejected_spans != batch.poison:
                self.tally.unexpected_rejections.append(f"{partial.rejected_spans} of {batch.poison} poison: "
                                                        f"{partial.error_message[:200]}")


# ---------------------------------------------------------------------------------------------------- faults


class Faults(threading.Thread):
    """Injects one fault every `every_s` seconds, each kind in turn."""

    def __init__(self, collector: CollectorProcess, admin: Engine, database: str, every_s: float, outage_s: float,
                 tally: Tally, stop: threading.Event, started: float) -> None:
        super().__init__(daemon=True)
        self.collector, self.admin, self.database = collector, admin, database
        self.every_s, self.outage_s, self.tally, self.stop, self.started = every_s, outage_s, tally, stop, started
        self.kinds: list[tuple[str, Callable[[], None]]] = [
            ("slow clients", self.slow_clients), ("worker kill", self.worker_kill),
            ("backend loss", self.backend_loss), ("outage", self.outage)]

    def run(self) -> None:
        for name, inject in itertools.cycle(self.kinds):
            if self.stop.wait(self.every_s):
                return
            with self.tally.lock:
                self.tally.faults.append((round(time.monotonic() - self.started, 1), name))
            inject()

    def slow_clients(self) -> None:
        uploads = [SlowUpload(self.collector.port, declared) for declared in (None, None, 8 * MB, 8 * MB)]
        for upload in uploads:
            upload.start()

        def collect() -> None:
            for upload in uploads:
                status = upload.status(timeout=120)
                with self.tally.lock:
                    self.tally.slow_uploads[str(status)] += 1

        threading.Thread(target=collect, daemon=True).start()

    def worker_kill(self) -> None:
        assert self.collector.proc is not None
        workers = [p for p in psutil.Process(self.collector.proc.pid).children()
                   if not any("resource_tracker" in part for part in p.cmdline())]
        if workers:
            workers[0].send_signal(signal.SIGKILL)

    def backend_loss(self) -> None:
        with self.admin.connect() as conn:
            conn.execute(text("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = :name"),
                         {"name": self.database})

    def outage(self) -> None:
        with refused_connections(self.admin, self.database):
            self.stop.wait(self.outage_s)


# ---------------------------------------------------------------------------------------------------- run


class Memory(threading.Thread):
    """The collector's resident memory (its whole process tree), sampled every second."""

    def __init__(self, pid: int) -> None:
        super().__init__(daemon=True)
        self.pid = pid
        self.peak = self.now = 0
        self._done = threading.Event()

    def run(self) -> None:
        while not self._done.wait(1.0):
            try:
                root = psutil.Process(self.pid)
                tree = [root, *root.children(recursive=True)]
            except psutil.NoSuchProcess:
                continue
            total = 0
            for process in tree:
                try:
                    total += process.memory_info().rss
                except psutil.NoSuchProcess:
                    pass
            self.now, self.peak = total, max(self.peak, total)

    def stop(self) -> None:
        self._done.set()
        self.join()


def stored_spans(db_url: str) -> int:
    engine = make_engine(db_url)
    try:
        with engine.connect() as conn:
            return int(conn.execute(text("SELECT count(*) FROM spans")).scalar_one())
    finally:
        engine.dispose()


def _stored_now(db_url: str) -> str:
    try:
        return f"{stored_spans(db_url):,}"
    except SQLAlchemyError:
        return "? (store unavailable)"


@contextmanager
def soak_database(admin: Engine, keep: bool) -> Iterator[str]:
    """A fresh PostgreSQL database on the admin URL's server, migrated; dropped afterwards unless `keep`."""
    name = f"tracemill_soak_{uuid.uuid4().hex[:8]}"
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    url = admin.url.set(database=name).render_as_string(hide_password=False)
    engine = make_engine(url)
    upgrade(engine)
    engine.dispose()
    try:
        yield url
    finally:
        if not keep:
            with admin.connect() as conn:
                conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


def soak(args: argparse.Namespace, db_url: str, admin: Engine, workdir: Path) -> dict[str, Any]:
    batches = Batches(args.poison_every, args.seed)
    collector = CollectorProcess(db_url, workdir, workers=args.workers).start()
    assert collector.proc is not None
    tally, stop, give_up = Tally(), threading.Event(), threading.Event()
    started = time.monotonic()
    memory = Memory(collector.proc.pid)
    memory.start()
    exporters = [Exporter(collector.url, batches, args.interval, tally, stop, give_up) for _ in range(args.exporters)]
    faults = Faults(collector, admin, make_url(db_url).database or "", args.fault_every, args.outage, tally, stop,
                    started)
    for thread in (*exporters, faults):
        thread.start()
    try:
        while (elapsed := time.monotonic() - started) < args.duration:
            time.sleep(min(args.report_every, args.duration - elapsed))
            stored_now = _stored_now(db_url)
            with tally.lock:
                line = (f"[{time.monotonic() - started:6.0f} s] acknowledged {tally.acked_spans:,} spans, "
                        f"stored {stored_now}; answers {dict(tally.statuses)}; "
                        f"faults {len(tally.faults)}; RSS {memory.now / MB:.0f} MB (peak {memory.peak / MB:.0f})")
            print(line, flush=True)
        stop.set()
        faults.join()
        deadline = time.monotonic() + args.drain
        for exporter in exporters:
            exporter.join(max(0.0, deadline - time.monotonic()))
        give_up.set()
        for exporter in exporters:
            exporter.join()
        stored = stored_spans(db_url)
    finally:
        memory.stop()
        collector.stop()
    log = collector.log.read_text(errors="replace").splitlines()
    return {
        "duration_s": round(time.monotonic() - started, 1), "acknowledged_spans": tally.acked_spans,
        "stored_spans": stored, "acknowledged_equals_stored": tally.acked_spans == stored,
        "acknowledged_requests": tally.acked_requests, "rejected_poison_spans": tally.rejected_spans,
        "unexpected_rejections": tally.unexpected_rejections, "given_up_batches": tally.given_up,
        "answers_by_status": dict(tally.statuses), "slow_uploads_by_status": dict(tally.slow_uploads),
        "faults": Counter(name for _, name in tally.faults), "fault_log": tally.faults,
        "peak_rss_mb": round(memory.peak / MB, 1),
        "collector_log": {"lines_by_level": Counter(line.split()[2] for line in log if len(line.split()) > 2
                                                    and line.split()[2] in ("WARNING", "ERROR", "CRITICAL")),
                          "last_problems": [line for line in log if " ERROR " in line or "Traceback" in line][-10:]},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--duration", type=float, default=1800.0, help="seconds of load (default 1800: 30 min)")
    parser.add_argument("--exporters", type=int, default=4, help="exporter threads (default 4)")
    parser.add_argument("--interval", type=float, default=1.0, help="seconds between an exporter's batches (default 1)")
    parser.add_argument("--poison-every", type=int, default=10, help="every n-th batch carries poison spans")
    parser.add_argument("--fault-every", type=float, default=30.0, help="seconds between faults (default 30)")
    parser.add_argument("--outage", type=float, default=10.0, help="seconds the store refuses connections (default 10)")
    parser.add_argument("--workers", type=int, default=2, help="collector ingest processes (default 2)")
    parser.add_argument("--drain", type=float, default=120.0,
                        help="seconds the exporters get after the load to have their last batches acknowledged")
    parser.add_argument("--report-every", type=float, default=60.0, help="seconds between progress lines")
    parser.add_argument("--admin-url", default=ADMIN_URL,
                        help=f"a PostgreSQL database to create the soak's own database from (default {ADMIN_URL})")
    parser.add_argument("--keep", action="store_true", help="keep the soak's database")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "out" / "soak.json")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()

    admin = create_engine(args.admin_url, isolation_level="AUTOCOMMIT")
    report: dict[str, Any] = {"command": " ".join([Path(sys.executable).name, *sys.argv]), "machine": machine(),
                              "started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                              "config": {k: str(v) for k, v in vars(args).items()}}
    with tempfile.TemporaryDirectory(prefix="bench-soak-") as workdir, soak_database(admin, args.keep) as db_url:
        report["result"] = result = soak(args, db_url, admin, Path(workdir))
    admin.dispose()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_bytes(orjson.dumps(report, option=orjson.OPT_INDENT_2))
    print(json.dumps({k: v for k, v in result.items() if k != "fault_log"}, indent=2))
    if not result["acknowledged_equals_stored"] or result["unexpected_rejections"]:
        raise SystemExit("FAILED: acknowledged spans and stored spans differ, or spans other than the poison were "
                         "rejected")


if __name__ == "__main__":
    main()
