"""The instrumentation libraries people already use, each pointed with its own exporter at one real collector, driving
one scripted OpenAI-compatible model: every scripted call is stored once, with its name, the tools offered where the
library records them, the model, and its execution where the library records one; `tracemill stats` agrees.

The script (`TURNS`): a valid call, a tool that fails when it runs, a wrong tool name, a wrong type, broken JSON, a
parallel pair and a call written as text. Each library's agent runs in its own process (spans are flushed at exit)
and asks for its own model name, so its rows are told apart by `model`.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from scripted_model import Reply, ScriptedModel
from sqlalchemy import select

from tracemill.miner.export import MineOptions, mine
from tracemill.net import ServerThread
from tracemill.store.engine import make_engine
from tracemill.store.queries import CallFilter
from tracemill.store.tables import ToolCallRow, ToolsetRow

from support import CollectorProcess

pytestmark = pytest.mark.timeout(90)

TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "Current weather for a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}},
    {"type": "function", "function": {
        "name": "get_forecast", "description": "Forecast for the next days.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                       "required": ["city", "days"]}}},
]


def _call(call_id: str, name: str, arguments: str) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


TEXT_CALL = '<tool_call>\n{"name": "get_forecast", "arguments": {"city": "Lyon", "days": 2}}\n</tool_call>'
TURNS: dict[str, Reply] = {
    "Weather in Paris?": Reply(tool_calls=[_call("call_valid", "get_weather", '{"city": "Paris"}')]),
    "Weather in Atlantis?": Reply(tool_calls=[_call("call_fails", "get_weather", '{"city": "Atlantis"}')]),
    "Weather in Rome?": Reply(tool_calls=[_call("call_name", "get_wether", '{"city": "Rome"}')]),
    "Forecast for Oslo?": Reply(tool_calls=[_call("call_type", "get_forecast", '{"city": "Oslo", "days": "three"}')]),
    "Forecast for Bern?": Reply(tool_calls=[_call("call_json", "get_forecast", '{"city": "Bern", "days": 3')]),
    "Weather in Nice and Lyon?": Reply(tool_calls=[_call("call_pair_1", "get_weather", '{"city": "Nice"}'),
                                                   _call("call_pair_2", "get_weather", '{"city": "Lyon"}')]),
    "Forecast for Lyon?": Reply(TEXT_CALL),
}


def replies_for(model: str) -> dict[str, Reply]:
    """The script with call ids of this run's own (ids repeated across runs would be one call)."""
    return {turn: Reply(reply.content, [{**c, "id": f"{model}-{c['id']}"} for c in reply.tool_calls or ()] or None)
            for turn, reply in TURNS.items()}


@dataclass
class Agents:
    collector: CollectorProcess
    model: ScriptedModel
    model_url: str
    db_url: str
    workdir: Path

    def run(self, script: str, model: str, python: str = sys.executable, **env: str) -> str:
        """Run an agent as its own process against the scripted model, asking for `model`; it must exit 0."""
        self.model.model = model
        self.model.replies = replies_for(model)
        done = subprocess.run([python, "-c", PRELUDE + textwrap.dedent(script)], check=False, cwd=self.workdir,
                              capture_output=True, text=True, timeout=60,
                              env={**os.environ, "COLLECTOR": self.collector.url, "MODEL_URL": self.model_url,
                                   "MODEL": model, "TOOLS": json.dumps(TOOLS), "TURNS": json.dumps(list(TURNS)),
                                   "OTEL_EXPORTER_OTLP_ENDPOINT": self.collector.url, "TRACELOOP_TELEMETRY": "false",
                                   **env})
        assert done.returncode == 0, done.stderr[-4000:]
        return done.stdout

    def rows(self, model: str, until: Callable[[list[ToolCallRow]], bool], timeout: float = 15.0) -> list[ToolCallRow]:
        engine = make_engine(self.db_url)
        deadline = time.monotonic() + timeout
        try:
            while True:
                with engine.connect() as conn:
                    rows = list(conn.execute(select(ToolCallRow).where(ToolCallRow.model.like(f"{model}%"))
                                             .order_by(ToolCallRow.start_time_ns, ToolCallRow.call_index)))
                if until(rows) or time.monotonic() > deadline:
                    return rows
                time.sleep(0.2)
        finally:
            engine.dispose()

    def stats(self, model: str) -> dict[str, Any]:
        done = subprocess.run([sys.executable, "-m", "tracemill.cli", "stats", "--db", self.db_url, "--json",
                               "--model", model], check=False, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)


