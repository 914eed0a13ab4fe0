"""Back-pressure and crash safety: a full queue answers 503 with Retry-After instead of growing, and a collector
killed with SIGKILL under load has stored every span it acknowledged."""

from __future__ import annotations

import os
import signal
import sqlite3
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import psutil
import pytest
from google.rpc.status_pb2 import Status
from sqlalchemy import text

from tracemill.store.engine import make_engine

from support import SlowUpload, chat_attributes, export_request, make_span

PROTOBUF = {"Content-Type": "application/x-protobuf"}


def request_body(n: int, spans: int) -> tuple[bytes, set[tuple[str, str]]]:
    """Request number n: `spans` chat spans with one tool call each, all with ids unique to this request."""
    trace = f"{n + 1:032x}"
    built = [make_span(trace, f"{n + 1:08x}{i + 1:08x}", "chat",
                       chat_attributes([{"id": f"{n}-{i}", "name": "get_weather", "arguments": {"city": "Rome"}}]))
             for i in range(spans)]
    return export_request(built), {(trace, f"{n + 1:08x}{i + 1:08x}") for i in range(spans)}


def stored_ids(db_url: str) -> set[tuple[str, str]]:
    engine = make_engine(db_url)
    with engine.connect() as conn:
        ids = {(r.trace_id, r.span_id) for r in conn.execute(text("select trace_id, span_id from spans"))}
    engine.dispose()
    return ids


def check_refusals(futures: list, url: str, sent: int) -> None:  # type: ignore[type-arg]
    refused = [f.result() for f in futures if f.done()]
    assert refused and all(r.status_code == 503 for r in refused)
    assert all(r.headers["Retry-After"] == "2" for r in refused)
    assert all("busy" in Status.FromString(r.content).message for r in refused)
    assert len(refused) >= sent - 4, "the queue took more than its 300 spans"
    assert 0 < httpx.get(f"{url}/healthz").json()["queued_spans"] <= 400


def test_full_queue_answers_503_and_keeps_what_it_acknowledged(tmp_path, start_collector) -> None:  # type: ignore[no-untyped-def]
    db_url = f"sqlite:///{tmp_path / 'pressure.db'}"
    collector = start_collector(db_url, TRACEMILL_INGEST_QUEUE_SPANS="300", TRACEMILL_RETRY_AFTER_SECONDS="2")
    bodies = [request_body(n, 100) for n in range(12)]

    # Another process holds the write lock: the collector's writer waits, and its queue fills up.
    blocker = sqlite3.connect(tmp_path / "pressure.db", timeout=1)
    blocker.execute("BEGIN IMMEDIATE")
    with ThreadPoolExecutor(len(bodies)) as pool:
        futures = [pool.submit(httpx.post, f"{collector.url}/v1/traces", content=body, headers=PROTOBUF,
                               timeout=60) for body, _ in bodies]
        time.sleep(2)
        try:
            check_refusals(futures, collector.url, len(bodies))
        finally:
            blocker.rollback()
            blocker.close()
        responses = [f.result() for f in futures]

    stored = stored_ids(db_url)
    for response, (_, ids) in zip(responses, bodies):
        assert response.status_code in (200, 503)
        if response.status_code == 200:
            assert ids <= stored
        else:
            assert not ids & stored
    assert sum(r.status_code == 200 for r in responses) >= 1


