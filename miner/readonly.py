"""Read-only access to the store for miner agents, that holds against a hostile query, not only a polite one.

Every query goes through three gates, each enough on its own for what it covers:
- `check_select`: sqlglot admits one SELECT (no `SELECT ... INTO`, no `FOR UPDATE`, no data-modifying CTE, no
  PRAGMA, ATTACH or SET), calling only standard functions and a short list of read-only ones;
- the connection itself: on SQLite a file opened `mode=ro` with an authorizer that allows reading and nothing else
  (no PRAGMA, no ATTACH: `mode=ro` alone lets ATTACH create and write another file, and PRAGMA query_only can be
  switched off by the query), a cap on the size of any value, and a progress handler as the deadline; on PostgreSQL
  a login role that may SELECT the store's tables and nothing more (no TEMPORARY, no CREATE, no other role to SET),
  with a statement timeout set before every statement;
- a deadline the query cannot lift, one for all the statements run on one connection (`connection`, `within_limit`:
  the failure clusters' windows, a trace's page and its length; the text search and the evidence lookup give each of
  their scans a connection, and so a deadline, of its own): SQLite's progress handler, PostgreSQL's statement timeout
  (what is left of the deadline) and a timer that cancels the statement from outside the session.
"""

from __future__ import annotations

import secrets
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import sqlglot
from sqlalchemy import Engine, create_engine, event, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError

READER_ROLE = "tracemill_reader"
READABLE_TABLES = ("spans", "payloads", "toolsets", "tool_calls", "tool_executions", "datasets", "reviews",
                   "findings", "models", "deployments")  # not api_keys
MAX_VALUE_BYTES = 10_000_000

_FORBIDDEN = tuple(getattr(sqlglot.exp, name) for name in (
    "Insert", "Update", "Delete", "Merge", "Create", "Drop", "Alter", "Command", "Set", "Pragma", "Into", "Lock",
    "Copy", "Transaction", "Commit", "Rollback", "Use", "LoadData", "Attach", "Detach") if hasattr(sqlglot.exp, name))
# functions sqlglot does not know by type, that only read
_READ_FUNCTIONS = frozenset({
    "json_extract", "json_array_length", "json_type", "json_each", "json_tree", "json_valid", "jsonb_array_length",
    "jsonb_array_elements", "jsonb_array_elements_text", "jsonb_extract_path_text", "json_extract_path_text",
    "jsonb_typeof", "jsonb_object_keys", "strftime", "julianday", "date_trunc", "to_timestamp", "instr", "printf",
    "ifnull", "iif", "nullif", "total", "group_concat", "string_agg", "unixepoch", "char_length", "position",
    "split_part", "regexp_replace", "starts_with", "typeof",
})


class QueryRefused(ValueError):
    """A query the read-only gate does not run; the message says why."""


def check_select(sql: str, dialect: str) -> str:
    """The query, if it is one SELECT that only reads; QueryRefused otherwise."""
    try:
        statements = [s for s in sqlglot.parse(sql, read="postgres" if dialect == "postgresql" else "sqlite") if s]
    except sqlglot.errors.SqlglotError as exc:
        raise QueryRefused(f"not a query this gate can read: {str(exc).splitlines()[0]}") from None
    if len(statements) != 1:
        raise QueryRefused(f"one SELECT statement only (got {len(statements)} statements)")
    statement = statements[0]
    if not isinstance(statement, sqlglot.exp.Query):
        raise QueryRefused(f"only SELECT is allowed (got {type(statement).__name__.upper()})")
    for node in statement.walk():
        if isinstance(node, _FORBIDDEN):
            raise QueryRefused(f"only reading is allowed ({type(node).__name__.upper()} refused)")
        if isinstance(node, sqlglot.exp.Anonymous) and str(node.name).lower() not in _READ_FUNCTIONS:
            raise QueryRefused(f"function {node.name}() is not allowed")
    return sql


@dataclass(frozen=True, slots=True)
class Limits:
    rows: int = 200
    seconds: float = 5.0
    cell_chars: int = 2000


# --- SQLite ---------------------------------------------------------------------------------------------------------

_ALLOWED_ACTIONS = {sqlite3.SQLITE_SELECT, sqlite3.SQLITE_READ, sqlite3.SQLITE_FUNCTION, sqlite3.SQLITE_RECURSIVE}
_DENIED_FUNCTIONS = frozenset({"load_extension", "fts3_tokenizer", "readfile", "writefile", "edit", "zeroblob"})


