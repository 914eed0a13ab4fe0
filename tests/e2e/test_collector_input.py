"""What the collector does with bad, repeated and unauthorised input: clear 4xx answers, nothing stored from a
refused request, spans stored once however often they are sent."""

from __future__ import annotations

import gzip
import hashlib
import json
import subprocess
import sys
import time

import httpx
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse
from opentelemetry.proto.trace.v1.trace_pb2 import Span
from sqlalchemy import text
from sqlalchemy.exc import OperationalError

from tracemill.collector.worker import _caused_by_data
from tracemill.otlp import partial_success
from tracemill.store.engine import make_engine

from support import chat_attributes, export_request, make_span

PROTOBUF = {"Content-Type": "application/x-protobuf"}
JSON = {"Content-Type": "application/json"}
TRACE = "5b8efff798038103d269b633813fc60c"


def counts(db_url: str) -> tuple[int, int]:
    engine = make_engine(db_url)
    with engine.connect() as conn:
        spans = conn.execute(text("select count(*) from spans")).scalar_one()
        calls = conn.execute(text("select count(*) from tool_calls")).scalar_one()
    engine.dispose()
    return spans, calls


def json_span(trace_id: str = TRACE, span_id: str = "eee19b7ec3c1b174", **extra: object) -> dict:
    return {"traceId": trace_id, "spanId": span_id, "name": "chat", "kind": 3,
            "startTimeUnixNano": "1700000000000000000", "endTimeUnixNano": "1700000000100000000",
            "attributes": [{"key": "gen_ai.operation.name", "value": {"stringValue": "chat"}}], **extra}


def json_request(*spans: dict) -> bytes:
    return json.dumps({"resourceSpans": [{"resource": {"attributes": []},
                                          "scopeSpans": [{"scope": {"name": "t"}, "spans": list(spans)}]}]}).encode()


@pytest.fixture(scope="module")
def collector(tmp_path_factory):  # type: ignore[no-untyped-def]
    from support import CollectorProcess

    workdir = tmp_path_factory.mktemp("collector")
    db_url = f"sqlite:///{workdir / 'input.db'}"
    process = CollectorProcess(db_url, workdir, {"TRACEMILL_MAX_BODY_BYTES": "200000",
                                                 "TRACEMILL_MAX_ATTRIBUTE_BYTES": "1000"}).start()
    yield process
    process.stop()


def refused(collector, body: bytes, headers: dict[str, str], status: int) -> str:  # type: ignore[no-untyped-def]
    before = counts(collector.db_url)
    response = httpx.post(f"{collector.url}/v1/traces", content=body, headers=headers)
    assert response.status_code == status, response.text
    assert counts(collector.db_url) == before, "a refused request stored something"
    if headers.get("Content-Type") == "application/x-protobuf":
        from google.rpc.status_pb2 import Status

        return Status.FromString(response.content).message
    return response.json()["message"]


def test_garbage_protobuf_is_refused(collector) -> None:  # type: ignore[no-untyped-def]
    message = refused(collector, b"\xff\xfe not a protobuf \x00\x01", PROTOBUF, 400)
    assert "protobuf ExportTraceServiceRequest" in message


def test_garbage_json_is_refused(collector) -> None:  # type: ignore[no-untyped-def]
    assert "not valid JSON" in refused(collector, b'{"resourceSpans": [', JSON, 400)


def test_unsupported_content_type(collector) -> None:  # type: ignore[no-untyped-def]
    message = refused(collector, b"hello", {"Content-Type": "text/plain"}, 415)
    assert "'text/plain'" in message and "application/x-protobuf" in message


