"""Each integration, in its own agent process, sends traces that a real collector turns into the right tool_calls rows.

The agents use the real libraries: the `openai` client (wrapped by Tracemill, or instrumented by OpenInference)
against a chat-completions server started here, a LangChain agent whose chat model is LangChain's own fake model with
scripted tool calls (once with Tracemill's callback handler, once through LangSmith's OpenTelemetry export), and an
`mcp` client session against an `mcp` stdio server.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from tracemill.store.engine import make_engine
from tracemill.store.payloads import resolve
from tracemill.store.tables import SpanRow, ToolCallRow, ToolExecutionRow

pytestmark = pytest.mark.timeout(60)

WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather for a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
FORECAST_TOOL = {"type": "function", "function": {
    "name": "get_forecast", "description": "Forecast for the next days.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                   "required": ["city", "days"]}}}


def run_agent(script: str, cwd: Path, **env: str) -> str:
    """Run an agent as its own Python process; it must exit 0 on its own (spans are flushed at exit)."""
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(script)], cwd=cwd, capture_output=True, text=True,
                          env={**os.environ, **env}, timeout=45)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def stored(db_url: str, until: Callable[[list[ToolCallRow]], bool], timeout: float = 10.0) -> list[ToolCallRow]:
    """The stored tool calls, in emission order, once `until` holds (executions may be linked a moment later)."""
    engine = make_engine(db_url)
    deadline = time.monotonic() + timeout
    try:
        while True:
            with engine.connect() as conn:
                rows = list(conn.execute(select(ToolCallRow).order_by(ToolCallRow.start_time_ns,
                                                                      ToolCallRow.call_index)))
            if until(rows) or time.monotonic() > deadline:
                return rows
            time.sleep(0.2)
    finally:
        engine.dispose()


def by_name(rows: list[Any]) -> dict[str | None, Any]:
    return {r.name: r for r in rows}


# --- OpenAI-compatible client --------------------------------------------------------------------------------------

def _completion(message: dict[str, Any], finish: str) -> dict[str, Any]:
    return {"id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": "llama3.1-8b-instruct",
            "choices": [{"index": 0, "message": {"role": "assistant", **message}, "finish_reason": finish}],
            "usage": {"prompt_tokens": 42, "completion_tokens": 7, "total_tokens": 49}}


def _native(call_id: str, name: str, arguments: str) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


SCRIPTED_ANSWERS: list[dict[str, Any]] = [
    _completion({"content": None, "tool_calls": [_native("call_1", "get_weather", '{"city": "Paris"}')]},
                "tool_calls"),
    # a model without native tool calling: the call is in the text
    _completion({"content": '<tool_call>\n{"name": "get_forecast", "arguments": {"city": "Paris", "days": 3}}\n'
                            '</tool_call>'}, "stop"),
    _completion({"content": None, "tool_calls": [_native("call_3", "get_forecast", '{"city": "Paris", "days": 3')]},
                "tool_calls"),
    {"stream": [  # a streamed answer: the call arrives in pieces
        {"index": 0, "id": "call_4", "type": "function", "function": {"name": "get_forecast", "arguments": ""}},
        {"index": 0, "function": {"arguments": '{"city": "Lyon", '}},
        {"index": 0, "function": {"arguments": '"days": 2}'}},
    ]},
    _completion({"content": "Sunny in Paris today, rain in Lyon later."}, "stop"),
]


class ChatCompletionsServer(ThreadingHTTPServer):
    """An OpenAI-compatible server that answers /v1/chat/completions with the scripted answers, in turn."""

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _ChatHandler)
        self.answers = iter(SCRIPTED_ANSWERS)
        self.requests: list[dict[str, Any]] = []

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/v1"


class _ChatHandler(BaseHTTPRequestHandler):
    server: ChatCompletionsServer

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["content-length"])))
        self.server.requests.append(body)
        answer = next(self.server.answers)
        if "stream" not in answer:
            payload = json.dumps(answer).encode()
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)
            return
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.end_headers()
        chunks = [{"tool_calls": [delta]} for delta in answer["stream"]]
        for i, delta in enumerate(chunks):
            chunk = {"id": "chatcmpl-2", "object": "chat.completion.chunk", "created": 1,
                     "model": "llama3.1-8b-instruct", "choices": [
                         {"index": 0, "delta": delta, "finish_reason": "tool_calls" if i == len(chunks) - 1 else None}]}
            self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
        self.wfile.write(b"data: [DONE]\n\n")

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def chat_server() -> Iterator[ChatCompletionsServer]:
    server = ChatCompletionsServer()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


OPENAI_AGENT = """
    import json, os
    from openai import OpenAI
    import tracemill.sdk as tm
    from tracemill.sdk.openai import instrument

    tm.init(os.environ["COLLECTOR"], service_name="openai-agent", harness_version="h-7")
    client = instrument(OpenAI(base_url=os.environ["MODEL_URL"], api_key="not-needed"))
    tools = json.loads(os.environ["TOOLS"])
    messages = [{"role": "user", "content": "Weather in Paris, then the forecast?"}]
    with tm.agent("weather"):
        for turn in range(5):
            if turn == 3:
                calls = {}
                for chunk in client.chat.completions.create(model="llama3.1-8b", messages=messages, tools=tools,
                                                            stream=True):
                    for d in chunk.choices[0].delta.tool_calls or ():
                        call = calls.setdefault(d.index, {"id": d.id, "name": "", "arguments": ""})
                        call["name"] += d.function.name or ""
                        call["arguments"] += d.function.arguments or ""
                calls = list(calls.values())
            else:
                message = client.chat.completions.create(model="llama3.1-8b", messages=messages,
                                                         tools=tools).choices[0].message
                calls = [{"id": c.id, "name": c.function.name, "arguments": c.function.arguments}
                         for c in message.tool_calls or ()]
            messages.append({"role": "assistant", "content": None, "tool_calls": [
                {"id": c["id"], "type": "function", "function": {"name": c["name"], "arguments": c["arguments"]}}
                for c in calls]})
            for c in calls:
                with tm.tool(c["name"], c["arguments"], call_id=c["id"]) as run:
                    args = json.loads(c["arguments"]) if c["arguments"].endswith("}") else None
                    if args is None:
                        run.fail("invalid_arguments", "arguments are not JSON")
                        result = "error: arguments are not JSON"
                    else:
                        result = f"sunny in {args['city']}"
                        run.result(result)
                messages.append({"role": "tool", "tool_call_id": c["id"], "content": result})
    print("done")
