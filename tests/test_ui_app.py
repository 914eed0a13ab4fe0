"""The Streamlit app through Streamlit's AppTest, on a store filled by the collector from `tracemill simulate`:
every page for every role, sign-in refusals, masking for viewers, a reviewer's schema-checked edit, a viewer's
refused decision, and deployments that only admins make."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from sqlalchemy import select, update
from sqlalchemy.orm import Session

from tracemill.miner.failures import failure_report
from tracemill.miner.findings import Finding, record
from tracemill.serving import deployments
from tracemill.settings import get_settings
from tracemill.store import learning
from tracemill.store.engine import make_engine
from tracemill.store.tables import FindingRow, ModelRow, ReviewQueueRow, SpanRow, ToolCallRow, utcnow
from tracemill.ui import decide, deploy, users
from tracemill.ui.access import Identity, NotAllowed, Role

from support import (
    CHAT_WITHOUT_OUTPUT,
    CollectorProcess,
    chat_attributes,
    export_request,
    logs_request,
    make_span,
    sidecar_and_agent_requests,
)

APP = Path(__file__).resolve().parents[1] / "ui" / "app.py"
PAGES = ("traces", "failures", "findings", "review", "datasets", "models")
TITLES = {"traces": "Traces", "failures": "Failure modes", "findings": "Findings", "review": "Review queue",
          "datasets": "Datasets", "models": "Models and deployments"}
PASSWORD = "a long enough password"


@pytest.fixture(autouse=True)
def _main_module_kept() -> Iterator[None]:
    """AppTest leaves the app's script as `__main__`: a process spawned later in this run (the miner's workers) would
    run the script again instead of its work, and never finish."""
    main = sys.modules["__main__"]
    yield
    sys.modules["__main__"] = main


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    from tracemill.simulate import simulate

    workdir = tmp_path_factory.mktemp("ui")
    url = f"sqlite:///{workdir / 'tracemill.db'}"
    collector = CollectorProcess(url, workdir).start()
    try:
        simulate(collector.url, traces=40, seed=3)
    finally:
        collector.stop()
    engine = make_engine(url)
    for name, role in (("vic", Role.VIEWER), ("rita", Role.REVIEWER), ("ada", Role.ADMIN)):
        users.add_user(engine, name, role, PASSWORD)
    engine.dispose()
    yield url


@pytest.fixture
def app(store: str, monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    from streamlit.testing.v1 import AppTest

    monkeypatch.setenv("TRACEMILL_DATABASE_URL", store)
    get_settings.cache_clear()

    def signed_in(name: str | None, password: str = PASSWORD):  # type: ignore[no-untyped-def]
        at = AppTest.from_file(str(APP), default_timeout=60).run()
        assert not at.exception, at.exception
        if name is not None:
            at.text_input(key="sign_in_name").input(name)
            at.text_input(key="sign_in_password").input(password)
            at.button[0].click().run()
        return at

    yield signed_in
    get_settings.cache_clear()


def _texts(at) -> str:  # type: ignore[no-untyped-def]
    parts = [e.value for kind in (at.markdown, at.caption, at.info, at.warning, at.error, at.success, at.code)
             for e in kind]
    return "\n".join(str(p) for p in parts)


def test_nothing_shows_before_sign_in_and_wrong_passwords_are_refused(app) -> None:  # type: ignore[no-untyped-def]
    at = app(None)
    assert not at.title and "Tracemill" in _texts(at)
    at = app("rita", "not the password")
    assert [e.value for e in at.error] == ["Sign-in refused: wrong name or password"] and not at.title


@pytest.mark.parametrize("role", ["vic", "rita", "ada"])
def test_every_page_for_every_role(app, role: str) -> None:  # type: ignore[no-untyped-def]
    at = app(role)
    for page in PAGES:
        at.switch_page(f"pages/{page}.py").run()
        assert not at.exception, (page, at.exception)
        assert [t.value for t in at.title] == [TITLES[page]], page
    at.switch_page("pages/models.py").run()
    assert next(b for b in at.button if b.label == "Deploy").disabled is (role != "ada")


def _medical_trace(store: str) -> str:
    engine = make_engine(store)
    with engine.connect() as conn:
        trace = conn.execute(select(ToolCallRow.trace_id).where(ToolCallRow.domain == "medical")
                             .order_by(ToolCallRow.id)).scalars().first()
    engine.dispose()
    assert trace is not None, "the simulated store holds no medical call"
    return trace


def test_a_trace_opens_with_its_calls_and_is_masked_for_viewers(app, store) -> None:  # type: ignore[no-untyped-def]
    trace = _medical_trace(store)
    for name, masked in (("rita", False), ("vic", True)):
        at = app(name)
        at.query_params["trace"] = trace
        at.switch_page("pages/traces.py").run()
        assert not at.exception, at.exception
        assert any(s.label == "Span" for s in at.selectbox)
        text = _texts(at)
        assert f"Trace {trace}" in [h.value for h in at.subheader]
        assert ("masked for viewers" in text) is masked
        raw = [c.value for c in at.code]
        assert raw and all(("masked:" in r) is masked for r in raw[:1])


def test_filters_select_traces_by_their_calls(app) -> None:  # type: ignore[no-untyped-def]
    at = app("rita")
    at.selectbox(key="f_domain").select("medical").run()
    assert not at.exception, at.exception
    shown = at.dataframe[0].value
    assert len(shown) >= 1 and all("medical" in d for d in shown["domain"])
    at.text_input(key="f_text").input("no output says this 9f8e7d").run()
    assert "No trace matches these filters." in _texts(at)


def test_failure_modes_are_the_miners_clusters(app, store: str) -> None:  # type: ignore[no-untyped-def]
    engine = make_engine(store)
    at = app("vic")
    at.switch_page("pages/failures.py").run()
    assert not at.exception, at.exception
    report = failure_report(engine)
    assert report.modes, "the simulated store holds no failed call"
    assert list(at.dataframe[-1].value["mode"]) == [m.label for m in report.modes]
    assert [m.value for m in at.metric][:2] == [f"{report.total_calls:,}", f"{report.failed_calls:,}"]
    assert {"Over time", "By harness version", "By model", "By tool"} <= {h.value for h in at.subheader}
    at.selectbox(key="failures_by").select("stage · kind").run()
    assert not at.exception, at.exception
    by_stage = failure_report(engine, by=("stage", "kind"))
    assert list(at.dataframe[-1].value["mode"]) == [m.label for m in by_stage.modes]
    engine.dispose()


def test_findings_list_what_miner_agents_found_with_their_traces(app, store: str) -> None:  # type: ignore[no-untyped-def]
    trace = _medical_trace(store)
    engine = make_engine(store)
    with engine.connect() as conn:
        span_id = conn.execute(select(ToolCallRow.span_id).where(ToolCallRow.trace_id == trace)).scalars().first()
    record(engine, Finding("upstream-timeouts", "get_weather times out on valid calls", [f"{trace}/{span_id}",
                                                                                         "0123456789abcdef"],
                           "say in its description that it may time out", [{"raw": "Jane Roe's dosage", "ok": False}]))
    record(engine, Finding("old-thing", "a failure no longer seen", [trace]))
    with engine.begin() as conn:
        conn.execute(update(FindingRow).where(FindingRow.key == "old-thing").values(status="expired"))
    engine.dispose()
    for name, masked in (("vic", True), ("rita", False)):
        at = app(name)
        at.switch_page("pages/findings.py").run()
        assert not at.exception, at.exception
        shown = at.dataframe[0].value
        assert list(shown["key"]) == ["upstream-timeouts"] and list(shown["evidence"]) == [2]
        assert "say in its description that it may time out" in _texts(at)
        assert ("Jane Roe" in at.json[0].value) is not masked
        assert [b.label for b in at.button if b.key and b.key.startswith("finding_trace_")] == \
            [f"Open trace {trace[:12]}"], "a span id alone names no trace to open"
    at.toggle(key="findings_expired").set_value(True).run()
    assert sorted(at.dataframe[0].value["key"]) == ["old-thing", "upstream-timeouts"]
    at.selectbox(key="finding").set_value(next(o for o in at.selectbox(key="finding").options
                                               if o.startswith("upstream-timeouts"))).run()
    at.button(key=f"finding_trace_{trace}").click().run()
    assert not at.exception, at.exception
    assert f"Trace {trace}" in [h.value for h in at.subheader], "the button opens the trace"


def _open_medical_item(at):  # type: ignore[no-untyped-def]
    at.switch_page("pages/review.py").run()
    at.segmented_control(key="review_reason").set_value("medical").run()
    assert not at.exception, at.exception
    return next(k for k in at.session_state.to_dict() if str(k).startswith("edit_"))


def test_a_reviewer_edits_a_medical_call_and_a_viewer_is_refused(app, store) -> None:  # type: ignore[no-untyped-def]
    at = app("vic")
    key = _open_medical_item(at)
    call_id = int(key.removeprefix("edit_"))
    assert "only reviewers and admins decide" in _texts(at)
    next(b for b in at.button if b.label == "Approve").click().run()
    assert any("Refused" in e.value and "only reviewers" in e.value for e in at.error)
    engine = make_engine(store)
    with engine.connect() as conn:
        assert learning.review(conn, call_id) is None

    at = app("rita")
    key = _open_medical_item(at)
    call_id = int(key.removeprefix("edit_"))
    assert any(e.label == "Conversation before the call" for e in at.expander)
    at.text_area(key=key).input('{"name": "no such tool", "arguments": {}}')
    next(b for b in at.button if b.label == "Approve").click().run()
    assert any("does not pass the verifier" in e.value for e in at.error)
    with engine.connect() as conn:
        assert learning.review(conn, call_id) is None
        queued = conn.execute(select(ReviewQueueRow.reason).where(ReviewQueueRow.call_id == call_id)).scalar()
    assert queued == "medical"
    item = decide.subject(engine, call_id)
    assert item is not None
    at.text_area(key=key).input(json.dumps(item.proposal))  # the call the page proposed, valid against the schema
    next(b for b in at.button if b.label == "Approve").click().run()
    assert not at.exception, at.exception
    with engine.connect() as conn:
        decided = learning.review(conn, call_id)
    engine.dispose()
    assert decided is not None and decided.reviewer == "rita" and decided.decision in ("approve", "edit")
    assert decided.after == item.proposal


def test_only_admins_deploy_and_roll_back(app, store: str) -> None:  # type: ignore[no-untyped-def]
    engine = make_engine(store)
    with engine.begin() as conn:
        for n in (1, 2):
            conn.execute(ModelRow.__table__.insert(), [{
                "name": f"reviser-000{n}", "base_model": "tiny", "kind": "lora", "path": f"/models/{n}",
                "config": {}, "metrics": {"reward": [0.1 * n, 0.2 * n, 0.3 * n]},
                "evaluation": {"verified_ok": 0.9 + n / 100}, "created_at": utcnow()}])
    at = app("ada")
    at.switch_page("pages/models.py").run()
    assert not at.exception, at.exception
    for version in ("reviser-0001", "reviser-0002"):
        at.selectbox(key="deploy_model").select_index(
            [o for o in at.selectbox(key="deploy_model").options].index(version)).run()
        next(b for b in at.button if b.label == "Deploy").click().run()
        assert not at.error, [e.value for e in at.error]
    next(b for b in at.button if b.label == "Roll back").click().run()
    assert not at.error, [e.value for e in at.error]
    with Session(engine) as session:
        history = deployments.history(session)
        state = deployments.served(session)
    assert [(d.action, d.actor) for d in history] == [("rollback", "ada"), ("deploy", "ada"), ("deploy", "ada")]
    assert state.active.name == "reviser-0001"
    assert [m.value for m in at.metric][:1] == ["reviser-0001"]  # the page shows what the rollback left active

    at = app("rita")
    at.switch_page("pages/models.py").run()
    assert next(b for b in at.button if b.label == "Roll back").disabled
    assert "Only admins deploy and roll back; you are a reviewer." in _texts(at)
    with pytest.raises(NotAllowed, match="only admins"):
        deploy.rollback(engine, Identity("rita", Role.REVIEWER))
    with Session(engine) as session:
        assert len(deployments.history(session)) == 3
    engine.dispose()


def _collected(url: str, folder: Path, requests: list[tuple[str, bytes]]) -> None:
    """Each (OTLP path, protobuf body) sent to a collector that stores in `url`, as an exporter sends it."""
    collector = CollectorProcess(url, folder).start()
    try:
        for path, body in requests:
            answer = httpx.post(f"{collector.url}/v1/{path}", content=body,
                                headers={"Content-Type": "application/x-protobuf"})
            assert answer.status_code == 200, answer.text
    finally:
        collector.stop()


def _app_on(url: str, name: str, role: Role, monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    """The app on a store of the test's own, `name` signed in with `role`."""
    from streamlit.testing.v1 import AppTest

    users.add_user(make_engine(url), name, role, PASSWORD)
    monkeypatch.setenv("TRACEMILL_DATABASE_URL", url)
    get_settings.cache_clear()
    at = AppTest.from_file(str(APP), default_timeout=60).run()
    at.text_input(key="sign_in_name").input(name)
    at.text_input(key="sign_in_password").input(PASSWORD)
    at.button[0].click().run()
    return at