def test_sigkill_under_load_loses_no_acknowledged_span(db_url: str, start_collector) -> None:  # type: ignore[no-untyped-def]
    # Two worker processes: two writers taking turns, both killed mid-load.
    collector = start_collector(db_url, workers=2)
    acknowledged: list[set[tuple[str, str]]] = []
    stop = threading.Event()
    counter = iter(range(1_000_000))
    lock = threading.Lock()

    def exporter() -> None:
        with httpx.Client(timeout=10) as client:
            while not stop.is_set():
                with lock:
                    n = next(counter)
                body, ids = request_body(n, 50)
                try:
                    response = client.post(f"{collector.url}/v1/traces", content=body, headers=PROTOBUF)
                except httpx.TransportError:
                    return
                if response.status_code == 200:
                    acknowledged.append(ids)

    threads = [threading.Thread(target=exporter) for _ in range(4)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 20
    while len(acknowledged) < 20 and time.monotonic() < deadline:
        time.sleep(0.05)
    collector.kill()
    stop.set()
    for t in threads:
        t.join()

    assert len(acknowledged) >= 20, "the load never got going"
    stored = stored_ids(db_url)
    lost = [ids for ids in acknowledged if not ids <= stored]
    assert not lost, f"{len(lost)} acknowledged requests missing after SIGKILL"


def padded_body(n: int, spans: int) -> tuple[bytes, set[tuple[str, str]]]:
    """Request number n: `spans` spans of about 1 kB each, with ids unique to this request."""
    trace = f"{n + 1:032x}"
    ids = [f"{n + 1:08x}{i + 1:08x}" for i in range(spans)]
    return (export_request([make_span(trace, i, "step", {"padding": "x" * 1000}) for i in ids]),
            {(trace, i) for i in ids})


@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
def test_bodies_being_read_are_bounded(tmp_path, start_collector, chunked: bool) -> None:  # type: ignore[no-untyped-def]
    """A crowd of senders cannot make the collector hold more request bytes than its budget: what has arrived of the
    bodies being read counts."""
    db_url = f"sqlite:///{tmp_path / 'inflight.db'}"
    collector = start_collector(db_url, TRACEMILL_MAX_BODY_BYTES="500000", TRACEMILL_MAX_INFLIGHT_BYTES="500000")
    slow_body, slow_ids = padded_body(0, 420)
    quick_body, quick_ids = padded_body(1, 200)
    assert 400_000 < len(slow_body) < 500_000 and 150_000 < len(quick_body) < 300_000
    release = threading.Event()

    def trickle():  # type: ignore[no-untyped-def]
        yield slow_body[:400_000]
        release.wait(10)
        yield slow_body[400_000:]

    headers = PROTOBUF if chunked else {**PROTOBUF, "Content-Length": str(len(slow_body))}
    with ThreadPoolExecutor(1) as pool:
        slow = pool.submit(httpx.post, f"{collector.url}/v1/traces", content=trickle(), headers=headers, timeout=30)
        time.sleep(1)
        refused = httpx.post(f"{collector.url}/v1/traces", content=quick_body, headers=PROTOBUF)
        release.set()
        assert slow.result().status_code == 200
    assert refused.status_code == 503 and refused.headers["Retry-After"]
    assert "bytes of requests are being read" in Status.FromString(refused.content).message
    assert httpx.post(f"{collector.url}/v1/traces", content=quick_body, headers=PROTOBUF).status_code == 200
    assert slow_ids | quick_ids <= stored_ids(db_url)


def test_a_slow_upload_gets_408_and_others_are_served_meanwhile(tmp_path, start_collector) -> None:  # type: ignore[no-untyped-def]
    """One sender trickling a byte at a time, chunked or announcing a body as large as the budget, holds only what it
    sent, and only until the body read timeout."""
    db_url = f"sqlite:///{tmp_path / 'slow.db'}"
    collector = start_collector(db_url, TRACEMILL_MAX_BODY_BYTES="500000", TRACEMILL_MAX_INFLIGHT_BYTES="500000",
                                TRACEMILL_BODY_READ_TIMEOUT_SECONDS="10")
    slow = [SlowUpload(collector.port, declared=500_000), SlowUpload(collector.port)]
    for upload in slow:
        upload.start()
        assert upload.sending.wait(10)

    answers = []
    for n in range(5):
        body, ids = request_body(n, 20)
        answers.append((httpx.post(f"{collector.url}/v1/traces", content=body, headers=PROTOBUF).status_code, ids))
    still_sending = [upload.is_alive() for upload in slow]
    statuses = [upload.status(timeout=60) for upload in slow]

    assert [code for code, _ in answers] == [200] * 5
    assert still_sending == [True, True], "the others were not served while the slow uploads were being read"
    assert statuses == [408, 408]
    assert set().union(*(ids for _, ids in answers)) == stored_ids(db_url)


def _ingest_processes(collector_pid: int) -> list[int]:
    """The collector's ingest processes (its children other than multiprocessing's resource tracker)."""
    children = Path(f"/proc/{collector_pid}/task/{collector_pid}/children").read_text().split()
    return [int(pid) for pid in children
            if b"resource_tracker" not in Path(f"/proc/{pid}/cmdline").read_bytes()]


@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="needs Linux /proc to find the ingest processes")
def test_a_killed_ingest_process_is_replaced(tmp_path, start_collector) -> None:  # type: ignore[no-untyped-def]
    db_url = f"sqlite:///{tmp_path / 'replaced.db'}"
    collector = start_collector(db_url, workers=2)
    assert collector.proc is not None
    victims = _ingest_processes(collector.proc.pid)
    assert len(victims) == 2
    os.kill(victims[0], signal.SIGKILL)

    answers = []
    for n in range(20):
        body, ids = request_body(1000 + n, 20)
        response = httpx.post(f"{collector.url}/v1/traces", content=body, headers=PROTOBUF, timeout=30)
        answers.append((response.status_code, ids))
        if response.status_code == 503:
            assert "could not be stored" in Status.FromString(response.content).message
            time.sleep(0.2)
    assert {code for code, _ in answers} <= {200, 503}
    assert [code for code, _ in answers[-5:]] == [200] * 5, "the collector did not recover"
    stored = stored_ids(db_url)
    assert all(ids <= stored for code, ids in answers if code == 200)
    deadline = time.monotonic() + 20
    while len(_ingest_processes(collector.proc.pid)) != 2 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert len(_ingest_processes(collector.proc.pid)) == 2


@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="needs Linux /proc to find the ingest processes")
def test_ingest_processes_die_with_a_killed_collector(tmp_path, start_collector) -> None:  # type: ignore[no-untyped-def]
    collector = start_collector(f"sqlite:///{tmp_path / 'orphans.db'}", workers=2)
    assert collector.proc is not None
    children = [psutil.Process(pid) for pid in _ingest_processes(collector.proc.pid)]
    assert len(children) == 2
    os.kill(collector.proc.pid, signal.SIGKILL)  # the collector alone, not its process group
    collector.proc.wait()

    _, alive = psutil.wait_procs(children, timeout=20)
    for orphan in alive:
        orphan.kill()
    assert not alive, f"{len(alive)} ingest processes outlived the collector"
