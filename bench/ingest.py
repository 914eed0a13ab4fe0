"""Ingest benchmark: spans *persisted* per second (rows committed in the store's `spans` table, not requests
answered), acknowledgement latency and resident memory, for Tracemill's collector and Arize Phoenix side by side on
the same OTLP/HTTP protobuf bodies.

Run by hand, never in CI (see bench/README.md, "Ingest"):

    .venv/bin/python bench/ingest.py --out bench/out/ingest.json

Phases (each server started here as a subprocess on a fresh temporary directory; rates are rows added to `spans`
per second, polled read-only, over the phase less its warm-up):
  peak       N closed-loop exporters post as fast as they are answered.
  half_peak  Tracemill: open-loop requests paced at 50 % of its peak; ack latency from the *scheduled* send time.
  overload   Tracemill: open-loop at several times its peak; resident memory (process tree), share of 503 answers.
  paced      Phoenix, before its peak: open loop at --phoenix-rate spans/s, about its capacity.
  drain      Phoenix, after its peak: no load while it commits what it has queued (its best insert rate).
Exporters honour 503/429 + Retry-After (1 s when absent) and resend the same body, as the OTel SDK does.
"""

from __future__ import annotations

import argparse
import http.client
import itertools
import os
import platform
import queue
import random
import re
import shutil
import signal
import sqlite3
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import psutil
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import InstrumentationScope, KeyValue
from opentelemetry.proto.resource.v1.resource_pb2 import Resource
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Span, Status

from tracemill.examples import example_value
from tracemill.net import free_port
from tracemill.otlp import key_values, partial_success
from tracemill.tools import Tool, load_mcp_bench

ROOT = Path(__file__).resolve().parent.parent
TRACEMILL_BIN = ROOT / ".venv" / "bin" / "tracemill"
PHOENIX_BIN = ROOT / "bench" / ".venv-phoenix" / "bin" / "phoenix"
MODELS = ("llama-3.1-8b-instruct", "gemma-3-27b-it", "qwen2.5-7b-instruct", "mistral-small-3.1-24b-instruct")
TOOL_ROUNDS = 3  # per trace: invoke_agent + 3 x (chat -> execute_tool) + final chat = 8 spans
SPANS_PER_TRACE = 2 + 2 * TOOL_ROUNDS
BROKEN_SHARE = 0.25
CALL_ID_TAIL = "0" * 8
DEFAULT_RETRY_AFTER_S = 1.0
MB = 1024 * 1024


# ---------------------------------------------------------------------------------------------------- span bodies


def _attrs(**kv: Any) -> list[KeyValue]:
    return key_values({k.replace("__", "."): v for k, v in kv.items()})


def _arguments(tool: Tool) -> dict[str, Any]:
    props: dict[str, Any] = dict(tool.input_schema.get("properties") or {})
    required = set(tool.input_schema.get("required") or list(props)[:1])
    return {name: example_value(schema, name) for name, schema in props.items() if name in required}


def _break(name: str, args: dict[str, Any], rng: random.Random) -> tuple[str, str]:
    """The kinds of almost-right calls open models emit: (tool name, raw arguments text)."""
    text = orjson.dumps(args).decode()
    kind = rng.randrange(4)
    if kind == 0:
        return name, text[:-1]  # missing closing brace
    if kind == 1:
        return name, f"Sure! I will call the tool now.\n```json\n{text}\n```"
    if kind == 2:
        return name, orjson.dumps({k: str(v) for k, v in args.items()}).decode()  # numbers as strings
    return name.replace("_", "-") if "_" in name else name + "s", text  # near-miss tool name