"""


def test_openai_client_calls_become_tool_call_rows(start_collector, sqlite_url: str, tmp_path: Path,
                                                    chat_server: ChatCompletionsServer) -> None:
    collector = start_collector(sqlite_url)
    run_agent(OPENAI_AGENT, tmp_path, COLLECTOR=collector.url, MODEL_URL=chat_server.url,
              TOOLS=json.dumps([WEATHER_TOOL, FORECAST_TOOL]))
    assert len(chat_server.requests) == 5  # the wrapper let every request through

    rows = stored(sqlite_url, lambda rs: len(rs) == 4 and sum(r.execution_status is not None for r in rs) == 3)
    assert len(rows) == 4
    native, text, broken, streamed = rows
    assert (native.name, native.tool_call_id, native.parsed, native.name_valid, native.schema_valid) == \
        ("get_weather", "call_1", True, True, True)
    assert native.execution_status == "success" and native.execution_result == "sunny in Paris"
    assert native.model in ("llama3.1-8b", "llama3.1-8b-instruct") and native.harness_version == "h-7"
    # the call written into the text is stored verbatim, for the reviser
    assert text.raw.startswith("<tool_call>") and '"days": 3' in text.raw and not text.parsed
    # ... with the tool it names and the arguments the reader recovers, so that it counts for that tool
    assert text.name == "get_forecast" and text.arguments == {"city": "Paris", "days": 3}
    # broken JSON arguments: still a call, by name, with its raw text, and its failed execution
    assert broken.name == "get_forecast" and not broken.parsed
    assert json.loads(broken.raw)["arguments"] == '{"city": "Paris", "days": 3'
    assert broken.execution_status == "error"
    # a streamed answer is put back together
    assert (streamed.name, streamed.tool_call_id, streamed.schema_valid) == ("get_forecast", "call_4", True)
    assert streamed.arguments == {"city": "Lyon", "days": 2} and streamed.execution_status == "success"


ASYNC_OPENAI_AGENT = """
    import asyncio, json, os
    from openai import AsyncOpenAI
    import tracemill.sdk as tm
    from tracemill.sdk.openai import instrument

    tm.init(os.environ["COLLECTOR"], service_name="async-openai-agent")

    async def main():
        client = instrument(AsyncOpenAI(base_url=os.environ["MODEL_URL"], api_key="not-needed"))
        messages = [{"role": "user", "content": "Weather?"}]
        with tm.agent("weather"):
            for turn in range(4):
                answer = await client.chat.completions.create(model="qwen3", messages=messages, tools=json.loads(
                    os.environ["TOOLS"]), stream=turn == 3)
                if turn == 3:
                    async for chunk in answer:
                        pass

    asyncio.run(main())
