"""Engines for the store: SQLite (WAL) by default, PostgreSQL at scale."""

from __future__ import annotations

import json
import re
from typing import Any

import orjson
from sqlalchemy import Engine, Insert, Table, create_engine, event
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import make_url
from sqlalchemy.exc import SQLAlchemyError

from tracemill.store.errors import StoreUnavailable
from tracemill.store.sqlite_writer import database_path


class StoreURLError(ValueError):
    pass


def is_sqlite(url: str) -> bool:
    return make_url(url).get_backend_name() == "sqlite"


def _sqlite_pragmas(dbapi_connection, _record) -> None:  # type: ignore[no-untyped-def]
    cursor = dbapi_connection.cursor()
    # WAL: readers never block the writer. synchronous=NORMAL keeps every commit across a process crash (SIGKILL);
    # only a power loss can take the last transactions.
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.execute("PRAGMA busy_timeout=60000")
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.close()


def _sqlite_writer_pragmas(dbapi_connection, _record) -> None:  # type: ignore[no-untyped-def]
    cursor = dbapi_connection.cursor()
    # Checkpoints are a `sqlite_writer.Checkpointer`'s job; the WAL file is cut back to 64 MB after one.
    cursor.execute("PRAGMA wal_autocheckpoint=0")
    cursor.execute("PRAGMA journal_size_limit=67108864")
    # 16 MB of page cache (SQLite's default is 2 MB): a collector transaction dirties more pages than 2 MB holds,
    # and a cache that fills up mid-transaction spills pages to the WAL that the commit then writes again.
    cursor.execute("PRAGMA cache_size=-16384")
    cursor.close()


def json_text(value: Any, sort_keys: bool = False) -> str:
    """The store's JSON encoding (orjson; non-string keys allowed). What orjson refuses is still stored: integers
    over 64 bits, exactly, and text holding half a character (a lone surrogate, as JSON's `\ud83d` escape allows
    and a cut emoji leaves), with U+FFFD in its place, since no database takes it."""
    try:
        return orjson.dumps(value, option=_SORTED if sort_keys else orjson.OPT_NON_STR_KEYS).decode()
    except orjson.JSONEncodeError:
        return json.dumps(_whole_characters(value), ensure_ascii=False, sort_keys=sort_keys, default=str)


_SORTED = orjson.OPT_SORT_KEYS  # keys from JSON are text: any other goes to the fallback
_LONE_SURROGATE = re.compile("[\ud800-\udfff]")  # a str holds a pair as one character: any surrogate is alone


def _whole_characters(value: Any) -> Any:
    if isinstance(value, str):
        return _LONE_SURROGATE.sub("\ufffd", value)
    if isinstance(value, dict):
        return {_whole_characters(k): _whole_characters(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_whole_characters(v) for v in value]
    return value


def insert_ignoring_duplicates(table: Table, dialect: str) -> Insert:
    """INSERT that skips rows whose unique key is already stored (exporters re-send what they were not sure of)."""
    module = postgresql if dialect == "postgresql" else sqlite
    return module.insert(table).on_conflict_do_nothing()


def make_engine(url: str, writer: bool = False, must_exist: bool = False) -> Engine:
    """`writer`: for a process that writes continuously (the collector) and checkpoints a SQLite WAL itself.
    `must_exist`: for commands that only read, to which a SQLite file that is not there is an error (SQLite would
    create an empty one). Errors never show the statement's values (span contents): `hide_parameters`."""
    try:
        parsed = make_url(url)
    except Exception as exc:
        raise StoreURLError(f"database URL {url!r} is not a valid SQLAlchemy URL: {exc}") from exc
    if parsed.get_backend_name() == "sqlite":
        path = database_path(url)
        if must_exist and path is not None and not path.exists():
            raise StoreURLError(f"no SQLite store at {url}: {path} does not exist")
        engine = create_engine(parsed, connect_args={"check_same_thread": False, "timeout": 60},
                               json_serializer=json_text, json_deserializer=orjson.loads, hide_parameters=True)
        event.listen(engine, "connect", _sqlite_pragmas)
        if writer:
            event.listen(engine, "connect", _sqlite_writer_pragmas)
        return engine
    return create_engine(parsed, pool_pre_ping=True, json_serializer=json_text, json_deserializer=orjson.loads,
                         hide_parameters=True)


def ping(engine: Engine) -> None:
    """Raises StoreUnavailable unless the store answers a query now."""
    try:
        with engine.connect() as conn:
            conn.exec_driver_sql("SELECT 1")
    except SQLAlchemyError as exc:
        raise StoreUnavailable(type(exc).__name__) from None
