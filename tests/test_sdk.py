"""The SDK against a real collector: what an agent records arrives as spans and tool calls; secrets are redacted
before they leave the process; a missing collector never stops the agent."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from sqlalchemy import select

import tracemill.sdk as tm
from tracemill.collector.keys import create_key
from tracemill.reviser_prompt import message_text
from tracemill.store.engine import make_engine
from tracemill.store.payloads import resolve
from tracemill.store.tables import SpanRow, ToolCallRow

from support import free_port

pytestmark = pytest.mark.timeout(60)

TOOLS = [{"name": "lookup_patient", "description": "Find a patient record.",
          "inputSchema": {"type": "object", "properties": {"email": {"type": "string"}, "limit": {"type": "integer"}},
                          "required": ["email"]}}]


@pytest.fixture
def sdk() -> Iterator[Any]:
    yield tm
    tm.shutdown()


def _read(db_url: str) -> tuple[list[Any], list[Any]]:
    engine = make_engine(db_url)
    with engine.connect() as conn:
        spans = [SimpleNamespace(**{**row._asdict(), "attributes": resolve(conn, row.attributes)})
                 for row in conn.execute(select(SpanRow).order_by(SpanRow.start_time_ns))]
        calls = list(conn.execute(select(ToolCallRow).order_by(ToolCallRow.start_time_ns, ToolCallRow.call_index)))
    engine.dispose()
    return spans, calls


def test_model_calls_and_tool_executions_arrive_as_tool_calls(start_collector, sqlite_url: str, sdk: Any) -> None:
    collector = start_collector(sqlite_url)
    sdk.init(collector.url, service_name="clinic-agent", harness_version="prompt-v3")
    with sdk.agent("clinic", conversation_id="conv-1"):
        with sdk.chat("llama3.1-8b", tools=TOOLS, messages=[{"role": "user", "content": "Find Ann"}]) as call:
            # no native tool calling: the call is written in the text, and the text is what gets recorded
            call.output('<|python_start|>lookup_patient(email="ann@example.org")<|python_end|>')
        with sdk.chat("llama3.1-8b", tools=TOOLS) as call:
            call.output(tool_calls=[{"id": "c2", "name": "lookup_patient",
                                     "arguments": '{"email": "ann@example.org", "limit": "5"}'}])
        with pytest.raises(TimeoutError), sdk.tool("lookup_patient", {"email": "ann@example.org"}, call_id="c2"):
            raise TimeoutError("records service timed out")
    assert sdk.flush()

    spans, calls = _read(sqlite_url)
    assert [s.name for s in spans] == ["invoke_agent clinic", "chat llama3.1-8b", "chat llama3.1-8b",
                                       "execute_tool lookup_patient"]
    assert all(s.resource["tracemill.harness.version"] == "prompt-v3" for s in spans)
    root = spans[0]
    assert all(s.parent_span_id == root.span_id and s.trace_id == root.trace_id for s in spans[1:])
    failed = spans[3]
    assert failed.status_code == 2 and failed.attributes["error.type"] == "TimeoutError"

    deadline = time.monotonic() + 5
    while calls[-1].execution_status is None and time.monotonic() < deadline:
        time.sleep(0.1)
        _, calls = _read(sqlite_url)
    text, native = calls
    assert text.raw == '<|python_start|>lookup_patient(email="ann@example.org")<|python_end|>'
    assert (native.name, native.name_valid, native.schema_valid) == ("lookup_patient", True, False)
    assert native.harness_version == "prompt-v3" and native.model == "llama3.1-8b"
    assert native.execution_status == "error" and "timed out" in (native.execution_error or "")


@pytest.mark.parametrize("redact", [[r"[\w.]+@[\w.]+"], lambda text: text.replace("ann@example.org", "[REDACTED]")],
                         ids=["regexes", "callable"])
def test_redaction_happens_before_anything_leaves(start_collector, sqlite_url: str, sdk: Any, redact: Any) -> None:
    collector = start_collector(sqlite_url)
    sdk.init(collector.url, redact=redact)
    with sdk.agent("clinic"):
        with sdk.chat("gemma3-27b", tools=TOOLS, system="Be brief.",
                      messages=[{"role": "user", "content": "Records for ann@example.org please"}]) as call:
            call.output("Looking up ann@example.org", tool_calls=[
                {"id": "c1", "name": "lookup_patient", "arguments": '{"email": "ann@example.org"}'}])
        with sdk.tool("lookup_patient", {"email": "ann@example.org"}, call_id="c1") as run:
            run.result({"patient": "Ann", "email": "ann@example.org"})
    assert sdk.flush()

    spans, calls = _read(sqlite_url)
    stored = json.dumps([s.attributes for s in spans]) + json.dumps([c.raw for c in calls])
    assert "ann@example.org" not in stored
    assert stored.count("[REDACTED]") >= 5
    # what the loop needs survives: the tool list, the call, its name and the parameter names
    assert calls[0].name == "lookup_patient" and calls[0].arguments == {"email": "[REDACTED]"}
    assert calls[0].schema_valid and calls[0].execution_status == "success"


def test_conversation_can_be_left_out(start_collector, sqlite_url: str, sdk: Any) -> None:
    collector = start_collector(sqlite_url)
    sdk.init(collector.url, capture_messages=False)
    with sdk.chat("qwen3", tools=TOOLS, messages=[{"role": "user", "content": "private question"}]) as call:
        call.output(tool_calls=[{"id": "c1", "name": "lookup_patient", "arguments": '{"email": "x@y.z"}'}])
    with sdk.tool("lookup_patient", {"email": "x@y.z"}, call_id="c1") as run:
        run.result("private answer")
    assert sdk.flush()

    spans, calls = _read(sqlite_url)
    attributes = json.dumps([s.attributes for s in spans])
    assert "private" not in attributes
    assert "gen_ai.tool.definitions" in spans[0].attributes and calls[0].arguments == {"email": "x@y.z"}


def test_long_conversations_all_arrive_however_many_a_batch_holds(start_collector, sqlite_url: str,
                                                                   sdk: Any) -> None:
    # real agent contexts reach 57k-128k tokens: a batch of such spans is larger than a collector takes in one request
    # (here 4 MiB; 32 MiB by default), and a refused request loses every span in it
    collector = start_collector(sqlite_url, TRACEMILL_MAX_BODY_BYTES=str(4 << 20))
    sdk.init(collector.url)
    document = "The attached contract, clause by clause. " * 5000  # 200,000 characters
    for n in range(60):
        with sdk.chat("qwen3", tools=TOOLS, messages=[{"role": "user", "content": f"[{n}] {document}"}]) as call:
            call.output(tool_calls=[{"id": f"c{n}", "name": "lookup_patient", "arguments": '{"email": "x@y.z"}'}])
    assert sdk.flush(30)

    spans, calls = _read(sqlite_url)
    assert len(spans) == len(calls) == 60
    said = {message_text(json.loads(s.attributes["gen_ai.input.messages"])[0])[1].partition("]")[0] for s in spans}
    assert said == {f"[{n}" for n in range(60)}

    # one span over the collector's limit is refused: the agent is told by flush, and nothing else is lost
    with sdk.chat("qwen3", tools=TOOLS, messages=[{"role": "user", "content": document * 25}]) as call:
        call.output("too long to store")
    with sdk.chat("qwen3", tools=TOOLS, messages=[{"role": "user", "content": "short"}]) as call:
        call.output("stored")
    assert not sdk.flush(30)
    assert sdk.flush(30)  # nothing failed since
    assert len(_read(sqlite_url)[0]) == 61


def test_api_key_is_sent(start_collector, sqlite_url: str, sdk: Any) -> None:
    collector = start_collector(sqlite_url)
    engine = make_engine(sqlite_url)
    _, key = create_key(engine, "agent")
    engine.dispose()
    time.sleep(2.5)  # the collector re-reads its keys every 2 s
    sdk.init(collector.url, api_key=key)
    with sdk.chat("qwen3", tools=TOOLS) as call:
        call.output(tool_calls=[{"id": "c1", "name": "lookup_patient", "arguments": '{"email": "x@y.z"}'}])
    assert sdk.flush()
    assert len(_read(sqlite_url)[1]) == 1


AGENT_WITHOUT_COLLECTOR = """
    import sys, time
    import tracemill.sdk as tm
    tm.init("http://127.0.0.1:{port}", service_name="lonely-agent", export_timeout_s=2)
    started = time.monotonic()
    for i in range(200):
        with tm.chat("llama3.1-8b", tools=[{{"name": "t", "inputSchema": {{"type": "object"}}}}]) as call:
            call.output('{{"name": "t", "arguments": {{}}}}')
        with tm.tool("t", {{}}, call_id=str(i)) as run:
            run.result("ok")
    tm.flush(timeout_s=1)
    print(f"agent work done in {{time.monotonic() - started:.2f}} s")
"""


def test_agent_goes_on_when_the_collector_is_down(tmp_path: Path) -> None:
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(AGENT_WITHOUT_COLLECTOR.format(port=free_port()))],
                          cwd=tmp_path, capture_output=True, text=True, timeout=30)
    elapsed = time.monotonic() - started
    assert done.returncode == 0, done.stderr
    work = float(done.stdout.split()[-2])
    assert work < 3.0  # recording never waited on the network beyond the one bounded flush
    assert elapsed < 12.0  # and exit waits at most one export timeout
    assert "Failed to export" in done.stderr  # the spans were dropped with a warning
