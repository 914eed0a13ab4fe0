"""The store's schema comes from the migrations alone, the same on SQLite and PostgreSQL."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from click.testing import CliRunner
from sqlalchemy import inspect, text

from tracemill.cli import main
from tracemill.store.engine import make_engine
from tracemill.store.migrate import current_revision, head_revision, upgrade
from tracemill.store.tables import Base


def tracemill(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tracemill.cli", *args], capture_output=True, text=True)


def test_db_upgrade_builds_the_tables_the_code_expects(db_url: str) -> None:
    result = tracemill("db", "upgrade", "--db", db_url)
    assert result.returncode == 0, result.stderr
    assert f"at revision {head_revision()}" in result.stdout
    engine = make_engine(db_url)
    assert current_revision(engine) == head_revision()
    assert {"spans", "toolsets", "tool_calls", "tool_executions", "api_keys"} <= set(inspect(engine).get_table_names())
    with engine.connect() as conn:
        assert compare_metadata(MigrationContext.configure(conn, opts={"compare_type": True}), Base.metadata) == []
    upgrade(engine)  # a second upgrade is a no-op
    assert current_revision(engine) == head_revision()
    engine.dispose()


def test_sqlite_store_uses_wal(sqlite_url: str) -> None:
    engine = make_engine(sqlite_url)
    upgrade(engine)
    with engine.connect() as conn:
        assert conn.execute(text("PRAGMA journal_mode")).scalar_one() == "wal"
    engine.dispose()


def test_collector_refuses_an_unmigrated_postgres_store(postgres_url: str) -> None:
    result = tracemill("collector", "--db", postgres_url, "--port", "1")
    assert result.returncode != 0
    assert "run `tracemill db upgrade --db URL` first" in result.stderr


def test_stats_on_a_missing_store_says_so(tmp_path) -> None:  # type: ignore[no-untyped-def]
    empty = tmp_path / "empty.db"
    make_engine(f"sqlite:///{empty}").connect().close()
    result = tracemill("stats", "--db", f"sqlite:///{empty}", "--json")
    assert result.returncode != 0 and "no Tracemill store" in result.stderr


def test_a_read_on_a_wrong_path_says_the_file_does_not_exist(tmp_path) -> None:  # type: ignore[no-untyped-def]
    missing = tmp_path / "typo.db"
    for command in (["stats", "--json"], ["db", "current"], ["keys", "list"], ["keys", "revoke", "1"],
                    ["models", "list"], ["failures"], ["mine", "--out", str(tmp_path / "export")]):
        result = tracemill(*command, "--db", f"sqlite:///{missing}")
        assert result.returncode != 0 and f"{missing} does not exist" in result.stderr, result.stderr
    assert not missing.exists(), "a read-only command created the database"


def test_bad_database_url_is_named() -> None:
    result = tracemill("stats", "--db", "not a url")
    assert result.returncode != 0 and "'not a url' is not a valid SQLAlchemy URL" in result.stderr


def test_a_file_that_is_no_database_is_named_in_one_line_by_every_command_that_opens_it(tmp_path: Path) -> None:
    garbage = tmp_path / "notes.db"
    garbage.write_text("not a database\n" * 100)
    before = garbage.read_bytes()
    for command in (["db", "upgrade"], ["db", "current"], ["collector", "--port", "0"], ["ui"], ["users", "list"],
                    ["keys", "list"], ["stats"], ["failures"], ["models", "list"], ["deployments"],
                    ["deploy", "rules"], ["rollback"], ["mine", "--out", str(tmp_path / "export")],
                    ["mine-agent", "--base-url", "http://127.0.0.1:9/v1", "--model", "m"]):
        result = CliRunner().invoke(main, [*command, "--db", f"sqlite:///{garbage}"])
        assert isinstance(result.exception, SystemExit) and result.exit_code == 1, (command, result.output)
        assert result.output.strip() == f"Error: cannot read the store at sqlite:///{garbage}: file is not a database"
    assert garbage.read_bytes() == before
