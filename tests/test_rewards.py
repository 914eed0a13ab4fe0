"""The trainer's parts that need no model: reward terms on hand-made completions, the LLM judge against a scripted
server, config and dataset checks (before any model loads), `--dry-run`'s launch commands, and the model registry."""

import json
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import ClassVar

import pytest
from click.testing import CliRunner

from tracemill.cli import main
from tracemill.reviser_prompt import PromptSettings
from tracemill.trainer.fault_rows import fault_cases, sampled_cases, write_rows
from tracemill.trainer.judge import LLMJudge
from tracemill.trainer.rewards import REWARD_FUNCTIONS, TERMS, row_from_columns, score

WEATHER = {"name": "get_weather", "description": "Weather forecast",
           "inputSchema": {"type": "object", "additionalProperties": False, "required": ["city", "days"],
                           "properties": {"city": {"type": "string"}, "days": {"type": "integer"},
                                          "units": {"type": "string", "enum": ["metric", "imperial"]}}}}
CONTEXT = [{"role": "user", "content": "What's the weather in Dublin for the next 3 days?"}]
REFERENCE = [{"name": "get_weather", "arguments": {"city": "Dublin", "days": 3}}]
BROKEN = '<tool_call>{"name": "get_weather", "arguments": {"city": "Dublin", "days": 3}</tool_call>'


def _row(raw=BROKEN, valid=False, reference=REFERENCE):
    return row_from_columns(raw, json.dumps([WEATHER]), json.dumps(CONTEXT),
                            json.dumps(reference) if reference is not None else None, valid)


def _terms(completion, row):
    s = score(completion, row)
    return {t: s.term(t) for t in TERMS}


def test_each_term_on_hand_made_completions():
    row = _row()
    exact = '{"name": "get_weather", "arguments": {"city": "Dublin", "days": 3}}'
    assert _terms(exact, row) == {"parses": 1, "tool_name": 1, "schema": 1, "reference_match": 1,
                                  "preserve_valid": None, "grounding": 0, "clean_format": 1}
    # the reader recovers the call from prose and fixes the type: content is paid, the format term is not
    assert _terms('Sure: ```json\n{"name": "get_weather", "arguments": {"city": "Dublin", "days": "3"}}\n```',
                  row) == {"parses": 1, "tool_name": 1, "schema": 1, "reference_match": 1, "preserve_valid": None,
                           "grounding": 0, "clean_format": 0}
    copied = score(BROKEN, row)
    assert copied.copied_invalid and all(not copied.term(t) for t in TERMS)
    assert score("  " + BROKEN.replace(", ", ",") + "\n", row).copied_invalid  # whitespace does not hide a copy
    # valid, but Sydney is in neither the output nor the conversation: one made-up value of two
    invented = _terms('{"name": "get_weather", "arguments": {"city": "Sydney", "days": 3}}', row)
    assert invented["schema"] == 1 and invented["grounding"] == -0.5
    assert invented["reference_match"] == pytest.approx(0.25 + 0.25 + 0.5 * 0.5)
    missing = _terms('{"name": "get_weather", "arguments": {"city": "Dublin"}}', row)
    assert missing["schema"] == 0.75 and missing["tool_name"] == 1  # one schema violation: 0.25 off
    assert missing["reference_match"] == pytest.approx(0.25 + 0.25 * 0.5 + 0.5 * 0.5)
    wrong_tool = _terms('{"name": "get_time", "arguments": {"city": "Dublin", "days": 3}}', row)
    assert wrong_tool["parses"] == 1 and wrong_tool["tool_name"] == 0 and wrong_tool["schema"] == 0
    assert wrong_tool["reference_match"] == 0
    assert _terms("I cannot help with that.", row) == {
        "parses": 0, "tool_name": 0, "schema": 0, "reference_match": 0, "preserve_valid": None, "grounding": 0,
        "clean_format": 0}
    enum = _terms('{"name": "get_weather", "arguments": {"city": "Dublin", "days": 3, "units": "metric"}}', row)
    assert enum["grounding"] == 0  # an enum value comes from the schema, not from nowhere
    assert _terms(exact, _row(reference=None))["reference_match"] is None


def test_a_valid_input_must_come_back_unchanged():
    sent = '{"name": "get_weather", "arguments": "{\\"city\\": \\"Dublin\\", \\"days\\": 3}"}'
    row = _row(raw=sent, valid=True)
    assert score(sent, row).preserve_valid == 0
    assert score('{"name": "get_weather", "arguments": {"city": "Dublin", "days": 3}}', row).preserve_valid == 0
    assert score('{"name": "get_weather", "arguments": {"city": "Dublin", "days": 4}}', row).preserve_valid == -1
    assert score("nothing", row).preserve_valid == -1


