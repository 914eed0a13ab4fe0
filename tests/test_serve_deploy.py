"""A running sidecar follows `tracemill deploy`, `--canary` and `rollback` without a restart: with a (scripted) vLLM
back end it loads each version's LoRA adapter, asks it as the request's `model`, sends a canary's share of
conversations to it (sticky) and unloads what nothing serves any more; without one it runs the version in process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from click.testing import CliRunner
from openai import OpenAI
from scripted_model import Reply, ScriptedModel, native
from sqlalchemy import select
from sqlalchemy.orm import Session
from test_deployments import add_models

from tracemill.cli import main
from tracemill.net import ServerThread, free_port
from tracemill.repair import revise
from tracemill.revisers import model_answer, register, registered
from tracemill.store.engine import make_engine
from tracemill.store.tables import ToolCallRow

from support import WEATHER_TOOLS

# get_forecast needs `days`: the rules cannot make it up, a model reviser may find it (here: scripted to).
BROKEN = native([{"name": "get_forecast", "arguments": '{"city": "Paris"}'}])
ANSWERS = {"tracemill-reviser-a": '{"name": "get_forecast", "arguments": {"city": "Paris", "days": 3}}',
           "tracemill-reviser-b": '{"name": "get_forecast", "arguments": {"city": "Paris", "days": 5}}'}


def tracemill(*args: str) -> str:
    result = CliRunner().invoke(main, list(args))
    assert result.exit_code == 0, result.output
    return result.output


def wait_for(check: Callable[[], bool], what: str, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


@pytest.fixture
def vllm() -> Iterator[tuple[ScriptedModel, ServerThread]]:
    scripted = ScriptedModel(reviser_answers=dict(ANSWERS))
    scripted.replies["forecast"] = Reply(tool_calls=BROKEN)
    server = ServerThread(scripted.app()).start()
    yield scripted, server
    server.stop()


def _ask(client: OpenAI, conversation: str | None = None) -> tuple[str, int | None]:
    """(the version that served, the `days` the client got: None when the call stayed broken)."""
    raw = client.chat.completions.with_raw_response.create(
        model="scripted-llama", messages=[{"role": "user", "content": "forecast"}], tools=WEATHER_TOOLS,
        extra_headers={"X-Conversation-Id": conversation} if conversation else None)
    call = raw.parse().choices[0].message.tool_calls[0]
    return raw.headers["x-tracemill-version"], json.loads(call.function.arguments).get("days")


class Sidecar:
    """`tracemill serve` as its own process, as a user runs it."""

    def __init__(self, tmp_path: Path, *args: str) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = tmp_path / f"serve-{self.port}.log"
        env = {**os.environ, "TRACEMILL_SERVE_POLL_SECONDS": "0.1", "PYTHONUNBUFFERED": "1"}
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen([sys.executable, "-m", "tracemill.cli", "serve", "--port", str(self.port),
                                          "--log-level", "warning", *args], env=env, stdout=log,
                                         stderr=subprocess.STDOUT)
        wait_for(self._up, f"the sidecar to start:\n{self.log.read_text()}")

    def _up(self) -> bool:
        if self.proc.poll() is not None:
            raise AssertionError(f"tracemill serve exited:\n{self.log.read_text()}")
        try:
            return httpx.get(self.url + "/healthz", timeout=1).status_code == 200
        except httpx.TransportError:
            return False

    def health(self) -> dict[str, Any]:
        return httpx.get(self.url + "/healthz", timeout=5).json()

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(20)


def test_deploy_canary_and_rollback_with_vllm_adapters(vllm, tmp_path, start_collector) -> None:
    scripted, upstream = vllm
    db = f"sqlite:///{tmp_path / 'store.db'}"
    add_models(db, "reviser-a", "reviser-b")
    traces = f"sqlite:///{tmp_path / 'traces.db'}"
    collector = start_collector(traces)
    sidecar = Sidecar(tmp_path, "--upstream", upstream.url + "/v1", "--db", db, "--vllm", upstream.url + "/v1",
                      "--collector", collector.url)
    try:
        client = OpenAI(base_url=sidecar.url + "/v1", api_key="k", max_retries=0)
        assert _ask(client) == ("rules", None)  # nothing deployed: the rules refuse to make up `days`

        tracemill("deploy", "reviser-a", "--db", db, "--actor", "ana")
        wait_for(lambda: sidecar.health()["version"] == "reviser-a", "reviser-a to serve")
        assert scripted.lora == [("load", "tracemill-reviser-a", "/adapters/reviser-a")]
        assert _ask(client) == ("reviser-a", 3)
        asked = [r for r in scripted.requests if r["model"] == "tracemill-reviser-a"][-1]
        assert asked["messages"][-1]["content"].startswith("<tools>")  # the kernel's reviser prompt

        tracemill("deploy", "reviser-b", "--canary", "50", "--db", db, "--actor", "ana")
        wait_for(lambda: (sidecar.health()["canary"] or {}).get("version") == "reviser-b", "the canary")
        assert scripted.lora[-1] == ("load", "tracemill-reviser-b", "/adapters/reviser-b")
        served = {f"conversation-{i}": _ask(client, f"conversation-{i}") for i in range(40)}
        on_b = [c for c, (version, _) in served.items() if version == "reviser-b"]
        assert 8 <= len(on_b) <= 32, len(on_b)
        assert all(days == (5 if version == "reviser-b" else 3) for version, days in served.values())
        assert all(_ask(client, c) == served[c] for c in list(served)[:12])  # sticky per conversation

        tracemill("rollback", "--db", db, "--actor", "bo")
        wait_for(lambda: sidecar.health()["canary"] is None, "the canary to end")
        wait_for(lambda: ("unload", "tracemill-reviser-b", "/adapters/reviser-b") in scripted.lora, "b unloaded")
        assert all(_ask(client, c)[0] == "reviser-a" for c in on_b[:5])

        tracemill("rollback", "--db", db, "--actor", "bo")
        wait_for(lambda: sidecar.health()["version"] == "rules", "the rules to serve again")
        wait_for(lambda: scripted.loaded == {}, "a unloaded")
        assert scripted.lora[-1] == ("unload", "tracemill-reviser-a", "/adapters/reviser-a")
        assert _ask(client) == ("rules", None)
    finally:
        sidecar.stop()
    engine = make_engine(traces)

    def by_version() -> dict[str | None, int]:
        with Session(engine) as session:
            models = session.execute(select(ToolCallRow.model)).scalars().all()
        return {m: models.count(m) for m in set(models)}

    wait_for(lambda: {"tracemill-reviser:reviser-a", "tracemill-reviser:reviser-b"} <= set(by_version()),
             "the revised calls of both versions in the collector")
    counts = by_version()
    engine.dispose()
    assert counts["tracemill-reviser:reviser-b"] == len(on_b) + 12 - sum(
        served[c][0] != "reviser-b" for c in list(served)[:12])  # every request b served, and only those


def test_a_version_that_cannot_load_leaves_the_previous_one_serving(vllm, tmp_path, start_proxy) -> None:
    scripted, upstream = vllm
    db = f"sqlite:///{tmp_path / 'store.db'}"
    add_models(db, "reviser-a")
    add_models(db, "reviser-full", kind="full")
    proxy = start_proxy(upstream.url + "/v1", db_url=db, vllm=upstream.url + "/v1", poll_seconds=0.05)
    tracemill("deploy", "reviser-a", "--db", db)
    wait_for(lambda: httpx.get(proxy.url + "/healthz").json()["version"] == "reviser-a", "reviser-a")
    tracemill("deploy", "reviser-full", "--db", db)
    wait_for(lambda: httpx.get(proxy.url + "/healthz").json()["deployment_error"] is not None, "the error")
    health = httpx.get(proxy.url + "/healthz").json()
    assert health["version"] == "reviser-a" and "only LoRA adapters" in health["deployment_error"]
    add_models(db, "reviser-8b", base="Qwen/Qwen3-8B")  # trained on other weights than those vLLM serves
    tracemill("deploy", "reviser-8b", "--db", db)
    wait_for(lambda: "Qwen/Qwen3-8B" in (httpx.get(proxy.url + "/healthz").json()["deployment_error"] or ""),
             "the error")
    health = httpx.get(proxy.url + "/healthz").json()
    assert health["version"] == "reviser-a" and "serves tiny-qwen" in health["deployment_error"]
    assert "tracemill-reviser-8b" not in scripted.loaded
    scripted.loaded.clear()  # vLLM restarted without the adapter: the model reviser fails, the rules' answer stands
    client = OpenAI(base_url=proxy.url + "/v1", api_key="k", max_retries=0)
    assert _ask(client) == ("reviser-a", None)
    assert 'tracemill_serve_reviser_errors_total{version="reviser-a"} 1.0' in httpx.get(proxy.url + "/metrics").text


class ScriptedModelReviser:
    """Stands in for the trainer's `model:PATH` reviser: the rules first, then the answer the "model" at PATH gives
    (read from PATH/answer.json), kept only when valid (`model_answer`), as the reviser contract says."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.answer = (Path(path) / "answer.json").read_text()

    def __call__(self, raw, index, context=None):  # type: ignore[no-untyped-def]
        first = revise(raw, index, context)
        if first.ok:
            return first
        return model_answer(first, raw, self.answer, index, context, f"the model at {self.path}")


