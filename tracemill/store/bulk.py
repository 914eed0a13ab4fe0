"""Fast multi-row INSERT that skips rows already stored. The statement is compiled once per table and dialect, and
rows go straight to the driver: the per-row work of the ORM is what limits ingest otherwise.

On SQLite, rows go many to a statement (`INSERT … VALUES (…), (…), …`) rather than through executemany, which costs a
trip from Python to SQLite (and a release and retake of the GIL) for every row, and JSON columns are encoded straight
to text, as SQLAlchemy would, without its per-value wrapper."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from itertools import chain
from operator import itemgetter
from typing import Any

from sqlalchemy import JSON, Connection, Dialect, Table

from tracemill.store.engine import insert_ignoring_duplicates, json_text

_SQLITE_MAX_VARIABLES = 32766  # SQLite's bound on ? parameters in one statement since 3.32


class BulkInsert:
    def __init__(self, table: Table, dialect: Dialect) -> None:
        columns = [c for c in table.columns if c is not table.autoincrement_column]
        compiled = insert_ignoring_duplicates(table, dialect.name).compile(
            dialect=dialect, column_keys=[c.key for c in columns])
        self.sql = str(compiled)
        self.positional = bool(compiled.positional)
        self.keys: Sequence[str] = list(compiled.positiontup or []) if self.positional else [c.key for c in columns]
        processors = {c.key: json_text if dialect.name == "sqlite" and isinstance(c.type, JSON)
                      else c.type.dialect_impl(dialect).bind_processor(dialect) for c in columns}
        self.columns: list[tuple[str, Callable[[Any], Any] | None]] = [(key, processors[key]) for key in self.keys]
        self._values: tuple[str, str, str] | None = None  # SQLite: the statement around its one VALUES group
        if dialect.name == "sqlite":
            group = "(" + ", ".join("?" * len(self.keys)) + ")"
            head, found, tail = self.sql.partition(f" VALUES {group}")
            if not found:
                raise RuntimeError(f"unexpected INSERT for {table.name}: {self.sql}")
            self._values = (head, group, tail)
            self.rows_per_statement = max(1, min(500, _SQLITE_MAX_VARIABLES // len(self.keys)))
        self._statements: dict[int, str] = {}

    def params(self, rows: list[dict[str, Any]]) -> list[tuple[Any, ...]] | list[dict[str, Any]]:
        """The driver's parameters for the rows; the rows themselves are left as they are. A value that is the very
        object the row before held (a batch's one timestamp, a request's one resource) is converted once."""
        pick = itemgetter(*self.keys)
        converted = [(n, processor) for n, (_, processor) in enumerate(self.columns) if processor is not None]
        last: dict[int, tuple[Any, Any]] = {}
        out: list[Any] = []
        for row in rows:
            values = list(pick(row))
            for n, processor in converted:
                value = values[n]
                if value is not None:
                    before, after = last.get(n, (None, None))
                    if value is not before:
                        after = processor(value)
                        last[n] = (value, after)
                    values[n] = after
            out.append(tuple(values) if self.positional else dict(zip(self.keys, values)))
        return out

    def execute(self, conn: Connection, rows: list[dict[str, Any]]) -> None:
        self.execute_params(conn, self.params(rows))

    def execute_params(self, conn: Connection, params: list[Any]) -> None:
        """Insert rows already converted by `params`."""
        if not params:
            return
        if self._values is None:
            conn.exec_driver_sql(self.sql, params)
            return
        step = self.rows_per_statement
        for start in range(0, len(params), step):
            chunk = params[start:start + step]
            conn.exec_driver_sql(self._statement(len(chunk)), tuple(chain.from_iterable(chunk)))

    def _statement(self, rows: int) -> str:
        sql = self._statements.get(rows)
        if sql is None:
            assert self._values is not None
            head, group, tail = self._values
            sql = self._statements[rows] = f"{head} VALUES {', '.join([group] * rows)}{tail}"
        return sql