def _trace_spans(trace_id: bytes, span_ids: list[bytes], toolset: list[Tool], server: str, start_ns: int,
                 rng: random.Random) -> list[Span]:
    """One agent run in OpenTelemetry GenAI conventions: invoke_agent, then chat / execute_tool rounds."""
    model = rng.choice(MODELS)
    conversation = f"conv-{rng.getrandbits(48):012x}"
    definitions = orjson.dumps([{"type": "function", "name": t.name, "description": t.description,
                                 "parameters": dict(t.input_schema)} for t in toolset]).decode()
    system = f"You are a helpful assistant with access to the {server} tools. Call tools with JSON arguments."
    messages: list[dict[str, Any]] = [{"role": "user", "parts": [
        {"type": "text", "content": f"Using {server}, {toolset[0].description.split('.')[0].lower()}, please."}]}]
    ids = iter(span_ids)
    root_id = next(ids)
    t = start_ns
    spans: list[Span] = []

    def chat(output: dict[str, Any], finish: str) -> None:
        nonlocal t
        duration = rng.randint(400, 2500) * 1_000_000
        in_messages = orjson.dumps(messages).decode()
        spans.append(Span(
            trace_id=trace_id, span_id=next(ids), parent_span_id=root_id, name=f"chat {model}",
            kind=Span.SPAN_KIND_CLIENT, start_time_unix_nano=t, end_time_unix_nano=t + duration,
            attributes=_attrs(gen_ai__operation__name="chat", gen_ai__provider__name="openai",
                              gen_ai__request__model=model, gen_ai__response__model=model,
                              gen_ai__request__temperature=0.2, gen_ai__conversation__id=conversation,
                              gen_ai__response__id=f"chatcmpl-{rng.getrandbits(64):016x}",
                              gen_ai__response__finish_reasons=[finish],
                              gen_ai__usage__input_tokens=len(in_messages) // 4 + len(definitions) // 4,
                              gen_ai__usage__output_tokens=rng.randint(20, 200),
                              gen_ai__system_instructions=orjson.dumps([{"type": "text", "content": system}]).decode(),
                              gen_ai__tool__definitions=definitions, gen_ai__input__messages=in_messages,
                              gen_ai__output__messages=orjson.dumps([output]).decode())))
        t += duration

    for _ in range(TOOL_ROUNDS):
        tool = rng.choice(toolset)
        call_id = f"call_{rng.getrandbits(32):08x}{CALL_ID_TAIL}"  # the tail made unique per request (Bodies.body)
        args = _arguments(tool)
        broken = rng.random() < BROKEN_SHARE
        name, raw = _break(tool.name, args, rng) if broken else (tool.name, orjson.dumps(args).decode())
        part = {"type": "tool_call", "id": call_id, "name": name, "arguments": raw if broken else args}
        assistant = {"role": "assistant", "parts": [part], "finish_reason": "tool_call"}
        chat(assistant, "tool_calls")
        result = (f"Error: invalid arguments for tool {name!r}" if broken
                  else orjson.dumps({"ok": True, "result": f"{tool.name} returned 3 items"}).decode())
        duration = rng.randint(20, 600) * 1_000_000
        spans.append(Span(
            trace_id=trace_id, span_id=next(ids), parent_span_id=root_id, name=f"execute_tool {name}",
            kind=Span.SPAN_KIND_INTERNAL, start_time_unix_nano=t, end_time_unix_nano=t + duration,
            status=Status(code=Status.STATUS_CODE_ERROR, message="tool error") if broken else Status(),
            attributes=_attrs(gen_ai__operation__name="execute_tool", gen_ai__tool__name=name,
                              gen_ai__tool__type="function", gen_ai__tool__call__id=call_id,
                              gen_ai__tool__call__arguments=raw, gen_ai__tool__call__result=result,
                              **({"error.type": "tool_error"} if broken else {}))))
        t += duration
        messages += [assistant, {"role": "tool", "parts": [{"type": "tool_call_response", "id": call_id,
                                                            "response": result}]}]
    chat({"role": "assistant", "parts": [{"type": "text", "content": "Here is what I found."}],
          "finish_reason": "stop"}, "stop")
    spans.insert(0, Span(
        trace_id=trace_id, span_id=root_id, name="invoke_agent tool_agent", kind=Span.SPAN_KIND_INTERNAL,
        start_time_unix_nano=start_ns, end_time_unix_nano=t,
        attributes=_attrs(gen_ai__operation__name="invoke_agent", gen_ai__agent__name="tool_agent",
                          gen_ai__conversation__id=conversation, gen_ai__provider__name="openai")))
    return spans


