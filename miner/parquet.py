"""A split's Parquet file, written in row groups as rows come (the same columns as its JSON Lines file)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

SCHEMA = pa.schema([
    ("id", pa.string()),
    ("prompt", pa.list_(pa.struct([("role", pa.string()), ("content", pa.string())]))),
    ("raw", pa.string()), ("tools", pa.string()), ("context", pa.string()), ("reference", pa.string()),
    ("provenance", pa.string()), ("valid", pa.bool_()), ("failure_class", pa.string()), ("stage", pa.string()),
    ("violations", pa.string()), ("model", pa.string()), ("harness_version", pa.string()), ("domain", pa.string()),
    ("trace_id", pa.string()), ("call_id", pa.int64()), ("created_at", pa.string()),
])


class ParquetSplit:
    def __init__(self, path: Path, group_rows: int = 10_000) -> None:
        self.writer = pq.ParquetWriter(path, SCHEMA, compression="zstd")
        self.group_rows = group_rows
        self.pending: list[dict[str, Any]] = []

    def add(self, row: dict[str, Any]) -> None:
        self.pending.append(row)
        if len(self.pending) >= self.group_rows:
            self.flush()

    def flush(self) -> None:
        if self.pending:
            self.writer.write_table(pa.Table.from_pylist(self.pending, schema=SCHEMA))
            self.pending = []

    def close(self) -> None:
        self.flush()
        self.writer.close()