"""


def test_async_openai_client(start_collector, sqlite_url: str, tmp_path: Path,
                             chat_server: ChatCompletionsServer) -> None:
    collector = start_collector(sqlite_url)
    run_agent(ASYNC_OPENAI_AGENT, tmp_path, COLLECTOR=collector.url, MODEL_URL=chat_server.url,
              TOOLS=json.dumps([WEATHER_TOOL, FORECAST_TOOL]))
    rows = stored(sqlite_url, lambda rs: len(rs) == 4)
    assert [(r.name, r.tool_call_id, r.schema_valid) for r in rows] == [
        ("get_weather", "call_1", True), ("get_forecast", None, None), ("get_forecast", "call_3", False),
        ("get_forecast", "call_4", True)]


OPENINFERENCE_AGENT = """
    import json, os
    from openai import OpenAI
    from openinference.instrumentation.openai import OpenAIInstrumentor
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(os.environ["COLLECTOR"] + "/v1/traces")))
    OpenAIInstrumentor().instrument(tracer_provider=provider)
    client = OpenAI(base_url=os.environ["MODEL_URL"], api_key="not-needed")
    for turn in range(3):
        client.chat.completions.create(model="llama3.1-8b", messages=[{"role": "user", "content": "Weather?"}],
                                       tools=json.loads(os.environ["TOOLS"]))
    provider.shutdown()
"""


def test_openinference_instrumented_client(start_collector, sqlite_url: str, tmp_path: Path,
                                           chat_server: ChatCompletionsServer) -> None:
    """An agent already instrumented with OpenInference needs nothing from Tracemill but the collector's URL."""
    pytest.importorskip("openinference.instrumentation.openai", reason="the [integrations] extra is not installed")
    collector = start_collector(sqlite_url)
    run_agent(OPENINFERENCE_AGENT, tmp_path, COLLECTOR=collector.url, MODEL_URL=chat_server.url,
              TOOLS=json.dumps([WEATHER_TOOL, FORECAST_TOOL]))
    rows = stored(sqlite_url, lambda rs: len(rs) == 3)
    assert [(r.name, r.tool_call_id, r.name_valid, r.schema_valid) for r in rows] == [
        ("get_weather", "call_1", True, True), ("get_forecast", None, False, None),
        ("get_forecast", "call_3", True, False)]
    assert rows[1].raw.startswith("<tool_call>")
    assert json.loads(rows[2].raw)["arguments"] == '{"city": "Paris", "days": 3'


# --- LangChain ------------------------------------------------------------------------------------------------------

