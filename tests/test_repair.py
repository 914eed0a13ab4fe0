import difflib
import json
import random

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from tracemill.bfcl import load_bfcl
from tracemill.faults import KINDS, corrupt_calls
from tracemill.names import similarity
from tracemill.repair import StepKind, revise
from tracemill.tools import load_mcp_bench, name_key, tool_index
from tracemill.verify import Stage, ToolCall, verify

CASES = load_bfcl()
BY_ID = {c.id: c for c in CASES}
SERVERS = load_mcp_bench()
MCP_TOOLS = [t for ts in SERVERS.values() for t in ts]

TRIANGLE = BY_ID["simple_python_0"]  # calculate_triangle_area(base: int, height: int, unit: str)
WANT = ToolCall("calculate_triangle_area", {"base": 10, "height": 5, "unit": "units"})
ARGS = json.dumps(WANT.arguments)


def _fixed(raw, case=TRIANGLE, want=(WANT,)):
    revision = revise(raw, case.tools)
    assert revision.ok, revision.verdicts
    assert list(revision.calls) == list(want)
    assert revision.changed
    return revision


def _kinds(revision):
    return [s.kind for s in revision.steps]


def test_valid_native_call_comes_back_untouched():
    raw = json.dumps({"name": WANT.name, "arguments": ARGS})
    revision = revise(raw, TRIANGLE.tools)
    assert revision.ok and not revision.changed and revision.steps == ()
    assert revision.calls == (WANT,)


@pytest.mark.parametrize("raw", [
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": WANT.name, "arguments": ARGS}}]},
    {"choices": [{"message": {"tool_calls": [{"type": "function", "function": {"name": WANT.name,
                                                                              "arguments": ARGS}}]}}]},
    [{"name": WANT.name, "arguments": WANT.arguments}],
])
def test_openai_shapes_are_read_without_changing_anything(raw):
    revision = revise(raw, TRIANGLE.tools)
    assert revision.ok and revision.calls == (WANT,) and not revision.changed


@pytest.mark.parametrize("raw", [
    f'{{"tool": "calculate_triangle_area", "args": {ARGS}}}',
    f'{{"type": "function", "name": "calculate_triangle_area", "parameters": {ARGS}}}',
    f'{{"type": "tool_use", "id": "toolu_1", "name": "calculate_triangle_area", "input": {ARGS}}}',
    f'{{"name": "calculate_triangle_area", "parameters": {ARGS}}}',
])
def test_wrappers_are_unwrapped(raw):
    assert StepKind.UNWRAP in _kinds(_fixed(raw))


@pytest.mark.parametrize("raw", [
    f'Sure! Here is the call:\n```json\n{{"name": "calculate_triangle_area", "arguments": {ARGS}}}\n```\nDone.',
    f'<tool_call>\n{{"name": "calculate_triangle_area", "arguments": {ARGS}}}\n</tool_call>',
    f'<|python_start|>{{"name": "calculate_triangle_area", "arguments": {ARGS}}}<|python_end|>',
    f'<|python_tag|>{{"name": "calculate_triangle_area", "parameters": {ARGS}}}<|eom_id|>',
    f'[TOOL_CALLS][{{"name": "calculate_triangle_area", "arguments": {ARGS}}}]',
    f'[TOOL_CALLS]calculate_triangle_area[ARGS]{ARGS}',
    f'<function=calculate_triangle_area>{ARGS}</function>',
    ('<think>The user wants {"base": 1}? No: base 10.</think>'
     f'{{"name": "calculate_triangle_area", "arguments": {ARGS}}}'),
    f'I will call the tool now: {{"name": "calculate_triangle_area", "arguments": {ARGS}}} and report back.',
])
def test_calls_are_read_out_of_text(raw):
    assert StepKind.EXTRACT in _kinds(_fixed(raw))


@pytest.mark.parametrize("raw", [
    '[calculate_triangle_area(base=10, height=5, unit="units")]',
    'calculate_triangle_area(base=10, height=5, unit="units")',
    '<|python_start|>[calculate_triangle_area(base=10, height=5, **{"unit": "units"})]<|python_end|>',
    "```python\ncalculate_triangle_area(base=10, height=5, unit='units')\n```",
])
def test_pythonic_calls_are_parsed(raw):
    assert StepKind.PYTHONIC in _kinds(_fixed(raw))


def test_pythonic_code_is_never_run(tmp_path):
    marker = tmp_path / "ran"
    raw = f'[calculate_triangle_area(base=__import__("pathlib").Path("{marker}").touch(), height=5)]'
    revision = revise(raw, TRIANGLE.tools)
    assert not revision.ok and not marker.exists()


def test_dotted_pythonic_names():
    case = BY_ID["simple_python_1"]  # math.factorial(number: int)
    _fixed("[math.factorial(number=5)]", case, (ToolCall("math.factorial", {"number": 5}),))


