"""The output formats real agents write that the reviser reads (ReAct text, Gemma's tool_code, Qwen3-Coder's XML),
null optional parameters, and parameters a tool does not declare: each still obeys "never guess, never change a valid
call"."""

import json

import pytest

from tracemill.bfcl import load_bfcl
from tracemill.reader import holds_call
from tracemill.repair import StepKind, revise
from tracemill.tools import tool_index
from tracemill.verify import ToolCall, verify

from support import WEATHER_TOOLS

INDEX = tool_index(WEATHER_TOOLS + [
    {"name": "lookup", "inputSchema": {"type": "object", "properties": {"term": {"type": "string"}}}},
    {"name": "page", "inputSchema": {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}},
    {"name": "configure", "inputSchema": {"type": "object", "required": ["name"], "properties": {
        "name": {"type": "string"}, "retries": {"type": "integer"}, "dry_run": {"type": "boolean"},
        "tags": {"type": "array", "items": {"type": "string"}}, "label": {"type": "string"},
        "note": {"type": ["string", "null"]}}}},
])
PARIS = ToolCall("get_weather", {"city": "Paris"})
FORECAST = ToolCall("get_forecast", {"city": "Paris", "days": 3})


def _ok(raw, *want):
    revision = revise(raw, INDEX)
    assert revision.ok, revision.verdicts
    assert list(revision.calls) == list(want)
    return revision


def _kinds(revision):
    return [s.kind for s in revision.steps]


def _refused(raw):
    revision = revise(raw, INDEX)
    assert not revision.ok
    return revision


# --- LangChain's ReAct text -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("raw", [
    'Thought: I need the weather.\nAction: get_weather\nAction Input: {"city": "Paris"}',
    'Thought: I need the weather.\nAction: `get_weather`\nAction Input: {"city": "Paris"}\n\nI will wait for it.',
    'Action: get_weather\nAction Input:\n```json\n{"city": "Paris"}\n```',
    "Action: get_weather\nAction Input: {'city': 'Paris'}",
])
def test_react_action_and_json_input(raw):
    assert StepKind.EXTRACT in _kinds(_ok(raw, PARIS))


def test_react_reads_nothing_after_an_observation_the_model_made_up():
    raw = ('Thought: weather first.\nAction: get_weather\nAction Input: {"city": "Paris"}\n'
           'Observation: 21 degrees\nThought: now the forecast.\nAction: get_forecast\n'
           'Action Input: {"city": "Paris", "days": 3}')
    _ok(raw, PARIS)
    assert not holds_call("Observation: sunny\nAction: get_weather\nAction Input: {\"city\": \"Paris\"}", INDEX)


@pytest.mark.parametrize(("raw", "want"), [
    ("Thought: look it up.\nAction: lookup\nAction Input: aspirin dosage",
     ToolCall("lookup", {"term": "aspirin dosage"})),
    ('Action: lookup\nAction Input: "aspirin dosage"', ToolCall("lookup", {"term": "aspirin dosage"})),
    ("Action: page\nAction Input: 3", ToolCall("page", {"n": 3})),
    ("Action: lookup\nAction Input: 3", ToolCall("lookup", {"term": "3"})),
])
def test_react_plain_text_input_of_a_one_parameter_tool(raw, want):
    assert StepKind.PLAIN_INPUT in _kinds(_ok(raw, want))


@pytest.mark.parametrize("raw", [
    "Action: get_forecast\nAction Input: Paris",  # two parameters: which one is Paris?
    "Action: page\nAction Input:",  # no input for a required parameter
    "Thought: I know this.\nFinal Answer: 21 degrees in Paris.",
])
def test_react_text_that_is_no_readable_call_is_refused(raw):
    _refused(raw)


def test_react_without_input_is_a_call_without_arguments_not_an_empty_value():
    _ok("Action: lookup\nAction Input:", ToolCall("lookup", {}))


