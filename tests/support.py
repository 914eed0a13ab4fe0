"""What the tests share: a real collector process, and OTLP requests built the way exporters build them."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import orjson
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.logs.v1.logs_pb2 import LogRecord
from opentelemetry.proto.trace.v1.trace_pb2 import Span
from sqlalchemy import Engine, text

from tracemill.collector.decode import Limits, decode_protobuf
from tracemill.collector.persist import SpanWriter
from tracemill.net import free_port
from tracemill.otlp import any_value, key_values
from tracemill.store.bulk import BulkInsert
from tracemill.store.tables import SpanRow, ToolCallRow

WEATHER_TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "Current weather for a city.",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string"}, "units": {"type": "string", "enum": ["metric", "imperial"]}},
            "required": ["city"], "additionalProperties": False}}},
    {"type": "function", "function": {
        "name": "get_forecast", "description": "Forecast for the next days.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                       "required": ["city", "days"]}}},
]


class CollectorProcess:
    """`tracemill collector` run as its own process, as a user runs it."""

    def __init__(self, db_url: str, workdir: Path, env: Mapping[str, str] | None = None, workers: int = 1) -> None:
        self.db_url = db_url
        self.workers = workers
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.grpc_port = free_port()
        self.grpc_target = f"127.0.0.1:{self.grpc_port}"
        self.log = workdir / f"collector-{self.port}.log"
        self._env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
        self._workdir = workdir
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 30.0, tries: int = 3) -> CollectorProcess:
        """`tries`: starts on new ports when a port `free_port` found was taken before the collector bound it (the
        tests' own connections draw their local ports from the same range)."""
        logged = self.log.stat().st_size if self.log.exists() else 0
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "tracemill.cli", "collector", "--port", str(self.port),
                 "--grpc-port", str(self.grpc_port), "--db", self.db_url,
                 "--workers", str(self.workers), "--log-level", "warning"],
                cwd=self._workdir, env=self._env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                said = self.log.read_bytes()[logged:].decode(errors="replace")
                if "address already in use" in said.lower() and tries > 1:
                    self.port, self.grpc_port = free_port(), free_port()
                    self.url, self.grpc_target = f"http://127.0.0.1:{self.port}", f"127.0.0.1:{self.grpc_port}"
                    return self.start(timeout, tries - 1)
                raise RuntimeError(f"collector exited with {self.proc.returncode}:\n{said}")
            try:
                if httpx.get(f"{self.url}/healthz", timeout=1).status_code == 200:
                    return self
            except httpx.TransportError:
                time.sleep(0.1)
        raise RuntimeError(f"collector did not answer within {timeout}s:\n{self.log.read_text()}")

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.kill()

    def kill(self) -> None:
        """SIGKILL to the collector and its worker processes, as a crash or an OOM kill of its cgroup does."""
        assert self.proc is not None
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()


def make_span(trace_id: str, span_id: str, name: str, attrs: Mapping[str, Any], parent: str | None = None,
              start_ns: int = 1_700_000_000_000_000_000, status_code: int = 0) -> Span:
    span = Span(trace_id=bytes.fromhex(trace_id), span_id=bytes.fromhex(span_id), name=name,
                start_time_unix_nano=start_ns, end_time_unix_nano=start_ns + 1_000_000)
    if parent:
        span.parent_span_id = bytes.fromhex(parent)
    span.attributes.extend(key_values(attrs))
    span.status.code = status_code
    return span


def export_request(spans: list[Span], resource: Mapping[str, Any] | None = None) -> bytes:
    request = ExportTraceServiceRequest()
    rs = request.resource_spans.add()
    rs.resource.attributes.extend(key_values(resource or {"service.name": "test-agent"}))
    ss = rs.scope_spans.add()
    ss.scope.name = "tests"
    ss.spans.extend(spans)
    return request.SerializeToString()


