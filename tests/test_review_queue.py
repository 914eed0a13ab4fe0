"""The review queue and decisions on SQLite and PostgreSQL: which calls the rules queue (once), reservations between
two reviewers, the first decision standing, edits checked against the tool's schema, and roles enforced below the
UI; users: hashed passwords, rate-limited sign-in, single sign-on by email."""

from __future__ import annotations

from datetime import timedelta

import pytest
from sqlalchemy import func, select

from tracemill.collector.decode import Limits, decode_protobuf
from tracemill.collector.persist import SpanWriter
from tracemill.settings import LowConfidenceRule, ReviewRule, Settings
from tracemill.store.engine import make_engine
from tracemill.store.migrate import upgrade
from tracemill.store.tables import ReviewQueueRow, ReviewRow, SignInFailureRow, UserRow
from tracemill.ui import decide, queue, users
from tracemill.ui.access import Identity, NotAllowed, Role

from support import chat_attributes, export_request, make_span

MEDICAL = [{"type": "function", "function": {
    "name": "Medical Calculator:bmi_bsa_calculator", "description": "Body mass index from weight and height.",
    "parameters": {"type": "object", "properties": {"weight_kg": {"type": "number"}, "height_cm": {"type": "number"}},
                   "required": ["weight_kg", "height_cm"], "additionalProperties": False}}},
    {"type": "function", "function": {"name": "Contracts:review_clause", "description": "Reads a clause.",
                                      "parameters": {"type": "object", "properties": {"text": {"type": "string"}}}}},
    {"type": "function", "function": {"name": "Weather:get_weather", "description": "Current weather for a city.",
                                      "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                     "required": ["city"]}}}]
RITA = Identity("rita", Role.REVIEWER)
ROB = Identity("rob", Role.REVIEWER)
VIC = Identity("vic", Role.VIEWER)


def _store(db_url: str):  # type: ignore[no-untyped-def]
    engine = make_engine(db_url)
    upgrade(engine)
    writer = SpanWriter(engine.dialect)
    calls = [{"id": "m1", "name": "Medical Calculator:bmi_bsa_calculator", "arguments": {"weight_kg": "70",
                                                                                      "height_cm": 180}},
             {"id": "c1", "name": "Contracts:review_clause", "arguments": {"text": "x"}},
             {"id": "w1", "name": "Weather:get_weather", "arguments": {"city": "Oslo"}},
             {"id": "w2", "name": "Weather:get_wether", "arguments": {"city": "Oslo"}},
             {"id": "w3", "name": "Weather:get_weather", "arguments": {"City": "Oslo"}}]
    spans = [make_span(f"{n + 1:032x}", f"{n + 1:016x}", "chat", chat_attributes([c], tools=MEDICAL))
             for n, c in enumerate(calls)]
    batch = writer.prepare(decode_protobuf(export_request(spans), Limits(1 << 20)).spans)
    with engine.begin() as conn:
        writer.write(conn, batch)
    writer.committed()
    return engine


def _rules(**changes: object) -> queue.QueueRules:
    settings = Settings(review_rules=[ReviewRule(domain="legal", tools=["contracts:*"])], **changes)
    return queue.QueueRules.from_settings(settings)


def _queued(engine) -> dict[str, str]:  # type: ignore[no-untyped-def]
    from tracemill.store.tables import ToolCallRow

    with engine.connect() as conn:
        rows = conn.execute(select(ToolCallRow.name, ReviewQueueRow.reason)
                            .join(ReviewQueueRow, ReviewQueueRow.call_id == ToolCallRow.id))
        return {name: reason for name, reason in rows}


def test_rules_queue_sensitive_and_guessed_calls_once(db_url: str) -> None:
    engine = _store(db_url)
    progress = queue.scan(engine, _rules())
    assert progress.remaining == 0 and progress.queued == 4
    # the medical server by its domain at ingest, the contract tool by a rule on its name, the near-miss tool name
    # and parameter name because the reviser had to guess; the valid weather call waits for nobody.
    assert _queued(engine) == {"Medical Calculator:bmi_bsa_calculator": "medical", "Contracts:review_clause": "legal",
                               "Weather:get_wether": "low_confidence", "Weather:get_weather": "low_confidence"}
    assert queue.scan(engine, _rules()).queued == 0
    # new rules read the store again: nothing queued twice
    changed = _rules(review_low_confidence=[LowConfidenceRule(source="rules", steps=["coerce"])])
    assert queue.scan(engine, changed).queued == 0
    with engine.connect() as conn:
        assert conn.execute(select(func.count()).select_from(ReviewQueueRow)).scalar() == 4
    assert queue.progress(engine).by_reason["medical"] == (1, 0)


def test_two_reviewers_get_different_items_and_the_first_decision_stands(db_url: str) -> None:
    engine = _store(db_url)
    queue.scan(engine, _rules())
    hold = timedelta(minutes=5)
    first = queue.waiting(engine, "rita")[0]
    assert queue.claim(engine, first.call_id, "rita", hold).reviewer == "rita"
    assert queue.claim(engine, first.call_id, "rob", hold).reviewer == "rita"  # reserved: rob does not get it
    assert first.call_id not in [i.call_id for i in queue.waiting(engine, "rob")]
    assert queue.waiting(engine, "rita")[0].call_id == first.call_id
    item = decide.subject(engine, first.call_id)
    assert item is not None
    stored = decide.decide(engine, RITA, item, decide.Decision.REJECT, note="not what was asked")
    assert stored.decision == "reject" and stored.after is None and stored.reviewer == "rita"
    with pytest.raises(decide.AlreadyDecided, match="rita already decided.*first decision stands"):
        decide.decide(engine, ROB, item, decide.Decision.APPROVE)
    assert first.call_id not in [i.call_id for i in queue.waiting(engine, "rob")]
    assert queue.claim(engine, first.call_id, "rob", timedelta(seconds=-1)).reviewer == "rob"  # lapsed reservations
    assert queue.progress(engine).by_reviewer == {"rita": {"reject": 1}}


def test_an_edit_is_checked_against_the_schema_and_viewers_cannot_decide(db_url: str) -> None:
    engine = _store(db_url)
    queue.scan(engine, _rules())
    medical = next(i for i in queue.waiting(engine, "rita") if i.reason == "medical")
    item = decide.subject(engine, medical.call_id)
    assert item is not None
    assert item.proposal == {"name": "Medical Calculator:bmi_bsa_calculator",
                             "arguments": {"weight_kg": 70, "height_cm": 180}}  # the reviser's fix, to start from
    with pytest.raises(NotAllowed, match="vic is a viewer"):
        decide.decide(engine, VIC, item, decide.Decision.APPROVE)
    wrong = {"name": "Medical Calculator:bmi_bsa_calculator", "arguments": {"weight_kg": 70, "height": 180}}
    with pytest.raises(decide.InvalidEdit, match="height_cm"):
        decide.decide(engine, RITA, item, decide.Decision.APPROVE, wrong)
    with pytest.raises(decide.InvalidEdit, match="as emitted|not of type|number"):
        decide.decide(engine, RITA, item, decide.Decision.APPROVE, {"name": item.proposal["name"],
                                                                     "arguments": {"weight_kg": "70",
                                                                                   "height_cm": 180}})
    with engine.connect() as conn:
        assert conn.execute(select(func.count()).select_from(ReviewRow)).scalar() == 0
    edited = {"name": "Medical Calculator:bmi_bsa_calculator", "arguments": {"weight_kg": 72.5, "height_cm": 180}}
    stored = decide.decide(engine, RITA, item, decide.Decision.APPROVE, edited)
    assert stored.decision == "edit" and stored.after == edited
    assert stored.before == {"name": "Medical Calculator:bmi_bsa_calculator",
                             "arguments": {"weight_kg": "70", "height_cm": 180}}


def test_passwords_are_hashed_and_failed_sign_ins_are_limited(db_url: str) -> None:
    engine = _store(db_url)
    users.add_user(engine, "rita", Role.REVIEWER, "correct horse", email="Rita@example.org")
    with engine.connect() as conn:
        stored = conn.execute(select(UserRow.password_hash)).scalar_one()
    assert "correct horse" not in stored and stored.startswith("$argon2")
    limit = users.SignInLimit(3, timedelta(minutes=15))
    assert users.sign_in(engine, "rita", "correct horse", limit) == RITA
    for _ in range(3):
        with pytest.raises(users.SignInRefused, match="wrong name or password"):
            users.sign_in(engine, "rita", "wrong", limit)
    with pytest.raises(users.SignInRefused, match="too many failed sign-ins"):
        users.sign_in(engine, "rita", "correct horse", limit)  # even the right password waits
    with pytest.raises(users.SignInRefused, match="wrong name or password"):
        users.sign_in(engine, "nobody", "correct horse", limit)
    with engine.connect() as conn:
        assert conn.execute(select(func.count()).select_from(SignInFailureRow)).scalar() == 4
    assert users.sso_identity(engine, "rita@EXAMPLE.org") == Identity("rita", Role.REVIEWER, via="sso")
    users.disable(engine, "rita")
    assert users.sso_identity(engine, "rita@example.org") is None
    with pytest.raises(users.UserError, match="already exists"):
        users.add_user(engine, "rita", Role.ADMIN, "another password")
    with pytest.raises(users.UserError, match="at least 8"):
        users.add_user(engine, "short", Role.VIEWER, "abc")


def test_a_low_confidence_revision_by_the_sidecar_waits_with_the_sidecars_call(  # type: ignore[no-untyped-def]
        start_collector, sqlite_url: str) -> None:
    """The real sidecar, tracing into a real collector: the call the upstream sent, which the sidecar fixed by
    guessing a near-miss tool name, is queued with the call the agent got as the proposal; what the sidecar served is
    not queued itself; a rule limited to other reviser versions queues nothing."""
    import time

    from openai import OpenAI
    from scripted_model import Reply, ScriptedModel, native

    import tracemill.sdk as tm
    from tracemill.net import ServerThread
    from tracemill.serving.app import ServeConfig, create_app
    from tracemill.store.tables import SpanRow, ToolCallRow

    from support import WEATHER_TOOLS

    scripted = ScriptedModel()
    scripted.replies["near miss"] = Reply(tool_calls=native([{"name": "get_wether", "arguments": '{"city": "Oslo"}'}]))
    scripted.replies["valid"] = Reply(tool_calls=native([{"name": "get_weather", "arguments": '{"city": "Rome"}'}]))
    upstream = ServerThread(scripted.app()).start()
    proxy = ServerThread(create_app(ServeConfig(upstream.url + "/v1", trace=True))).start()
    collector = start_collector(sqlite_url)
    tm.init(collector.url, service_name="tracemill-serve", set_global=False)
    try:
        client = OpenAI(base_url=proxy.url + "/v1", api_key="k", max_retries=0)
        for ask in ("near miss", "valid"):
            client.chat.completions.create(model="scripted-llama", messages=[{"role": "user", "content": ask}],
                                           tools=WEATHER_TOOLS)
        time.sleep(0.3)  # spans are recorded after each answer is sent
        assert tm.flush(10)
    finally:
        tm.shutdown()
        proxy.stop()
        upstream.stop()
    engine = make_engine(sqlite_url)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        with engine.connect() as conn:
            if conn.execute(select(func.count()).select_from(SpanRow)).scalar() >= 3:
                break
        time.sleep(0.2)
    with engine.connect() as conn:
        sent = conn.execute(select(ToolCallRow.id).where(ToolCallRow.name == "get_wether")).scalar_one()
        served = conn.execute(select(ToolCallRow.id).where(ToolCallRow.model == "tracemill-reviser:rules")).scalar_one()

    def sidecar_only(**rule: object) -> queue.QueueRules:
        return queue.QueueRules.from_settings(Settings(review_domains=[], review_rules=[], review_low_confidence=[
            LowConfidenceRule(source="sidecar", steps=["tool_name"], **rule)]))

    assert queue.scan(engine, sidecar_only(versions=["reviser-*"])).queued == 0
    assert queue.scan(engine, sidecar_only()).queued == 1
    [item] = queue.waiting(engine, "rita")
    assert item.call_id == sent and item.reason == "low_confidence" and queue.served_as(item.detail) == served
    assert "the sidecar's reviser rules revised it with tool_name" in item.detail
    subject = decide.subject(engine, sent, queue.served_as(item.detail))
    assert subject is not None and subject.proposal == {"name": "get_weather", "arguments": {"city": "Oslo"}}
    stored = decide.decide(engine, RITA, subject, decide.Decision.APPROVE)
    assert stored.decision == "edit" and stored.after == subject.proposal  # differs from what the upstream sent
    engine.dispose()


def test_a_low_confidence_rule_with_an_unknown_step_is_refused() -> None:
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="no reviser step 'tool-name'"):
        LowConfidenceRule(source="sidecar", steps=["tool-name"])
