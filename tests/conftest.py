from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from support import CollectorProcess

os.environ.setdefault("HF_HUB_OFFLINE", "1")

POSTGRES_URL = os.environ.get("TRACEMILL_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test")
REQUIRE_POSTGRES = os.environ.get("TRACEMILL_REQUIRE_POSTGRES") == "1"


@pytest.fixture(scope="session")
def postgres_admin():  # type: ignore[no-untyped-def]
    engine = create_engine(POSTGRES_URL, isolation_level="AUTOCOMMIT")
    try:
        with engine.connect() as conn:
            conn.execute(text("select 1"))
    except Exception as exc:
        engine.dispose()
        message = f"PostgreSQL not reachable at {POSTGRES_URL} ({type(exc).__name__}); set TRACEMILL_TEST_POSTGRES_URL"
        if REQUIRE_POSTGRES:
            pytest.fail(message)
        pytest.skip(message)
    yield engine
    engine.dispose()


@pytest.fixture
def postgres_url(postgres_admin) -> Iterator[str]:  # type: ignore[no-untyped-def]
    """A fresh, empty PostgreSQL database for one test, dropped afterwards."""
    name = f"tracemill_test_{uuid.uuid4().hex[:12]}"
    with postgres_admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    yield make_url(POSTGRES_URL).set(database=name).render_as_string(hide_password=False)
    with postgres_admin.connect() as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


@pytest.fixture(scope="session")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`tracemill tiny-model`, built once for the trainer's and the cycle's tests."""
    from click.testing import CliRunner

    from tracemill.cli import main

    out = tmp_path_factory.mktemp("tiny") / "model"
    result = CliRunner().invoke(main, ["tiny-model", "--out", str(out)], catch_exceptions=False)
    assert result.exit_code == 0 and "MB)" in result.output, result.output
    return out


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'tracemill.db'}"


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """Each test that takes it runs on SQLite and on PostgreSQL."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'tracemill.db'}"
    return request.getfixturevalue("postgres_url")


@pytest.fixture
def start_collector(tmp_path: Path) -> Iterator:  # type: ignore[type-arg]
    started: list[CollectorProcess] = []

    def start(db_url: str, workers: int = 1, **env: str) -> CollectorProcess:
        if not db_url.startswith("sqlite"):
            from tracemill.store.engine import make_engine
            from tracemill.store.migrate import upgrade

            engine = make_engine(db_url)
            upgrade(engine)
            engine.dispose()
        collector = CollectorProcess(db_url, tmp_path, env, workers).start()
        started.append(collector)
        return collector

    yield start
    for collector in started:
        collector.stop()


@pytest.fixture
def start_proxy() -> Iterator:  # type: ignore[type-arg]
    """Start the reviser sidecar in this process: start(upstream_base_url, **ServeConfig fields) -> its server."""
    from tracemill.net import ServerThread
    from tracemill.serving.app import ServeConfig, create_app

    started: list[ServerThread] = []

    def start(upstream: str, **config: object) -> ServerThread:
        server = ServerThread(create_app(ServeConfig(upstream, **config))).start()  # type: ignore[arg-type]
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()