def test_bad_ids_refuse_the_whole_request(collector) -> None:  # type: ignore[no-untyped-def]
    good = make_span(TRACE, "00f067aa0ba902b7", "chat", chat_attributes([{"id": "a", "name": "get_weather",
                                                                          "arguments": {"city": "Rome"}}]))
    bad = make_span(TRACE, "00f067aa0ba902b8", "chat", {})
    bad.trace_id = b"\x01\x02\x03"
    message = refused(collector, export_request([good, bad]), PROTOBUF, 400)
    assert message == "resourceSpans[0].scopeSpans[0].spans[1].traceId: must be 16 bytes, got 3"

    message = refused(collector, json_request(json_span(), json_span(span_id="not-hex-at-all!")), JSON, 400)
    assert message.startswith("resourceSpans[0].scopeSpans[0].spans[1].spanId: expected 16 hex digits")

    message = refused(collector, json_request(json_span(trace_id="5b8efff798038103 d269b633813fc6 ")), JSON, 400)
    assert message.startswith("resourceSpans[0].scopeSpans[0].spans[0].traceId: expected 32 hex digits")


@pytest.mark.parametrize("value, expected", [
    ({"intValue": "twelve"}, "expected an integer"),
    ("plain string", "expected an AnyValue object"),
    ({"stringValue": 12}, "expected a string"),
    ({"boolValue": "yes"}, "expected a boolean"),
    ({"arrayValue": {"values": "x"}}, "expected a list"),
])
def test_wrong_attribute_types(collector, value: object, expected: str) -> None:  # type: ignore[no-untyped-def]
    span = json_span(attributes=[{"key": "gen_ai.usage.input_tokens", "value": value}])
    message = refused(collector, json_request(span), JSON, 400)
    assert "spans[0].attributes['gen_ai.usage.input_tokens']" in message and expected in message




def test_values_in_every_form_proto3_json_allows_are_stored(collector) -> None:  # type: ignore[no-untyped-def]
    """Doubles as strings, integers as integral floats or in exponent form, empty values and lists written as null:
    what proto3's JSON mapping allows, and other OTLP encoders than the Python SDK write."""
    attributes = {"d_text": {"doubleValue": "1.5"}, "d_nan": {"doubleValue": "NaN"}, "i_float": {"intValue": 3.0},
                  "i_exp": {"intValue": "1e3"}, "empty": None, "no_list": {"arrayValue": {"values": None}}}
    span = json_span(span_id="f00d00000000beef", startTimeUnixNano=1.7e18, endTimeUnixNano="1.7000000001e18",
                     attributes=[{"key": k, "value": v} for k, v in attributes.items()])
    response = httpx.post(f"{collector.url}/v1/traces", content=json_request(span), headers=JSON)
    assert response.status_code == 200, response.text
    assert partial_success(response.content, response.headers["content-type"]).rejected_spans == 0
    engine = make_engine(collector.db_url)
    with engine.connect() as conn:
        stored = conn.execute(text("select attributes, start_time_ns, end_time_ns from spans where span_id = "
                                   "'f00d00000000beef'")).one()
    engine.dispose()
    found = stored.attributes if isinstance(stored.attributes, dict) else json.loads(stored.attributes)
    assert (found["d_text"], found["i_float"], found["i_exp"], found["empty"], found["no_list"]) == (
        1.5, 3, 1000, None, [])
    assert (stored.start_time_ns, stored.end_time_ns) == (1_700_000_000_000_000_000, 1_700_000_000_100_000_000)


def test_body_over_the_limit(collector) -> None:  # type: ignore[no-untyped-def]
    spans = [make_span(TRACE, f"{i:016x}", "s", {"k": "v" * 900}) for i in range(1, 400)]
    assert "over the limit of 200000" in refused(collector, export_request(spans), PROTOBUF, 413)


def test_gzip_bomb_and_broken_gzip(collector) -> None:  # type: ignore[no-untyped-def]
    bomb = gzip.compress(b"\x00" * 5_000_000)
    assert len(bomb) < 200000
    assert "decompressed body" in refused(collector, bomb, {**PROTOBUF, "Content-Encoding": "gzip"}, 413)
    assert "not valid gzip" in refused(collector, b"\x1f\x8b garbage", {**PROTOBUF, "Content-Encoding": "gzip"}, 400)


