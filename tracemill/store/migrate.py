"""Schema migrations: the only way the store's schema changes."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from alembic import command, op
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Engine

# The scripts live in the top-level `alembic/` folder of a checkout (no __init__.py there, so the folder never shadows
# the alembic library) and are installed as `tracemill/migrations/` by a wheel.
_SCRIPT_DIRS = (Path(__file__).resolve().parents[1] / "migrations", Path(__file__).resolve().parents[2] / "alembic")


def _config() -> Config:
    config = Config()
    location = next(d for d in _SCRIPT_DIRS if (d / "env.py").is_file())
    config.set_main_option("script_location", str(location))
    return config


def head_revision() -> str | None:
    return ScriptDirectory.from_config(_config()).get_current_head()


def current_revision(engine: Engine) -> str | None:
    with engine.connect() as connection:
        return MigrationContext.configure(connection).get_current_revision()


def upgrade(engine: Engine, revision: str = "head") -> None:
    config = _config()
    with engine.begin() as connection:
        config.attributes["connection"] = connection
        command.upgrade(config, revision)


def is_current(engine: Engine) -> bool:
    return current_revision(engine) == head_revision()


def retype_on_postgresql(columns: Mapping[str, Sequence[str]], to: str) -> None:
    """In a migration script: the columns of each table made of type `to` on PostgreSQL, one statement a table (each
    rewrites it). SQLite, whose JSON is text whatever the declared type, is left alone."""
    if op.get_bind().dialect.name != "postgresql":
        return
    for table, names in columns.items():
        changes = ", ".join(f'ALTER COLUMN "{c}" TYPE {to} USING "{c}"::{to}' for c in names)
        op.execute(f"ALTER TABLE {table} {changes}")
