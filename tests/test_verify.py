"""The verifier on real tool schemas: MCP-Bench's servers and BFCL's functions with their ground truth."""

from __future__ import annotations

import json
from importlib import resources
from typing import Any

import fastjsonschema
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tracemill.tools import Tool, ToolFormatError, load_mcp_bench, normalize_tool, normalize_tools
from tracemill.verify import Execution, Stage, ToolCall, compiled_validator, verify

SERVERS = load_mcp_bench()
TOOLS = [t for tools in SERVERS.values() for t in tools]
BY_NAME = {t.name: t for t in TOOLS}


def bfcl_rows(category: str) -> list[tuple[list[dict[str, Any]], list[dict[str, Any]]]]:
    folder = resources.files("tracemill").joinpath("data/bfcl")
    questions = {}
    for line in folder.joinpath(f"BFCL_v4_{category}.json").read_text().splitlines():
        row = json.loads(line)
        questions[row["id"]] = row["function"]
    answers = [json.loads(line) for line in folder.joinpath(f"possible_answer_BFCL_v4_{category}.json")
               .read_text().splitlines()]
    return [(questions[a["id"]], a["ground_truth"]) for a in answers]


def first_accepted(value: Any) -> Any:
    """BFCL lists accepted values per parameter, nested objects too; take the first of each."""
    if isinstance(value, dict):
        return {k: first_accepted(v) for k, v in value.items() if not (isinstance(v, list) and v and v[0] == "")}
    if isinstance(value, list) and value:
        chosen = value[0]
        if isinstance(chosen, list):
            return [first_accepted(c) if isinstance(c, dict) else c for c in chosen]
        return first_accepted(chosen) if isinstance(chosen, dict) else chosen
    return value


def test_every_mcp_bench_schema_compiles() -> None:
    assert len(TOOLS) == 257
    assert [t.name for t in TOOLS if compiled_validator(t.input_schema).warning] == []


@pytest.mark.parametrize("category", ["simple_python", "multiple", "parallel", "live_simple"])
def test_bfcl_ground_truth_calls_pass(category: str) -> None:
    checked = failed = 0
    for functions, ground_truth in bfcl_rows(category):
        tools = normalize_tools(functions)
        for answer in ground_truth:
            (name, params), = answer.items()
            omitted = {k for k, v in params.items() if v and v[0] == ""}
            tool = next(t for t in tools if t.name == name)
            if omitted & set(tool.input_schema.get("required", [])):
                continue  # BFCL lets a required parameter be left out here; the schema does not
            checked += 1
            verdict = verify({"name": name, "arguments": first_accepted(params)}, tools)
            failed += not verdict.ok
    assert checked >= 70
    # live rows are real users' definitions; one puts an item enum on the array itself, which JSON Schema rejects
    assert failed <= (1 if category.startswith("live") else 0)


def test_bfcl_python_types_become_json_schema() -> None:
    tool = normalize_tool({"name": "f", "parameters": {"type": "dict", "properties": {
        "x": {"type": "float"}, "pair": {"type": "tuple", "items": {"type": "integer"}}, "anything": {"type": "any"},
        "opts": {"type": "dict", "properties": {"n": {"type": "float"}}}}}})
    assert tool.input_schema["type"] == "object"
    assert tool.input_schema["properties"]["x"] == {"type": "number"}
    assert tool.input_schema["properties"]["pair"]["type"] == "array"
    assert tool.input_schema["properties"]["anything"] == {}
    assert tool.input_schema["properties"]["opts"]["properties"]["n"] == {"type": "number"}
    assert verify({"name": "f", "arguments": {"x": 1.5, "pair": [1, 2], "anything": None, "opts": {"n": 2}}},
                  [tool]).ok


