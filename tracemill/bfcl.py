"""The Berkeley Function Calling Leaderboard (v4) as Tracemill reads it: its rows as cases (functions offered, the
user's question, the accepted answers), and its AST agreement check of calls against those answers.

The package ships a subset (`tracemill/data/bfcl/`, Apache-2.0, see its NOTICE); the eval suites and the simulator
both read it here."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from typing import Any

import orjson

from tracemill.tools import Tool, is_json_type, normalize_tool, schema_types, tool_index
from tracemill.verify import ToolCall, verify

BFCL_CATEGORIES = ("simple_python", "multiple", "parallel", "live_simple")

Answer = dict[str, dict[str, list[Any]]]


# --- BFCL -----------------------------------------------------------------------------------------------------------

def _first_accepted(value: Any) -> Any:
    """A concrete value from BFCL's nested accepted-values form (dicts map keys to lists of accepted values)."""
    if isinstance(value, dict):
        return {k: _first_accepted(vs[0]) for k, vs in value.items() if isinstance(vs, list) and vs and vs[0] != ""}
    if isinstance(value, list):
        return [_first_accepted(v) for v in value]
    return value


@dataclass(frozen=True, slots=True)
class BfclCase:
    """One BFCL row: the functions offered, the user's question, and the accepted answers, one
    `{function: {param: [accepted values]}}` per expected call (`""` among the values: the parameter may be omitted)."""

    id: str
    tools: tuple[Tool, ...]
    question: str
    answers: tuple[Answer, ...]

    def reference(self) -> list[ToolCall]:
        """The expected calls, each parameter at its first accepted value (left out where that is `""`)."""
        calls = []
        for answer in self.answers:
            (name, params), = answer.items()
            calls.append(ToolCall(name, {p: _first_accepted(values[0]) for p, values in params.items()
                                         if values and values[0] != ""}))
        return calls


def bfcl_tool(function: dict[str, Any]) -> Tool:
    """A BFCL function as a Tool. BFCL's AST checker rejects parameters a function does not declare, so the tool's
    schema says so (`additionalProperties: false`)."""
    tool = normalize_tool(function, where=f"BFCL function {function.get('name')!r}")
    return Tool(tool.name, tool.description, {**tool.input_schema, "additionalProperties": False})


def package_jsonl(path: str) -> list[dict[str, Any]]:
    """A JSON Lines file shipped in the package (`path` under `tracemill/`)."""
    text = resources.files("tracemill").joinpath(path).read_bytes()
    return [orjson.loads(line) for line in text.splitlines() if line.strip()]


def question(row: Mapping[str, Any]) -> str:
    """A BFCL row's user turns, one per line."""
    return "\n".join(m["content"] for turn in row["question"] for m in turn if m.get("role") == "user")


def cases_from_rows(rows: Sequence[Mapping[str, Any]], answers: Mapping[str, Any]) -> list[BfclCase]:
    """BFCL rows with their possible answers (`{id: ground_truth}`); rows without answers are left out."""
    return [BfclCase(row["id"], tuple(bfcl_tool(f) for f in row["function"]), question(row), tuple(answers[row["id"]]))
            for row in rows if row["id"] in answers]


def load_bfcl(categories: Sequence[str] = BFCL_CATEGORIES) -> list[BfclCase]:
    """The BFCL subset shipped in the package, keeping the cases whose reference calls pass `verify`."""
    cases = []
    for category in categories:
        answers = {row["id"]: row["ground_truth"]
                   for row in package_jsonl(f"data/bfcl/possible_answer_BFCL_v4_{category}.json")}
        for case in cases_from_rows(package_jsonl(f"data/bfcl/BFCL_v4_{category}.json"), answers):
            index = tool_index(case.tools)
            if all(verify(call, index).ok for call in case.reference()):
                cases.append(case)
    return cases


# --- BFCL's AST agreement ------------------------------------------------------------------------------------------

def _standardize(text: str) -> str:
    """BFCL's string normalisation: no spaces or `,./-_*^`, lower case, one kind of quote."""
    return re.sub(r"[ ,./\-_*^]", "", text).lower().replace("'", '"')


def _type_ok(value: Any, schema: Any) -> bool:
    types = schema_types(schema)
    return not types or any(is_json_type(value, t) for t in types)


def _value_matches(value: Any, accepted: Any) -> bool:
    """One value against one accepted value (BFCL nested form for dicts: each key maps to a list of accepted)."""
    if isinstance(accepted, dict):
        if not isinstance(value, dict) or any(k not in accepted for k in value):
            return False
        return all(_any_matches(value[k], vs) if k in value else "" in vs for k, vs in accepted.items())
    if isinstance(accepted, list):
        return isinstance(value, list) and len(value) == len(accepted) and all(
            _value_matches(v, a) for v, a in zip(value, accepted, strict=True))
    if isinstance(accepted, str):
        return isinstance(value, str) and _standardize(value) == _standardize(accepted)
    if isinstance(accepted, bool) or isinstance(value, bool):
        return value is accepted
    if isinstance(accepted, (int, float)):
        return isinstance(value, (int, float)) and float(value) == float(accepted)
    return value == accepted


def _any_matches(value: Any, accepted: list[Any]) -> bool:
    return any(_value_matches(value, a) for a in accepted if a != "" or value == "")


def value_matches(value: Any, accepted: list[Any]) -> bool:
    """One argument value against BFCL's accepted values for its parameter, after BFCL's normalisation."""
    return _any_matches(value, accepted)


def _call_matches(call: ToolCall, answer: Answer, index: Mapping[str, Tool]) -> bool:
    (name, params), = answer.items()
    if call.name != name or name not in index:
        return False
    schema = index[name].input_schema
    props = schema.get("properties", {}) if isinstance(schema, Mapping) else {}
    required = schema.get("required", []) if isinstance(schema, Mapping) else []
    if any(r not in call.arguments for r in required):
        return False
    for param, value in call.arguments.items():
        if param not in params or not _type_ok(value, props.get(param)) or not _any_matches(value, params[param]):
            return False
    return all("" in accepted for param, accepted in params.items() if param not in call.arguments)


def ast_match(calls: Sequence[ToolCall], answers: Sequence[Answer], tools: Sequence[Tool] | Mapping[str, Tool]) -> bool:
    """BFCL's AST agreement: as many calls as answers, each answer met by a different call (in any order); a call
    meets an answer when the name is right, the required parameters are there, no parameter is unexpected, and every
    value has the right type and is one of the accepted values after BFCL's normalisation."""
    index = tools if isinstance(tools, Mapping) else tool_index(tools)
    if len(calls) != len(answers):
        return False
    fits = [[_call_matches(c, a, index) for c in calls] for a in answers]

    def assign(i: int, used: frozenset[int]) -> bool:
        return i == len(answers) or any(fits[i][j] and j not in used and assign(i + 1, used | {j})
                                        for j in range(len(calls)))

    return assign(0, frozenset())


def _as_accepted(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: [_as_accepted(v)] for k, v in value.items()}
    if isinstance(value, list):
        return [_as_accepted(v) for v in value]
    return value


def answers_for(reference: Sequence[ToolCall]) -> list[Answer]:
    """Reference calls as the one accepted answer each (every value exactly, no other parameter)."""
    return [{c.name: {p: [_as_accepted(v)] for p, v in c.arguments.items()}} for c in reference]