# What every agent shares: the tools (one fails for Atlantis) and the scripted turns.
PRELUDE = """
import json, os
TOOLS = json.loads(os.environ["TOOLS"])
TURNS = json.loads(os.environ["TURNS"])
MODEL, MODEL_URL, COLLECTOR = os.environ["MODEL"], os.environ["MODEL_URL"], os.environ["COLLECTOR"]

def weather(city):
    if city == "Atlantis":
        raise RuntimeError("no weather station in Atlantis")
    return f"sunny in {city}"

def forecast(city, days):
    return f"{int(days)} days of sun in {city}"

def run_tool(name, arguments):
    return {"get_weather": weather, "get_forecast": forecast}[name](**json.loads(arguments))

def otlp_provider():
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor
    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(COLLECTOR + "/v1/traces")))
    return provider
"""


@pytest.fixture(scope="module")
def agents(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Agents]:
    workdir = tmp_path_factory.mktemp("instrumentations")
    db_url = f"sqlite:///{workdir / 'tracemill.db'}"
    model = ScriptedModel(replies=dict(TURNS), after_tool=Reply("Done."))
    server = ServerThread(model.app()).start()
    collector = CollectorProcess(db_url, workdir).start()
    try:
        yield Agents(collector, model, server.url + "/v1", db_url, workdir)
    finally:
        collector.stop()
        server.stop()


def toolset_names(db_url: str, toolset_id: int | None) -> list[str] | None:
    if toolset_id is None:
        return None
    engine = make_engine(db_url)
    with engine.connect() as conn:
        tools = conn.execute(select(ToolsetRow.tools).where(ToolsetRow.id == toolset_id)).scalar_one()
    engine.dispose()
    return sorted(t["name"] for t in tools)


# --- OpenAI client instrumentations -------------------------------------------------------------------------------

OPENLLMETRY_OPENAI = """
from openai import OpenAI
from opentelemetry.instrumentation.openai import OpenAIInstrumentor
provider = otlp_provider()
OpenAIInstrumentor().instrument(tracer_provider=provider)
client = OpenAI(base_url=MODEL_URL, api_key="not-needed")
for turn in TURNS:
    client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": turn}], tools=TOOLS)
provider.shutdown()
"""

OPENINFERENCE_OPENAI = OPENLLMETRY_OPENAI.replace("opentelemetry.instrumentation.openai",
                                                  "openinference.instrumentation.openai")

TRACELOOP_SDK = """
from openai import OpenAI
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from traceloop.sdk import Traceloop
from traceloop.sdk.decorators import tool, workflow
Traceloop.init(app_name="weather-agent", exporter=OTLPSpanExporter(COLLECTOR + "/v1/traces"), disable_batch=True,
               telemetry_enabled=False)
client = OpenAI(base_url=MODEL_URL, api_key="not-needed")

@tool(name="get_weather")
def get_weather(city):
    return weather(city)

@tool(name="get_forecast")
def get_forecast(city, days):
    return forecast(city, days)

@workflow(name="weather")
def answer(turn):
    message = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": turn}],
                                             tools=TOOLS).choices[0].message
    for call in message.tool_calls or ():
        try:
            {"get_weather": get_weather, "get_forecast": get_forecast}[call.function.name](
                **json.loads(call.function.arguments))
        except Exception:
            pass

for turn in TURNS:
    answer(turn)
"""


