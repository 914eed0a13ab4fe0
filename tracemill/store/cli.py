"""`tracemill db`: schema migrations."""

from __future__ import annotations

import click


def database_option(func):  # type: ignore[no-untyped-def]
    return click.option("--db", "db_url", metavar="URL", help="Database URL (default: TRACEMILL_DATABASE_URL, "
                        "else a SQLite file tracemill.db in the current folder).")(func)


def resolve_db(db_url: str | None) -> str:
    from tracemill.settings import get_settings

    return db_url or get_settings().database_url


@click.group()
def db() -> None:
    """Manage the store's schema."""


@db.command()
@database_option
def upgrade(db_url: str | None) -> None:
    """Migrate the store to the newest schema."""
    from tracemill.store.engine import make_engine
    from tracemill.store.migrate import current_revision, upgrade as run_upgrade

    engine = make_engine(resolve_db(db_url))
    run_upgrade(engine)
    click.echo(f"{engine.url.render_as_string(hide_password=True)}: at revision {current_revision(engine)}")


@db.command()
@database_option
def current(db_url: str | None) -> None:
    """Print the store's schema revision and the newest one."""
    from tracemill.store.engine import make_engine
    from tracemill.store.migrate import current_revision, head_revision

    engine = make_engine(resolve_db(db_url))
    click.echo(f"current: {current_revision(engine) or 'empty'}\nhead:    {head_revision()}")