def test_trl_reward_functions_take_the_columns_and_log_what_they_saw():
    rows = [_row(), _row(raw=json.dumps(REFERENCE[0]), valid=True)]
    logged = {}
    completions = [[{"role": "assistant", "content": BROKEN}],
                   [{"role": "assistant", "content": '{"name": "get_weather", "arguments": {"city": "Cork", '
                                                     '"days": 3}}'}]]
    columns = {"raw": [r.raw for r in rows], "tools": [json.dumps([WEATHER])] * 2,
               "context": [json.dumps(CONTEXT)] * 2, "reference": [json.dumps(REFERENCE)] * 2,
               "valid": [False, True]}
    out = {name: fn(prompts=[[]] * 2, completions=completions, completion_ids=[[]] * 2, trainer_state=None,
                    log_metric=lambda k, v: logged.__setitem__(k, v), log_extra=None, **columns)
           for name, fn in REWARD_FUNCTIONS.items()}
    assert [fn.__name__ for fn in REWARD_FUNCTIONS.values()] == list(TERMS)  # each shows under its own name
    assert out["parses"] == [0.0, 1.0] and out["preserve_valid"] == [None, -1.0]
    assert out["grounding"] == [0.0, -0.5]
    assert logged == {"copied_invalid": 1.0, "valid_changed": 1.0}


def test_each_completion_of_a_batch_is_scored_as_alone_however_its_groups_repeat():
    # a generation batch as TRL sends it, group after group; a group may hold one completion twice, and the next batch
    # may repeat this one (then each term reads the scores kept of the latest batch)
    answers = [BROKEN, json.dumps(REFERENCE[0]), BROKEN, '{"name": "get_weather", "arguments": {"city": "Cork"}}']
    groups = [(BROKEN, False), (json.dumps(REFERENCE[0]), True)]
    batch = [(raw, valid, answer) for raw, valid in groups for answer in answers]
    columns = {"raw": [raw for raw, _, _ in batch], "tools": [json.dumps([WEATHER])] * len(batch),
               "context": [json.dumps(CONTEXT)] * len(batch), "reference": [json.dumps(REFERENCE)] * len(batch),
               "valid": [valid for _, valid, _ in batch]}
    completions = [[{"role": "assistant", "content": answer}] for _, _, answer in batch]
    for _ in range(2):
        out = {name: fn(completions=completions, **columns) for name, fn in REWARD_FUNCTIONS.items()}
        for n, (raw, valid, answer) in enumerate(batch):
            assert {t: out[t][n] for t in TERMS} == _terms(answer, _row(raw=raw, valid=valid)), (raw, answer)


class _ScriptedJudge(BaseHTTPRequestHandler):
    replies: ClassVar[list] = []
    requests: ClassVar[list] = []

    def content(self, body):  # None: fail
        return type(self).replies.pop(0)

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).requests.append(body)
        content = self.content(body)
        if content is None:
            self.send_response(500)
            self.end_headers()
            return
        reply = json.dumps({"choices": [{"index": 0, "message": {"role": "assistant", "content": content}}]})
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(reply)))
        self.end_headers()
        self.wfile.write(reply.encode())

    def log_message(self, *args):
        pass


def test_llm_judge_against_a_scripted_openai_compatible_server():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _ScriptedJudge)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    _ScriptedJudge.replies, _ScriptedJudge.requests = ["Score: 8", None, "Score: 6"], []
    try:
        judge = LLMJudge(f"http://127.0.0.1:{server.server_address[1]}/v1", "tiny-judge", num_generations=2,
                         workers=1)
        logged = {}
        good = '{"name": "get_weather", "arguments": {"city": "Dublin", "days": 3}}'
        # three prompts, two completions each, as TRL passes a batch; the last prompt has no request to judge by
        scores = judge([good, "no call here", good, good, good, good], raw=[BROKEN] * 6,
                       tools=[json.dumps([WEATHER])] * 6, context=[json.dumps(CONTEXT)] * 4 + [None] * 2,
                       log_metric=lambda k, v: logged.__setitem__(k, v))
    finally:
        server.shutdown()
    assert judge.__name__ == "judge"
    # judged, and no call to judge (0 without asking); the judge failed on one of the group, so it scores none of it
    # (a lone None would cost that completion the judge's weight beside its sibling's 0.6); nothing to judge by
    assert scores == [0.8, 0.0, None, None, None, None]
    assert logged == {"judge_failed": 1 / 3}
    assert len(_ScriptedJudge.requests) == 3
    body = _ScriptedJudge.requests[0]
    assert body["model"] == "tiny-judge" and "Dublin for the next 3 days" in body["messages"][1]["content"]
    assert json.loads(body["messages"][1]["content"].split("Tool call:\n")[1].split("\n\nScore")[0]) == REFERENCE