@dataclass(frozen=True)
class Template:
    body: bytes
    offsets: tuple[int, ...]  # where the last 4 bytes of every trace id and span id occurrence sit in `body`
    call_offsets: tuple[int, ...]  # where the last 8 characters of every tool call id occurrence sit
    times: tuple[tuple[int, int], ...]  # (where, nanoseconds before the send) of every span start and end time


class Bodies:
    """OTLP ExportTraceServiceRequest bodies encoded once; `body(seq)` gives request `seq` unique ids by writing `seq`
    into the last 4 bytes of every trace id and span id (the first 12 / 4 bytes are random and distinct per span) and
    into the last 8 characters of every tool call id (a model server draws them at random: no two requests share one),
    and
    times relative to when it is sent: each agent run ended 0-5 s before (the SDK's batch delay), as a live
    exporter's spans do."""

    def __init__(self, templates: int, spans_per_request: int, seed: int) -> None:
        if spans_per_request % SPANS_PER_TRACE:
            raise SystemExit(f"--spans-per-request must be a multiple of {SPANS_PER_TRACE} (spans per trace)")
        rng = random.Random(seed)
        servers = [(name, tools) for name, tools in load_mcp_bench(qualified=False).items() if len(tools) >= 2]
        traces = spans_per_request // SPANS_PER_TRACE
        prefixes = iter(rng.sample(range(1, 2**32), templates * spans_per_request))
        now = time.time_ns()
        self.spans_per_request = spans_per_request
        self.templates: list[Template] = []
        for _ in range(templates):
            spans: list[Span] = []
            ids: list[bytes] = []
            for _ in range(traces):
                trace_id = rng.randbytes(12) + b"\0\0\0\0"
                span_ids = [next(prefixes).to_bytes(4, "big") + b"\0\0\0\0" for _ in range(SPANS_PER_TRACE)]
                server, tools = rng.choice(servers)
                toolset = rng.sample(tools, min(len(tools), rng.randint(3, 6)))
                run = _trace_spans(trace_id, span_ids, toolset, server, now, rng)
                shift = -rng.randint(0, 5000) * 1_000_000 - (run[0].end_time_unix_nano - now)
                for span in run:
                    span.start_time_unix_nano += shift
                    span.end_time_unix_nano += shift
                spans += run
                ids += [trace_id, *span_ids]
            request = ExportTraceServiceRequest(resource_spans=[ResourceSpans(
                resource=Resource(attributes=_attrs(service__name="support-agent", service__version="1.4.2",
                                                    deployment__environment="bench")),
                scope_spans=[ScopeSpans(scope=InstrumentationScope(name="tracemill.bench", version="1"),
                                        spans=spans)])])
            body = request.SerializeToString()
            offsets: list[int] = []
            for ident in ids:  # the zeroed tail makes each id searchable; every occurrence (parents too) is patched
                pos = body.find(ident)
                while pos >= 0:
                    offsets.append(pos + len(ident) - 4)
                    pos = body.find(ident, pos + 1)
            if len(offsets) != 2 * spans_per_request + (SPANS_PER_TRACE - 1) * traces:
                raise RuntimeError("span or trace id bytes found in an unexpected place; change --seed")
            call_offsets = tuple(m.end() - len(CALL_ID_TAIL)
                                 for m in re.finditer(rb"call_[0-9a-f]{8}" + CALL_ID_TAIL.encode(), body))
            times: list[tuple[int, int]] = []
            pos = 0
            for span in spans:  # fixed64 fields 7 and 8 of Span, in the order they are encoded
                for tag, value in ((b"\x39", span.start_time_unix_nano), (b"\x41", span.end_time_unix_nano)):
                    pos = body.find(tag + value.to_bytes(8, "little"), pos) + 1
                    if pos <= 0:
                        raise RuntimeError("a span time not found in its body")
                    times.append((pos, value - now))
            self.templates.append(Template(body, tuple(offsets), call_offsets, tuple(times)))

    def body(self, seq: int) -> bytearray:
        template = self.templates[seq % len(self.templates)]
        buf = bytearray(template.body)
        tail = (seq + 1).to_bytes(4, "big")
        for off in template.offsets:
            buf[off:off + 4] = tail
        call_tail = f"{seq + 1:08x}".encode()
        for off in template.call_offsets:
            buf[off:off + 8] = call_tail
        now = time.time_ns()
        for off, relative in template.times:
            struct.pack_into("<Q", buf, off, now + relative)
        return buf

    @property
    def mean_bytes(self) -> int:
        return sum(len(t.body) for t in self.templates) // len(self.templates)