LANGCHAIN_AGENT = """
    import os
    from langchain.agents import create_agent
    from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
    from langchain_core.messages import AIMessage
    from langchain_core.tools import tool
    from langchain_core.utils.function_calling import convert_to_openai_tool

    class ScriptedChatModel(GenericFakeChatModel):
        def bind_tools(self, tools, **kwargs):
            return self.bind(tools=[convert_to_openai_tool(t) for t in tools], **kwargs)

    @tool
    def get_weather(city: str) -> str:
        \"\"\"Current weather for a city.\"\"\"
        return f"18 degrees and sunny in {city}"

    model = ScriptedChatModel(messages=iter([
        AIMessage(content="", tool_calls=[{"name": "get_weather", "args": {"city": "Paris"}, "id": "call_1"}]),
        AIMessage(content="", tool_calls=[{"name": "get_wether", "args": {"city": "Paris"}, "id": "call_2"}]),
        AIMessage(content="", tool_calls=[{"name": "get_weather", "args": {"town": "Paris"}, "id": "call_3"}]),
        AIMessage(content="It is 18 degrees and sunny in Paris."),
    ]))
    callbacks = []
    if os.environ.get("TRACEMILL_HANDLER"):
        import tracemill.sdk as tm
        from tracemill.sdk.langchain import TracemillCallbackHandler
        tm.init(os.environ["COLLECTOR"], service_name="langchain-agent")
        callbacks = [TracemillCallbackHandler(agent_name="weather")]
    agent = create_agent(model, [get_weather], system_prompt="You answer weather questions.")
    out = agent.invoke({"messages": [{"role": "user", "content": "Weather in Paris?"}]},
                       config={"callbacks": callbacks})
    print(out["messages"][-1].content)
"""


def _assert_langchain_rows(rows: list[ToolCallRow]) -> None:
    assert [(r.name, r.tool_call_id) for r in rows] == \
        [("get_weather", "call_1"), ("get_wether", "call_2"), ("get_weather", "call_3")]
    ok, unknown, wrong = rows
    assert ok.name_valid and ok.schema_valid and ok.arguments == {"city": "Paris"}
    assert ok.execution_status == "success" and "sunny in Paris" in (ok.execution_result or "")
    assert unknown.name_valid is False
    assert wrong.name_valid and wrong.schema_valid is False


def test_langchain_agent_with_callback_handler(start_collector, sqlite_url: str, tmp_path: Path) -> None:
    collector = start_collector(sqlite_url)
    out = run_agent(LANGCHAIN_AGENT, tmp_path, COLLECTOR=collector.url, TRACEMILL_HANDLER="1")
    assert "sunny in Paris" in out
    rows = stored(sqlite_url, lambda rs: len(rs) == 3 and rs[0].execution_status is not None)
    _assert_langchain_rows(rows)


def test_langchain_agent_through_langsmith_otel_export(start_collector, sqlite_url: str, tmp_path: Path) -> None:
    """A LangSmith user changes only environment variables: LangSmith's own OTel export reaches the collector."""
    collector = start_collector(sqlite_url)
    run_agent(LANGCHAIN_AGENT, tmp_path, LANGSMITH_TRACING="true", LANGSMITH_TRACING_MODE="otel",
              OTEL_EXPORTER_OTLP_ENDPOINT=collector.url)
    rows = stored(sqlite_url, lambda rs: len(rs) >= 3 and rs[0].execution_status is not None)
    _assert_langchain_rows(rows)


def _mined_prompts(db_url: str, folder: Path) -> list[list[dict[str, str]]]:
    from tracemill.miner.export import MineOptions, mine

    engine = make_engine(db_url)
    try:
        result = mine(engine, folder, MineOptions(eval_share=0.0, valid_share=1.0))
    finally:
        engine.dispose()
    rows = [json.loads(line) for line in (result.path / "train.jsonl").read_text().splitlines()]
    return [r["prompt"] for r in sorted(rows, key=lambda r: r["call_id"])]


