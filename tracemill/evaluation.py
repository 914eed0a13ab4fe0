"""`tracemill eval`: the yardstick every reviser is measured with."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources
from typing import Any

import orjson

from tracemill.tools import Tool, normalize_tool
from tracemill.verify import ToolCall, tool_index, verify

BFCL_CATEGORIES = ("simple_python", "multiple", "parallel", "live_simple")


@dataclass(frozen=True, slots=True)
class BfclCase:
    """One BFCL row: the functions offered, the user's question, and the accepted answers, one
    `{function: {param: [accepted values]}}` per expected call (`""` among the values: the parameter may be left out)."""

    id: str
    tools: tuple[Tool, ...]
    question: str
    answers: tuple[dict[str, dict[str, list[Any]]], ...]

    def reference(self) -> list[ToolCall]:
        """The expected calls, each parameter at its first accepted value (left out where that is `""`)."""
        calls = []
        for answer in self.answers:
            (name, params), = answer.items()
            calls.append(ToolCall(name, {p: values[0] for p, values in params.items() if values and values[0] != ""}))
        return calls


def bfcl_tool(function: dict[str, Any]) -> Tool:
    """A BFCL function as a Tool. BFCL's AST checker rejects parameters a function does not declare, so the tool's
    schema says so (`additionalProperties: false`)."""
    tool = normalize_tool(function, where=f"BFCL function {function.get('name')!r}")
    return Tool(tool.name, tool.description, {**tool.input_schema, "additionalProperties": False})


def _jsonl(name: str) -> list[dict[str, Any]]:
    text = resources.files("tracemill").joinpath(f"data/bfcl/{name}").read_bytes()
    return [orjson.loads(line) for line in text.splitlines() if line.strip()]


def load_bfcl(categories: Sequence[str] = BFCL_CATEGORIES) -> list[BfclCase]:
    """The BFCL subset shipped in the package, keeping the cases whose reference calls pass `verify`."""
    cases = []
    for category in categories:
        answers = {row["id"]: row["ground_truth"] for row in _jsonl(f"possible_answer_BFCL_v4_{category}.json")}
        for row in _jsonl(f"BFCL_v4_{category}.json"):
            turns = [m["content"] for turn in row["question"] for m in turn if m.get("role") == "user"]
            case = BfclCase(row["id"], tuple(bfcl_tool(f) for f in row["function"]), "\n".join(turns),
                            tuple(answers[row["id"]]))
            index = tool_index(case.tools)
            if all(verify(call, index).ok for call in case.reference()):
                cases.append(case)
    return cases