# --- LangChain ------------------------------------------------------------------------------------------------------

LANGCHAIN_AGENT = """
from langchain.agents import create_agent
from langchain_core.tools import ToolException, tool
from langchain_openai import ChatOpenAI

@tool
def get_weather(city: str) -> str:
    \"\"\"Current weather for a city.\"\"\"
    try:
        return weather(city)
    except RuntimeError as exc:
        raise ToolException(str(exc))

get_weather.handle_tool_error = True  # the agent sees the error as the tool's answer

@tool
def get_forecast(city: str, days: int) -> str:
    \"\"\"Forecast for the next days.\"\"\"
    return forecast(city, days)

def run_agent():
    model = ChatOpenAI(model=MODEL, base_url=MODEL_URL, api_key="not-needed")
    agent = create_agent(model, [get_weather, get_forecast], system_prompt="You answer weather questions.")
    for turn in TURNS:
        agent.invoke({"messages": [{"role": "user", "content": turn}]})
"""

OPENINFERENCE_LANGCHAIN = LANGCHAIN_AGENT + """
from openinference.instrumentation.langchain import LangChainInstrumentor
provider = otlp_provider()
LangChainInstrumentor().instrument(tracer_provider=provider)
if os.environ.get("WITH_OPENAI"):
    from openinference.instrumentation.openai import OpenAIInstrumentor
    OpenAIInstrumentor().instrument(tracer_provider=provider)
run_agent()
provider.shutdown()
"""

LANGSMITH_OTEL = LANGCHAIN_AGENT + """
run_agent()
"""

# --- Langfuse, pydantic-ai ------------------------------------------------------------------------------------------

LANGFUSE = """
from langfuse import Langfuse, observe
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
langfuse = Langfuse(public_key="pk-lf-local", secret_key="sk-lf-local", base_url=COLLECTOR,
                    span_exporter=OTLPSpanExporter(COLLECTOR + "/v1/traces"))
from langfuse.openai import OpenAI
client = OpenAI(base_url=MODEL_URL, api_key="not-needed")

@observe(as_type="tool", name="get_weather")
def get_weather(city):
    return weather(city)

@observe(as_type="tool", name="get_forecast")
def get_forecast(city, days):
    return forecast(city, days)

@observe(name="weather-agent")
def answer(turn):
    message = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": turn}],
                                             tools=TOOLS).choices[0].message
    for call in message.tool_calls or ():
        try:
            {"get_weather": get_weather, "get_forecast": get_forecast}[call.function.name](
                **json.loads(call.function.arguments))
        except Exception:
            pass

for turn in TURNS:
    answer(turn)
langfuse.shutdown()
"""

PYDANTIC_AI = """
import logfire
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from pydantic_ai import Agent
from pydantic_ai.models.openai import OpenAIChatModel
from pydantic_ai.providers.openai import OpenAIProvider

logfire.configure(send_to_logfire=False, console=False,
                  additional_span_processors=[BatchSpanProcessor(OTLPSpanExporter(COLLECTOR + "/v1/traces"))])
logfire.instrument_pydantic_ai()
agent = Agent(OpenAIChatModel(MODEL, provider=OpenAIProvider(base_url=MODEL_URL, api_key="not-needed")))

@agent.tool_plain
def get_weather(city: str) -> str:
    \"\"\"Current weather for a city.\"\"\"
    return weather(city)

@agent.tool_plain
def get_forecast(city: str, days: int) -> str:
    \"\"\"Forecast for the next days.\"\"\"
    return forecast(city, days)

for turn in TURNS:
    try:
        agent.run_sync(turn)
    except Exception as exc:
        print("agent:", type(exc).__name__)
logfire.shutdown()
"""


# --- OpenLLMetry's MCP instrumentation, in an environment of its own -----------------------------------------------

