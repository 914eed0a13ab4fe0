"""Tracemill's SDK: send an agent's model calls and tool executions to the collector, in OpenTelemetry GenAI terms.

    import tracemill.sdk as tm
    tm.init("http://127.0.0.1:4318", service_name="my-agent")
    with tm.chat("llama3.1-8b", messages=messages, tools=tools) as call:
        call.output(text)                      # the raw text, tool calls in it included
    with tm.tool("get_weather", {"city": "Paris"}, call_id="c1") as run:
        run.result(get_weather(city="Paris"))

Integrations: `tracemill.sdk.openai`, `tracemill.sdk.langchain`, `tracemill.sdk.mcp`.
"""

from tracemill.sdk.core import ChatCall, Delivery, ToolExecution, agent, chat, delivery, flush, init, shutdown, tool
from tracemill.sdk.redact import Redactor

__all__ = ["ChatCall", "Delivery", "Redactor", "ToolExecution", "agent", "chat", "delivery", "flush", "init",
           "shutdown", "tool"]
