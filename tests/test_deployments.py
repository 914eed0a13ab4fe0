"""`tracemill deploy`, `rollback` and `deployments` on a real store (SQLite and PostgreSQL): an append-only history
that replays to what the sidecars serve."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from tracemill.cli import main
from tracemill.serving.deployments import DeployError, deploy, rollback, served
from tracemill.store.engine import make_engine
from tracemill.store.migrate import upgrade
from tracemill.store.tables import DeploymentRow, ModelRow


def add_models(db_url: str, *names: str, kind: str = "lora", base: str = "tiny-qwen") -> None:
    engine = make_engine(db_url)
    upgrade(engine)
    with Session(engine) as session:
        for name in names:
            session.add(ModelRow(name=name, base_model=base, kind=kind, path=f"/adapters/{name}",
                                 config={"prompt_settings": {"max_tools": 3}}, metrics={},
                                 evaluation={"reference_match": 0.9, "valid_changed": 0.0}))
        session.commit()
    engine.dispose()


def tracemill(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, list(args))
    return result.exit_code, result.output


def _state(db_url: str):  # type: ignore[no-untyped-def]
    engine = make_engine(db_url)
    with Session(engine) as conn:
        state = served(conn)
    engine.dispose()
    return state


def test_deploy_canary_and_rollback_walk_the_history(db_url: str) -> None:
    add_models(db_url, "reviser-a", "reviser-b")
    engine = make_engine(db_url)
    assert _state(db_url).active.name == "rules"
    deploy(engine, "reviser-a", actor="ana", note="beats rules on mcp-bench")
    state = _state(db_url)
    assert (state.active.name, state.active.path, state.canary) == ("reviser-a", "/adapters/reviser-a", None)
    assert state.active.config["prompt_settings"] == {"max_tools": 3}
    deploy(engine, "2", actor="ana", canary=10)  # by id
    state = _state(db_url)
    assert (state.active.name, state.canary.name, state.canary_percent) == ("reviser-a", "reviser-b", 10)
    rollback(engine, actor="bo")  # ends the canary
    state = _state(db_url)
    assert (state.active.name, state.canary) == ("reviser-a", None)
    deploy(engine, "reviser-b", actor="ana")
    deploy(engine, "reviser-a", actor="ana")
    rollback(engine, actor="bo")
    assert _state(db_url).active.name == "reviser-b"
    rollback(engine, actor="bo")
    assert _state(db_url).active.name == "reviser-a"
    rollback(engine, actor="bo")
    assert _state(db_url).active.name == "rules"
    with pytest.raises(DeployError, match="nothing to roll back"):
        rollback(engine, actor="bo")
    with Session(engine) as session:
        rows = list(session.execute(select(DeploymentRow).order_by(DeploymentRow.id)).scalars())
    assert [(r.role, r.action) for r in rows] == [
        ("active", "deploy"), ("canary", "canary"), ("canary", "end_canary"), ("active", "deploy"),
        ("active", "deploy"), ("active", "rollback"), ("active", "rollback"), ("active", "rollback")]
    assert rows[0].justification == {"replaces": "rules", "note": "beats rules on mcp-bench",
                                     "evaluation": {"reference_match": 0.9, "valid_changed": 0.0}}
    assert [r.model_id for r in rows[-3:]] == [2, 1, None]  # each rollback names the version it goes back to
    engine.dispose()


def test_promoting_a_canary_ends_it(db_url: str) -> None:
    add_models(db_url, "reviser-a", "reviser-b")
    engine = make_engine(db_url)
    deploy(engine, "reviser-a", actor="ana")
    deploy(engine, "reviser-b", actor="ana", canary=25)
    rows = deploy(engine, "reviser-b", actor="ana")
    assert [(r.role, r.action) for r in rows] == [("canary", "end_canary"), ("active", "deploy")]
    state = _state(db_url)
    assert (state.active.name, state.canary) == ("reviser-b", None)
    rollback(engine, actor="ana")
    assert _state(db_url).active.name == "reviser-a"
    engine.dispose()


def test_deploy_refuses_what_it_cannot_do(db_url: str) -> None:
    add_models(db_url, "reviser-a")
    engine = make_engine(db_url)
    with pytest.raises(DeployError, match="no model 'reviser-z'.*newest models: reviser-a"):
        deploy(engine, "reviser-z", actor="ana")
    with pytest.raises(DeployError, match="rules is already active"):
        deploy(engine, "rules", actor="ana")
    deploy(engine, "reviser-a", actor="ana")
    with pytest.raises(DeployError, match="a canary must be another version"):
        deploy(engine, "reviser-a", actor="ana", canary=5)
    with pytest.raises(DeployError, match="over 0 and at most 100"):
        deploy(engine, "rules", actor="ana", canary=0)
    with Session(engine) as session:
        assert session.execute(select(func.count()).select_from(DeploymentRow)).scalar() == 1
    engine.dispose()


def test_the_commands(tmp_path) -> None:  # type: ignore[no-untyped-def]
    db = f"sqlite:///{tmp_path / 'store.db'}"
    code, output = tracemill("deployments", "--db", db)
    assert code != 0 and "does not exist" in output and not (tmp_path / "store.db").exists()
    add_models(db, "reviser-a", "reviser-b")
    code, output = tracemill("deploy", "reviser-a", "--db", db, "--actor", "ana", "--note", "better")
    assert code == 0 and "reviser-a active" in output, output
    code, output = tracemill("deploy", "reviser-b", "--canary", "10", "--db", db, "--actor", "ana")
    assert code == 0 and "reviser-b canary for 10 % of conversations" in output, output
    code, output = tracemill("deploy", "reviser-b", "--canary", "150", "--db", db)
    assert code != 0 and "150" in output
    code, output = tracemill("deploy", "nope", "--db", db)
    assert code != 0 and "no model 'nope'" in output
    code, output = tracemill("rollback", "--db", db, "--actor", "bo")
    assert code == 0 and "canary ended; reviser-a is active" in output, output
    code, output = tracemill("deployments", "--db", db, "--json")
    listed = json.loads(output)
    assert listed["active"] == "reviser-a" and listed["canary"] is None
    assert [(r["action"], r["version"], r["actor"]) for r in listed["history"]] == [
        ("end_canary", "", "bo"), ("canary", "reviser-b", "ana"), ("deploy", "reviser-a", "ana")]
    assert listed["history"][-1]["justification"]["note"] == "better"
    code, output = tracemill("deployments", "--db", db)
    assert code == 0 and "serving: reviser-a active" in output