# opentelemetry-instrumentation-mcp 0.62.4, its newest release, patches `mcp.shared.session`, which mcp 2 removed; the
# lock pins mcp 2.3. So its agent runs in a virtual environment of its own: mcp 1.x, everything else as the lock pins
# it. Built once from the package index, kept in the user's cache under a key of the pins (about 25 s on 2 cores).
MCP1_REQUIREMENTS = ("mcp==1.30.0", "opentelemetry-instrumentation-mcp", "opentelemetry-instrumentation-openai",
                     "opentelemetry-instrumentation-openai-v2", "openai", "opentelemetry-sdk",
                     "opentelemetry-exporter-otlp-proto-http")
LOCK = Path(__file__).resolve().parents[2] / "requirements.lock"


def own_environment(requirements: tuple[str, ...]) -> Path:
    """The python of a virtual environment holding `requirements`, the lock's pins for all else; built if missing."""
    overridden = {r.split("==")[0].lower() for r in requirements if "==" in r}
    constraints = "".join(line + "\n" for line in LOCK.read_text().splitlines()
                          if line.split("==")[0].lower() not in overridden)
    key = hashlib.sha256("\n".join((sys.version, *requirements, constraints)).encode()).hexdigest()[:16]
    home = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "tracemill-tests" / f"venv-{key}"
    if not (home / "bin" / "python").exists():
        building = home.with_name(f"{home.name}.{os.getpid()}")
        subprocess.run([sys.executable, "-m", "venv", str(building)], check=True)
        (building / "constraints.txt").write_text(constraints)
        subprocess.run([str(building / "bin" / "python"), "-m", "pip", "install", "--quiet",
                        "--disable-pip-version-check", "-c", str(building / "constraints.txt"), *requirements],
                       check=True, timeout=600)
        try:
            building.rename(home)  # whole or not at all, should a run be cut short
        except OSError:  # another test session built it meanwhile
            shutil.rmtree(building)
    return home / "bin" / "python"


MCP_SERVER = """
from mcp.server.fastmcp import FastMCP
server = FastMCP("weather")

@server.tool()
def get_weather(city: str) -> str:
    \"\"\"Current weather for a city.\"\"\"
    if city == "Atlantis":
        raise RuntimeError("no weather station in Atlantis")
    return f"sunny in {city}"

@server.tool()
def get_forecast(city: str, days: int) -> str:
    \"\"\"Forecast for the next days.\"\"\"
    return f"{days} days of sun in {city}"

server.run("stdio")
"""

# The agent offers the model the MCP server's tools (`tools/list`) and runs the calls it can on the server.
OPENLLMETRY_MCP = """
import asyncio, sys
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client
from openai import OpenAI
from opentelemetry.instrumentation.mcp import McpInstrumentor
if os.environ["MODEL_CLIENT"] == "openai-v2":
    from opentelemetry.instrumentation.openai_v2 import OpenAIInstrumentor
else:
    from opentelemetry.instrumentation.openai import OpenAIInstrumentor
provider = otlp_provider()
McpInstrumentor().instrument(tracer_provider=provider)
OpenAIInstrumentor().instrument(tracer_provider=provider)
tracer = provider.get_tracer("weather-agent")
client = OpenAI(base_url=MODEL_URL, api_key="not-needed")

async def main():
    server = StdioServerParameters(command=sys.executable, args=["mcp_server.py"])
    async with stdio_client(server, errlog=open(os.devnull, "w")) as (read, write):
        async with ClientSession(read, write) as session:
            await session.initialize()
            for turn in TURNS:
                with tracer.start_as_current_span("weather-agent"):
                    listed = (await session.list_tools()).tools
                    tools = [{"type": "function", "function": {"name": t.name, "description": t.description,
                                                               "parameters": t.inputSchema}} for t in listed]
                    message = client.chat.completions.create(model=MODEL, tools=tools,
                                                             messages=[{"role": "user", "content": turn}]
                                                             ).choices[0].message
                    for call in message.tool_calls or ():
                        try:
                            arguments = json.loads(call.function.arguments)
                        except ValueError:
                            continue
                        if call.function.name in {t.name for t in listed}:
                            await session.call_tool(call.function.name, arguments)

asyncio.run(main())
provider.shutdown()
"""