# ---------------------------------------------------------------------------------------------------- servers


class Server:
    """A collector started as a subprocess on a fresh temporary directory, with its SQLite store read read-only."""

    name = ""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.port = free_port()
        self.db_path = workdir / f"{self.name}.db"
        self.log_path = workdir / "server.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self._db: sqlite3.Connection | None = None

    def command(self) -> tuple[list[str], dict[str, str]]:
        raise NotImplementedError

    def version(self) -> str:
        raise NotImplementedError

    def start(self, timeout_s: float = 180.0) -> None:
        argv, env = self.command()
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(argv, env={**os.environ, **env}, cwd=self.workdir, stdout=log,
                                         stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode}:\n{self.log_tail()}")
            try:
                conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=2)
                conn.request("GET", "/healthz")
                if conn.getresponse().status == 200:
                    conn.close()
                    return
                conn.close()
            except OSError:
                pass
            time.sleep(0.5)
        raise RuntimeError(f"{self.name} not healthy after {timeout_s:.0f} s:\n{self.log_tail()}")

    def log_tail(self, lines: int = 30) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        os.killpg(self.proc.pid, signal.SIGINT)
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def rows(self) -> int:
        """Committed rows in `spans`, read through a read-only connection (0 until the table exists)."""
        if self._db is None:
            if not self.db_path.exists():
                return 0
            self._db = sqlite3.connect(f"file:{self.db_path}?mode=ro", uri=True, timeout=30,
                                       check_same_thread=False)
        try:
            return int(self._db.execute("SELECT count(*) FROM spans").fetchone()[0])
        except sqlite3.OperationalError as err:
            if "no such table" in str(err):
                return 0
            raise

    def journal_mode(self) -> str:
        return str(self._db.execute("PRAGMA journal_mode").fetchone()[0]) if self._db else "unknown"

    def tree(self) -> list[psutil.Process]:
        assert self.proc is not None
        try:
            root = psutil.Process(self.proc.pid)
            return [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            return []

    def rss_bytes(self) -> int:
        total = 0
        for p in self.tree():
            try:
                total += p.memory_info().rss
            except psutil.NoSuchProcess:
                pass
        return total

    def cpu_seconds(self) -> float:
        total = 0.0
        for p in self.tree():
            try:
                t = p.cpu_times()
                total += t.user + t.system
            except psutil.NoSuchProcess:
                pass
        return total


class Tracemill(Server):
    name = "tracemill"

    def command(self) -> tuple[list[str], dict[str, str]]:
        return [str(TRACEMILL_BIN), "collector", "--host", "127.0.0.1", "--port", str(self.port),
                "--grpc-port", str(free_port()), "--db", f"sqlite:///{self.db_path}"], {}

    def version(self) -> str:
        out = subprocess.run([str(TRACEMILL_BIN), "--version"], capture_output=True, text=True, check=False)
        commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                                text=True, check=False).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--", "tracemill", "collector",
                                "alembic"], capture_output=True, text=True, check=False).stdout.strip()
        return f"{out.stdout.strip()} (git {commit}{' with uncommitted changes' if dirty else ''})"


class Phoenix(Server):
    name = "phoenix"

    def command(self) -> tuple[list[str], dict[str, str]]:
        return [str(PHOENIX_BIN), "serve"], {
            "PHOENIX_WORKING_DIR": str(self.workdir), "PHOENIX_HOST": "127.0.0.1", "PHOENIX_PORT": str(self.port),
            "PHOENIX_GRPC_PORT": str(free_port()), "PHOENIX_SQL_DATABASE_URL": f"sqlite:///{self.db_path}",
            "PHOENIX_TELEMETRY_ENABLED": "false"}

    def version(self) -> str:
        pip = PHOENIX_BIN.parent / "pip"
        out = subprocess.run([str(pip), "show", "arize-phoenix"], capture_output=True, text=True, check=False)
        return next((line.split(":", 1)[1].strip() for line in out.stdout.splitlines()
                     if line.startswith("Version:")), "unknown")