def test_every_gzip_member_is_stored_and_trailing_bytes_are_refused(collector) -> None:  # type: ignore[no-untyped-def]
    spans = [make_span("ab" * 16, f"{i + 1:016x}", "chat", {"gen_ai.operation.name": "chat"}) for i in range(10)]
    two_members = gzip.compress(export_request(spans[:5])) + gzip.compress(export_request(spans[5:]))
    before, _ = counts(collector.db_url)
    response = httpx.post(f"{collector.url}/v1/traces", content=two_members,
                          headers={**PROTOBUF, "Content-Encoding": "gzip"})
    assert response.status_code == 200
    assert counts(collector.db_url)[0] == before + 10

    trailing = gzip.compress(export_request([make_span("ac" * 16, "01" * 8, "chat", {})])) + b"garbage"
    message = refused(collector, trailing, {**PROTOBUF, "Content-Encoding": "gzip"}, 400)
    assert "7 bytes after the gzip member" in message


def test_gzip_body_is_accepted(collector) -> None:  # type: ignore[no-untyped-def]
    span = make_span("aa" * 16, "00f067aa0ba90300", "chat", {"gen_ai.operation.name": "chat"})
    response = httpx.post(f"{collector.url}/v1/traces", content=gzip.compress(export_request([span])),
                          headers={**PROTOBUF, "Content-Encoding": "gzip"})
    assert response.status_code == 200
    assert not ExportTraceServiceResponse.FromString(response.content).HasField("partial_success")


def test_invalid_spans_are_a_partial_success(collector) -> None:  # type: ignore[no-untyped-def]
    before_spans, _ = counts(collector.db_url)
    zero = json_span(trace_id="0" * 32, span_id="1111111111111111")
    backwards = json_span(span_id="2222222222222222", startTimeUnixNano="1700000000200000000")
    good = json_span(span_id="3333333333333333")
    response = httpx.post(f"{collector.url}/v1/traces", content=json_request(zero, backwards, good), headers=JSON)
    assert response.status_code == 200
    partial = response.json()["partialSuccess"]
    assert partial["rejectedSpans"] == "2"
    assert "spans[0]: trace id and span id must not be all zeros" in partial["errorMessage"]
    assert "spans[1]: ends" in partial["errorMessage"]
    assert counts(collector.db_url)[0] == before_spans + 1

    pb_zero = make_span("0" * 32, "00f067aa0ba90301", "chat", {})
    response = httpx.post(f"{collector.url}/v1/traces", content=export_request([pb_zero]), headers=PROTOBUF)
    assert ExportTraceServiceResponse.FromString(response.content).partial_success.rejected_spans == 1


def test_resent_spans_are_stored_once(collector) -> None:  # type: ignore[no-untyped-def]
    before = counts(collector.db_url)
    calls = [{"id": "r1", "name": "get_weather", "arguments": {"city": "Lima"}},
             {"id": "r2", "name": "get_weather", "arguments": "{'city': 'Lima'}"}]
    body = export_request([make_span("bb" * 16, "00f067aa0ba90400", "chat", chat_attributes(calls)),
                           make_span("bb" * 16, "00f067aa0ba90401", "execute_tool get_weather",
                                     {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.call.id": "r1",
                                      "gen_ai.tool.name": "get_weather"})])
    for _ in range(3):
        assert httpx.post(f"{collector.url}/v1/traces", content=body, headers=PROTOBUF).status_code == 200
    assert counts(collector.db_url) == (before[0] + 2, before[1] + 2)