def _authorizer(action: int, arg1: str | None, arg2: str | None, db: str | None, trigger: str | None) -> int:
    if action == sqlite3.SQLITE_PRAGMA and arg1 == "read_uncommitted" and arg2 is None:
        return sqlite3.SQLITE_OK  # SQLAlchemy reads it when it first connects; reading a pragma changes nothing
    if action not in _ALLOWED_ACTIONS:
        return sqlite3.SQLITE_DENY
    if action == sqlite3.SQLITE_FUNCTION and (arg2 or "").lower() in _DENIED_FUNCTIONS:
        return sqlite3.SQLITE_DENY
    if action == sqlite3.SQLITE_READ and arg1 not in _SQLITE_READABLE:
        return sqlite3.SQLITE_DENY  # api_keys, as a PostgreSQL reader role is not granted it
    return sqlite3.SQLITE_OK


_SQLITE_READABLE = frozenset({*READABLE_TABLES, "sqlite_master", "sqlite_schema"})


class _ReadConnection(sqlite3.Connection):
    """A SQLite connection with the time its running statement must end by, which its progress handler checks."""

    deadline = float("inf")

    def past_deadline(self) -> int:
        return 1 if time.monotonic() > self.deadline else 0


def _sqlite_reader(path: str) -> Engine:
    def connect() -> sqlite3.Connection:
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, check_same_thread=False, factory=_ReadConnection)
        conn.execute("PRAGMA query_only = ON")
        conn.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, MAX_VALUE_BYTES)
        conn.setlimit(sqlite3.SQLITE_LIMIT_ATTACHED, 0)
        conn.set_authorizer(_authorizer)
        conn.set_progress_handler(conn.past_deadline, 1000)
        return conn

    return create_engine("sqlite://", creator=connect)


# --- PostgreSQL -----------------------------------------------------------------------------------------------------

def ensure_reader_role(admin: Engine, role: str = READER_ROLE) -> str:
    """Create (or refresh) a login role that may only SELECT the store's tables, with a new random password, and
    return a URL that logs in as it. Needs a role that can CREATE ROLE and GRANT on the store. TEMPORARY is revoked
    from PUBLIC on the store's database (and granted back to the role running this): otherwise every role has it."""
    password = secrets.token_urlsafe(24)
    with admin.begin() as conn:
        database = conn.execute(text("SELECT current_database()")).scalar_one()
        exists = conn.execute(text("SELECT 1 FROM pg_roles WHERE rolname = :r"), {"r": role}).first()
        verb = "ALTER" if exists else "CREATE"
        conn.execute(text(f'{verb} ROLE "{role}" LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION '
                          f"NOBYPASSRLS NOINHERIT CONNECTION LIMIT 8 PASSWORD '{password}'"))
        conn.execute(text(f'REVOKE TEMPORARY ON DATABASE "{database}" FROM PUBLIC'))
        conn.execute(text(f'GRANT TEMPORARY ON DATABASE "{database}" TO CURRENT_USER'))
        conn.execute(text(f'REVOKE ALL ON DATABASE "{database}" FROM "{role}"'))
        conn.execute(text(f'GRANT CONNECT ON DATABASE "{database}" TO "{role}"'))
        conn.execute(text(f'REVOKE ALL ON ALL TABLES IN SCHEMA public FROM "{role}"'))
        conn.execute(text('REVOKE CREATE ON SCHEMA public FROM PUBLIC'))
        conn.execute(text(f'GRANT USAGE ON SCHEMA public TO "{role}"'))
        present = set(conn.execute(text("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")).scalars())
        for table in READABLE_TABLES:
            if table in present:
                conn.execute(text(f'GRANT SELECT ON "{table}" TO "{role}"'))
    return make_url(admin.url).set(username=role, password=password).render_as_string(hide_password=False)


def check_reader(engine: Engine) -> None:
    """Refuse a PostgreSQL role that could write: a superuser, one with TEMPORARY or CREATE, or any write grant."""
    with engine.connect() as conn:
        row = conn.execute(text(
            "SELECT rolsuper, rolcreaterole, rolcreatedb, rolbypassrls, "
            "has_database_privilege(current_user, current_database(), 'TEMPORARY') AS temp, "
            "has_database_privilege(current_user, current_database(), 'CREATE') AS create_db, "
            "has_schema_privilege(current_user, 'public', 'CREATE') AS create_schema, "
            "(SELECT count(*) FROM information_schema.role_table_grants WHERE grantee = current_user "
            " AND privilege_type <> 'SELECT') AS writes, "
            "(SELECT count(*) FROM pg_auth_members m JOIN pg_roles r ON r.oid = m.member "
            " WHERE r.rolname = current_user) AS memberships "
            "FROM pg_roles WHERE rolname = current_user")).one()
        conn.rollback()
    problems = [name for name, bad in (("superuser", row.rolsuper), ("CREATEROLE", row.rolcreaterole),
                                       ("CREATEDB", row.rolcreatedb), ("BYPASSRLS", row.rolbypassrls),
                                       ("TEMPORARY", row.temp), ("CREATE on the database", row.create_db),
                                       ("CREATE on schema public", row.create_schema),
                                       ("write grants", row.writes), ("role memberships", row.memberships)) if bad]
    if problems:
        raise QueryRefused(f"the reader role {engine.url.username!r} is not read-only: it has {', '.join(problems)}")