# What each scripted call must be stored as: (name, parsed, name_valid, schema_valid); the text call has no id.
EXPECTED = {
    "call_valid": ("get_weather", True, True, True), "call_fails": ("get_weather", True, True, True),
    "call_name": ("get_wether", True, False, None), "call_type": ("get_forecast", True, True, False),
    "call_json": ("get_forecast", False, True, False), "call_pair_1": ("get_weather", True, True, True),
    "call_pair_2": ("get_weather", True, True, True), None: ("get_forecast", False, False, None),
}
# The calls an agent ran (the wrong name and, but for pydantic-ai, the broken JSON never reach a tool).
RAN = {"call_valid": "success", "call_fails": "error", "call_type": "error", "call_pair_1": "success",
       "call_pair_2": "success"}
LIBRARIES = {  # library -> (agent, environment, the executions its spans record)
    "openllmetry": (OPENLLMETRY_OPENAI, {}, {}),
    "openinference-openai": (OPENINFERENCE_OPENAI, {}, {}),
    "traceloop-sdk": (TRACELOOP_SDK, {}, RAN),
    "openinference-langchain": (OPENINFERENCE_LANGCHAIN, {}, RAN),
    "langsmith-otel": (LANGSMITH_OTEL, {"LANGSMITH_TRACING": "true", "LANGSMITH_TRACING_MODE": "otel"}, RAN),
    "langfuse": (LANGFUSE, {}, RAN),
    "pydantic-ai": (PYDANTIC_AI, {}, {**RAN, "call_json": "error"}),
}


def _rate(hits: int, total: int) -> float | None:
    return hits / total if total else None


@pytest.mark.parametrize("library", LIBRARIES)
def test_every_scripted_call_is_stored_once(agents: Agents, library: str) -> None:
    script, env, executed = LIBRARIES[library]
    agents.run(script, library, **env)
    assert_stored_once(agents, library, executed)


@pytest.fixture(scope="module")
def mcp1_python() -> Path:
    return own_environment(MCP1_REQUIREMENTS)


@pytest.mark.timeout(900)  # the first run builds the environment
@pytest.mark.parametrize("model_client", ["openllmetry", "openai-v2"])
def test_openllmetry_mcp(agents: Agents, mcp1_python: Path, model_client: str) -> None:
    """OpenLLMetry's MCP instrumentation with a real MCP client and server: every execution is linked to its call (by
    tool name and arguments: its tool spans carry no call id). With openai-v2, whose spans do not list the tools, the
    `tools/list` result is the tools offered, so the name and schema verdicts are known."""
    library = f"mcp-openllmetry+{model_client}"
    (agents.workdir / "mcp_server.py").write_text(MCP_SERVER)
    agents.run(OPENLLMETRY_MCP, library, str(mcp1_python), MODEL_CLIENT=model_client,
               OTEL_SEMCONV_STABILITY_OPT_IN="gen_ai_latest_experimental",
               OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT="SPAN_ONLY")
    assert_stored_once(agents, library, RAN)


def assert_stored_once(agents: Agents, library: str, executed: dict[str, str]) -> None:
    rows = agents.rows(library, lambda rs: len(rs) >= len(EXPECTED)
                       and sum(r.execution_status is not None for r in rs) >= len(executed))
    stored = {(r.tool_call_id.removeprefix(f"{library}-") if r.tool_call_id else None):
              (r.name, r.parsed, r.name_valid, r.schema_valid) for r in rows}
    assert len(rows) == len(EXPECTED) and stored == EXPECTED
    assert {r.model for r in rows} == {library}
    assert all(toolset_names(agents.db_url, r.toolset_id) == ["get_forecast", "get_weather"] for r in rows)
    ran = {r.tool_call_id.removeprefix(f"{library}-"): r.execution_status for r in rows if r.execution_status}
    assert ran == executed
    text = next(r for r in rows if r.tool_call_id is None)
    assert text.raw == TEXT_CALL and text.arguments == {"city": "Lyon", "days": 2}
    assert_mined_with_their_turns(agents, library, rows)

    figures = agents.stats(library)
    verdicts = list(EXPECTED.values())
    assert figures["total_calls"] == len(EXPECTED)
    assert figures["valid_tool_name_rate"] == _rate(sum(v[2] is True for v in verdicts),
                                                    sum(v[2] is not None for v in verdicts))
    assert figures["input_schema_compliance"] == _rate(sum(v[2] is True and v[3] is True for v in verdicts),
                                                       sum(v[2] is True for v in verdicts))