# ---------------------------------------------------------------------------------------------------- load


@dataclass
class Record:
    """What the exporters saw in one phase; lists are appended from many threads (atomic under the GIL)."""

    latencies_s: list[float] = field(default_factory=list)  # per acknowledged request, first attempt -> 200
    statuses: Counter[str] = field(default_factory=Counter)  # per attempt: "200", "503", "error", ...
    acked_requests: int = 0
    rejected_spans: int = 0  # in acknowledged requests, reported in partial_success
    dropped_requests: int = 0  # given up: still refused when the phase ended
    unsent_requests: int = 0  # open loop: their turn came after the phase, the server being that far behind
    lock: threading.Lock = field(default_factory=threading.Lock)

    def attempt(self, status: str) -> None:
        with self.lock:
            self.statuses[status] += 1


class Exporter:
    """One OTLP/HTTP exporter: a keep-alive connection that resends a body on 503/429 after Retry-After (or on a
    connection error after 1 s), until `give_up_at`. A connection idle for over 2 s is replaced before use, so that a
    server closing idle keep-alive connections (uvicorn: after 5 s) does not show up as errors and retry delays."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
        self.used = time.monotonic()

    def export(self, body: bytearray, record: Record, started: float, give_up_at: float) -> None:
        while True:
            if time.monotonic() - self.used > 2.0:
                self.conn.close()
                self.conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=120)
            try:
                self.conn.request("POST", "/v1/traces", body=body,
                                  headers={"Content-Type": "application/x-protobuf"})
                resp = self.conn.getresponse()
                answer = resp.read()
                status, retry_after = resp.status, resp.getheader("Retry-After")
            except (OSError, http.client.HTTPException):
                self.conn.close()
                self.conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=120)
                status, retry_after = 0, None
            self.used = time.monotonic()
            record.attempt(str(status) if status else "error")
            if status == 200:
                record.latencies_s.append(time.monotonic() - started)
                rejected = partial_success(answer, resp.getheader("Content-Type", "")).rejected_spans
                with record.lock:
                    record.acked_requests += 1
                    record.rejected_spans += rejected
                return
            wait = float(retry_after) if retry_after and retry_after.isdigit() else DEFAULT_RETRY_AFTER_S
            if status not in (0, 429, 503) or time.monotonic() + wait > give_up_at:
                with record.lock:
                    record.dropped_requests += 1
                return
            time.sleep(wait)


def closed_loop(port: int, bodies: Bodies, seqs: itertools.count[int], exporters: int, duration_s: float,
                record: Record) -> None:
    end = time.monotonic() + duration_s

    def run() -> None:
        exporter = Exporter(port)
        while time.monotonic() < end:
            body = bodies.body(next(seqs))
            exporter.export(body, record, time.monotonic(), give_up_at=end)

    threads = [threading.Thread(target=run, daemon=True) for _ in range(exporters)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def open_loop(port: int, bodies: Bodies, seqs: itertools.count[int], requests_per_s: float, duration_s: float,
              max_in_flight: int, record: Record) -> None:
    """Requests scheduled at a fixed rate whatever the answers; latency counts from the scheduled time, so a slow
    server cannot hide its queueing (no coordinated omission). At most `max_in_flight` exporters send at once."""
    start = time.monotonic()
    end = start + duration_s
    scheduled: queue.SimpleQueue[float | None] = queue.SimpleQueue()

    def run() -> None:
        exporter = Exporter(port)
        while (at := scheduled.get()) is not None:
            if time.monotonic() < end:
                exporter.export(bodies.body(next(seqs)), record, at, give_up_at=end)
            else:
                with record.lock:
                    record.unsent_requests += 1

    threads = [threading.Thread(target=run, daemon=True) for _ in range(max_in_flight)]
    for t in threads:
        t.start()
    for i in itertools.count():
        at = start + i / requests_per_s
        if at >= end:
            break
        time.sleep(max(0.0, at - time.monotonic()))
        scheduled.put(at)
    for _ in threads:
        scheduled.put(None)
    for t in threads:
        t.join()


class Sampler(threading.Thread):
    """Polls committed rows and the server's resident memory (process tree) every `interval_s`."""

    def __init__(self, server: Server, interval_s: float) -> None:
        super().__init__(daemon=True)
        self.server = server
        self.interval_s = interval_s
        self.samples: list[tuple[float, int, int]] = []  # (monotonic time, rows, rss bytes)
        self.query_s: list[float] = []
        self._done = threading.Event()

    def sample(self) -> tuple[float, int, int]:
        t0 = time.monotonic()
        rows = self.server.rows()
        self.query_s.append(time.monotonic() - t0)
        s = (time.monotonic(), rows, self.server.rss_bytes())
        self.samples.append(s)
        return s

    def run(self) -> None:
        while not self._done.wait(self.interval_s):
            self.sample()

    def stop(self) -> None:
        self._done.set()
        self.join()

    def rows_at(self, t: float) -> float:
        """Committed rows at time `t`, interpolated between the samples around it."""
        before = max((s for s in self.samples if s[0] <= t), key=lambda s: s[0])
        after = min((s for s in self.samples if s[0] >= t), key=lambda s: s[0], default=before)
        if after[0] == before[0]:
            return float(before[1])
        return before[1] + (after[1] - before[1]) * (t - before[0]) / (after[0] - before[0])