def tracemill(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tracemill.cli", *args], capture_output=True, text=True, check=True)


def test_api_keys(tmp_path, start_collector) -> None:  # type: ignore[no-untyped-def]
    db_url = f"sqlite:///{tmp_path / 'keys.db'}"
    collector = start_collector(db_url)
    span = make_span("cc" * 16, "00f067aa0ba90500", "chat", {"gen_ai.operation.name": "chat"})
    url, body = f"{collector.url}/v1/traces", export_request([span])
    assert httpx.post(url, content=body, headers=PROTOBUF).status_code == 200  # no keys yet: open

    key = tracemill("keys", "create", "--name", "agent-fleet", "--db", db_url).stdout.strip()
    assert key.startswith("tm_")
    stored = b"".join(path.read_bytes() for path in tmp_path.glob("keys.db*"))  # the database file and its WAL
    assert b"agent-fleet" in stored
    assert key.encode() not in stored, "the key itself must not be stored"
    deadline = time.monotonic() + 10
    while httpx.post(url, content=body, headers=PROTOBUF).status_code != 401:  # keys are re-read every 2 s
        assert time.monotonic() < deadline, "a new key was not enforced"
        time.sleep(0.2)

    body = export_request([make_span("cd" * 16, "00f067aa0ba90501", "chat", {})])

    def post(headers: dict[str, str]) -> httpx.Response:
        return httpx.post(url, content=body, headers={**PROTOBUF, **headers})

    from google.rpc.status_pb2 import Status

    response = post({})
    assert response.status_code == 401 and "requires an API key" in Status.FromString(response.content).message
    assert post({"Authorization": "Bearer tm_wrong"}).status_code == 401
    assert post({"Authorization": key}).status_code == 401
    assert counts(db_url)[0] == 1, "a refused request stored spans"
    assert post({"Authorization": f"Bearer {key}"}).status_code == 200
    assert counts(db_url)[0] == 2

    key_id = tracemill("keys", "list", "--db", db_url).stdout.split("\t")[0]
    tracemill("keys", "revoke", key_id, "--db", db_url)
    deadline = time.monotonic() + 10
    while post({"Authorization": f"Bearer {key}"}).status_code != 401:
        assert time.monotonic() < deadline, "a revoked key still works"
        time.sleep(0.2)


def pb_span(trace: str, span_id: str, **changes: object) -> Span:
    span = make_span(trace, span_id, "chat", {"gen_ai.operation.name": "chat"})
    for name, value in changes.items():
        setattr(span, name, value)
    return span


def late_event(trace: str, span_id: str) -> Span:
    span = pb_span(trace, span_id)
    span.events.add(name="e", time_unix_nano=2**63)
    return span

PROTOBUF_POISONS = {  # the poison span, and what the answer must name
    "start past 2^63 ns": (lambda t, s: pb_span(t, s, start_time_unix_nano=2**63), ".startTimeUnixNano"),
    "end at 2^64 - 1 ns": (lambda t, s: pb_span(t, s, end_time_unix_nano=2**64 - 1), ".endTimeUnixNano"),
    "event past 2^63 ns": (late_event, ".events[0].timeUnixNano"),
    "NUL in its name": (lambda t, s: pb_span(t, s, name="ch\x00at"), ".name"),
    "NUL in an attribute": (lambda t, s: make_span(t, s, "chat", {"note": "a\x00b"}), ".attributes['note']"),
    "NUL in an attribute key": (lambda t, s: make_span(t, s, "chat", {"no\x00te": "ab"}), ".attributes["),
    "an attribute over the limit": (lambda t, s: make_span(t, s, "chat", {"gen_ai.output.messages": "x" * 5000}),
                                    ".attributes['gen_ai.output.messages']"),
}

JSON_POISONS = {
    "start past 2^64 ns": ({"startTimeUnixNano": "99999999999999999999"}, ".startTimeUnixNano"),
    "a negative start": ({"startTimeUnixNano": "-1", "endTimeUnixNano": "1"}, ".startTimeUnixNano"),
    "a negative end": ({"endTimeUnixNano": -5}, ".endTimeUnixNano"),
    "an intValue over int64": ({"attributes": [{"key": "n", "value": {"intValue": "9223372036854775808"}}]},
                               ".attributes['n']"),
    "NUL in a string": ({"attributes": [{"key": "s", "value": {"stringValue": "a\u0000b"}}]}, ".attributes['s']"),
    "a kind over int32": ({"kind": 2**40}, ".kind"),
}


def stored(db_url: str, trace: str) -> set[str]:
    engine = make_engine(db_url)
    with engine.connect() as conn:
        ids = {r[0] for r in conn.execute(text("select span_id from spans where trace_id = :t"), {"t": trace})}
    engine.dispose()
    return ids


def rejected_alone(collector, body: bytes, headers: dict[str, str], trace: str) -> str:  # type: ignore[no-untyped-def]
    """Posts spans 1 and 3 valid, 2 poisoned; checks that the answer refuses span 2 alone and that 1 and 3 are
    stored. Returns what the answer said about span 2."""
    response = httpx.post(f"{collector.url}/v1/traces", content=body, headers=headers)
    assert response.status_code == 200, response.text
    partial = partial_success(response.content, response.headers["Content-Type"])
    assert partial.rejected_spans == 1, partial
    assert stored(collector.db_url, trace) == {"01" * 8, "03" * 8}
    return partial.error_message


def test_poison_spans_are_refused_alone_and_their_neighbours_stored(db_url: str, start_collector) -> None:  # type: ignore[no-untyped-def]
    collector = start_collector(db_url, TRACEMILL_MAX_ATTRIBUTE_BYTES="1000")
    failures = {}
    for n, (case, (poison, where)) in enumerate(PROTOBUF_POISONS.items()):
        trace = f"{n + 1:032x}"
        body = export_request([pb_span(trace, "01" * 8), poison(trace, "02" * 8), pb_span(trace, "03" * 8)])
        message = rejected_alone(collector, body, PROTOBUF, trace)
        if not message.startswith("resourceSpans[0].scopeSpans[0].spans[1]") or where not in message:
            failures[case] = message
    for n, (case, (fields, where)) in enumerate(JSON_POISONS.items()):
        trace = f"{n + 101:032x}"
        body = json_request(json_span(trace, "01" * 8), json_span(trace, "02" * 8, **fields),
                            json_span(trace, "03" * 8))
        message = rejected_alone(collector, body, JSON, trace)
        if not message.startswith(f"resourceSpans[0].scopeSpans[0].spans[1]{where}"):
            failures[case] = message
    assert not failures


def test_a_poisoned_resource_refuses_its_own_spans_only(sqlite_url: str, start_collector) -> None:  # type: ignore[no-untyped-def]
    collector = start_collector(sqlite_url)
    good = {"resource": {"attributes": []},
            "scopeSpans": [{"spans": [json_span("ef" * 16, "01" * 8), json_span("ef" * 16, "03" * 8)]}]}
    bad = {"resource": {"attributes": [{"key": "host.name", "value": {"stringValue": "a\u0000"}}]},
           "scopeSpans": [{"spans": [json_span("ef" * 16, "02" * 8), json_span("ef" * 16, "04" * 8)]}]}
    response = httpx.post(f"{collector.url}/v1/traces", json={"resourceSpans": [good, bad]})
    assert response.status_code == 200
    partial = partial_success(response.content, response.headers["Content-Type"])
    assert partial.rejected_spans == 2
    assert partial.error_message.startswith("resourceSpans[1].resource.attributes['host.name']")
    assert stored(sqlite_url, "ef" * 16) == {"01" * 8, "03" * 8}


def test_a_nul_inside_a_json_attribute_is_stored_alike_on_sqlite_and_postgresql(db_url: str, start_collector) -> None:  # type: ignore[no-untyped-def]
    """A NUL character written as `\\u0000` inside the JSON of a call only shows up once the JSON is read (the call's
    name, its raw text). PostgreSQL's text refuses NUL: on both stores it becomes U+FFFD, and the span is kept."""
    collector = start_collector(db_url)
    trace = "fa" * 16
    attributes = chat_attributes([])
    attributes["gen_ai.output.messages"] = json.dumps([{"role": "assistant", "parts": [{"type": "text", "content": (
        '{"name": "get_\\u0000weather", "arguments": {"city": "Pa\\u0000ris"}}\u0000')}]}])
    body = export_request([pb_span(trace, "01" * 8), make_span(trace, "02" * 8, "chat", attributes)])
    response = httpx.post(f"{collector.url}/v1/traces", content=body, headers=PROTOBUF)
    assert response.status_code == 200
    assert partial_success(response.content, PROTOBUF["Content-Type"]).rejected_spans == 0
    assert stored(db_url, trace) == {"01" * 8, "02" * 8}
    engine = make_engine(db_url)
    with engine.connect() as conn:
        call = conn.execute(text("select name, raw from tool_calls where trace_id = :t"), {"t": trace}).one()
    engine.dispose()
    assert call.name == "get_\ufffdweather" and call.raw.endswith("}\ufffd")


def test_a_string_that_is_not_utf8_is_stored_mended_and_its_neighbours_with_it(db_url: str, start_collector) -> None:  # type: ignore[no-untyped-def]
    """One bad string used to refuse its whole request: a byte that is not UTF-8 in a protobuf string, a lone surrogate
    escape in JSON (an SDK that cut text inside an emoji). Each is stored with U+FFFD, the answer says where."""
    collector = start_collector(db_url)
    trace = "fb" * 16
    chat = chat_attributes([{"id": "call_Xk2pQ9rT", "name": "get_weather", "arguments": {"city": "Paris"}}])
    body = export_request([make_span(trace, "01" * 8, "chat", chat),
                           make_span(trace, "02" * 8, "note", {"said": "MARK"})]).replace(b"MARK", b"M\xffRK")
    response = httpx.post(f"{collector.url}/v1/traces", content=body, headers=PROTOBUF)
    assert response.status_code == 200, response.text
    partial = partial_success(response.content, PROTOBUF["Content-Type"])
    assert partial.rejected_spans == 0 and partial.error_message == (
        "resourceSpans[0].scopeSpans[0].spans[1].attributes[0].value.stringValue: not valid UTF-8: stored with U+FFFD "
        "in place of what could not be")
    for span, said in (("03", "sunny \ud83d"), ("04", "MARK")):
        sent = json_request(json_span(trace, span * 8, attributes=[{"key": "said", "value": {"stringValue": said}}]))
        response = httpx.post(f"{collector.url}/v1/traces", content=sent.replace(b"MARK", b"M\xffRK"), headers=JSON)
        assert response.status_code == 200, response.text
        partial = partial_success(response.content, JSON["Content-Type"])
        assert partial.rejected_spans == 0 and partial.error_message.startswith(
            "resourceSpans[0].scopeSpans[0].spans[0].attributes[0].value.stringValue: not valid UTF-8")
    assert "not a protobuf" in refused(collector, body[:-3], PROTOBUF, 400)  # broken otherwise too: refused whole
    engine = make_engine(db_url)
    with engine.connect() as conn:
        said = dict(conn.execute(text("select span_id, attributes from spans where trace_id = :t"), {"t": trace}).all())
        calls = conn.execute(text("select count(*) from tool_calls where trace_id = :t"), {"t": trace}).scalar_one()
    engine.dispose()
    said = {span: (a if isinstance(a, dict) else json.loads(a)).get("said") for span, a in said.items()}
    assert said == {"01" * 8: None, "02" * 8: "M\ufffdRK", "03" * 8: "sunny \ufffd", "04" * 8: "M\ufffdRK"}
    assert calls == 1


def test_a_tool_call_id_too_long_for_an_index_is_kept_as_its_digest(db_url: str, start_collector) -> None:  # type: ignore[no-untyped-def]
    """PostgreSQL's index on tool call ids holds at most 2,704 bytes an entry: a span with a longer id could not be
    stored there (and its whole request was answered 503, again and again). Such an id is kept as its digest on both
    stores, and the tool's execution, which names the same id, is still linked to the call."""
    collector = start_collector(db_url)
    trace = "fb" * 16
    long_id = "".join(f"{n:x}" for n in range(2_000))  # 6,890 characters that do not compress
    chat = make_span(trace, "02" * 8, "chat", chat_attributes(
        [{"id": long_id, "name": "get_weather", "arguments": {"city": "Paris"}}]))
    ran = make_span(trace, "03" * 8, "execute_tool get_weather", {
        "gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "get_weather", "gen_ai.tool.call.id": long_id,
        "gen_ai.tool.call.result": "sunny"}, parent="02" * 8)
    response = httpx.post(f"{collector.url}/v1/traces", content=export_request([chat, ran]), headers=PROTOBUF)
    assert response.status_code == 200
    assert partial_success(response.content, PROTOBUF["Content-Type"]).rejected_spans == 0
    engine = make_engine(db_url)
    with engine.connect() as conn:
        call = conn.execute(text("select tool_call_id, execution_status, execution_result from tool_calls "
                                 "where trace_id = :t"), {"t": trace}).one()
    engine.dispose()
    assert call.tool_call_id == "sha256:" + hashlib.sha256(long_id.encode()).hexdigest()
    assert (call.execution_status, call.execution_result) == ("success", "sunny")


@pytest.mark.postgres
def test_a_value_past_a_postgresql_limit_is_its_span_s_fault_and_a_lost_store_is_not(postgres_url: str) -> None:
    """psycopg raises PostgreSQL's "program limit exceeded" (an index entry over 2,704 bytes) as an OperationalError,
    as it does a lost connection. The first would fail again however often it is sent: its span is refused alone, like
    a DataError; the second is worth a retry (503)."""
    engine = make_engine(postgres_url)
    with pytest.raises(OperationalError) as past_limit, engine.begin() as conn:
        conn.exec_driver_sql("CREATE TEMPORARY TABLE limited (v text)")
        conn.exec_driver_sql("CREATE INDEX ON limited (v)")
        conn.exec_driver_sql("INSERT INTO limited VALUES (%(v)s)", {"v": "".join(f"{n:x}" for n in range(2_000))})
    engine.dispose()
    unreachable = make_engine("postgresql+psycopg://postgres@127.0.0.1:1/test")
    with pytest.raises(OperationalError) as lost:
        unreachable.connect()
    assert _caused_by_data(past_limit.value) and not _caused_by_data(lost.value)


@pytest.mark.postgres
def test_a_span_the_store_refuses_for_its_values_is_rejected_alone_and_the_rest_of_its_request_is_stored(
        postgres_url: str, start_collector) -> None:  # type: ignore[no-untyped-def]
    """A rule of the store's that no check of the collector's knows (a DBA's trigger, here, refusing one span name as
    PostgreSQL refuses a bad value: SQLSTATE class 22, a DataError) fails the transaction of the whole request. The
    collector halves the batch until it finds the span at fault: that span alone is rejected, by name, and the seven
    others are stored, with their tool calls. A store error that is not a value's (class 53) keeps the request
    whole: 503, nothing stored, worth a retry."""
    engine = make_engine(postgres_url)
    collector = start_collector(postgres_url)  # the schema is in place once it answers
    with engine.begin() as conn:
        conn.exec_driver_sql("""
            CREATE FUNCTION refuse() RETURNS trigger AS $$ BEGIN
                IF NEW.name = 'poison' THEN RAISE EXCEPTION 'refused by rule' USING ERRCODE = '22000'; END IF;
                IF NEW.name = 'store down' THEN RAISE EXCEPTION 'out of room' USING ERRCODE = '53100'; END IF;
                RETURN NEW; END $$ LANGUAGE plpgsql""")
        conn.exec_driver_sql("CREATE TRIGGER refuse BEFORE INSERT ON spans FOR EACH ROW EXECUTE FUNCTION refuse()")
    spans = [make_span(f"{n + 1:032x}", f"{n + 1:016x}", "poison" if n == 5 else "chat",
                       chat_attributes([{"id": f"c{n}", "name": "get_weather", "arguments": {"city": f"Oslo {n}"}}]))
             for n in range(8)]
    response = httpx.post(f"{collector.url}/v1/traces", content=export_request(spans), headers=PROTOBUF)
    assert response.status_code == 200
    partial = partial_success(response.content, PROTOBUF["Content-Type"])
    assert partial.rejected_spans == 1 and "scopeSpans[0].spans[5]: the store cannot keep" in partial.error_message
    assert counts(postgres_url) == (7, 7)
    with engine.connect() as conn:
        stored = set(conn.execute(text("select span_id from spans")).scalars())
    assert stored == {f"{n + 1:016x}" for n in range(8) if n != 5}

    down = [make_span("ff" * 16, f"{n + 1:016x}", "store down" if n == 0 else "chat", chat_attributes([]))
            for n in range(4)]
    assert httpx.post(f"{collector.url}/v1/traces", content=export_request(down), headers=PROTOBUF).status_code == 503
    assert counts(postgres_url) == (7, 7)
    engine.dispose()
