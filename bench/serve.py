"""Sidecar overhead: what `tracemill serve` adds to a chat completion that needs no revision, and the rate it holds.

Run by hand, never in CI (see bench/README.md, "Serving"), under the bench lock:

    flock /tmp/tracemill-bench.lock .venv/bin/python bench/serve.py --out bench/out/serve.json

Everything runs on this machine, each server its own process: a local upstream (a minimal OpenAI-compatible server
answering every request with the same valid native tool call, pre-encoded, so that it costs as little as possible),
`tracemill serve` in front of it (the real command; rules reviser), and, for the traced runs, a real collector the
sidecar traces to. Requests are what an agent sends: one MCP-Bench server's tools and a short conversation (with
`--context-chars`, a pasted document ahead of it: real agent contexts reach 57k-128k tokens).
The load comes from a small asyncio HTTP/1.1 client with keep-alive connections (cheaper than any HTTP library, so
that the figures are the servers').

Phases, each direct to the upstream and through the sidecar:
  latency   one request at a time; the overhead is the difference of the medians (non-streamed and streamed).
  paced     open loop at --rate requests/s for --seconds over --connections connections; latency from the scheduled
            send time, so a proxy that falls behind shows it.
  peak      closed loop, --connections requests in flight: the most it answers per second.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import orjson

from tracemill.examples import example_call
from tracemill.net import free_port
from tracemill.tools import load_mcp_bench

ROOT = Path(__file__).resolve().parent.parent
PYTHON = sys.executable


# --- the upstream: a raw ASGI app, cheaper than any framework ---------------------------------------------------

_DOCUMENT = ("Section 4.2 of the attached report: revenue grew 12.5 percent to 4,200 units across 17 regions, while "
             "returns fell to 310 units; the appendix lists every store by city and quarter. ")


def _payloads(context_chars: int = 0) -> tuple[bytes, bytes, bytes]:
    """(the request an agent sends, the upstream's answer, the same answer streamed); with `context_chars`, the
    conversation starts with a user message of that many characters (a pasted document)."""
    tools = load_mcp_bench()["Weather Data"]
    call = next(c for c in map(example_call, tools) if c is not None)
    document = (_DOCUMENT * (context_chars // len(_DOCUMENT) + 1))[:context_chars]
    request = orjson.dumps({"model": "bench-model", "messages": [
        {"role": "system", "content": "You are a helpful assistant with weather tools."},
        *([{"role": "user", "content": document}] if document else []),
        {"role": "user", "content": "What is the weather in Paris right now, and tomorrow?"}],
        "tools": [{"type": "function", "function": {"name": t.name, "description": t.description,
                                                    "parameters": dict(t.input_schema)}} for t in tools]})
    arguments = json.dumps(call.arguments)
    answer = orjson.dumps({"id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": "bench-model",
                           "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {
                               "role": "assistant", "content": None, "tool_calls": [{
                                   "id": "call_1", "type": "function",
                                   "function": {"name": call.name, "arguments": arguments}}]}}],
                           "usage": {"prompt_tokens": 300, "completion_tokens": 20, "total_tokens": 320}})

    def chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
        return b"data: " + orjson.dumps({"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1,
                                          "model": "bench-model", "choices": [{"index": 0, "delta": delta,
                                                                              "finish_reason": finish}]}) + b"\n\n"
    pieces = [chunk({"role": "assistant", "content": ""}),
              chunk({"tool_calls": [{"index": 0, "id": "call_1", "type": "function",
                                     "function": {"name": call.name, "arguments": ""}}]})]
    pieces += [chunk({"tool_calls": [{"index": 0, "function": {"arguments": arguments[i:i + 8]}}]})
               for i in range(0, len(arguments), 8)]
    pieces += [chunk({}, "tool_calls"), b"data: [DONE]\n\n"]
    return request, answer, b"".join(pieces)


def upstream_app() -> Any:
    _, answer, streamed = _payloads()

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        stream = b'"stream":true' in body or b'"stream": true' in body
        payload, kind = (streamed, b"text/event-stream") if stream else (answer, b"application/json")
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", kind), (b"content-length", str(len(payload)).encode())]})
        await send({"type": "http.response.body", "body": payload})
    return app


# --- a minimal keep-alive HTTP/1.1 client -------------------------------------------------------------------

class Connection:
    answered = 0  # by every connection: the requests answered, to compare with the spans a traced run stored

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def request(self, path: str, body: bytes) -> bytes:
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
        head = (f"POST {path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(body)}\r\n\r\n").encode()
        self.writer.write(head + body)
        assert self.reader is not None
        status = await self.reader.readuntil(b"\r\n")
        if b" 200 " not in status:
            raise RuntimeError(f"{path}: {status!r}")
        length, chunked = None, False
        while (line := await self.reader.readuntil(b"\r\n")) != b"\r\n":
            name, _, value = line.decode().partition(":")
            if name.lower() == "content-length":
                length = int(value)
            elif name.lower() == "transfer-encoding" and "chunked" in value:
                chunked = True
        Connection.answered += 1
        if not chunked:
            return await self.reader.readexactly(length or 0)
        parts = []
        while (size := int((await self.reader.readuntil(b"\r\n")).strip(), 16)) != 0:
            parts.append(await self.reader.readexactly(size + 2))
        await self.reader.readuntil(b"\r\n")
        return b"".join(p[:-2] for p in parts)


def _summary(latencies: list[float]) -> dict[str, float]:
    ordered = sorted(latencies)
    pick = lambda q: ordered[min(len(ordered) - 1, int(len(ordered) * q))] * 1000
    return {"requests": len(ordered), "p50_ms": statistics.median(ordered) * 1000, "p90_ms": pick(0.9),
            "p99_ms": pick(0.99), "max_ms": ordered[-1] * 1000}


async def sequential(port: int, body: bytes, n: int, warmup: int) -> dict[str, float]:
    conn = Connection("127.0.0.1", port)
    latencies = []
    for i in range(n + warmup):
        start = time.perf_counter()
        await conn.request("/v1/chat/completions", body)
        if i >= warmup:
            latencies.append(time.perf_counter() - start)
    return _summary(latencies)


async def paced(port: int, body: bytes, rate: float, seconds: float, connections: int) -> dict[str, float]:
    idle: asyncio.Queue[Connection] = asyncio.Queue()
    for _ in range(connections):
        idle.put_nowait(Connection("127.0.0.1", port))
    latencies: list[float] = []
    late = 0

    async def one(scheduled: float) -> None:
        conn = await idle.get()
        try:
            await conn.request("/v1/chat/completions", body)
        finally:
            idle.put_nowait(conn)
        latencies.append(time.perf_counter() - scheduled)

    start = time.perf_counter()
    tasks = []
    total = int(rate * seconds)
    for i in range(total):
        scheduled = start + i / rate
        delay = scheduled - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        elif delay < -0.05:
            late += 1
        tasks.append(asyncio.create_task(one(scheduled)))
    await asyncio.gather(*tasks)
    elapsed = time.perf_counter() - start
    return {**_summary(latencies), "offered_per_s": rate, "answered_per_s": len(latencies) / elapsed,
            "sent_late": late}


async def peak(port: int, body: bytes, seconds: float, connections: int) -> dict[str, float]:
    done = 0
    stop = time.perf_counter() + seconds

    async def worker() -> None:
        nonlocal done
        conn = Connection("127.0.0.1", port)
        while time.perf_counter() < stop:
            await conn.request("/v1/chat/completions", body)
            done += 1

    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(connections)))
    return {"connections": connections, "answered_per_s": done / (time.perf_counter() - start)}


# --- processes ---------------------------------------------------------------------------------------------

def _wait(url: str, proc: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{url} exited:\n{log.read_text()}")
        try:
            httpx.get(url, timeout=1)
            return
        except httpx.TransportError:
            time.sleep(0.1)
    raise RuntimeError(f"{url} did not start:\n{log.read_text()}")


def _start(args: list[str], url: str, workdir: Path, name: str) -> subprocess.Popen[bytes]:
    log = workdir / f"{name}.log"
    proc = subprocess.Popen(args, cwd=workdir, stdout=log.open("wb"), stderr=subprocess.STDOUT,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    _wait(url, proc, log)
    return proc


def _stored_spans(path: Path) -> int:
    with sqlite3.connect(path) as conn:
        return int(conn.execute("SELECT count(*) FROM spans").fetchone()[0])


def _stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()


async def measure(port: int, body: bytes, stream_body: bytes, args: argparse.Namespace) -> dict[str, Any]:
    return {"latency": await sequential(port, body, args.requests, 200),
            "latency_streamed": await sequential(port, stream_body, args.requests // 2, 100),
            "paced": await paced(port, body, args.rate, args.seconds, args.connections),
            "peak": await peak(port, body, args.seconds / 2, args.connections)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=2000, help="sequential requests per latency phase")
    parser.add_argument("--rate", type=float, default=500.0, help="offered requests/s in the paced phase")
    parser.add_argument("--seconds", type=float, default=20.0, help="length of the paced phase")
    parser.add_argument("--connections", type=int, default=32)
    parser.add_argument("--context-chars", type=int, default=0,
                        help="a user message of this many characters ahead of the conversation (a pasted document)")
    parser.add_argument("--out", type=Path, help="write the figures here as JSON")
    parser.add_argument("--upstream-only", type=int, metavar="PORT", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.upstream_only:
        import uvicorn

        uvicorn.run(upstream_app(), host="127.0.0.1", port=args.upstream_only, log_level="warning",
                    access_log=False, loop="uvloop", http="httptools")
        return

    body, _, _ = _payloads(args.context_chars)
    stream_body = body[:-1] + b',"stream":true}'
    figures: dict[str, Any] = {
        "machine": {"python": platform.python_version(), "cpu": platform.processor() or platform.machine(),
                    "cpus": os.cpu_count(), "system": platform.platform()},
        "request_bytes": len(body), "context_chars": args.context_chars}
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        up_port = free_port()
        upstream = _start([PYTHON, __file__, "--upstream-only", str(up_port)], f"http://127.0.0.1:{up_port}/",
                          workdir, "upstream")
        try:
            print("direct to the upstream ...", file=sys.stderr)
            figures["direct"] = asyncio.run(measure(up_port, body, stream_body, args))
            for traced in (False, True):
                collector = None
                extra: list[str] = []
                if traced:
                    c_port = free_port()
                    collector = _start([PYTHON, "-m", "tracemill.cli", "collector", "--port", str(c_port),
                                        "--grpc-port", "0", "--db",
                                        f"sqlite:///{workdir / 'traces.db'}", "--workers", "1", "--log-level",
                                        "warning"], f"http://127.0.0.1:{c_port}/healthz", workdir, "collector")
                    extra = ["--collector", f"http://127.0.0.1:{c_port}"]
                port = free_port()
                proxy = _start([PYTHON, "-m", "tracemill.cli", "serve", "--upstream",
                                f"http://127.0.0.1:{up_port}/v1", "--port", str(port), "--db",
                                f"sqlite:///{workdir / 'none.db'}", "--log-level", "warning", *extra],
                               f"http://127.0.0.1:{port}/healthz", workdir, f"serve-{traced}")
                name = "sidecar_traced" if traced else "sidecar"
                print(f"through the sidecar{' (traced)' if traced else ''} ...", file=sys.stderr)
                Connection.answered = 0
                try:
                    figures[name] = asyncio.run(measure(port, body, stream_body, args))
                finally:
                    _stop(proxy)  # its spans flushed as it exits
                    if collector is not None:
                        _stop(collector)
                if traced:
                    figures[name]["requests_answered"] = Connection.answered
                    figures[name]["spans_stored"] = _stored_spans(workdir / "traces.db")
        finally:
            _stop(upstream)
    for name in ("sidecar", "sidecar_traced"):
        figures[name]["overhead_p50_ms"] = figures[name]["latency"]["p50_ms"] - figures["direct"]["latency"]["p50_ms"]
        figures[name]["overhead_p50_streamed_ms"] = (figures[name]["latency_streamed"]["p50_ms"]
                                                     - figures["direct"]["latency_streamed"]["p50_ms"])
    print(json.dumps(figures, indent=2))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(figures, indent=2) + "\n")


if __name__ == "__main__":
    main()