def sidecar_and_agent_requests() -> list[bytes]:
    """One answer behind the reviser sidecar, as the store gets it twice, each in a trace of its own: the model's call
    as sent (`city` a number where the schema wants a string), traced by the sidecar (`tracemill-serve`), and the
    revised call the agent got, traced by the agent (`weather-agent`)."""
    sent = chat_attributes([{"id": "call_Xk2pQ9rT", "name": "get_weather", "arguments": {"city": 7}}])
    got = chat_attributes([{"id": "call_Xk2pQ9rT", "name": "get_weather", "arguments": {"city": "7"}}])
    return [export_request([make_span(trace, "01" * 8, "chat", attributes)], {"service.name": service})
            for trace, attributes, service in (("a1" * 16, sent, "tracemill-serve"), ("b2" * 16, got, "weather-agent"))]


def store_sidecar_and_agent(engine: Engine) -> None:
    """`sidecar_and_agent_requests` stored as the collector stores them (the store upgraded already)."""
    writer = SpanWriter(engine.dialect)
    for body in sidecar_and_agent_requests():
        with engine.begin() as conn:
            writer.write(conn, writer.prepare(decode_protobuf(body, Limits(1 << 20)).spans))
        writer.committed()


def store_as_before(engine: Engine, body: bytes, later_columns: tuple[str, ...]) -> None:
    """What a writer of an earlier revision stored of one request (`body`): its spans, and its calls without the
    columns later revisions added (the store must be at that revision)."""
    batch = SpanWriter(engine.dialect).prepare(decode_protobuf(body, Limits(1 << 20)).spans)
    calls = ToolCallRow.__table__
    with engine.begin() as conn:
        BulkInsert(SpanRow.__table__, engine.dialect).execute_params(conn, batch.span_params)
        for call in batch.calls:
            conn.execute(calls.insert().values({k: v for k, v in call.items() if k in calls.c
                                                and k not in later_columns}))


# A chat span as OpenTelemetry's openai-v2 sends it when the messages go in log events: no output on it.
CHAT_WITHOUT_OUTPUT = {"gen_ai.operation.name": "chat", "gen_ai.system": "openai",
                       "gen_ai.request.model": "llama3.1-8b", "gen_ai.response.model": "llama3.1-8b-instruct"}


def chat_attributes(calls: list[dict[str, Any]], tools: list[dict[str, Any]] = WEATHER_TOOLS,
                    model: str = "llama3.1-8b") -> dict[str, Any]:
    """A GenAI chat span's attributes: the tools offered and the tool calls in the model's answer."""
    parts = [{"type": "tool_call", **c} for c in calls]
    return {
        "gen_ai.operation.name": "chat", "gen_ai.request.model": model,
        "gen_ai.tool.definitions": json.dumps(tools),
        "gen_ai.input.messages": json.dumps([{"role": "user", "parts": [{"type": "text", "content": "Weather?"}]}]),
        "gen_ai.output.messages": json.dumps([{"role": "assistant", "parts": parts}]),
    }


class UIProcess:
    """`tracemill ui` run as its own process, as a user runs it."""

    def __init__(self, db_url: str, workdir: Path) -> None:
        self.db_url = db_url
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = workdir / f"ui-{self.port}.log"
        self._workdir = workdir
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 60.0) -> UIProcess:
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "tracemill.cli", "ui", "--db", self.db_url, "--port", str(self.port)],
                cwd=self._workdir, env={**os.environ, "PYTHONUNBUFFERED": "1"}, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"tracemill ui exited with {self.proc.returncode}:\n{self.log.read_text()}")
            try:
                if httpx.get(f"{self.url}/_stcore/health", timeout=1).status_code == 200:
                    return self
            except httpx.TransportError:
                time.sleep(0.2)
        raise RuntimeError(f"tracemill ui did not answer within {timeout}s:\n{self.log.read_text()}")

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()


CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")