def test_violations_name_the_kind_and_the_pointer() -> None:
    tool = BY_NAME["Unit Converter:convert_energy"]
    verdict = verify({"name": tool.name, "arguments": {"value": "12", "from_unit": "Joule", "to": "calorie"}}, TOOLS)
    assert not verdict.ok and verdict.stage is Stage.SCHEMA
    found = {(v.kind, v.pointer) for v in verdict.violations}
    assert found == {("wrong_type", "/arguments/value"), ("enum", "/arguments/from_unit"),
                     ("missing_required", "/arguments/to_unit")}


def test_unknown_parameter_where_the_schema_forbids_it() -> None:
    tool = BY_NAME["Google Maps:maps_geocode"]
    required = tool.input_schema.get("required", [])
    arguments = {name: "Paris" for name in required} | {"langauge": "fr"}
    verdict = verify({"name": tool.name, "arguments": arguments}, TOOLS)
    assert [(v.kind, v.pointer) for v in verdict.violations] == [("unknown_param", "/arguments/langauge")]


def test_stages_in_order() -> None:
    assert verify('{"name": "x", "arguments": {', TOOLS).stage is Stage.PARSE
    assert "line 1 column" in verify('{"name": "x", "arguments": {', TOOLS).violations[0].message
    unknown = verify({"name": "convert_energy", "arguments": {}}, TOOLS)
    assert unknown.stage is Stage.TOOL_NAME and unknown.violations[0].pointer == "/name"
    ok_call = {"name": "Unit Converter:convert_energy",
               "arguments": {"value": 3, "from_unit": "joule", "to_unit": "calorie"}}
    assert verify(ok_call, TOOLS).ok
    failed_run = verify(ok_call, TOOLS, execution=Execution(ok=False, error="HTTP 500 from server"))
    assert failed_run.stage is Stage.EXECUTION and failed_run.violations[0].message == "HTTP 500 from server"


@pytest.mark.parametrize("raw, kind", [
    ('[{"name": "a", "arguments": {}}]', "not_a_single_call"),
    ('"just a string"', "not_a_call"),
    ('{"arguments": {}}', "missing_name"),
    ('{"name": "a"}', "missing_arguments"),
    ('{"name": "a", "arguments": "{\\"x\\": 1"}', "invalid_json"),
    ('{"name": "a", "arguments": [1, 2]}', "arguments_not_object"),
])
def test_parse_failures_are_named(raw: str, kind: str) -> None:
    verdict = verify(raw, TOOLS)
    assert verdict.stage is Stage.PARSE and verdict.violations[0].kind == kind


def test_nan_infinity_and_numbers_past_a_double_are_not_json_however_the_call_comes() -> None:
    """Python's reader takes them; JSON, and an MCP server that reads it strictly, does not."""
    name = "Unit Converter:convert_energy"
    verdicts = [verify(f'{{"name": "{name}", "arguments": {{"value": NaN, "from_unit": "erg", "to_unit": "joule"}}}}',
                       TOOLS),
                verify({"name": name, "arguments": '{"value": -Infinity, "from_unit": "erg", "to_unit": "joule"}'},
                       TOOLS),
                verify(ToolCall(name, {"value": float("nan"), "from_unit": "erg", "to_unit": "joule"}), TOOLS),
                verify(f'{{"name": "{name}", "arguments": {{"value": 1e999, "from_unit": "erg", "to_unit": "joule"}}}}',
                       TOOLS)]
    assert [(v.ok, v.stage, v.violations[0].kind, v.violations[0].pointer) for v in verdicts] == [
        (False, Stage.PARSE, "invalid_json", ""), (False, Stage.PARSE, "invalid_json", "/arguments"),
        (False, Stage.PARSE, "invalid_json", "/arguments/value"), (False, Stage.PARSE, "invalid_json", "")]
    assert "NaN is not a JSON value" in verdicts[0].violations[0].message
    assert "1e999 is out of a number's range" in verdicts[3].violations[0].message
    assert verify(f'{{"name": "{name}", "arguments": {{"value": 1.5e300, "from_unit": "erg", "to_unit": "joule"}}}}',
                  TOOLS).ok


