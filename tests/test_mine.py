"""`tracemill mine` on corpora `tracemill simulate` sent through a real collector, on SQLite and PostgreSQL: the
exported failed calls are the injected faults, every silver reference is the call the simulated agent meant, the
export loads with `datasets`, is the same twice, never splits a trace, and bad input or an interrupted run leaves
nothing half-written."""

from __future__ import annotations

import gc
import itertools
import json
import os
import threading
from collections import Counter
from pathlib import Path

import httpx
import pytest
from click.testing import CliRunner
from sim_truth import simulated_outputs
from sqlalchemy import func, insert, select

from tracemill.cli import main
from tracemill.faults import PROFILES, Profile
from tracemill.miner.export import MineOptions, mine
from tracemill.miner.failures import failure_modes
from tracemill.simulate import simulate
from tracemill.store.engine import make_engine
from tracemill.store.queries import CallFilter
from tracemill.store.tables import DatasetRow, ReviewRow, ToolCallRow
from tracemill.suites import read_cases

from support import chat_attributes, export_request, make_span

pytestmark = pytest.mark.timeout(240)

START_NS = 1_780_000_000_000_000_000


def _mine(db_url: str, out: Path, *args: str) -> dict:
    done = CliRunner().invoke(main, ["mine", "--db", db_url, "--out", str(out), "--json", *args])
    assert done.exit_code == 0, done.output
    return json.loads(done.output)


def _rows(out: Path, split: str | None = None) -> list[dict]:
    return [json.loads(line) for s in ([split] if split else ["train", "eval"])
            for line in (out / f"{s}.jsonl").read_text().splitlines()]


def _span_of_call(db_url: str) -> dict[int, tuple[str, str]]:
    engine = make_engine(db_url)
    with engine.connect() as conn:
        found = {r.id: (r.trace_id, r.span_id) for r in conn.execute(
            select(ToolCallRow.id, ToolCallRow.trace_id, ToolCallRow.span_id))}
    engine.dispose()
    return found


def test_exported_failures_are_the_injected_faults_and_silver_is_what_was_meant(start_collector, db_url: str,
                                                                               tmp_path: Path) -> None:
    collector = start_collector(db_url)
    simulate(collector.url, traces=300, seed=5, profile="llama3.1-8b", start_ns=START_NS)
    card = _mine(db_url, tmp_path / "ds")
    rows = _rows(tmp_path / "ds")
    outputs = simulated_outputs(db_url)
    span_of = _span_of_call(db_url)

    exported = {span_of[r["call_id"]] for r in rows if not r["valid"]}
    injected = {key for key, o in outputs.items() if o.injected}
    hits = len(exported & injected)
    assert hits / len(exported) >= 0.99 and hits / len(injected) >= 0.99, (len(exported), len(injected), hits)

    silver = [r for r in rows if r["provenance"] == "silver"]
    assert len(silver) > 50
    for row in silver:
        intended = outputs[span_of[row["call_id"]]].intended
        assert all(call in intended for call in json.loads(row["reference"])), row
    assert card["counts"]["provenance"]["bronze"] > 50
    assert 0.15 < card["counts"]["failure_class"]["valid"] / card["counts"]["rows"] < 0.25

    # the repairs are in the store too: each silver repair names the failed call it repaired
    engine = make_engine(db_url)
    with engine.connect() as conn:
        linked = conn.execute(select(ToolCallRow.repairs_id, ToolCallRow.stage, ToolCallRow.execution_status)
                              .where(ToolCallRow.repairs_id.is_not(None))).all()
        failed = set(conn.execute(select(ToolCallRow.id).where(ToolCallRow.stage.is_not(None))).scalars())
    engine.dispose()
    assert len(linked) == card["repairs_linked"] >= len({r["id"] for r in silver}) * 0.5
    assert all(stage is None and status != "error" for _, stage, status in linked)
    silver_ids = {int(r["id"]) for r in silver}
    assert silver_ids & {f for f, _, _ in linked} and {f for f, _, _ in linked} <= failed | {
        int(r["id"]) for r in rows if r["failure_class"].startswith("execution")} | silver_ids


RANKED = Profile("ranked", {"python_tag": 0.12, "number_as_string": 0.25, "tool_name_case": 0.05,
                            "missing_required": 0.02})
MODE_OF_KIND = {"python_tag": "parse · invalid_json", "tool_name_case": "tool_name · unknown_tool",
                "number_as_string": "schema · wrong_type", "missing_required": "schema · missing_required"}
PRECEDENCE = ("python_tag", "tool_name_case", "missing_required", "number_as_string")  # the verifier's stage order


