import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import ClassVar

import pytest
from click.testing import CliRunner

from tracemill.bfcl import ast_match, load_bfcl
from tracemill.cli import main
from tracemill.tools import load_mcp_bench
from tracemill.verify import ToolCall

QUALITY = ("json_valid", "valid_tool_name_rate", "input_schema_compliance", "ok_rate", "reference_match", "recovered")


def _eval(*args):
    result = CliRunner().invoke(main, ["eval", *args], catch_exceptions=False)
    return result


def _report(*args):
    result = _eval(*args, "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    return report, {m["reviser"]: m for m in report["revisers"]}


@pytest.fixture(scope="module")
def bfcl():
    return _report("--cases", "bfcl")


def test_rules_recover_bfcl_and_beat_json_repair(bfcl):
    report, by = bfcl
    assert report["cases"] > 1000 and report["broken_cases"] > 300
    rules, repair, none = by["rules"], by["json-repair"], by["none"]
    assert rules["recoverable_cases"] > 300
    assert rules["recovered"] >= 0.95
    assert rules["valid_changed"] == 0 and rules["valid_inputs"] > 500
    for metric in QUALITY:
        assert rules[metric] > repair[metric], metric
    assert repair["json_valid"] > none["json_valid"]
    assert rules["wrong_ok"] <= repair["wrong_ok"]


def test_do_no_harm_changes_nothing():
    _, by = _report("--cases", "do-no-harm", "--reviser", "rules")
    rules = by["rules"]
    assert rules["valid_inputs"] == rules["cases"] > 500
    assert rules["valid_changed"] == 0 and rules["ok_rate"] == 1 and rules["reference_match"] == 1


def test_mcp_bench_suite_side_by_side_table():
    result = _eval("--cases", "mcp-bench", "--reviser", "none,rules", "--limit", "150")
    assert result.exit_code == 0
    _, by = _report("--cases", "mcp-bench", "--reviser", "none,rules", "--limit", "150")
    cells = [[c.strip() for c in re.split("[│┃]", line)[1:-1]] for line in result.output.splitlines()]
    rows = {row[0]: row[1:] for row in cells if len(row) == 3}
    assert "mcp-bench: 150 cases" in result.output
    assert rows["metric"] == ["none", "rules"]
    for label, key in (("input schema compliance", "input_schema_compliance"), ("verified ok", "ok_rate"),
                       ("reference match (BFCL AST)", "reference_match")):
        assert rows[label] == [f"{by[r][key]:.1%}" for r in ("none", "rules")], label
    assert by["rules"]["ok_rate"] > by["none"]["ok_rate"]


def test_own_case_file_with_out_dir_round_trips(tmp_path):
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
        "required": ["city"]}}}]
    cases = [
        {"tools": tools,
         "raw": 'Sure!\n```json\n{"name": "get_weather", "arguments": {"city": "Paris", "days": "3"}}\n```',
         "reference": [{"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}], "context": None},
        {"tools": tools, "raw": '{"name": "get_weather", "arguments": {"city": "Oslo"}}', "reference": None,
         "context": [{"role": "user", "content": "Weather in Oslo?"}]},
    ]
    path = tmp_path / "cases.jsonl"
    path.write_text("".join(json.dumps(c) + "\n" for c in cases))
    out = tmp_path / "out"
    report, by = _report("--cases", str(path), "--out", str(out))
    assert by["rules"]["reference_match"] == 1 and by["none"]["reference_match"] == 0
    assert by["rules"]["valid_inputs"] == 1 and by["rules"]["valid_changed"] == 0
    assert {p.name for p in out.iterdir()} == {"report.json", "table.md", "cases.jsonl", "results.jsonl"}
    assert "| reference match (BFCL AST) | 0.0% | 0.0% | 100.0% |" in (out / "table.md").read_text()
    again, _ = _report("--cases", str(out / "cases.jsonl"))
    untimed = [[{k: v for k, v in m.items() if not k.endswith("_us")} for m in r["revisers"]] for r in (again, report)]
    assert untimed[0] == untimed[1]
    results = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    fixed = next(r for r in results if r["reviser"] == "rules" and r["match"])
    assert fixed["steps"] == ["extract", "coerce"]


def test_bad_case_file_names_the_line_and_field(tmp_path):
    path = tmp_path / "cases.jsonl"
    path.write_text(json.dumps({"tools": [], "raw": "{}"}) + "\n" + json.dumps({"tools": [], "raw": 3}) + "\n")
    result = _eval("--cases", str(path))
    assert result.exit_code != 0
    assert f"{path}:2" in result.output and "'raw'" in result.output


def test_model_reviser_needs_a_trained_model_folder(tmp_path):
    result = _eval("--cases", "do-no-harm", "--reviser", f"model:{tmp_path}")
    assert result.exit_code == 2 and f"model:{tmp_path}: not a trained reviser (no reviser.json" in result.output
    (tmp_path / "reviser.json").write_text("{}")
    result = _eval("--cases", "do-no-harm", "--reviser", f"model:{tmp_path}")
    assert result.exit_code == 2 and "reviser.json cannot be read" in result.output


def test_bfcl_ast_agreement_uses_bfcl_normalisation():
    case = next(c for c in load_bfcl(["simple_python"]) if c.id == "simple_python_0")
    answers = list(case.answers)  # base 10, height 5, unit "units" or left out
    ok = [ToolCall("calculate_triangle_area", {"base": 10, "height": 5}),
          ToolCall("calculate_triangle_area", {"base": 10, "height": 5, "unit": "Units"})]
    wrong = [ToolCall("calculate_triangle_area", {"base": 10}),
             ToolCall("calculate_triangle_area", {"base": 10, "height": 5, "color": "red"}),
             ToolCall("calculate_triangle_area", {"base": 10.0, "height": 5}),
             ToolCall("calculate_triangle_area", {"base": 11, "height": 5})]
    assert all(ast_match([c], answers, case.tools) for c in ok)
    assert not any(ast_match([c], answers, case.tools) for c in wrong)
    parallel = next(c for c in load_bfcl(["parallel"]) if c.id == "parallel_0")
    calls = parallel.reference()
    assert ast_match(calls[::-1], list(parallel.answers), parallel.tools)
    assert not ast_match(calls[:1], list(parallel.answers), parallel.tools)


class _FixedCompletion(BaseHTTPRequestHandler):
    requests: ClassVar[list] = []
    content = ""
    answer: ClassVar[tuple[int, str] | None] = None  # (status, body) answered in place of a completion

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).requests.append((self.path, body))
        reply = json.dumps({"id": "x", "object": "chat.completion", "model": body["model"], "choices": [
            {"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": self.content}}]})
        status, reply = self.answer or (200, reply)
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(reply)))
        self.end_headers()
        self.wfile.write(reply.encode())

    def log_message(self, *args):
        pass


