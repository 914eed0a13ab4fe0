"""Fast multi-row INSERT that skips rows already stored. The statement is compiled once per table and dialect, and
rows go straight to the driver's executemany: the per-row work of the ORM is what limits ingest otherwise."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from sqlalchemy import Connection, Dialect, Table

from tracemill.store.engine import insert_ignoring_duplicates


class BulkInsert:
    def __init__(self, table: Table, dialect: Dialect) -> None:
        columns = [c for c in table.columns if c is not table.autoincrement_column]
        compiled = insert_ignoring_duplicates(table, dialect.name).compile(
            dialect=dialect, column_keys=[c.key for c in columns])
        self.sql = str(compiled)
        self.positional = bool(compiled.positional)
        self.keys: Sequence[str] = list(compiled.positiontup or []) if self.positional else [c.key for c in columns]
        self.processors: list[tuple[str, Callable[[Any], Any]]] = []
        for column in columns:
            processor = column.type.dialect_impl(dialect).bind_processor(dialect)
            if processor is not None:
                self.processors.append((column.key, processor))

    def execute(self, conn: Connection, rows: list[dict[str, Any]]) -> None:
        if not rows:
            return
        for row in rows:
            for key, processor in self.processors:
                value = row[key]
                if value is not None:
                    row[key] = processor(value)
        if self.positional:
            keys = self.keys
            conn.exec_driver_sql(self.sql, [tuple(row[k] for k in keys) for row in rows])
        else:
            conn.exec_driver_sql(self.sql, rows)
