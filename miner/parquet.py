"""A split's Parquet file: written from the rows as they are made (the JSON Lines columns, typed), then extended with
the kept rows of the later parts' files."""

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
GROUP_BYTES = 4 << 20  # and at most about this much: a row holds a whole conversation, which can reach megabytes,
# and a group is held as rows, as a table and as pages while it is written (32 MB groups of 200 KB rows: +200 MB)
BATCH_ROWS, BATCH_BYTES = 250, 4 << 20  # rows kept as Python objects before they are made an Arrow batch


def _writer(path: Path) -> pq.ParquetWriter:
    # statistics only for the short columns: min and max of a prompt column are whole prompts, kept per row group;
    # dictionaries only for the columns whose values repeat (each distinct prompt would be hashed into one in vain)
    return pq.ParquetWriter(path, SCHEMA, compression="zstd", write_statistics=list(_STATISTICS),
                            use_dictionary=list(_REPEATED))


_STATISTICS = ("valid", "failure_class", "provenance", "stage", "model", "harness_version", "domain", "call_id")
_REPEATED = ("tools", "provenance", "valid", "failure_class", "stage", "violations", "model", "harness_version",
             "domain")


class RowWriter:
    """Rows (dicts of the export's columns, `rows.COLUMNS`) written to one Parquet file as they are made, then, where
    the rows came in parts, the kept rows of the later parts' files (`append_part`). A row group is cut after GROUP_ROWS
    rows, or sooner where its rows' sizes reach GROUP_BYTES: where the rows alone say, never where a batch or a part
    ends, so that however many parts the rows came in, the file is the same."""

    def __init__(self, path: Path) -> None:
        self.writer = _writer(path)
        self.rows: list[dict[str, Any]] = []  # made, not yet an Arrow batch
        self.sizes: list[int] = []
        self.batch_bytes = 0
        self.group: list[pa.RecordBatch] = []  # the row group being filled
        self.group_rows = self.group_bytes = 0
        self.wrote = False

    def add(self, row: dict[str, Any], size: int) -> None:
        """`size`: about how many bytes the row holds (its JSON line's length)."""
        self.rows.append(row)
        self.sizes.append(size)
        self.batch_bytes += size
        if len(self.rows) >= BATCH_ROWS or self.batch_bytes >= BATCH_BYTES:
            self._batch()

    def append_part(self, path: Path, kept: list[bool], sizes: list[int]) -> None:
        """The rows of a part's file that `kept` marks (a flag per row; `sizes`: each row's size), after those
        written so far."""
        self._batch()
        start = 0
        rows = max(1, min(BATCH_ROWS, BATCH_BYTES * len(sizes) // max(1, sum(sizes))))  # of the part's mean size
        with pq.ParquetFile(path, pre_buffer=False) as part:
            for batch in part.iter_batches(batch_size=rows, use_threads=False):
                flags, lengths = kept[start:start + batch.num_rows], sizes[start:start + batch.num_rows]
                start += batch.num_rows
                if not all(flags):
                    batch = batch.filter(pa.array(flags, type=pa.bool_()))
                    lengths = [n for n, keep in zip(lengths, flags, strict=True) if keep]
                self._group(batch, lengths)
        if start != len(kept):
            raise ValueError(f"{path.name} holds {start} rows, its .meta lines {len(kept)}")

    def _batch(self) -> None:
        if self.rows:
            self._group(pa.RecordBatch.from_pylist(self.rows, schema=SCHEMA), self.sizes)
        self.rows, self.sizes, self.batch_bytes = [], [], 0

    def _group(self, batch: pa.RecordBatch, sizes: list[int]) -> None:
        start = 0
        for end, size in enumerate(sizes, 1):
            self.group_rows += 1
            self.group_bytes += size
            if self.group_rows >= GROUP_ROWS or self.group_bytes >= GROUP_BYTES:
                self.group.append(batch.slice(start, end - start))
                start = end
                self._write_group()
        if start < len(sizes):
            self.group.append(batch.slice(start))

    def _write_group(self) -> None:
        if self.group:
            self.writer.write_table(pa.Table.from_batches(self.group, SCHEMA).combine_chunks())  # one page run
            self.wrote = True
        self.group, self.group_rows, self.group_bytes = [], 0, 0

    def close(self) -> None:
        if not self.writer.is_open:
            return
        self._batch()
        self._write_group()
        if not self.wrote:  # no rows: the schema alone
            self.writer.write_table(SCHEMA.empty_table())
        self.writer.close()