def _pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _busy_seconds() -> float:
    """CPU seconds the whole machine has spent not idle (to see whether anything else ran during a phase)."""
    t = psutil.cpu_times()
    return float(sum(t) - t.idle - getattr(t, "iowait", 0.0))


def _best_rate(samples: list[tuple[float, int, int]], span_s: float = 10.0) -> float | None:
    """The highest commit rate over any `span_s` seconds of the phase (from the first sample that far on)."""
    rates = [(later[1] - s[1]) / (later[0] - s[0]) for i, s in enumerate(samples)
             for later in samples[i + 1:][:1 + int(span_s)] if later[0] - s[0] >= span_s]
    return round(max(rates), 1) if rates else None


def run_phase(server: Server, bodies: Bodies, seqs: itertools.count[int], kind: str, duration_s: float,
              warmup_s: float, sample_s: float, *, exporters: int = 0, requests_per_s: float = 0.0,
              max_in_flight: int = 0) -> dict[str, Any]:
    record = Record()
    sampler = Sampler(server, sample_s)
    first = sampler.sample()
    sampler.start()
    me = psutil.Process()
    cpu0, srv_cpu0, busy0, t0 = sum(me.cpu_times()[:2]), server.cpu_seconds(), _busy_seconds(), time.monotonic()
    if kind == "idle":
        time.sleep(duration_s)
    elif kind == "closed":
        closed_loop(server.port, bodies, seqs, exporters, duration_s, record)
    else:
        open_loop(server.port, bodies, seqs, requests_per_s, duration_s, max_in_flight, record)
    sent_until = time.monotonic()
    loadgen_cores = (sum(me.cpu_times()[:2]) - cpu0) / (sent_until - t0)
    server_cores = (server.cpu_seconds() - srv_cpu0) / (sent_until - t0)
    other_cores = (_busy_seconds() - busy0) / (sent_until - t0) - server_cores - loadgen_cores
    sampler.sample()
    sampler.stop()
    window_start = min(t0 + warmup_s, t0 + (time.monotonic() - t0) / 2)
    window_end = t0 + duration_s
    persisted = (sampler.rows_at(window_end) - sampler.rows_at(window_start)) / (window_end - window_start)
    attempts = sum(record.statuses.values())
    acked = record.acked_requests * bodies.spans_per_request - record.rejected_spans
    last = sampler.samples[-1]
    return {
        "load": kind, "duration_s": round(sent_until - t0, 2), "window_s": [round(window_start - t0, 2),
                                                                           round(window_end - t0, 2)],
        "exporters": exporters or max_in_flight, "offered_requests_per_s": round(requests_per_s, 2) or None,
        "persisted_spans_per_s": round(persisted, 1), "best_10s_persisted_spans_per_s": _best_rate(sampler.samples),
        "acked_spans_per_s": round(acked / (sent_until - t0), 1), "acked_spans": acked,
        "rejected_spans": record.rejected_spans,
        "rows_added": last[1] - first[1], "dropped_requests": record.dropped_requests,
        "unsent_requests": record.unsent_requests,
        "attempts": dict(record.statuses),
        "share_503": round(record.statuses["503"] / attempts, 4) if attempts else None,
        "ack_latency_ms": {q: None if (v := _pct(record.latencies_s, p)) is None else round(v * 1000, 1)
                           for q, p in (("p50", 0.5), ("p90", 0.9), ("p99", 0.99), ("max", 1.0))},
        "rss_max_mb": round(max(s[2] for s in sampler.samples) / MB, 1),
        "server_cpu_cores": round(server_cores, 2), "loadgen_cpu_cores": round(loadgen_cores, 2),
        "other_processes_cpu_cores": round(max(0.0, other_cores), 2),
        "rows_query_ms_mean": round(1000 * sum(sampler.query_s) / len(sampler.query_s), 1),
        "series": [(round(t - t0, 2), rows, round(rss / MB, 1)) for t, rows, rss in sampler.samples],
    }