def test_failures_rank_the_injected_modes_in_the_order_of_their_rates(start_collector, db_url: str,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(PROFILES, "ranked", RANKED)
    collector = start_collector(db_url)
    simulate(collector.url, traces=400, seed=2, profile="ranked", start_ns=START_NS, tool_error_rate=0.01)
    injected: Counter[str] = Counter()
    for output in simulated_outputs(db_url).values():
        first = next((k for k in PRECEDENCE if k in output.faults), None)
        if first is not None:
            injected[MODE_OF_KIND[first]] += 1
    engine = make_engine(db_url)
    found = {m.label: m.count for m in failure_modes(engine, by=("stage", "kind"))}
    engine.dispose()
    expected_order = [mode for mode, _ in injected.most_common()]
    assert [mode for mode in sorted(found, key=lambda m: -found[m]) if mode in injected] == expected_order
    for mode, count in injected.items():
        assert abs(found[mode] - count) <= max(3, 0.05 * count), (mode, found[mode], count)


def test_the_export_loads_with_datasets_is_deterministic_and_never_splits_a_trace(start_collector, db_url: str,
                                                                                tmp_path: Path, monkeypatch) -> None:
    from datasets import load_dataset

    from tracemill.miner.part import _Conversations

    collector = start_collector(db_url)
    simulate(collector.url, traces=120, seed=9, profile="gemma3-27b", start_ns=START_NS)
    first = _mine(db_url, tmp_path / "a", "--eval-share", "0.3", "--workers", "1")
    second = _mine(db_url, tmp_path / "b", "--eval-share", "0.3", "--workers", "3")  # another split of the work
    monkeypatch.setattr(_Conversations, "CHARS", 1)  # conversations read one call at a time, as very long ones are
    third = _mine(db_url, tmp_path / "c", "--eval-share", "0.3", "--workers", "1")
    assert first["content_hash"] == second["content_hash"] == third["content_hash"]
    for name in ("train.jsonl", "eval.jsonl", "train.parquet", "eval.parquet"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "c" / name).read_bytes()

    train, evaluation = _rows(tmp_path / "a", "train"), _rows(tmp_path / "a", "eval")
    assert train and evaluation
    assert not {r["trace_id"] for r in train} & {r["trace_id"] for r in evaluation}
    assert len({r["id"] for r in train + evaluation}) == len(train) + len(evaluation)

    files = {s: str(tmp_path / "a" / f"{s}.jsonl") for s in ("train", "eval")}
    loaded = load_dataset("json", data_files=files)
    parquet = load_dataset("parquet", data_files={s: f.replace(".jsonl", ".parquet") for s, f in files.items()})
    for data in (loaded, parquet):
        assert data["train"].num_rows == len(train) and data["eval"].num_rows == len(evaluation)
        prompt = data["train"][0]["prompt"]
        assert [m["role"] for m in prompt] == ["system", "user"] and "<output>" in prompt[1]["content"]
    assert loaded["train"].column_names == parquet["train"].column_names
    assert first["prompt_settings"]["max_tools"] == 4

    cases = read_cases(tmp_path / "a" / "eval.jsonl")  # an eval split is a case file for `tracemill eval`
    assert len(cases) == len(evaluation) and all(c.tools for c in cases)
    done = CliRunner().invoke(main, ["eval", "--cases", files["eval"], "--reviser", "rules", "--json"])
    assert done.exit_code == 0 and json.loads(done.output)["cases"] == len(evaluation)

    later = _mine(db_url, tmp_path / "d", "--eval-after", "2000-01-01")  # every trace began after it: all eval
    assert later["splits"]["train"]["rows"] == 0 and later["splits"]["eval"]["rows"] > 0


@pytest.mark.postgres
def test_the_same_traffic_exports_the_same_rows_from_sqlite_and_postgresql(start_collector, sqlite_url: str,
                                                                          postgres_url: str, tmp_path: Path) -> None:
    # PostgreSQL's JSONB sorts an object's keys: stored so, a tool's parameters would reach the reviser's prompt in
    # another order than the agent's model was shown them, and than the sidecar shows them at serving time
    exports = []
    for n, url in enumerate((sqlite_url, postgres_url)):
        collector = start_collector(url)
        simulate(collector.url, traces=80, seed=4, profile="llama3.1-8b", start_ns=START_NS)
        _mine(url, tmp_path / f"ds{n}", "--workers", "1")
        exports.append([{k: v for k, v in r.items() if k not in ("id", "call_id", "created_at")}
                        for r in _rows(tmp_path / f"ds{n}")])
    from_sqlite, from_postgresql = exports
    assert len(from_sqlite) > 50
    assert from_postgresql == from_sqlite  # the prompt and the JSON columns are text: key order counts

    offered = {t["name"]: list(t["inputSchema"].get("properties", {})) for r in from_sqlite
               for t in json.loads(r["tools"])}
    assert any(order != sorted(order, key=lambda k: (len(k), k)) for order in offered.values())  # not JSONB's order


@pytest.mark.postgres
def test_a_conversation_sent_as_structured_values_exports_the_same_from_sqlite_and_postgresql(
        start_collector, sqlite_url: str, postgres_url: str, tmp_path: Path) -> None:
    # OTLP attributes and log records can hold maps: an instrumentation may send the messages so, not as JSON text.
    # The arguments of a call in the history reach the prompt as text, in the order the model wrote them.
    history = [
        {"role": "user", "parts": [{"type": "text", "content": "Weather in Paris, in celsius?"}]},
        {"role": "assistant", "parts": [{"type": "tool_call", "id": "c0", "name": "get_weather",
                                         "arguments": {"units": "celsius", "city": "Paris"}}]},
        {"role": "tool", "parts": [{"type": "tool_call_response", "id": "c0",
                                    "response": {"temp": 21, "sky": "clear"}}]},
    ]
    chat = chat_attributes([{"id": "c1", "name": "get_weather", "arguments": {"city": 7}}])  # city must be a string
    chat["gen_ai.input.messages"] = history
    body = export_request([make_span("ab" * 16, "cd" * 8, "chat", chat)])
    exported = []
    for n, url in enumerate((sqlite_url, postgres_url)):
        collector = start_collector(url)
        assert httpx.post(f"{collector.url}/v1/traces", content=body,
                          headers={"Content-Type": "application/x-protobuf"}).status_code == 200
        _mine(url, tmp_path / f"ds{n}", "--eval-share", "0")
        [row] = _rows(tmp_path / f"ds{n}")
        exported.append({k: v for k, v in row.items() if k != "created_at"})
    from_sqlite, from_postgresql = exported
    assert 'assistant: get_weather({"units":"celsius","city":"Paris"})' in from_sqlite["prompt"][1]["content"]
    assert json.loads(from_sqlite["context"]) == history
    assert from_postgresql == from_sqlite


# one conversation (a request, the assistant's call, the tool's answer) flattened into one attribute per value
FLATTENED = {
    "openllmetry": {"gen_ai.prompt.0.role": "user", "gen_ai.prompt.0.content": json.dumps(  # parts, as JSON text
                        [{"type": "text", "text": "Weather in Paris, in celsius?"},
                         {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}]),
                    "gen_ai.prompt.1.role": "assistant", "gen_ai.prompt.1.tool_calls.0.id": "c0",
                    "gen_ai.prompt.1.tool_calls.0.name": "get_weather",
                    "gen_ai.prompt.1.tool_calls.0.arguments": '{"units":"celsius","city":"Paris"}',
                    "gen_ai.prompt.2.role": "tool", "gen_ai.prompt.2.tool_call_id": "c0",
                    "gen_ai.prompt.2.content": '{"temp":21,"sky":"clear"}'},
    "openinference": {"llm.input_messages.0.message.role": "user",  # its text and an image, as a list of parts
                      "llm.input_messages.0.message.contents.0.message_content.type": "text",
                      "llm.input_messages.0.message.contents.0.message_content.text": "Weather in Paris, in celsius?",
                      "llm.input_messages.0.message.contents.1.message_content.type": "image",
                      "llm.input_messages.0.message.contents.1.message_content.image.image.url": "data:image/png;"
                                                                                                 "base64,iVBORw0KGgo=",
                      "llm.input_messages.1.message.role": "assistant",
                      "llm.input_messages.1.message.tool_calls.0.tool_call.function.name": "get_weather",
                      "llm.input_messages.1.message.tool_calls.0.tool_call.function.arguments":
                          '{"units":"celsius","city":"Paris"}',
                      "llm.input_messages.2.message.role": "tool",
                      "llm.input_messages.2.message.content": '{"temp":21,"sky":"clear"}'},
}


@pytest.mark.parametrize("convention", FLATTENED)
def test_a_conversation_flattened_into_attributes_is_mined_with_every_turn(start_collector, sqlite_url: str,
                                                                          tmp_path: Path, convention: str) -> None:
    """The earlier OpenLLMetry and OpenInference send a model call's messages one attribute per value: the row's prompt
    shows the request, the assistant's call and the tool's answer, as from GenAI's messages."""
    chat = chat_attributes([{"id": "c1", "name": "get_weather", "arguments": {"city": 7}}])  # city must be a string
    del chat["gen_ai.input.messages"]
    collector = start_collector(sqlite_url)
    body = export_request([make_span("ab" * 16, "cd" * 8, "chat", {**chat, **FLATTENED[convention]})])
    assert httpx.post(f"{collector.url}/v1/traces", content=body,
                      headers={"Content-Type": "application/x-protobuf"}).status_code == 200
    _mine(sqlite_url, tmp_path / "ds", "--eval-share", "0")
    [row] = _rows(tmp_path / "ds")
    assert ("<conversation>\nuser: Weather in Paris, in celsius? [image]\n"
            'assistant: get_weather({"units":"celsius","city":"Paris"})\n'
            'tool: {"temp":21,"sky":"clear"}\n</conversation>') in row["prompt"][1]["content"]


def test_since_last_mines_only_what_is_new_and_gold_comes_from_reviews(start_collector, sqlite_url: str,
                                                                       tmp_path: Path) -> None:
    collector = start_collector(sqlite_url)
    simulate(collector.url, traces=60, seed=1, start_ns=START_NS)
    first = _mine(sqlite_url, tmp_path / "one")
    engine = make_engine(sqlite_url)
    with engine.begin() as conn:
        failed = conn.execute(select(ToolCallRow.id).where(ToolCallRow.stage.is_not(None))
                              .order_by(ToolCallRow.id.desc()).limit(1)).scalar_one()
    simulate(collector.url, traces=60, seed=2, start_ns=START_NS)
    approved = {"name": "Reviewed:tool", "arguments": {"checked": True}}
    with engine.begin() as conn:
        newest = conn.execute(select(ToolCallRow.id).where(ToolCallRow.stage.is_not(None))
                              .order_by(ToolCallRow.id.desc()).limit(1)).scalar_one()
        conn.execute(insert(ReviewRow).values(call_id=newest, reviewer="ana", decision="edit", before=None,
                                              after=approved))
    # an export of other calls in between (another model's, stored later): it read past calls the next
    # `--since last` has not exported yet
    simulate(collector.url, traces=20, seed=3, start_ns=START_NS, profile="qwen3")
    _mine(sqlite_url, tmp_path / "qwen", "--model", "qwen3", "--since", "last")
    second = _mine(sqlite_url, tmp_path / "two", "--since", "last")
    rows = _rows(tmp_path / "two")
    assert rows and all(r["call_id"] > first["last_call_id"] for r in rows) and failed <= first["last_call_id"]
    gold = [r for r in rows if r["provenance"] == "gold"]
    assert [(r["call_id"], json.loads(r["reference"])) for r in gold] == [(newest, [approved])]
    with engine.connect() as conn:
        recorded = conn.execute(select(DatasetRow.name, DatasetRow.last_call_id, DatasetRow.train_rows,
                                       DatasetRow.content_hash).order_by(DatasetRow.id)).all()
    engine.dispose()
    assert [r.name for r in recorded] == ["one", "qwen", "two"]
    assert recorded[2].last_call_id == second["last_call_id"] > first["last_call_id"]
    assert recorded[2].content_hash == second["content_hash"]


@pytest.mark.postgres
def test_since_last_misses_no_call_whose_transaction_commits_after_a_newer_one(start_collector, postgres_url: str,
                                                                                tmp_path: Path) -> None:
    """PostgreSQL draws ids before commit: a call with a lower id can become visible after a read saw a higher one.
    An export waits for the inserts in progress, so that it and the next `--since last` see every call."""
    collector = start_collector(postgres_url)
    simulate(collector.url, traces=20, seed=3, start_ns=START_NS)
    engine = make_engine(postgres_url)
    calls = ToolCallRow.__table__
    with engine.connect() as conn:
        failed = conn.execute(select(calls).where(calls.c.stage.is_not(None)).limit(1)).mappings().one()
    slow = engine.connect()
    slow.begin()
    held = slow.execute(insert(calls).values({**{k: v for k, v in failed.items() if k != "id"}, "call_index": 99,
                                                     "raw": failed["raw"] + " (held)"})
                        .returning(calls.c.id)).scalar_one()  # an insert whose transaction is still open
    simulate(collector.url, traces=20, seed=4, start_ns=START_NS)  # newer ids, committed first
    with engine.connect() as conn:
        assert conn.execute(select(func.max(calls.c.id))).scalar_one() > held
    later = threading.Timer(2.0, slow.commit)
    later.start()
    try:
        first = _mine(postgres_url, tmp_path / "one")
    finally:
        later.join()
        slow.close()
    second = _mine(postgres_url, tmp_path / "two", "--since", "last")
    exported = [r["call_id"] for r in _rows(tmp_path / "one") + _rows(tmp_path / "two")]
    engine.dispose()
    assert held in exported and len(exported) == len(set(exported))
    assert second["last_call_id"] == first["last_call_id"] >= held


def test_since_last_exports_a_call_read_as_valid_whose_execution_failed_after_the_export(
        start_collector, db_url: str, tmp_path: Path) -> None:
    """The agent's call (valid as sent) is stored and exported before its tool's execute_tool span arrives: no row
    (valid calls are not sampled here). The execution then fails: the next `--since last` exports the call as failed,
    though no call is newer, and the one after that does not export it again."""
    collector = start_collector(db_url)

    def send(*spans) -> None:  # type: ignore[no-untyped-def]
        assert httpx.post(f"{collector.url}/v1/traces", content=export_request(list(spans)),
                          headers={"Content-Type": "application/x-protobuf"}).status_code == 200

    ran = {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "get_weather", "gen_ai.tool.call.id": "w1",
           "error.type": "upstream_error"}
    send(make_span("a1" * 16, "cd" * 8, "chat", chat_attributes([{"id": "w1", "name": "get_weather",
                                                                  "arguments": {"city": "Oslo"}}])),
         make_span("b2" * 16, "cd" * 8, "chat", chat_attributes([{"id": "w2", "name": "get_weather",
                                                                  "arguments": {"city": 7}}])))  # a string
    first = _mine(db_url, tmp_path / "one", "--valid-share", "0", "--eval-share", "0")
    assert [r["trace_id"] for r in _rows(tmp_path / "one")] == ["b2" * 16]
    send(make_span("a1" * 16, "ef" * 8, "execute_tool get_weather", ran, parent="cd" * 8, status_code=2))
    second = _mine(db_url, tmp_path / "two", "--valid-share", "0", "--eval-share", "0", "--since", "last",
                   "--workers", "2")
    [row] = _rows(tmp_path / "two")
    assert (row["trace_id"], row["valid"], row["failure_class"]) == ("a1" * 16, False, "execution:upstream_error")
    assert second["last_call_id"] == first["last_call_id"] and second["last_execution_id"] > 0
    third = _mine(db_url, tmp_path / "three", "--valid-share", "0", "--eval-share", "0", "--since", "last")
    assert _rows(tmp_path / "three") == [] and third["last_execution_id"] == second["last_execution_id"]


def test_an_execution_that_fails_while_an_export_runs_puts_its_call_in_the_next_export_only(
        start_collector, db_url: str, tmp_path: Path) -> None:
    """An export counts the executions stored when it began: one that arrives while it reads (before it reaches the
    call's page) leaves the call as not run yet in this export, and the next `--since last` exports it as failed;
    read as failed by both, it would be trained on twice."""
    collector = start_collector(db_url)

    def send(*spans) -> None:  # type: ignore[no-untyped-def]
        assert httpx.post(f"{collector.url}/v1/traces", content=export_request(list(spans)),
                          headers={"Content-Type": "application/x-protobuf"}).status_code == 200

    send(make_span("b2" * 16, "cd" * 8, "chat", chat_attributes([{"id": "w2", "name": "get_weather",
                                                                  "arguments": {"city": 7}}])))  # a string
    send(make_span("a1" * 16, "cd" * 8, "chat", chat_attributes([{"id": "w1", "name": "get_weather",
                                                                  "arguments": {"city": "Oslo"}}])))
    ran = {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "get_weather", "gen_ai.tool.call.id": "w1",
           "error.type": "upstream_error"}
    arrived = []

    def between_pages(calls: int) -> None:  # after the first page (b2's call), before the second (a1's)
        if not arrived:
            arrived.append(calls)
            send(make_span("a1" * 16, "ef" * 8, "execute_tool get_weather", ran, parent="cd" * 8, status_code=2))

    engine = make_engine(db_url)
    first = mine(engine, tmp_path / "one", MineOptions(valid_share=0, eval_share=0, batch=1), between_pages)
    engine.dispose()
    assert arrived == [1] and first.card["last_execution_id"] == 0
    assert [r["trace_id"] for r in _rows(tmp_path / "one")] == ["b2" * 16]
    _mine(db_url, tmp_path / "two", "--valid-share", "0", "--eval-share", "0", "--since", "last")
    [row] = _rows(tmp_path / "two")
    assert (row["trace_id"], row["failure_class"]) == ("a1" * 16, "execution:upstream_error")


def test_an_export_that_reads_up_to_an_id_is_followed_by_since_last_from_that_id(start_collector, sqlite_url: str,
                                                                                   tmp_path: Path) -> None:
    """A caller that bounds the read (the cycle passes the newest committed id it decided on) records that bound as
    what the export read, not a newer call stored meanwhile: the next `--since last` starts there and misses none."""
    collector = start_collector(sqlite_url)
    spans = [make_span(f"{n + 1:032x}", "cd" * 8, "chat", chat_attributes(
        [{"id": f"w{n}", "name": "get_weather", "arguments": {"city": n}}]), start_ns=START_NS + n) for n in range(4)]
    assert httpx.post(f"{collector.url}/v1/traces", content=export_request(spans),
                      headers={"Content-Type": "application/x-protobuf"}).status_code == 200
    engine = make_engine(sqlite_url)
    with engine.connect() as conn:
        ids = list(conn.execute(select(ToolCallRow.id).order_by(ToolCallRow.id)).scalars())
    first = mine(engine, tmp_path / "one", MineOptions(where=CallFilter(up_to_id=ids[1]), eval_share=0))
    engine.dispose()
    assert first.card["last_call_id"] == ids[1] and [r["call_id"] for r in _rows(tmp_path / "one")] == ids[:2]
    _mine(sqlite_url, tmp_path / "two", "--since", "last", "--eval-share", "0")
    assert [r["call_id"] for r in _rows(tmp_path / "two")] == ids[2:]


def test_a_call_whose_conversation_runs_to_megabytes_is_exported(start_collector, sqlite_url: str,
                                                                   tmp_path: Path) -> None:
    import pyarrow.parquet as pq

    collector = start_collector(sqlite_url)
    chat = chat_attributes([{"id": "c1", "name": "get_weather", "arguments": {"city": 7}}])  # city must be a string
    said = "Weather in Lisbon? Here is the whole report I was sent: " + "sunny and mild; " * 150_000  # 2.4 MB
    chat["gen_ai.input.messages"] = json.dumps([{"role": "user", "parts": [{"type": "text", "content": said}]}])
    body = export_request([make_span("ab" * 16, "cd" * 8, "chat", chat)])
    assert httpx.post(f"{collector.url}/v1/traces", content=body,
                      headers={"Content-Type": "application/x-protobuf"}).status_code == 200
    _mine(sqlite_url, tmp_path / "big", "--eval-share", "0")
    [row] = _rows(tmp_path / "big")
    assert row["valid"] is False and json.loads(row["context"])[0]["parts"][0]["content"] == said
    assert row["context"] == chat["gen_ai.input.messages"]  # as the agent sent it, not decoded and encoded again
    assert len(row["prompt"][1]["content"]) < 10_000  # the prompt keeps the newest part of it, to its budget
    table = pq.read_table(tmp_path / "big" / "train.parquet")
    assert table.num_rows == 1 and table.column("context")[0].as_py() == row["context"]


def test_rows_whose_prompts_differ_only_in_whitespace_are_exported_once(start_collector, sqlite_url: str,
                                                                         tmp_path: Path) -> None:
    collector = start_collector(sqlite_url)
    report = "Sunny, then rain from the west. " * 100  # a line of 3.2 KB: a long line is normalised too
    requests = {"a1": "Weather in Lisbon, please?", "b2": "Weather  in\n  Lisbon,\tplease? ",  # a1's, spaced out
                "c3": f"Weather in Porto? {report}", "d4": f"Weather in Porto?  {report.replace('. ', '.   ')}"}
    for n, (trace, said) in enumerate(requests.items()):
        chat = chat_attributes([{"id": "c1", "name": "get_weather", "arguments": {"city": 7}}])  # city: a string
        chat["gen_ai.input.messages"] = json.dumps([{"role": "user", "parts": [{"type": "text", "content": said}]}])
        body = export_request([make_span(trace * 16, "cd" * 8, "chat", chat, start_ns=START_NS + n)])
        assert httpx.post(f"{collector.url}/v1/traces", content=body,
                          headers={"Content-Type": "application/x-protobuf"}).status_code == 200
    for workers in ("1", "3"):  # one part, or a1 and b2 in two parts (the merge drops the repeat)
        card = _mine(sqlite_url, tmp_path / workers, "--eval-share", "0", "--workers", workers)
        rows = _rows(tmp_path / workers)
        assert [r["trace_id"] for r in rows] == ["a1" * 16, "c3" * 16]  # b2's prompt is a1's but for whitespace
        assert card["duplicates_dropped"] == 2 and "Lisbon, please?" in rows[0]["prompt"][1]["content"]


def test_an_eval_row_whose_prompt_a_train_row_has_is_dropped_from_the_files_as_the_card_says(
        start_collector, sqlite_url: str, tmp_path: Path) -> None:
    """a1 (train) and b2 (eval, by --eval-after) make the same prompt. The train row is kept, the eval row dropped,
    in the files as in the card, with one part or several."""
    import pyarrow.parquet as pq

    collector = start_collector(sqlite_url)
    for trace, day in (("a1", 0), ("b2", 2), ("c3", 2)):
        chat = chat_attributes([{"id": "c1", "name": "get_weather", "arguments": {"city": 7}}])
        said = "Weather in Porto?" if trace == "c3" else "Weather in Lisbon?"
        chat["gen_ai.input.messages"] = json.dumps([{"role": "user", "parts": [{"type": "text", "content": said}]}])
        body = export_request([make_span(trace * 16, "cd" * 8, "chat", chat, start_ns=START_NS + day * 86_400 * 10**9)])
        assert httpx.post(f"{collector.url}/v1/traces", content=body,
                          headers={"Content-Type": "application/x-protobuf"}).status_code == 200
    hashes = set()
    for workers in ("1", "3"):
        out = tmp_path / workers
        card = _mine(sqlite_url, out, "--eval-after", "2026-05-30", "--workers", workers)
        assert [r["trace_id"] for r in _rows(out, "train")] == ["a1" * 16]
        assert [r["trace_id"] for r in _rows(out, "eval")] == ["c3" * 16]
        assert pq.read_table(out / "eval.parquet").column("trace_id").to_pylist() == ["c3" * 16]
        assert card["splits"]["eval"]["rows"] == 1 and card["duplicates_dropped"] == 1
        hashes.add(card["content_hash"])
    assert len(hashes) == 1


def test_a_trace_that_began_before_eval_after_stays_train_when_its_later_calls_are_mined_since_last(
        start_collector, sqlite_url: str, tmp_path: Path) -> None:
    """a1's first call (day 0) is exported to train; its next call (day 2, after --eval-after) is mined by the next
    `--since last`, which reads only the new calls: it must go where its trace went, not leak a train trace to eval."""
    collector = start_collector(sqlite_url)

    def send(trace: str, span: str, city: int, day: int) -> None:
        chat = chat_attributes([{"id": f"c{city}", "name": "get_weather", "arguments": {"city": city}}])
        body = export_request([make_span(trace * 16, span * 8, "chat", chat, start_ns=START_NS + day * 86_400 * 10**9)])
        assert httpx.post(f"{collector.url}/v1/traces", content=body,
                          headers={"Content-Type": "application/x-protobuf"}).status_code == 200

    send("a1", "cd", 7, 0)
    _mine(sqlite_url, tmp_path / "one", "--eval-after", "2026-05-30")
    assert [r["trace_id"] for r in _rows(tmp_path / "one", "train")] == ["a1" * 16]
    send("a1", "ef", 8, 2)
    send("b2", "cd", 9, 2)
    _mine(sqlite_url, tmp_path / "two", "--eval-after", "2026-05-30", "--since", "last", "--workers", "2")
    assert [r["trace_id"] for r in _rows(tmp_path / "two", "train")] == ["a1" * 16]
    assert [r["trace_id"] for r in _rows(tmp_path / "two", "eval")] == ["b2" * 16]


def test_valid_rows_are_the_share_asked_for_when_some_failed_calls_have_no_known_tools(
        start_collector, sqlite_url: str, tmp_path: Path) -> None:
    """100 failed calls with their tools, 100 broken ones from spans that list no tools (no row can be made of
    them), 1,000 valid calls: a fifth of the rows are valid ones, as asked, not a third."""
    collector = start_collector(sqlite_url)
    plan = [(False, True)] * 100 + [(False, False)] * 100 + [(True, True)] * 1000  # (valid, tools listed)
    spans = []
    for n, (valid, tools) in enumerate(plan):
        arguments = {"city": f"Oslo {n}"} if valid else f'{{"city": "Paris {n}"'  # each its own prompt
        attributes = chat_attributes([{"id": f"call_{n:012d}", "name": "get_weather", "arguments": arguments}])
        if not tools:
            del attributes["gen_ai.tool.definitions"]
        spans.append(make_span(f"{n + 1:032x}", "cd" * 8, "chat", attributes, start_ns=START_NS + n))
    for start in range(0, len(spans), 200):
        assert httpx.post(f"{collector.url}/v1/traces", content=export_request(spans[start:start + 200]),
                          headers={"Content-Type": "application/x-protobuf"}).status_code == 200
    card = _mine(sqlite_url, tmp_path / "out", "--eval-share", "0")
    assert card["no_tools_known"] == 100
    assert 0.15 < card["counts"]["failure_class"]["valid"] / card["counts"]["rows"] < 0.25


def test_bad_input_gets_one_line_naming_it(start_collector, sqlite_url: str, tmp_path: Path) -> None:
    collector = start_collector(sqlite_url)
    simulate(collector.url, traces=10, seed=1, start_ns=START_NS)
    runner = CliRunner()
    unknown = runner.invoke(main, ["mine", "--db", sqlite_url, "--out", str(tmp_path / "x"), "--model", "gpt-9"])
    assert unknown.exit_code == 1 and "no stored call has model 'gpt-9'" in unknown.output
    garbage = tmp_path / "garbage.db"
    garbage.write_text("not a database\n" * 100)
    unreadable = runner.invoke(main, ["mine", "--db", f"sqlite:///{garbage}", "--out", str(tmp_path / "y")])
    assert unreadable.exit_code == 1 and "cannot read the store" in unreadable.output
    assert len(unreadable.output.strip().splitlines()) == 1
    taken = tmp_path / "notes"
    taken.mkdir()
    (taken / "todo.txt").write_text("mine")
    refused = runner.invoke(main, ["mine", "--db", sqlite_url, "--out", str(taken)])
    assert refused.exit_code == 1 and f"{taken} exists and is not a Tracemill export" in refused.output
    assert (taken / "todo.txt").read_text() == "mine" and not (tmp_path / "x").exists()


def test_an_interrupted_run_leaves_no_export_and_keeps_the_previous_one(start_collector, sqlite_url: str,
                                                                       tmp_path: Path) -> None:
    collector = start_collector(sqlite_url)
    simulate(collector.url, traces=80, seed=4, start_ns=START_NS)
    engine = make_engine(sqlite_url)
    out = tmp_path / "ds"

    def interrupt(_: int) -> None:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        mine(engine, out, MineOptions(batch=50), progress=interrupt)
    assert not out.exists() and not [p for p in tmp_path.iterdir() if p.name.startswith(".ds")]
    assert gc.isenabled() and gc.get_freeze_count() == 0  # the caller's process gets its cyclic collector back
    (tmp_path / ".ds.partial-killed").mkdir()  # what a run killed outright leaves: the next run clears it
    done = mine(engine, out, MineOptions())
    assert not (tmp_path / ".ds.partial-killed").exists()
    assert gc.isenabled() and gc.get_freeze_count() == 0
    gc.freeze()  # a caller's own frozen objects (a server's, before it forks) stay frozen
    try:
        with pytest.raises(KeyboardInterrupt):
            mine(engine, tmp_path / "frozen", MineOptions(batch=50), progress=interrupt)
        assert gc.get_freeze_count() > 0
    finally:
        gc.unfreeze()
    before = (out / "train.jsonl").read_bytes()
    with pytest.raises(KeyboardInterrupt):
        mine(engine, out, MineOptions(batch=50, seed=1), progress=interrupt)
    assert (out / "train.jsonl").read_bytes() == before and json.loads((out / "dataset.json").read_text())[
        "content_hash"] == done.card["content_hash"]
    aside = tmp_path / ".ds.old-killed"  # a swap by two renames (where two folders cannot be swapped at once) killed
    aside.mkdir()  # between them: the earlier export moved aside, nothing yet in its place
    os.replace(out, aside / "export")
    with pytest.raises(KeyboardInterrupt):
        mine(engine, out, MineOptions(batch=50, seed=1), progress=interrupt)
    assert (out / "train.jsonl").read_bytes() == before and not aside.exists()
    with engine.connect() as conn:
        assert conn.execute(select(DatasetRow.id)).scalars().all() == [done.dataset_id]
    engine.dispose()


def test_the_merge_copies_part_files_without_holding_them_in_memory(tmp_path: Path) -> None:
    """A split's first part, kept whole, becomes the file and the next parts are appended to it by the kernel: a
    part of a million-call export is gigabytes, which a copy through Python held whole (copy_file_range refuses a file
    opened to append, and the fallback read each kept range at once)."""
    import tracemalloc

    from tracemill.miner.export import _copy_lines
    from tracemill.miner.part import part_files

    pad = b"x" * 900
    lines = [[b'{"part": %d, "row": %d, "pad": "%s"}\n' % (p, n, pad) for n in range(30_000)] for p in range(2)]
    for part, rows in enumerate(lines):
        part_files(tmp_path, part, "train")[0].write_bytes(b"".join(rows))
    kept = [[True] * 30_000, [n != 7 for n in range(30_000)]]  # the second part repeats a row of the first
    tracemalloc.start()
    try:
        _copy_lines(tmp_path, "train", kept, [[len(r) for r in rows] for rows in lines])
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert (tmp_path / "train.jsonl").read_bytes() == b"".join(
        [*lines[0], *(r for r, keep in zip(lines[1], kept[1], strict=True) if keep)])
    assert peak < 4 << 20  # the parts hold 55 MB


def test_the_parquet_file_is_the_same_however_many_parts_its_rows_came_in(tmp_path: Path) -> None:
    """Row groups are cut where the kept rows say, not where the parts end: 1, 2 or 3 workers write the same bytes."""
    import pyarrow.parquet as pq

    from tracemill.miner.parquet import GROUP_ROWS, RowWriter

    rows = [{"id": str(n), "prompt": [{"role": "user", "content": f"call {n} " * (n % 7 + 300)}], "raw": f"out {n}",
             "valid": n % 5 == 0, "call_id": n} for n in range(int(2.5 * GROUP_ROWS))]
    dropped = {1500, 1501, 2001}  # repeats of an earlier part's prompts (the first part writes none)

    def merged(cuts: list[int], name: str) -> bytes:
        bounds = [0, *cuts, len(rows)]
        first = RowWriter(tmp_path / f"{name}.parquet")
        for row in rows[:bounds[1]]:
            first.add(row, len(json.dumps(row)))
        for n, (a, b) in enumerate(itertools.pairwise(bounds[1:])):
            part = RowWriter(tmp_path / f"{name}-{n}.parquet")
            for row in rows[a:b]:
                part.add(row, len(json.dumps(row)))
            part.close()
            first.append_part(tmp_path / f"{name}-{n}.parquet", [i not in dropped for i in range(a, b)],
                              [len(json.dumps(row)) for row in rows[a:b]])
        first.close()
        return (tmp_path / f"{name}.parquet").read_bytes()

    two = merged([1234], "two")
    assert merged([700, 1901], "three") == two
    one = RowWriter(tmp_path / "one.parquet")
    for n, row in enumerate(rows):
        if n not in dropped:
            one.add(row, len(json.dumps(row)))
    one.close()
    assert (tmp_path / "one.parquet").read_bytes() == two
    table = pq.read_table(tmp_path / "one.parquet")
    assert table.num_rows == len(rows) - len(dropped) and table.column("call_id")[1500].as_py() == 1502
    assert [g.num_rows for g in (pq.ParquetFile(tmp_path / "one.parquet").metadata.row_group(i)
                                 for i in range(3))] == [GROUP_ROWS, GROUP_ROWS, len(rows) - len(dropped) - 2000]
