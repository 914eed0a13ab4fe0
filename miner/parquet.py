"""A split's Parquet files: written from the rows as they are made (the JSON Lines columns, typed), and merged."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
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


GROUP_ROWS = 1_000  # rows per row group: few enough groups that the file's metadata stays small
GROUP_BYTES = 32 << 20  # and at most about this much: a row holds a whole conversation, which can reach megabytes
BATCH_ROWS, BATCH_BYTES = 250, 4 << 20  # rows kept as Python objects before they are made an Arrow batch


class _Groups:
    """Batches written as row groups of about GROUP_ROWS rows."""

    def __init__(self, writer: pq.ParquetWriter) -> None:
        self.writer, self.pending, self.rows, self.bytes, self.wrote = writer, [], 0, 0, False

    def add(self, batch: pa.RecordBatch) -> None:
        self.pending.append(batch)
        self.rows += batch.num_rows
        self.bytes += batch.nbytes
        if self.rows >= GROUP_ROWS or self.bytes >= GROUP_BYTES:
            self.flush()

    def flush(self) -> None:
        if self.rows:
            self.writer.write_table(pa.Table.from_batches(self.pending, SCHEMA))
            self.wrote = True
        self.pending, self.rows, self.bytes = [], 0, 0

    def close(self) -> None:
        self.flush()
        if not self.wrote:
            self.writer.write_table(SCHEMA.empty_table())


def _writer(path: Path) -> pq.ParquetWriter:
    # statistics only for the short columns: min and max of a prompt column are whole prompts, kept per row group;
    # dictionaries only for the columns whose values repeat (each distinct prompt would be hashed into one in vain)
    return pq.ParquetWriter(path, SCHEMA, compression="zstd", write_statistics=list(_STATISTICS),
                            use_dictionary=list(_REPEATED))


_STATISTICS = ("valid", "failure_class", "provenance", "stage", "model", "harness_version", "domain", "call_id")
_REPEATED = ("tools", "provenance", "valid", "failure_class", "stage", "violations", "model", "harness_version",
             "domain")


class RowWriter:
    """Rows (dicts of the export's columns, `rows.COLUMNS`) written to one Parquet file as they are made."""

    def __init__(self, path: Path) -> None:
        self.writer = _writer(path)
        self.groups = _Groups(self.writer)
        self.rows: list[dict[str, Any]] = []
        self.bytes = 0

    def add(self, row: dict[str, Any], size: int) -> None:
        """`size`: about how many bytes the row holds (its JSON line's length)."""
        self.rows.append(row)
        self.bytes += size
        if len(self.rows) >= BATCH_ROWS or self.bytes >= BATCH_BYTES:
            self._flush()

    def _flush(self) -> None:
        if self.rows:
            self.groups.add(pa.RecordBatch.from_pylist(self.rows, schema=SCHEMA))
        self.rows, self.bytes = [], 0

    def close(self) -> None:
        self._flush()
        self.groups.close()
        self.writer.close()


def merge_parquet(parts: list[Path], kept: list[list[bool]], sizes: list[list[int]], out: Path) -> None:
    """Part files as one, in order, keeping the rows `kept` marks (one flag per row of each part; `sizes`: each row's
    size, its JSON line's length). Row groups are cut where the kept rows alone say (`_group_rows`), not where the
    parts end, so that however many parts the rows came in, the file is the same."""
    cuts = _group_rows(kept, sizes)
    groups = iter(cuts)
    want = next(groups, None)
    with _writer(out) as writer:
        pending: list[pa.RecordBatch] = []
        held = 0
        for path, mask in zip(parts, kept, strict=True):
            start = 0
            for batch in pq.ParquetFile(path).iter_batches(batch_size=500):
                flags = mask[start:start + batch.num_rows]
                start += batch.num_rows
                pending.append(batch if all(flags) else batch.filter(pa.array(flags, type=pa.bool_())))
                held += pending[-1].num_rows
                while want is not None and held >= want:
                    table = pa.Table.from_batches(pending, SCHEMA)
                    writer.write_table(table.slice(0, want).combine_chunks())  # a page's cut is not a part's
                    pending, held = table.slice(want).to_batches(), held - want
                    want = next(groups, None)
        if want is not None:
            raise ValueError(f"{out.name}: the parts hold fewer rows than their .meta lines say")
        if not cuts:  # nothing kept: the schema alone
            writer.write_table(SCHEMA.empty_table())


def _group_rows(kept: list[list[bool]], sizes: list[list[int]]) -> list[int]:
    """How many rows each row group of the merged file holds: GROUP_ROWS, or fewer where they reach GROUP_BYTES."""
    groups: list[int] = []
    rows = size = 0
    for mask, lengths in zip(kept, sizes, strict=True):
        for keep, length in zip(mask, lengths, strict=True):
            if not keep:
                continue
            rows += 1
            size += length
            if rows >= GROUP_ROWS or size >= GROUP_BYTES:
                groups.append(rows)
                rows = size = 0
    if rows:
        groups.append(rows)
    return groups