def drain(server: Server, quiet_s: float = 2.0, timeout_s: float = 60.0) -> int:
    """Wait until the row count has stopped moving for `quiet_s` (queued spans committed), up to `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    rows, since = server.rows(), time.monotonic()
    while time.monotonic() < deadline and time.monotonic() - since < quiet_s:
        time.sleep(0.5)
        if (now := server.rows()) != rows:
            rows, since = now, time.monotonic()
    return rows


def bench_server(server: Server, bodies: Bodies, args: argparse.Namespace) -> dict[str, Any]:
    """Tracemill: peak, then half_peak and overload derived from the measured peak. Phoenix (capped at
    --phoenix-cap s a phase, it is slow): paced at --phoenix-rate spans/s first (near its capacity, its best case),
    then the same closed-loop peak as Tracemill, which for Phoenix is also its overload (it answers 200 before
    persisting), then no load while it commits its queue (its best case: inserting with nothing else to do)."""
    phoenix = server.name == "phoenix"
    duration = min(args.duration, args.phoenix_cap) if phoenix else args.duration
    print(f"[{server.name}] starting on port {server.port} in {server.workdir}", flush=True)
    server.start()
    seqs = itertools.count()
    phases: dict[str, dict[str, Any]] = {}
    result: dict[str, Any] = {"version": server.version(), "phases": phases}

    def open_phase(name: str, spans_per_s: float, in_flight: int) -> None:
        rps = spans_per_s / bodies.spans_per_request
        print(f"[{server.name}] {name}: {rps:.2f} requests/s open loop for {duration:.0f} s", flush=True)
        phases[name] = run_phase(server, bodies, seqs, "open", duration, args.warmup, args.sample,
                                 requests_per_s=rps, max_in_flight=in_flight)
        print(f"[{server.name}] {name}: {phases[name]['persisted_spans_per_s']:.0f} spans/s persisted", flush=True)

    try:
        if phoenix:
            open_phase("paced", args.phoenix_rate, args.exporters)
        print(f"[{server.name}] peak: {args.exporters} closed-loop exporters for {duration:.0f} s", flush=True)
        phases["peak"] = run_phase(server, bodies, seqs, "closed", duration, args.warmup, args.sample,
                                   exporters=args.exporters)
        peak = phases["peak"]["persisted_spans_per_s"]
        print(f"[{server.name}] peak: {peak:.0f} spans/s persisted", flush=True)
        if phoenix:
            print(f"[{server.name}] drain: no load for {duration:.0f} s, committing its queue", flush=True)
            phases["drain"] = run_phase(server, bodies, seqs, "idle", duration, 0.0, args.sample)
            print(f"[{server.name}] drain: {phases['drain']['persisted_spans_per_s']:.0f} spans/s persisted",
                  flush=True)
        if not phoenix and peak > 0:
            drain(server)
            open_phase("half_peak", 0.5 * peak, 4 * args.exporters)
            drain(server)
            open_phase("overload", args.overload * peak, args.overload_exporters)
        result["journal_mode"] = server.journal_mode()
        result["rows_final"] = drain(server, timeout_s=10 if phoenix else 60)
        result["acked_spans_total"] = sum(p["acked_spans"] for p in phases.values())
        if any(p["rejected_spans"] for p in phases.values()):
            print(f"[{server.name}] WARNING: spans rejected as invalid; the workload is broken", flush=True)
        if not phoenix and result["rows_final"] != result["acked_spans_total"]:
            print(f"[{server.name}] WARNING: {result['acked_spans_total']} spans acknowledged but "
                  f"{result['rows_final']} in the store", flush=True)
    finally:
        server.stop()
    return result


def machine() -> dict[str, Any]:
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor())
    return {"cpu": cpu, "cores": os.cpu_count(), "memory_gb": round(psutil.virtual_memory().total / 1024**3, 1),
            "os": platform.platform(), "python": platform.python_version(), "sqlite": sqlite3.sqlite_version,
            "load_average_at_start": os.getloadavg()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--duration", type=float, default=60.0, help="seconds per phase (default 60)")
    parser.add_argument("--exporters", type=int, default=8, help="concurrent exporters in the peak phase (default 8)")
    parser.add_argument("--only", choices=("tracemill", "phoenix"), help="run one server only")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "out" / "ingest.json")
    parser.add_argument("--spans-per-request", type=int, default=512, help="like the SDK's BatchSpanProcessor")
    parser.add_argument("--templates", type=int, default=8, help="distinct request bodies encoded up front")
    parser.add_argument("--warmup", type=float, default=5.0, help="seconds left out of each phase's rate")
    parser.add_argument("--sample", type=float, default=1.0, help="seconds between row-count / memory samples")
    parser.add_argument("--overload", type=float, default=3.0, help="overload offered rate, times the peak")
    parser.add_argument("--overload-exporters", type=int, default=256,
                        help="exporters in flight under overload (default 256: more than a 100k-span queue holds)")
    parser.add_argument("--phoenix-cap", type=float, default=60.0, help="max seconds of a Phoenix phase (default 60)")
    parser.add_argument("--phoenix-rate", type=float, default=250.0, help="spans/s offered in Phoenix's paced phase")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()

    t = time.monotonic()
    bodies = Bodies(args.templates, args.spans_per_request, args.seed)
    print(f"encoded {args.templates} bodies of {args.spans_per_request} spans, {bodies.mean_bytes / MB:.2f} MB each, "
          f"in {time.monotonic() - t:.1f} s", flush=True)
    report: dict[str, Any] = {"command": " ".join([Path(sys.executable).name, *sys.argv]), "machine": machine(),
                              "started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                              "config": {k: str(v) for k, v in vars(args).items()},
                              "body_bytes_mean": bodies.mean_bytes, "servers": {}}
    for cls in (Tracemill, Phoenix):
        if args.only and args.only != cls.name:
            continue
        workdir = Path(tempfile.mkdtemp(prefix=f"bench-ingest-{cls.name}-"))
        try:
            report["servers"][cls.name] = bench_server(cls(workdir), bodies, args)
        finally:
            shutil.rmtree(workdir, ignore_errors=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_bytes(orjson.dumps(report, option=orjson.OPT_INDENT_2))
    print(f"\nwrote {args.out}\n")
    print(f"{'server':<10} {'phase':<10} {'persisted/s':>12} {'acked/s':>10} {'p50 ms':>8} {'p99 ms':>8} "
          f"{'RSS max MB':>11} {'503 share':>10} {'srv cores':>10} {'gen cores':>10} {'other cores':>12}")
    for name, res in report["servers"].items():
        for phase, p in res["phases"].items():
            lat = p["ack_latency_ms"]
            print(f"{name:<10} {phase:<10} {p['persisted_spans_per_s']:>12,.0f} {p['acked_spans_per_s']:>10,.0f} "
                  f"{lat['p50'] or 0:>8.1f} {lat['p99'] or 0:>8.1f} {p['rss_max_mb']:>11.0f} "
                  f"{p['share_503'] or 0:>10.3f} {p['server_cpu_cores']:>10.2f} {p['loadgen_cpu_cores']:>10.2f} "
                  f"{p['other_processes_cpu_cores']:>12.2f}")


if __name__ == "__main__":
    main()