def test_a_langchain_agent_s_training_prompts_are_the_same_through_langsmith_and_the_handler(
        start_collector, tmp_path: Path) -> None:
    """LangSmith sends a chat model's conversation as LangChain's serialized messages, batched; Tracemill's handler as
    GenAI's messages. The miner reads both into the same reviser prompts: the user's request and the turns it
    answered, as a served model would be sent them."""
    prompts = []
    for name, env in (("handler", {"TRACEMILL_HANDLER": "1"}),
                      ("langsmith", {"LANGSMITH_TRACING": "true", "LANGSMITH_TRACING_MODE": "otel"})):
        db_url = f"sqlite:///{tmp_path / name}.db"
        collector = start_collector(db_url)
        (tmp_path / name).mkdir()
        run_agent(LANGCHAIN_AGENT, tmp_path / name, COLLECTOR=collector.url, OTEL_EXPORTER_OTLP_ENDPOINT=collector.url,
                  **env)
        stored(db_url, lambda rs: len(rs) >= 3 and rs[0].execution_status is not None)
        prompts.append(_mined_prompts(db_url, tmp_path / name / "export"))
    handler, langsmith = prompts
    assert len(langsmith) == 3 and langsmith == handler
    last = langsmith[-1][-1]["content"]
    assert "user: Weather in Paris?" in last and "You answer weather questions" not in last
    assert "tool: Error: get_wether is not a valid tool" in last


# --- MCP ------------------------------------------------------------------------------------------------------------

MCP_SERVER = """
    from mcp.server.mcpserver import MCPServer
    from mcp.server.mcpserver.exceptions import ToolError

    server = MCPServer("weather")

    @server.tool()
    def get_weather(city: str) -> str:
        \"\"\"Current weather for a city.\"\"\"
        if city == "Atlantis":
            raise ToolError("no weather station in Atlantis")
        return f"sunny in {city}"

    server.run("stdio")
"""

MCP_AGENT = """
    import asyncio, json, os, sys
    from mcp import ClientSession, StdioServerParameters
    from mcp.client.stdio import stdio_client
    import tracemill.sdk as tm
    from tracemill.sdk.mcp import instrument

    tm.init(os.environ["COLLECTOR"], service_name="mcp-agent")

    async def main():
        server = StdioServerParameters(command=sys.executable, args=["server.py"])
        async with stdio_client(server, errlog=open(os.devnull, "w")) as (read, write):
            async with ClientSession(read, write) as session:
                await session.initialize()
                session = instrument(session)
                tools = [t.model_dump(by_alias=True, exclude_none=True) for t in (await session.list_tools()).tools]
                with tm.agent("weather"):
                    for call_id, city in (("call_1", "Paris"), ("call_2", "Atlantis")):
                        call = {"id": call_id, "name": "get_weather", "arguments": json.dumps({"city": city})}
                        with tm.chat("qwen3", tools=tools, messages=[{"role": "user", "content": city}]) as chat:
                            chat.output(tool_calls=[call])
                        result = await session.call_tool("get_weather", {"city": city}, tool_call_id=call_id)
                        print(city, result.is_error)

    asyncio.run(main())
"""


def test_mcp_client_session(start_collector, sqlite_url: str, tmp_path: Path) -> None:
    collector = start_collector(sqlite_url)
    (tmp_path / "server.py").write_text(textwrap.dedent(MCP_SERVER))
    out = run_agent(MCP_AGENT, tmp_path, COLLECTOR=collector.url)
    assert out.split() == ["Paris", "False", "Atlantis", "True"]

    rows = stored(sqlite_url, lambda rs: len(rs) == 2 and all(r.execution_status for r in rs))
    paris, atlantis = rows
    assert (paris.tool_call_id, paris.schema_valid, paris.execution_status) == ("call_1", True, "success")
    assert paris.execution_result == "sunny in Paris"
    assert (atlantis.tool_call_id, atlantis.execution_status) == ("call_2", "error")
    assert "no weather station in Atlantis" in (atlantis.execution_error or "")

    engine = make_engine(sqlite_url)
    with engine.connect() as conn:
        spans = [(name, resolve(conn, a)) for name, a in conn.execute(select(SpanRow.name, SpanRow.attributes))]
        executions = list(conn.execute(select(ToolExecutionRow.tool_call_id, ToolExecutionRow.ok)))
    engine.dispose()
    listed = [a for name, a in spans if name == "tools/list"]
    assert len(listed) == 1 and '"get_weather"' in listed[0]["gen_ai.tool.definitions"]
    assert sorted(e for e in executions if e[0]) == [("call_1", True), ("call_2", False)]