def test_a_span_whose_messages_came_as_log_events_shows_them(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    url = f"sqlite:///{tmp_path / 'events.db'}"
    trace, span = "ab" * 16, "cd" * 8
    _collected(url, tmp_path, [
        ("traces", export_request([make_span(trace, span, "chat llama3.1-8b", CHAT_WITHOUT_OUTPUT)])),
        ("logs", logs_request(trace, span, [
            {"name": "gen_ai.user.message", "body": {"content": "Weather in Oslo tonight?"}},
            {"name": "gen_ai.choice", "body": {"index": 0, "message": {
                "role": "assistant", "tool_calls": [{"id": "c1", "type": "function", "function": {
                    "name": "get_weather", "arguments": '{"city": "Oslo"'}}]}}}]))])
    try:
        at = _app_on(url, "rita", Role.REVIEWER, monkeypatch)
        at.query_params["trace"] = trace
        at.switch_page("pages/traces.py").run()
        assert not at.exception, at.exception
        assert [t.label for t in at.tabs][2] == "Events (2)"
        assert "gen_ai.user.message** · log event" in _texts(at)
        assert any("Weather in Oslo tonight?" in json.dumps(j.value) for j in at.json)
    finally:
        get_settings.cache_clear()


def test_a_long_conversation_stored_in_parts_reads_page_by_page(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    url = f"sqlite:///{tmp_path / 'parts.db'}"
    trace, span = "ef" * 16, "01" * 8
    messages = [{"role": ("user", "tool")[k % 2], "content": f"turn {k}: " + "ipsum " * 400} for k in range(6)]
    conversation = json.dumps(messages)
    attributes = {**chat_attributes([{"id": "call_a1b2c3d4e5", "name": "get_weather", "arguments": {"city": "Oslo"}}]),
                  "gen_ai.input.messages": conversation}
    _collected(url, tmp_path, [("traces", export_request([make_span(trace, span, "chat", attributes)]))])
    engine = make_engine(url)
    with engine.connect() as conn:
        stored = conn.execute(select(SpanRow.attributes)).scalar_one()["gen_ai.input.messages"]
    engine.dispose()
    assert len(stored["$parts"]) > 2, "the conversation was stored in parts"
    try:
        at = _app_on(url, "rita", Role.REVIEWER, monkeypatch)
        at.query_params["trace"] = trace
        at.switch_page("pages/traces.py").run()
        assert not at.exception, at.exception
        assert conversation[:4000] in [c.value for c in at.code]
        at.number_input(key=f"pg_{span}_gen_ai.input.messages").set_value(3).run()
        assert not at.exception, at.exception
        assert conversation[8000:12000] in [c.value for c in at.code], "a page that spans two parts"
    finally:
        get_settings.cache_clear()


def test_failure_modes_read_one_service_s_calls(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Behind the reviser sidecar each answer is stored twice: the model's answer as sent (the sidecar's service) and
    the call the agent got once it was revised (the agent's). The failure-modes page counts either."""
    url = f"sqlite:///{tmp_path / 'services.db'}"
    _collected(url, tmp_path, [("traces", body) for body in sidecar_and_agent_requests()])
    try:
        at = _app_on(url, "vic", Role.VIEWER, monkeypatch)
        at.switch_page("pages/failures.py").run()
        assert not at.exception, at.exception
        assert [m.value for m in at.metric][:2] == ["2", "1"]
        assert any("counted here twice" in c.value for c in at.caption)
        at.selectbox(key="failures_service").select("tracemill-serve").run()
        assert not any("counted here twice" in c.value for c in at.caption)
        assert [m.value for m in at.metric][:2] == ["1", "1"]
        assert list(at.dataframe[-1].value["mode"]) == ["get_weather · schema · wrong_type · /arguments/city"]
        at.selectbox(key="failures_service").select("weather-agent").run()
        assert [m.value for m in at.metric][:2] == ["1", "0"]
        assert [s.value for s in at.success] == ["No stored call failed."]
    finally:
        get_settings.cache_clear()


def test_a_harness_version_behind_the_sidecar_is_compared_on_the_model_s_answers_as_sent(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """v2 ran behind the reviser sidecar, named to it: the model failed as often as under v1 and the agent got every
    call revised. With every service shown, the page compares v2 on the sidecar's record, as `--compare` does."""
    url = f"sqlite:///{tmp_path / 'harness.db'}"
    sent = [("v1", "weather-agent", n % 2 == 0) for n in range(40)]
    sent += [("v2", "tracemill-serve", n % 2 == 0) for n in range(40)] + [("v2", "weather-agent", False)] * 40
    requests = []
    for n, (version, service, broken) in enumerate(sent):
        call = {"id": f"call_{n:04d}Xk2pQ", "name": "get_weather", "arguments": {"city": 7 if broken else "Oslo"}}
        span = make_span(f"{n + 1:032x}", "01" * 8, "chat", chat_attributes([call]))
        requests.append(("traces", export_request([span], {"service.name": service,
                                                           "tracemill.harness.version": version})))
    _collected(url, tmp_path, requests)
    try:
        at = _app_on(url, "vic", Role.VIEWER, monkeypatch)
        at.switch_page("pages/failures.py").run()
        assert not at.exception, at.exception
        (compared,) = [d.value for d in at.dataframe if "v1 rate" in d.value.columns]
        assert list(compared["v1 rate"]) == [0.5] and list(compared["v2 rate"]) == [0.5]
        assert list(compared["change"]) == ["no significant change"]
        assert any("v2 read from the reviser sidecar's record alone" in c.value for c in at.caption)
    finally:
        get_settings.cache_clear()