@pytest.fixture
def model_reviser() -> Iterator[None]:
    before = next((r for r in registered() if r.name == "model"), None)
    register("model", ScriptedModelReviser, takes_argument=True)
    yield
    if before is not None:
        register(before.name, before.factory, takes_argument=before.takes_argument, help=before.help)


def test_without_vllm_a_deployed_version_runs_in_process(vllm, tmp_path, model_reviser, start_proxy) -> None:
    scripted, upstream = vllm
    db = f"sqlite:///{tmp_path / 'store.db'}"
    add_models(db, "reviser-a")
    engine = make_engine(db)
    with engine.begin() as conn:  # point the version at a real folder holding its "weights"
        conn.exec_driver_sql("UPDATE models SET path = ?", (str(tmp_path / "reviser-a"),))
    engine.dispose()
    (tmp_path / "reviser-a").mkdir()
    (tmp_path / "reviser-a" / "answer.json").write_text(ANSWERS["tracemill-reviser-a"])
    proxy = start_proxy(upstream.url + "/v1", db_url=db, poll_seconds=0.05)
    client = OpenAI(base_url=proxy.url + "/v1", api_key="k", max_retries=0)
    assert _ask(client) == ("rules", None)
    tracemill("deploy", "reviser-a", "--db", db)
    wait_for(lambda: httpx.get(proxy.url + "/healthz").json()["version"] == "reviser-a", "reviser-a")
    assert _ask(client) == ("reviser-a", 3)
    assert scripted.lora == []  # nothing was loaded into vLLM
    valid = native([{"name": "get_forecast", "arguments": '{"city": "Paris", "days": 9}'}])
    scripted.replies["forecast"] = Reply(tool_calls=valid)
    assert _ask(client) == ("reviser-a", 9)  # a valid call is never sent to the model reviser