# --- the gateway ----------------------------------------------------------------------------------------------------

@dataclass(slots=True)
class ReadOnlyStore:
    """The store as miner agents see it. `engine` reads through the connection-level gates; `query` also checks the
    SQL with `check_select` and returns at most `limits.rows` rows."""

    engine: Engine
    dialect: str
    limits: Limits

    @contextmanager
    def connection(self) -> Iterator[Any]:
        """A connection whose statements, however many, end by one deadline, `limits.seconds` from now; rolled back
        at the end."""
        deadline = time.monotonic() + self.limits.seconds
        with self.engine.connect() as conn:
            raw = conn.connection.dbapi_connection
            timer: threading.Timer | None = None
            if self.dialect == "sqlite":
                raw.deadline = deadline
            else:
                # each statement gets what is left, set on a cursor of its own (a streaming statement's is a
                # server-side cursor, which takes nothing but a query)
                def time_left(*_: Any) -> None:
                    raw.execute(f"SET statement_timeout = {max(1, int((deadline - time.monotonic()) * 1000))}")

                event.listen(conn, "before_cursor_execute", time_left)
                timer = threading.Timer(self.limits.seconds + 1, raw.cancel)  # past any SET the query made
                timer.start()
            try:
                yield conn
            finally:
                if timer is not None:
                    timer.cancel()
                    event.remove(conn, "before_cursor_execute", time_left)
                if self.dialect == "sqlite":
                    raw.deadline = float("inf")
                conn.rollback()

    def within_limit(self, work: Callable[[Any], object]) -> bool:
        """Runs `work` on a connection with the deadline; whether it ran to its end (False: the deadline stopped it,
        and what it kept by then is the caller's)."""
        with self.connection() as conn:
            try:
                work(conn)
            except DBAPIError as exc:
                if not _past_deadline(exc.orig):
                    raise
                return False
        return True

    def stream(self, statement: Any, rows: list[Any]) -> bool:
        """Runs `statement` with the deadline, appending its rows to `rows` as the database finds them; whether it
        ran to its end (False: the rows found by then are kept)."""
        return self.within_limit(lambda conn: rows.extend(conn.execution_options(yield_per=1).execute(statement)))

    def query(self, sql: str) -> tuple[list[str], list[list[Any]], bool]:
        """(columns, rows, truncated) of one checked SELECT. Only the rows returned are fetched: PostgreSQL's client
        would otherwise take in every row of the result first (a `SELECT * FROM spans`: the whole store)."""
        check_select(sql, self.dialect)
        with self.connection() as conn:
            result = conn.execution_options(stream_results=True, max_row_buffer=self.limits.rows + 1) \
                .exec_driver_sql(sql)
            columns = list(result.keys())
            rows = [[_cell(v, self.limits.cell_chars) for v in row] for row in result.fetchmany(self.limits.rows + 1)]
        return columns, rows[: self.limits.rows], len(rows) > self.limits.rows


def _past_deadline(error: BaseException | None) -> bool:
    """Whether a database error is the deadline's: SQLite's progress handler interrupting, PostgreSQL cancelling."""
    if isinstance(error, sqlite3.OperationalError):
        return str(error) == "interrupted"
    return type(error).__name__ == "QueryCanceled"  # psycopg's, by either the statement timeout or the timer


def _cell(value: Any, chars: int) -> Any:
    if isinstance(value, (bytes, memoryview)):
        value = bytes(value).decode("utf-8", "replace")
    if isinstance(value, str) and len(value) > chars:
        return value[:chars] + f"... [{len(value) - chars} more characters]"
    return value if isinstance(value, (int, float, bool, type(None), str)) else str(value)


def open_reader(store: Engine, reader_url: str | None = None, limits: Limits = Limits()) -> ReadOnlyStore:
    """The read-only store beside `store` (the engine the miner writes its findings with). On PostgreSQL
    `reader_url` logs in as a read-only role; without it one is made with `ensure_reader_role` on `store`."""
    if store.dialect.name == "sqlite":
        path = store.url.database
        if not path or path == ":memory:":
            raise QueryRefused("a miner agent needs a SQLite store in a file")
        return ReadOnlyStore(_sqlite_reader(path), "sqlite", limits)
    engine = create_engine(reader_url or ensure_reader_role(store), pool_pre_ping=True)
    event.listen(engine, "connect", lambda dbapi, _: setattr(dbapi, "read_only", True))
    check_reader(engine)
    return ReadOnlyStore(engine, "postgresql", limits)