class _JudgeFailingOnCork(_ScriptedJudge):
    """Fails on a call to Cork, scores any other 8, in whatever order the requests come."""

    def content(self, body):
        return None if "Cork" in body["messages"][1]["content"] else "Score: 8"


JUDGE_IN_A_PROCESS = """
import json, pathlib, sys
from accelerate import PartialState
from tracemill.trainer.judge import LLMJudge

state = PartialState(cpu=True)  # as TRL's trainer starts it on CPU
batch = json.loads(sys.argv[2])[state.process_index]
scores = LLMJudge(sys.argv[1], "judge", num_generations=4, workers=1)(**batch)
pathlib.Path(sys.argv[3], f"{state.process_index}.json").write_text(json.dumps(scores))
state.destroy_process_group()
"""


def test_a_group_split_over_two_processes_is_left_out_on_both_when_the_judge_fails_on_one(tmp_path):
    server = ThreadingHTTPServer(("127.0.0.1", 0), _JudgeFailingOnCork)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    script = tmp_path / "judge_in_a_process.py"
    script.write_text(JUDGE_IN_A_PROCESS)

    def batch(cities):
        return {"completions": [json.dumps({"name": "get_weather", "arguments": {"city": c, "days": 3}})
                                for c in cities],
                "raw": [BROKEN] * 6, "tools": [json.dumps([WEATHER])] * 6, "context": [json.dumps(CONTEXT)] * 6}

    # three groups of four over two processes of six: the middle group is the last two of process 0 and the first two
    # of process 1, where the judge fails on one
    batches = [batch(["Dublin"] * 6), batch(["Cork", *["Dublin"] * 5])]
    try:
        done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                               str(script), f"http://127.0.0.1:{server.server_address[1]}/v1", json.dumps(batches),
                               str(tmp_path)], capture_output=True, text=True, timeout=120)
    finally:
        server.shutdown()
    assert done.returncode == 0, done.stderr[-3000:]
    scores = [json.loads((tmp_path / f"{rank}.json").read_text()) for rank in (0, 1)]
    assert scores == [[0.8] * 4 + [None] * 2, [None] * 2 + [0.8] * 4]


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    cases = fault_cases(0, sources=("bfcl",), max_calls=1)[:40]
    return write_rows(tmp_path_factory.mktemp("rows") / "mined", cases, PromptSettings(max_tools=1))


def _train(tmp_path, toml, *args):
    path = tmp_path / "train.toml"
    path.write_text(toml)
    return CliRunner().invoke(main, ["train", "--config", str(path), *args])


BASE = '[model]\nbase = "/nowhere/no-model"\n[data]\ndataset = "{dataset}"\n'


@pytest.mark.parametrize("extra, message", [
    ("[grpo]\nnum_generation = 4\n", "grpo.num_generation: Extra inputs are not permitted"),
    ("[grpo]\nnum_generations = 3\n", "must be a multiple of num_generations (3)"),
    ("[rewards.weights]\nvibes = 1.0\n", "unknown reward term(s) vibes"),
    ("[rewards.judge]\nenabled = true\n", "an enabled judge needs `url`"),
    ("[model\n", "not valid TOML"),
    ("[grpo]\nnum_generation = 4\nmax_step = 5\n", ("grpo.num_generation: Extra inputs are not permitted; "
                                                   "grpo.max_step: Extra inputs are not permitted")),
])
def test_a_config_error_names_the_field_before_any_model_loads(tmp_path, dataset, extra, message):
    result = _train(tmp_path, BASE.format(dataset=dataset) + extra)
    assert result.exit_code == 1 and message in result.output, result.output
    assert str(tmp_path / "train.toml") in result.output and len(result.output.strip().splitlines()) == 1


def test_an_unusable_dataset_is_refused_with_its_file_and_line(tmp_path, dataset):
    broken = tmp_path / "broken"
    broken.mkdir()
    lines = (dataset / "train.jsonl").read_text().splitlines()
    row = json.loads(lines[1])
    row["tools"] = row["tools"][:-1]
    (broken / "train.jsonl").write_text("\n".join([lines[0], json.dumps(row), *lines[2:]]) + "\n")
    result = _train(tmp_path, BASE.format(dataset=broken))
    assert result.exit_code == 1 and "dataset.json: missing" in result.output
    (broken / "dataset.json").write_text((dataset / "dataset.json").read_text())
    result = _train(tmp_path, BASE.format(dataset=broken))  # not a dry run: it still stops before the model
    assert result.exit_code == 1 and f"{broken / 'train.jsonl'}:2: 'tools' is not JSON" in result.output
    result = _train(tmp_path, BASE.format(dataset=tmp_path / "none"))
    assert result.exit_code == 1 and "no such dataset folder" in result.output