# --- Gemma's tool_code ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("raw", [
    '```tool_code\nprint(get_weather(city="Paris"))\n```',
    "```tool_code\nget_weather(city='Paris')\n```",
    'I will check.\n```tool_code\nprint(default_api.get_weather(city="Paris"))\n```\n',
    '<tool_code>print(get_weather(city="Paris"))</tool_code>',
])
def test_gemma_tool_code_blocks(raw):
    revision = _ok(raw, PARIS)
    assert StepKind.PYTHONIC in _kinds(revision)
    assert holds_call(raw, INDEX)


def test_two_printed_calls_and_print_of_plain_text():
    raw = '```tool_code\nprint(get_weather(city="Paris"))\nprint(get_forecast(city="Paris", days=3))\n```'
    _ok(raw, PARIS, FORECAST)
    _refused('```tool_code\nprint("the weather in Paris")\n```')


# --- Qwen3-Coder's XML calls ----------------------------------------------------------------------------------------

QWEN = ("<tool_call>\n<function=configure>\n<parameter=name>\nnightly\n</parameter>\n<parameter=retries>\n3\n"
        "</parameter>\n<parameter=dry_run>\ntrue\n</parameter>\n<parameter=tags>\n[\"a\", \"b\"]\n</parameter>\n"
        "<parameter=label>\n42\n</parameter>\n</function>\n</tool_call>")
CONFIGURE = ToolCall("configure", {"name": "nightly", "retries": 3, "dry_run": True, "tags": ["a", "b"],
                                   "label": "42"})


def test_qwen3_coder_xml_values_are_typed_by_the_schema():
    revision = _ok(QWEN, CONFIGURE)
    assert StepKind.XML_PARAMETERS in _kinds(revision)
    assert StepKind.COERCE not in _kinds(revision)  # typed as read, not repaired afterwards


def test_qwen3_coder_xml_without_the_tool_call_tag_and_two_calls():
    one = "<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>"
    two = ("<function=get_forecast>\n<parameter=city>\nParis\n</parameter>\n<parameter=days>\n3\n</parameter>\n"
           "</function>")
    _ok(one, PARIS)
    _ok(f"<tool_call>\n{one}\n</tool_call>\n<tool_call>\n{two}\n</tool_call>", PARIS, FORECAST)
    _ok("Let me check.\n" + one + "\n" + two, PARIS, FORECAST)


@pytest.mark.parametrize("cut", ["</parameter>\n", "</parameter>\n</func", "</parameter>\n</function>\n</tool"])
def test_qwen3_coder_block_cut_after_its_last_complete_parameter(cut):
    raw = QWEN[: QWEN.index("</parameter>\n</function>")] + cut
    revision = _ok(raw, CONFIGURE)
    assert StepKind.CLOSE_BRACKETS in _kinds(revision) or cut.endswith("</tool")


@pytest.mark.parametrize("raw", [
    QWEN[: QWEN.index("nightly") + 4],  # inside a value
    QWEN[: QWEN.index("<parameter=label>") + 6],  # inside the next parameter's tag
    QWEN[: QWEN.index("<parameter=label>") + len("<parameter=label>\n4")],  # the next parameter cut mid-value
])
def test_qwen3_coder_block_cut_mid_parameter_is_refused(raw):
    revision = _refused(raw)
    assert any(v.violations[0].kind == "truncated" for v in revision.verdicts)


def test_qwen3_coder_round_trip_of_valid_bfcl_calls():
    """Every valid single-call BFCL reference written as Qwen3-Coder XML (strings verbatim, the rest as JSON) is read
    back exactly."""
    checked = 0
    for case in load_bfcl():
        calls = case.reference()
        if len(calls) != 1 or not verify(calls[0], case.tools).ok:
            continue
        call = calls[0]
        params = "".join(f"<parameter={k}>\n{v if isinstance(v, str) else json.dumps(v)}\n</parameter>\n"
                         for k, v in call.arguments.items())
        tools = tool_index(case.tools)
        props = tools[call.name].input_schema.get("properties", {})
        if any(isinstance(v, str) and "string" not in json.dumps(props.get(k, {})) for k, v in call.arguments.items()):
            continue  # a string where the schema says another type cannot round-trip through untyped text
        revision = revise(f"<tool_call>\n<function={call.name}>\n{params}</function>\n</tool_call>", tools)
        assert revision.ok and revision.calls == (call,), (case.id, revision.calls)
        checked += 1
    assert checked > 200