@pytest.mark.parametrize("raw", [
    f'{{"name": "calculate_triangle_area", "arguments": {ARGS}',
    '{"name": "calculate_triangle_area", "arguments": {"base": 10, "height": 5, "unit": "units"',
    "{'name': 'calculate_triangle_area', 'arguments': {'base': 10, 'height': 5, 'unit': 'units'}}",
    '{"name": "calculate_triangle_area", "arguments": {"base": 10, "height": 5, "unit": "units",},}',
    '{"name": "calculate_triangle_area", "arguments": "{\'base\': 10, \'height\': 5, \'unit\': \'units\'}"}',
    json.dumps({"name": "calculate_triangle_area", "arguments": json.dumps(ARGS)}),
])
def test_broken_json_is_repaired(raw):
    _fixed(raw)


def test_several_calls_in_one_string():
    case = BY_ID["parallel_0"]  # spotify.play twice
    want = tuple(case.reference())
    one, two = (json.dumps(c.to_dict()) for c in want)
    for raw in (one + two, one + "\n" + two, f"<tool_call>{one}</tool_call>\n<tool_call>{two}</tool_call>",
                '[spotify.play(artist="Taylor Swift", duration=20), spotify.play(artist="Maroon 5", duration=15)]'):
        _fixed(raw, case, want)


@pytest.mark.parametrize("name", ["Calculate_Triangle_Area", "calculate-triangle-area", "calculateTriangleArea",
                                  "functions.calculate_triangle_area", "calculate_triangel_area"])
def test_near_miss_tool_names(name):
    revision = _fixed(json.dumps({"name": name, "arguments": WANT.arguments}))
    assert next(s for s in revision.steps if s.kind is StepKind.TOOL_NAME).before == name


def test_server_prefix_is_restored_on_mcp_bench():
    index = tool_index(MCP_TOOLS)
    revision = revise('{"name": "get_current_weather_tool", "arguments": {"city": "Paris"}}', index)
    assert revision.calls[0].name == "Weather Data:get_current_weather_tool"


def test_two_equally_close_names_are_not_picked():
    index = tool_index(MCP_TOOLS)
    assert sum(name.endswith(":search") for name in index) == 2
    revision = revise('{"name": "search", "arguments": {"query": "aspirin"}}', index)
    assert not revision.ok and revision.calls[0].name == "search"
    assert revision.verdicts[0].stage is Stage.TOOL_NAME


def test_name_similarity_is_difflibs_ratio_on_every_platform():
    # a compiled SequenceMatcher is used where its wheel exists; prompts and near-miss picks must not depend on that
    keys = sorted({name_key(t.name) for t in MCP_TOOLS} | {name_key(t.name) for c in CASES[:300] for t in c.tools})
    pairs = [(a, b) for i, a in enumerate(keys) for b in keys[i + 1:i + 40]]
    assert len(pairs) > 10_000
    assert [similarity(a, b) for a, b in pairs] == [
        difflib.SequenceMatcher(None, a, b, autojunk=False).ratio() for a, b in pairs]


@given(st.text(max_size=60), st.text(max_size=60))
@settings(max_examples=300)
def test_name_similarity_is_difflibs_ratio_on_any_text(a, b):
    assert similarity(a, b) == difflib.SequenceMatcher(None, a, b, autojunk=False).ratio()


def test_schema_guided_coercion_and_names():
    raw = json.dumps({"name": WANT.name, "arguments": {"Base": "10", "HEIGHT": 5.0, "unit": "units"}})
    revision = _fixed(raw)
    assert {StepKind.PARAM_NAME, StepKind.COERCE} <= set(_kinds(revision))


def test_json_encoded_array_and_enum_case():
    tools = [{"name": "pick", "inputSchema": {"type": "object", "properties": {
        "sizes": {"type": "array", "items": {"type": "integer"}},
        "mode": {"type": "string", "enum": ["fast", "Slow", "slow"]},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}, "required": ["sizes"]}}]
    revision = revise('{"name": "pick", "arguments": {"sizes": "[1, 2]", "unit": "Celsius"}}', tools)
    assert revision.ok and revision.calls[0].arguments == {"sizes": [1, 2], "unit": "celsius"}
    ambiguous = revise('{"name": "pick", "arguments": {"sizes": [1], "mode": "SLOW"}}', tools)
    assert not ambiguous.ok and ambiguous.calls[0].arguments["mode"] == "SLOW"


def test_unknown_parameters_go_only_where_the_schema_forbids_them():
    revision = _fixed(json.dumps({"name": WANT.name, "arguments": {**WANT.arguments, "verbose": True}}))
    assert StepKind.DROP_UNKNOWN in _kinds(revision)
    weather = SERVERS["Weather Data"]
    call = {"name": "Weather Data:get_current_weather_tool", "arguments": {"city": "Paris", "verbose": True}}
    assert verify(call, weather).ok
    assert not revise(json.dumps(call), weather).changed


