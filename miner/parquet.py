"""A split's Parquet files: made from JSON Lines a block at a time (the same columns, typed), and merged."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.json as pa_json
import pyarrow.parquet as pq

pa.set_memory_pool(pa.system_memory_pool())  # freed memory goes back to the system: resident memory stays flat

SCHEMA = pa.schema([
    ("id", pa.string()),
    ("prompt", pa.list_(pa.struct([("role", pa.string()), ("content", pa.string())]))),
    ("raw", pa.string()), ("tools", pa.string()), ("context", pa.string()), ("reference", pa.string()),
    ("provenance", pa.string()), ("valid", pa.bool_()), ("failure_class", pa.string()), ("stage", pa.string()),
    ("violations", pa.string()), ("model", pa.string()), ("harness_version", pa.string()), ("domain", pa.string()),
    ("trace_id", pa.string()), ("call_id", pa.int64()), ("created_at", pa.string()),
])


GROUP_ROWS = 2_000  # rows per row group: few enough groups that the file's metadata stays small


class _Groups:
    """Batches written as row groups of about GROUP_ROWS rows."""

    def __init__(self, writer: pq.ParquetWriter) -> None:
        self.writer, self.pending, self.rows, self.wrote = writer, [], 0, False

    def add(self, batch: pa.RecordBatch) -> None:
        self.pending.append(batch)
        self.rows += batch.num_rows
        if self.rows >= GROUP_ROWS:
            self.flush()

    def flush(self) -> None:
        if self.rows:
            self.writer.write_table(pa.Table.from_batches(self.pending, SCHEMA))
            self.wrote = True
        self.pending, self.rows = [], 0

    def close(self) -> None:
        self.flush()
        if not self.wrote:
            self.writer.write_table(SCHEMA.empty_table())


def _writer(path: Path) -> pq.ParquetWriter:
    # statistics only for the short columns: min and max of a prompt column are whole prompts, kept per row group
    return pq.ParquetWriter(path, SCHEMA, compression="zstd", write_statistics=list(_STATISTICS))


_STATISTICS = ("valid", "failure_class", "provenance", "stage", "model", "harness_version", "domain", "call_id")


def write_parquet(jsonl: Path, parquet: Path, block_bytes: int = 1 << 20) -> None:
    with _writer(parquet) as writer:
        groups = _Groups(writer)
        if jsonl.stat().st_size:
            reader = pa_json.open_json(jsonl, read_options=pa_json.ReadOptions(block_size=block_bytes),
                                       parse_options=pa_json.ParseOptions(explicit_schema=SCHEMA,
                                                                          unexpected_field_behavior="error"))
            for batch in reader:
                groups.add(batch)
        groups.close()


def merge_parquet(parts: list[Path], kept: list[list[bool]], out: Path) -> None:
    """Part files as one, in order, keeping the rows `kept` marks (one flag per row of each part)."""
    with _writer(out) as writer:
        groups = _Groups(writer)
        for path, mask in zip(parts, kept, strict=True):
            start = 0
            for batch in pq.ParquetFile(path).iter_batches(batch_size=500):
                flags = mask[start:start + batch.num_rows]
                start += batch.num_rows
                groups.add(batch if all(flags) else batch.filter(pa.array(flags, type=pa.bool_())))
        groups.close()