# --- null optional parameters ---------------------------------------------------------------------------------------

def test_optional_parameter_sent_as_null_is_dropped():
    raw = json.dumps({"name": "configure", "arguments": json.dumps({"name": "x", "retries": None, "note": None})})
    revision = _ok(raw, ToolCall("configure", {"name": "x", "note": None}))
    drop = next(s for s in revision.steps if s.kind is StepKind.DROP_NULL)
    assert (drop.pointer, drop.before) == ("/arguments/retries", {"retries": None})


def test_required_parameter_sent_as_null_is_not_dropped():
    revision = _refused(json.dumps({"name": "configure", "arguments": {"name": None}}))
    assert revision.calls[0].arguments == {"name": None}


def test_null_where_the_schema_takes_null_is_left_alone():
    raw = json.dumps({"name": "configure", "arguments": json.dumps({"name": "x", "note": None})})
    revision = revise(raw, INDEX)
    assert revision.ok and not revision.changed


# --- parameters the tool does not declare ---------------------------------------------------------------------------

SEARCH = [{"name": "search", "inputSchema": {"type": "object", "required": ["query"], "properties": {
    "query": {"type": "string"}, "limit": {"type": "integer"}}}}]  # no additionalProperties: undeclared ones are valid
LOOSE = {"name": "search", "arguments": {"query": "aspirin", "Limit": 5, "verbose": True}}


def test_a_valid_call_keeps_parameters_the_tool_does_not_declare():
    assert verify(LOOSE, SEARCH).ok
    for raw in (json.dumps(LOOSE), json.dumps([LOOSE]), {"tool_calls": [{"type": "function", "function": {
            "name": "search", "arguments": json.dumps(LOOSE["arguments"])}}]}):
        revision = revise(raw, SEARCH)
        assert revision.ok and not revision.changed and revision.calls[0].arguments == LOOSE["arguments"]


@pytest.mark.parametrize("raw", [f"Sure:\n```json\n{json.dumps(LOOSE)}\n```",
                                 'search(query="aspirin", Limit=5, verbose=True)',
                                 json.dumps({"name": "Search", "arguments": LOOSE["arguments"]})])
def test_a_rewritten_call_gets_the_parameters_the_tool_declares(raw):
    revision = revise(raw, SEARCH)
    assert revision.ok and revision.calls[0].arguments == {"query": "aspirin", "limit": 5}
    assert {StepKind.PARAM_NAME, StepKind.DROP_UNKNOWN} <= set(_kinds(revision))


def test_a_tool_that_declares_no_parameters_gets_none_but_one_whose_schema_is_silent_keeps_them():
    tools = [{"name": "status", "inputSchema": {"type": "object", "properties": {}}},
             {"name": "anything", "inputSchema": {"type": "object"}}]
    revision = revise('```json\n[{"name": "status", "arguments": {"format": "json"}}, '
                      '{"name": "anything", "arguments": {"format": "json"}}]\n```', tools)
    assert revision.ok and [c.arguments for c in revision.calls] == [{}, {"format": "json"}]


def test_a_schema_that_takes_undeclared_parameters_keeps_them():
    tools = [{"name": "tag", "inputSchema": {"type": "object", "properties": {"id": {"type": "integer"}},
                                             "additionalProperties": True}}]
    revision = revise('```\n{"name": "tag", "arguments": {"id": "7", "colour": "red"}}\n```', tools)
    assert revision.ok and revision.calls[0].arguments == {"id": 7, "colour": "red"}