def test_endpoint_reviser_against_a_real_openai_compatible_server(tmp_path):
    tools = [t.to_mcp() for ts in load_mcp_bench().values() for t in ts]
    _FixedCompletion.content = ('Here you go: {"name": "Weather Data:get_weather_forecast_tool", '
                                '"arguments": {"city": "Paris", "days": 2}}')
    _FixedCompletion.requests = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _FixedCompletion)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        case = {"tools": tools, "raw": '{"name": "get_weather_forecast_tool", "arguments": {"days": 2}}',
                "context": [{"role": "user", "content": "Forecast for Paris, 2 days"}],
                "reference": [{"name": "Weather Data:get_weather_forecast_tool",
                               "arguments": {"city": "Paris", "days": 2}}]}
        valid = dict(case, raw=json.dumps(case["reference"][0]))
        path = tmp_path / "cases.jsonl"
        path.write_text(json.dumps(case) + "\n" + json.dumps(valid) + "\n")
        url = f"http://127.0.0.1:{server.server_address[1]}/v1"
        _, by = _report("--cases", str(path), "--reviser", "rules", "--reviser", f"endpoint:{url}")
    finally:
        server.shutdown()
    assert by["rules"]["ok_rate"] == 0.5  # the city is not in the output: rules do not invent it
    assert by[f"endpoint:{url}"]["ok_rate"] == 1 and by[f"endpoint:{url}"]["reference_match"] == 1
    assert by[f"endpoint:{url}"]["valid_changed"] == 0
    assert len(_FixedCompletion.requests) == 1  # the valid call never reached the model
    path_, body = _FixedCompletion.requests[0]
    assert path_ == "/v1/chat/completions"
    system, user = body["messages"]
    assert system["role"] == "system" and user["role"] == "user"
    sections = user["content"].split("\n")
    tool_lines = sections[sections.index("<tools>") + 1:sections.index("</tools>")]
    offered = [json.loads(line)["name"] for line in tool_lines]
    assert offered[0] == "Weather Data:get_weather_forecast_tool" and len(offered) <= 4 < len(tools)
    conversation = sections[sections.index("<conversation>") + 1:sections.index("</conversation>")]
    assert conversation == ["user: Forecast for Paris, 2 days"]
    assert sections[sections.index("<output>") + 1] == case["raw"]


@pytest.mark.parametrize(("answer", "said"), [
    ((404, '{"detail": "Not Found"}'), 'answered 404: {"detail": "Not Found"}'),
    ((200, "<html>a proxy's page</html>"), ("did not answer as an OpenAI-compatible chat endpoint does (no "
                                           "choices[0].message): <html>a proxy's page</html>")),
    (None, "cannot reach the model reviser"),
])
def test_an_endpoint_reviser_that_cannot_answer_stops_the_eval_with_a_line_that_names_it(answer, said):
    _FixedCompletion.answer = answer
    server = ThreadingHTTPServer(("127.0.0.1", 0), _FixedCompletion)
    url = f"http://127.0.0.1:{server.server_address[1]}/v1"
    if answer is None:
        server.server_close()  # nothing listens there
    else:
        threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        result = _eval("--cases", "bfcl", "--limit", "40", "--reviser", f"endpoint:{url}")
    finally:
        if answer is not None:
            server.shutdown()
        _FixedCompletion.answer = None
    assert result.exit_code == 1 and result.output.strip().count("\n") == 0, result.output
    assert result.output.strip().startswith("Error: ") and f"{url}/chat/completions" in result.output
    assert said in result.output


def test_a_case_may_give_its_tools_calls_and_context_as_json_text(tmp_path):
    tools = [{"name": "get_weather", "inputSchema": {"type": "object", "properties": {"days": {"type": "integer"}}}}]
    reference = [{"name": "get_weather", "arguments": {"days": 3}}]
    row = {"id": "7", "tools": json.dumps(tools), "raw": '{"name": "get_weather", "arguments": {"days": "3"}}',
           "reference": json.dumps(reference), "context": json.dumps([{"role": "user", "content": "3 days"}])}
    path = tmp_path / "eval.jsonl"
    path.write_text(json.dumps(row) + "\n" + json.dumps({**row, "id": "8", "tools": "[{"}) + "\n")
    result = _eval("--cases", str(path))
    assert result.exit_code != 0 and f"{path}:2" in result.output and "'tools' is text but not JSON" in result.output
    path.write_text(json.dumps(row) + "\n")
    _, by = _report("--cases", str(path), "--reviser", "none,rules")
    assert by["none"]["reference_match"] == 0 and by["rules"]["reference_match"] == 1
