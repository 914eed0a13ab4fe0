"""How much room an agent's conversations take in the store: agent runs whose k-th model call sends the whole
conversation so far (as every chat span carries it: OpenTelemetry GenAI's `gen_ai.input.messages`, or LangSmith's
`gen_ai.prompt` of LangChain's serialized messages), sent to `tracemill collector` over OTLP/HTTP as an SDK sends them,
on a fresh SQLite store.

Reported per kind of run: the conversation characters the spans carried, what the store would hold with each distinct
conversation stored once whole (a run's k calls: the square of its length), and what it holds (payloads and values
kept inline), with the store file's size."""

from __future__ import annotations

import argparse
import itertools
import json
import random
import sqlite3
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import orjson
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.trace.v1.trace_pb2 import Span

from tracemill.otlp import key_values
from tracemill.store.payloads import PAYLOAD_MIN_CHARS

from mine import running_collector

# (model calls in a run, characters of each message): short turns, tool results, pasted documents
RUNS = ((16, 300), (30, 1500), (40, 4000), (20, 20000))
WORDS = ("the", "tool", "returned", "an", "error", "for", "city", "Paris", "with", "radius", "of", "3", "km", "and",
         "then", "retried", "search_places", "weather", "forecast", "document", "section", "page")


def _genai(role: str, text: str) -> dict[str, Any]:
    return {"role": role, "parts": [{"type": "text", "content": text}]}


def _langchain(role: str, text: str) -> dict[str, Any]:
    """A message as LangChain serializes it (`dumpd`)."""
    kind = {"user": ("HumanMessage", "human"), "tool": ("ToolMessage", "tool")}[role]
    kwargs = {"content": text, "type": kind[1]} | ({"tool_call_id": "call_1"} if role == "tool" else {})
    return {"lc": 1, "type": "constructor", "id": ["langchain", "schema", "messages", kind[0]], "kwargs": kwargs}


# each instrumentation's attribute, its messages, and its conversation's JSON (LangSmith: orjson, a batch of one)
FORMS: dict[str, tuple[str, Callable[[str, str], dict[str, Any]], Callable[[list[Any]], str]]] = {
    "genai": ("gen_ai.input.messages", _genai, json.dumps),
    "langsmith": ("gen_ai.prompt", _langchain, lambda messages: orjson.dumps({"messages": [messages]}).decode()),
}


def _run(rng: random.Random, run: int, calls: int, chars: int, form: str) -> tuple[list[Span], list[str]]:
    """One agent run: its chat spans and the conversation each sent."""
    attribute, message, encoded = FORMS[form]
    messages: list[dict[str, Any]] = []
    spans, sent = [], []
    trace_id = rng.randbytes(16)
    for k in range(calls):
        text = " ".join(rng.choice(WORDS) for _ in range(chars // 5))[:chars]
        messages.append(message(("user", "tool")[k % 2], text))
        conversation = encoded(messages)
        sent.append(conversation)
        start = 1_700_000_000_000_000_000 + run * 10**12 + k * 10**9
        spans.append(Span(trace_id=trace_id, span_id=rng.randbytes(8), name="chat", kind=Span.SPAN_KIND_CLIENT,
                          start_time_unix_nano=start, end_time_unix_nano=start + 10**8,
                          attributes=key_values({"gen_ai.operation.name": "chat", "gen_ai.request.model": "m",
                                                 attribute: conversation})))
    return spans, sent


def _post(url: str, spans: list[Span]) -> None:
    request = ExportTraceServiceRequest()
    resource = request.resource_spans.add()
    resource.resource.attributes.extend(key_values({"service.name": "bench-agent"}))
    resource.scope_spans.add().spans.extend(spans)
    answer = httpx.post(f"{url}/v1/traces", content=request.SerializeToString(),
                        headers={"Content-Type": "application/x-protobuf"}, timeout=60)
    answer.raise_for_status()


def _stored(db: Path, attribute: str) -> int:
    """Conversation characters the store holds: every payload (nothing else is large here) and the inline values."""
    with sqlite3.connect(db) as conn:
        payloads = conn.execute("SELECT coalesce(sum(chars), 0) FROM payloads").fetchone()[0]
        inline = conn.execute(f"SELECT coalesce(sum(length(json_extract(attributes, '$.\"{attribute}\"'))), 0) "
                              f"FROM spans WHERE json_type(attributes, '$.\"{attribute}\"') = 'text'").fetchone()[0]
    return int(payloads) + int(inline)


def measure(runs: int, calls: int, chars: int, form: str, workdir: Path, seed: int) -> dict[str, Any]:
    db = workdir / f"store-{form}-{calls}x{chars}.db"
    with running_collector(f"sqlite:///{db}") as url:
        rng = random.Random(seed)
        sent: list[str] = []
        for run in range(runs):
            spans, conversations = _run(rng, run, calls, chars, form)
            sent += conversations
            for start in range(0, len(spans), 8):  # a batch of the SDK's exporter at a time
                _post(url, spans[start:start + 8])
    whole = sum(len(c) for c in set(sent) if len(c) >= PAYLOAD_MIN_CHARS) + sum(
        len(c) for c in sent if len(c) < PAYLOAD_MIN_CHARS)
    return {"form": form, "runs": runs, "calls_per_run": calls, "message_chars": chars,
            "last_conversation_chars": len(sent[-1]), "sent_chars": sum(len(c) for c in sent),
            "stored_whole_chars": whole, "stored_chars": _stored(db, FORMS[form][0]),
            "store_file_bytes": db.stat().st_size}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=10, help="agent runs of each kind (default 10)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--form", choices=FORMS, action="append", help="the instrumentations' forms (default: all)")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "out" / "conversation_storage.json")
    args = parser.parse_args()
    results = []
    with tempfile.TemporaryDirectory(prefix="tracemill-conversations-") as work:
        for form, (calls, chars) in itertools.product(args.form or FORMS, RUNS):
            results.append(measure(args.runs, calls, chars, form, Path(work), args.seed))
            r = results[-1]
            print(f"{form}: {calls} calls of {chars:,}-character messages: {r['sent_chars']:,} characters sent, "
                  f"{r['stored_whole_chars']:,} stored whole, {r['stored_chars']:,} stored "
                  f"({r['stored_whole_chars'] / r['stored_chars']:.1f}x less), store file "
                  f"{r['store_file_bytes'] / 2**20:.1f} MB", file=sys.stderr)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_bytes(orjson.dumps({"runs": results}, option=orjson.OPT_INDENT_2))


if __name__ == "__main__":
    main()