def test_openai_tool_call_with_string_arguments() -> None:
    call = {"type": "function", "function": {"name": "Unit Converter:convert_energy",
                                             "arguments": '{"value": 1, "from_unit": "erg", "to_unit": "joule"}'}}
    verdict = verify(call, TOOLS)
    assert verdict.ok and verdict.call == ToolCall("Unit Converter:convert_energy",
                                                   {"value": 1, "from_unit": "erg", "to_unit": "joule"})


def test_tool_shapes_are_equivalent() -> None:
    schema = {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]}
    shapes = [
        {"name": "search", "description": "d", "inputSchema": schema},
        {"name": "search", "description": "d", "input_schema": schema},
        {"type": "function", "function": {"name": "search", "description": "d", "parameters": schema}},
    ]
    tools = [normalize_tool(s) for s in shapes]
    assert tools[0] == tools[1] == tools[2] == Tool("search", "d", schema)
    for shape in shapes:
        assert [v.kind for v in verify({"name": "search", "arguments": {}}, [shape]).violations] == \
            ["missing_required"]


def test_bad_tool_definitions_are_named() -> None:
    with pytest.raises(ToolFormatError, match=r"tools\[1\]: 'name' must be a non-empty string"):
        normalize_tools([{"name": "ok"}, {"description": "no name"}])
    with pytest.raises(ToolFormatError, match="input schema must be an object"):
        normalize_tool({"name": "x", "inputSchema": "nope"})


def test_the_schema_draft_is_the_schema_s_own() -> None:
    draft4 = {"$schema": "http://json-schema.org/draft-04/schema#", "type": "object",
              "properties": {"n": {"type": "number", "maximum": 10, "exclusiveMaximum": True}}}
    tool = {"name": "t", "inputSchema": draft4}
    assert verify({"name": "t", "arguments": {"n": 9}}, [tool]).ok
    assert [v.kind for v in verify({"name": "t", "arguments": {"n": 10}}, [tool]).violations] == ["out_of_range"]


def test_an_invalid_schema_is_reported_not_raised() -> None:
    verdict = verify({"name": "t", "arguments": {}}, [{"name": "t", "inputSchema": {"type": "no-such-type"}}])
    assert verdict.ok and "not valid JSON Schema" in verdict.warnings[0]


def test_validators_are_compiled_once_per_distinct_schema() -> None:
    from tracemill.verify import _compile

    tool = BY_NAME["Unit Converter:convert_energy"]
    call = {"name": tool.name, "arguments": {"value": 1, "from_unit": "erg", "to_unit": "joule"}}
    verify(call, TOOLS)
    before = _compile.cache_info()
    for _ in range(50):
        verify(call, TOOLS)
    copy = orjson.loads(orjson.dumps(tool.input_schema))  # an equal schema read anew: the same validator
    assert compiled_validator(copy) is compiled_validator(tool.input_schema)
    assert _compile.cache_info().misses == before.misses


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-10**6, 10**6) | st.floats(allow_nan=False) | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=6,
)
FAST_TOOLS = [t for t in TOOLS if compiled_validator(t.input_schema).fast_check() is not None]


def test_most_real_schemas_take_the_fast_path() -> None:
    assert len(FAST_TOOLS) >= len(TOOLS) // 2


@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_the_fast_path_never_accepts_what_jsonschema_refuses(data: st.DataObject) -> None:
    tool = data.draw(st.sampled_from(FAST_TOOLS))
    names = sorted(tool.input_schema.get("properties", {})) + ["extra"]
    arguments = data.draw(st.dictionaries(st.sampled_from(names), json_values, max_size=len(names)))
    compiled = compiled_validator(tool.input_schema)
    try:
        compiled.fast_check()(arguments)
    except fastjsonschema.JsonSchemaException:
        return
    assert list(compiled.validator.iter_errors(arguments)) == []