def chromium(profile: Path, width: int = 1440, height: int = 1000):  # type: ignore[no-untyped-def]
    """Headless Chromium from Debian's packages, driven by its chromedriver through Selenium (never a download)."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--disable-dev-shm-usage", f"--user-data-dir={profile}", f"--window-size={width},{height}"):
        options.add_argument(flag)
    return webdriver.Chrome(service=Service(executable_path=str(CHROMEDRIVER)), options=options)


class SlowUpload(threading.Thread):
    """A client that sends the headers of a POST /v1/traces, then one byte of its body every `interval_s` until it is
    answered: chunked when `declared` is None, else announcing a Content-Length of `declared` bytes."""

    def __init__(self, port: int, declared: int | None = None, interval_s: float = 0.5) -> None:
        super().__init__(daemon=True)
        self.port = port
        self.declared = declared
        self.interval_s = interval_s
        self.sending = threading.Event()  # the headers and a first byte are sent
        self.answer = b""  # what the collector answered, once it did
        self._done = threading.Event()

    def run(self) -> None:
        length = "Transfer-Encoding: chunked" if self.declared is None else f"Content-Length: {self.declared}"
        byte = b"1\r\nx\r\n" if self.declared is None else b"x"
        with socket.create_connection(("127.0.0.1", self.port)) as sock:
            sock.sendall(f"POST /v1/traces HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/x-protobuf\r\n"
                         f"{length}\r\n\r\n".encode() + byte)
            self.sending.set()
            sock.settimeout(self.interval_s)
            while not self._done.is_set():
                try:
                    self.answer = sock.recv(65536)
                    return
                except TimeoutError:
                    sock.sendall(byte)
                except OSError:
                    return

    def status(self, timeout: float) -> int | None:
        """The HTTP status the collector answered within `timeout` seconds, else None."""
        self.join(timeout)
        self._done.set()
        return int(self.answer.split()[1]) if self.answer.startswith(b"HTTP/") else None


@contextmanager
def refused_connections(admin: Engine, database: str) -> Iterator[None]:
    """An outage of PostgreSQL database `database`: its open connections are terminated and new ones refused, until
    the block ends. `admin` is an AUTOCOMMIT engine on another database of the same server."""
    with admin.connect() as conn:
        conn.execute(text(f'ALTER DATABASE "{database}" ALLOW_CONNECTIONS false'))
        conn.execute(text("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = :name"),
                     {"name": database})
    try:
        yield
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'ALTER DATABASE "{database}" ALLOW_CONNECTIONS true'))


def logs_request(trace: str, span: str, events: list[dict[str, Any]]) -> bytes:
    """An OTLP logs request (protobuf): each event `{"name", "body"}` a log record of the span."""
    request = ExportLogsServiceRequest()
    scope = request.resource_logs.add().scope_logs.add()
    for n, event in enumerate(events):
        record = LogRecord(time_unix_nano=1_700_000_000_000_000_000 + n, trace_id=bytes.fromhex(trace),
                           span_id=bytes.fromhex(span), event_name=event["name"], body=any_value(event["body"]))
        record.attributes.extend(key_values({"gen_ai.system": "openai"}))
        scope.log_records.append(record)
    return request.SerializeToString()


def _json_any_value(value: Any) -> dict[str, Any]:
    if isinstance(value, dict):
        return {"kvlistValue": {"values": [{"key": k, "value": _json_any_value(v)} for k, v in value.items()]}}
    if isinstance(value, list):
        return {"arrayValue": {"values": [_json_any_value(v) for v in value]}}
    if isinstance(value, int):
        return {"intValue": str(value)}
    return {"stringValue": value}


def logs_json(trace: str, span: str, events: list[dict[str, Any]]) -> bytes:
    records = [{"timeUnixNano": str(1_700_000_000_000_000_000 + n), "traceId": trace, "spanId": span,
                "eventName": e["name"], "body": _json_any_value(e["body"]),
                "attributes": [{"key": "gen_ai.system", "value": {"stringValue": "openai"}}]}
               for n, e in enumerate(events)]
    return orjson.dumps({"resourceLogs": [{"scopeLogs": [{"logRecords": records}]}]})