def assert_mined_with_their_turns(agents: Agents, library: str, rows: list[ToolCallRow]) -> None:
    """`tracemill mine` reads each call's conversation from what this instrumentation recorded: every row's prompt
    holds the user's turn that the call answered."""
    turns = {call["id"]: turn for turn, reply in replies_for(library).items() for call in reply.tool_calls or ()}
    turn_of = {r.id: turns.get(r.tool_call_id or "", "Forecast for Lyon?") for r in rows}  # the text call: no id
    engine = make_engine(agents.db_url)
    try:
        export = mine(engine, agents.workdir / f"export-{library}",
                      MineOptions(where=CallFilter(model=library), eval_share=0.0, valid_share=1.0))
    finally:
        engine.dispose()
    mined = [json.loads(line) for line in (export.path / "train.jsonl").read_text().splitlines()]
    assert len(mined) == len(rows)
    missing = [(r["call_id"], turn_of[r["call_id"]]) for r in mined
               if f"user: {turn_of[r['call_id']]}" not in r["prompt"][-1]["content"]]
    assert not missing, f"rows whose prompt lacks the turn their call answered: {missing}"


def test_two_instrumentations_of_one_call_store_it_once(agents: Agents) -> None:
    """OpenInference's LangChain and OpenAI instrumentations together: the OpenAI spans start traces of their own, and
    each call is still one row, with the execution LangChain's trace records; the call written as text, which has no
    id, is one row too (both spans record the response's id)."""
    library = "openinference-langchain+openai"
    agents.run(OPENINFERENCE_LANGCHAIN, library, WITH_OPENAI="1")
    rows = agents.rows(library, lambda rs: len(rs) >= len(EXPECTED) and
                       sum(r.execution_status is not None for r in rs) >= len(RAN))
    native = {r.tool_call_id.removeprefix(f"{library}-"): r for r in rows if r.tool_call_id}
    assert {k: (r.name, r.parsed, r.name_valid, r.schema_valid) for k, r in native.items()} == \
        {k: v for k, v in EXPECTED.items() if k}
    assert {k: r.execution_status for k, r in native.items() if r.execution_status} == RAN
    [text] = [r for r in rows if r.tool_call_id is None]
    assert (text.raw, text.name, text.arguments, text.model) == (TEXT_CALL, "get_forecast", {"city": "Lyon", "days": 2},
                                                                 library)
    assert toolset_names(agents.db_url, text.toolset_id) == ["get_forecast", "get_weather"]


def test_one_text_call_in_two_responses_is_two_calls(agents: Agents) -> None:
    """The same call written as text in two responses (the same question asked twice): two rows, though both
    instrumentations saw each, since each response has its id."""
    library = "openinference-langchain+openai-twice"
    agents.run(OPENINFERENCE_LANGCHAIN, library, WITH_OPENAI="1",
               TURNS=json.dumps(["Forecast for Lyon?", "Forecast for Lyon?"]))
    rows = agents.rows(library, lambda rs: True)  # the exporters have flushed: what is acknowledged is stored
    assert [(r.tool_call_id, r.raw) for r in rows] == [(None, TEXT_CALL)] * 2
    assert len({r.trace_id for r in rows}) == 2