def test_dry_run_prints_the_launch_command_and_resolved_settings(tmp_path, dataset):
    from accelerate.commands.config.config_args import load_config_from_file

    result = _train(tmp_path, BASE.format(dataset=dataset) + "[grpo]\nnum_generations = 4\n", "--dry-run")
    assert result.exit_code == 0, result.output
    first, rest = result.output.split("\n", 1)
    settings = json.loads(rest)
    assert first.endswith(f"-m tracemill.cli train --config {tmp_path / 'train.toml'}") and "accelerate" not in first
    assert settings["dataset"]["train_rows"] == 32 and settings["dataset"]["prompt_settings"]["max_tools"] == 1
    assert settings["grpo"]["num_generations"] == 4 and settings["grpo"]["loss_type"] == "dapo"
    assert settings["grpo"]["beta"] == 0.0 and settings["rewards"]["reference_match"] == 2.0

    multi = BASE.format(dataset=dataset) + (
        '[launch]\nnum_processes = 4\ndeepspeed = "zero3"\n[generation]\nuse_vllm = true\nvllm_mode = "server"\n'
        'vllm_server_base_url = "http://127.0.0.1:8000"\n')
    result = _train(tmp_path, multi.replace("[model]\n", '[model]\nkind = "full"\n'), "--dry-run",
                    "--db", "sqlite:///elsewhere.db")
    assert result.exit_code == 0, result.output
    command = result.output.splitlines()[0]
    assert "accelerate.commands.launch --config_file" in command and "--num_processes 4" in command
    assert command.endswith("--db sqlite:///elsewhere.db --launched")  # each process registers in the same store
    assert "vllm server (start first, on other GPUs): trl vllm-serve --model /nowhere/no-model" in result.output
    shipped = command.split("--config_file ")[1].split()[0]
    zero3 = load_config_from_file(shipped)
    assert zero3.distributed_type == "DEEPSPEED" and zero3.deepspeed_config["zero_stage"] == 3
    settings = json.loads(result.output.split("\n", 2)[2])
    assert settings["grpo"]["use_vllm"] and settings["grpo"]["vllm_mode"] == "server"


def test_models_are_registered_by_version_and_listed(db_url):
    from sqlalchemy.orm import Session

    from tracemill.store.engine import make_engine
    from tracemill.store.migrate import upgrade
    from tracemill.store.tables import DatasetRow
    from tracemill.trainer.registry import NewModel, register_model

    engine = make_engine(db_url)
    upgrade(engine)
    with Session(engine) as session, session.begin():
        session.add(DatasetRow(name="mined", path="/data/mined", content_hash="ab" * 32, filters={}, train_rows=10,
                               eval_rows=2, card={}))
    evaluation = {"eval": {"cases": 8, "broken_cases": 4,
                           "rules": {"ok_rate": 0.5, "reference_match": 0.5, "valid_changed": 0.0},
                           "model": {"ok_rate": 0.75, "reference_match": 0.625, "valid_changed": 0.0}}}
    first = register_model(engine, NewModel("tiny", "lora", "/runs/a/model", "ab" * 32, {"grpo": {}}, {}, evaluation))
    second = register_model(engine, NewModel("tiny", "full", "/runs/b/model", "cd" * 32, {}, {}, {}))
    assert (first.name, second.name) == ("reviser-0001", "reviser-0002")
    assert first.dataset_id is not None and second.dataset_id is None
    result = CliRunner().invoke(main, ["models", "list", "--db", db_url])
    assert result.exit_code == 0, result.output
    line = next(li for li in result.output.splitlines() if "reviser-0001" in li)
    assert "75.0% | 50.0%" in line and "62.5% | 50.0%" in line
    listed = json.loads(CliRunner().invoke(main, ["models", "list", "--db", db_url, "--json"]).output)
    assert [m["name"] for m in listed] == ["reviser-0001", "reviser-0002"] and listed[0]["path"] == "/runs/a/model"
    engine.dispose()


def test_sampled_cases_are_many_calls_to_few_small_tools():
    from tracemill.tools import tool_index
    from tracemill.verify import verify

    cases = sampled_cases(300, seed=3)
    names = {c.reference[0].name for c in cases}
    assert len(cases) == 300 and 2 < len(names) <= 12
    assert len({json.dumps(c.reference[0].arguments, sort_keys=True) for c in cases}) > 150  # the values vary
    assert all(verify(c.reference[0], tool_index(c.tools)).ok for c in cases)
    assert 0.2 < sum(bool(c.faults) for c in cases) / 300 < 0.8
    assert sampled_cases(300, seed=3) == cases
