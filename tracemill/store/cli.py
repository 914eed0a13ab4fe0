"""`tracemill db`: schema migrations; and the options every command that reads the store shares."""

from __future__ import annotations

import functools
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any

import click


def database_option(func):  # type: ignore[no-untyped-def]
    return click.option("--db", "db_url", metavar="URL", help="Database URL (default: TRACEMILL_DATABASE_URL, "
                        "else a SQLite file tracemill.db in the current folder).")(func)


def resolve_db(db_url: str | None) -> str:
    from tracemill.settings import get_settings

    return db_url or get_settings().database_url


@contextmanager
def store_errors(engine: Any) -> Iterator[None]:
    """A database error while the store is opened or read (a file that is no database, a server that refuses), as
    one line that names the store."""
    from sqlalchemy.exc import SQLAlchemyError

    try:
        yield
    except SQLAlchemyError as exc:
        detail = str(getattr(exc, "orig", exc)).strip().splitlines()[0]
        shown = engine.url.render_as_string(hide_password=True)
        raise click.ClickException(f"cannot read the store at {shown}: {detail}") from None


def open_store(db_url: str | None):  # type: ignore[no-untyped-def]
    """The store's engine, migrated if it is a SQLite file (created if there is none: for commands that write, such as
    the collector); a PostgreSQL store must be migrated on purpose."""
    from tracemill.store.engine import make_engine

    url = resolve_db(db_url)
    engine = make_engine(url)
    with store_errors(engine):
        return _migrated(engine, url)


def _migrated(engine: Any, url: str) -> Any:
    from tracemill.store.engine import is_sqlite
    from tracemill.store.migrate import current_revision, head_revision, upgrade

    if is_sqlite(url):
        upgrade(engine)
    elif current_revision(engine) != head_revision():
        raise click.ClickException(
            f"the store at {engine.url.render_as_string(hide_password=True)} is at schema revision "
            f"{current_revision(engine) or 'none'}, not {head_revision()}: run `tracemill db upgrade --db URL` first")
    return engine


def read_store(db_url: str | None, where: Any = None):  # type: ignore[no-untyped-def]
    """`open_store` for commands that read what was stored: a store that is not there, or a database that is no
    Tracemill store, is a one-line error naming it (never an empty store made on a mistyped path), as is a filter
    value (`where`, a CallFilter) no stored call has."""
    from tracemill.store.engine import StoreURLError, make_engine
    from tracemill.store.migrate import current_revision
    from tracemill.store.queries import FilterError, check_filter

    url = resolve_db(db_url)
    hint = "(start the collector on it, or run `tracemill db upgrade`)"
    try:
        engine = make_engine(url, must_exist=True)
    except StoreURLError as exc:
        raise click.ClickException(f"{exc} {hint}") from None
    try:
        with store_errors(engine):
            if current_revision(engine) is None:
                raise click.ClickException(f"no Tracemill store at {engine.url.render_as_string(hide_password=True)} "
                                           f"{hint}")
            _migrated(engine, url)
            if where is not None:
                with engine.connect() as conn:
                    check_filter(conn, where)
    except FilterError as exc:
        raise click.ClickException(str(exc)) from None
    return engine


class UTCDateTime(click.ParamType):
    """A date or date and time in ISO 8601 (`2026-11-30`, `2026-11-30T08:00`); UTC unless it names its zone."""

    name = "DATE"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> datetime:
        if isinstance(value, datetime):
            return value
        try:
            parsed = datetime.fromisoformat(str(value))
        except ValueError:
            self.fail(f"{value!r} is not a date (use ISO 8601, e.g. 2026-11-30 or 2026-11-30T08:00)", param, ctx)
        return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


DATE = UTCDateTime()


def call_filter_options(func):  # type: ignore[no-untyped-def]
    """--model, --harness, --domain, --tool, --service: which stored calls a command reads, passed on as `where` (a
    CallFilter) with anything the command adds later (dates, ids)."""
    from tracemill.store.queries import CallFilter

    @functools.wraps(func)
    def wrapper(*args: Any, model: str | None, harness: str | None, domain: str | None, tool: str | None,
                service: str | None, **kwargs: Any) -> Any:
        return func(*args, where=CallFilter(model=model, harness_version=harness, domain=domain, tool=tool,
                                            service=service), **kwargs)

    sidecar = "service (the agent's; tracemill-serve: the reviser sidecar's record of the model's answers)"
    for name, what in (("service", sidecar), ("tool", "tool name"), ("domain", "domain (medical, legal, ...)"),
                       ("harness", "harness version"), ("model", "model")):
        wrapper = click.option(f"--{name}", default=None, help=f"Only calls with this {what}.")(wrapper)
    return wrapper


@click.group()
def db() -> None:
    """Manage the store's schema."""


@db.command()
@database_option
def upgrade(db_url: str | None) -> None:
    """Migrate the store to the newest schema."""
    from tracemill.store.engine import make_engine
    from tracemill.store.migrate import current_revision
    from tracemill.store.migrate import upgrade as run_upgrade

    engine = make_engine(resolve_db(db_url))
    with store_errors(engine):
        run_upgrade(engine)
        click.echo(f"{engine.url.render_as_string(hide_password=True)}: at revision {current_revision(engine)}")


@db.command()
@database_option
def current(db_url: str | None) -> None:
    """Print the store's schema revision and the newest one."""
    from tracemill.store.engine import make_engine
    from tracemill.store.migrate import current_revision, head_revision

    engine = make_engine(resolve_db(db_url), must_exist=True)
    with store_errors(engine):
        click.echo(f"current: {current_revision(engine) or 'empty'}\nhead:    {head_revision()}")