def test_schema_default_fills_a_missing_required_parameter_only_when_given():
    tools = [{"name": "f", "inputSchema": {"type": "object", "required": ["a", "b"], "properties": {
        "a": {"type": "string"}, "b": {"type": "integer", "default": 3}}}}]
    revision = revise('{"name": "f", "arguments": {"a": "x"}}', tools)
    assert revision.ok and revision.calls[0].arguments == {"a": "x", "b": 3}
    missing = revise('{"name": "f", "arguments": {"b": 1}}', tools)
    assert not missing.ok and missing.calls[0].arguments == {"b": 1}
    assert missing.verdicts[0].violations[0].kind == "missing_required"


@pytest.mark.parametrize("raw", [
    '{"name": "calculate_triangle_area", "arguments": {"base": 10, "height": 5, "unit": "uni',
    '<|python_start|>[calculate_triangle_area(base=10, height=5, unit="un',
    '{"name": "calculate_triangle_area", "arguments": "{\\"base\\": 10, \\"height\\": 5, \\"unit\\": \\"un"}',
    '{"name": "calculate_triangle_area", "arguments": {"base": 10, "height": 5, "unit"',
])
def test_output_cut_mid_value_is_refused_not_completed(raw):
    revision = revise(raw, TRIANGLE.tools)
    assert not revision.ok
    assert any(v.violations[0].kind == "truncated" for v in revision.verdicts)


def test_no_call_at_all():
    revision = revise("The area of the triangle is 25 square units.", TRIANGLE.tools)
    assert not revision.ok and revision.calls == ()
    assert revision.verdicts[0].violations[0].kind == "no_call"


def test_steps_are_data_a_reviewer_can_read():
    revision = _fixed('<tool_call>{"name": "calculate_triangle_area", "arguments": {"base": "10", "height": 5, '
                      '"unit": "units"}}</tool_call>')
    coerce = next(s for s in revision.steps if s.kind is StepKind.COERCE)
    assert (coerce.pointer, coerce.before, coerce.after, coerce.call) == ("/arguments/base", "10", 10, 0)
    assert json.loads(json.dumps(revision.to_dict()))["steps"][0]["kind"] == "extract"


@pytest.mark.parametrize("raw", ["[" * 5000, "{" * 5000, '{"a": ' * 3000, "f(" * 3000, "[1, " * 3000 + "]" * 3000,
                                 '[{"name": "x"' + "," * 100000 + "]"])
@pytest.mark.timeout(20)  # quadratic work on these inputs takes minutes: a hang, as a user would see it
def test_stray_brackets_do_not_hang(raw):
    assert not revise(raw, TRIANGLE.tools).ok


# --- properties -----------------------------------------------------------------------------------------------------

_SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@_SETTINGS
@given(st.text(max_size=300))
def test_never_raises_on_arbitrary_text(text):
    revision = revise(text, TRIANGLE.tools)
    assert revision.ok == (bool(revision.calls) and all(v.ok for v in revision.verdicts))


@_SETTINGS
@given(st.text(alphabet='{}[]()"\':,<>|_=\\ \nabcnamergumts0123456789.TrueNoneflsu', max_size=200))
def test_never_raises_on_jsonish_text(text):
    revise(text, TRIANGLE.tools)
    revise("<tool_call>" + text, TRIANGLE.tools)


def _values_for(schema, draw):
    if schema.get("enum"):
        return draw(st.sampled_from(schema["enum"]))
    kind = schema.get("type")
    if kind == "integer":
        return draw(st.integers(-10**6, 10**6))
    if kind == "number":
        return draw(st.one_of(st.integers(-1000, 1000), st.floats(-1e6, 1e6, allow_nan=False)))
    if kind == "boolean":
        return draw(st.booleans())
    if kind == "string":
        return draw(st.text(max_size=30))
    return None


@st.composite
def valid_calls(draw):
    case = draw(st.sampled_from([c for c in CASES if len(c.answers) == 1]))
    call = case.reference()[0]
    tool = next(t for t in case.tools if t.name == call.name)
    props = tool.input_schema.get("properties", {})
    arguments = dict(call.arguments)
    for name in arguments:
        value = _values_for(props.get(name, {}), draw)
        if value is not None:
            arguments[name] = value
    call = ToolCall(call.name, arguments)
    assume(verify(call, case.tools).ok)
    return case, call


@_SETTINGS
@given(valid_calls(), st.booleans())
def test_valid_call_comes_back_unchanged(case_call, native):
    case, call = case_call
    args = json.dumps(call.arguments) if native else call.arguments
    revision = revise(json.dumps({"name": call.name, "arguments": args}), case.tools)
    assert revision.ok and not revision.changed and revision.calls == (call,)


@_SETTINGS
@given(st.sampled_from(CASES), st.lists(st.sampled_from(KINDS), max_size=5), st.integers(0, 2**32),
       st.integers(0, 400), st.text(max_size=5))
def test_every_call_returned_ok_passes_verify(case, kinds, seed, cut, noise):
    raw = corrupt_calls(case.reference(), case.tools, kinds, random.Random(seed)).raw
    for text in (raw, raw[:cut] + noise + raw[cut:], raw[:cut]):
        revision = revise(text, case.tools)
        if revision.ok:
            assert all(verify(call, case.tools).ok for call in revision.calls)
