"""An ingest process of the collector. Each one takes whole request bodies from the HTTP process, decodes them,
extracts and verifies their tool calls, and commits them before answering; the processes take turns for SQLite's
write lock (`sqlite_writer.WriteLock`) and PostgreSQL lets them write at once.

One thread does all of that, so nothing in the process competes for its GIL: a process that decodes in one thread
while another writes loses most of the write's time waiting to take the GIL back after each SQLite call.
"""

from __future__ import annotations

import atexit
import gc
import logging
import multiprocessing
import os
import signal
import threading
import time
import traceback
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection
from sqlalchemy.exc import DataError, DBAPIError, OperationalError, SQLAlchemyError, StatementError

from tracemill.collector.decode import DECODERS, Decoded, Limits, PayloadError
from tracemill.collector.logs import LOG_DECODERS, DecodedLogs, LogEvent
from tracemill.collector.persist import SpanWriter
from tracemill.spans import SpanRecord
from tracemill.store.engine import make_engine
from tracemill.store.errors import describe
from tracemill.store.sqlite_writer import WriteLock, database_path

log = logging.getLogger("tracemill.collector")

_GZIP_MAGIC = b"\x1f\x8b"


@dataclass(frozen=True, slots=True)
class WorkerConfig:
    database_url: str
    max_body_bytes: int
    max_attribute_bytes: int


@dataclass(frozen=True, slots=True)
class Stored:
    """What the HTTP process needs to answer: the spans (or log records) committed and the ones rejected, with why."""

    spans: int
    rejected: int
    reasons: list[str]  # one per rejected span or group of spans, and per string mended to be stored


class BodyTooLarge(ValueError):
    pass


class NotStored(RuntimeError):
    """The store refused the write. The message names the kind of error only: the store's own message can quote the
    statement and its values (and the exception may not pickle); the ingest process logs what `describe` says."""


class _Worker:
    def __init__(self, config: WorkerConfig) -> None:
        self.config = config
        self.limits = Limits(max_attribute_bytes=config.max_attribute_bytes)
        self.engine = make_engine(config.database_url, writer=True)
        self.writer = SpanWriter(self.engine.dialect)
        self.lock = WriteLock(database_path(config.database_url))

    def ingest(self, body: bytes, content_type: str, gzipped: bool) -> Stored:
        if gzipped:
            body = gunzip(body, self.config.max_body_bytes)
        decoded = DECODERS[content_type](body, self.limits)
        committed = self._store(decoded.spans, decoded.places, decoded, self._commit_spans)
        return Stored(committed, decoded.rejected, decoded.reasons)

    def ingest_logs(self, body: bytes, content_type: str, gzipped: bool) -> Stored:
        if gzipped:
            body = gunzip(body, self.config.max_body_bytes)
        decoded = LOG_DECODERS[content_type](body, self.limits)
        places = [f"log record of span {e.span_id} in trace {e.trace_id}" for e in decoded.events]
        committed = self._store(decoded.events, places, decoded, self._commit_events)
        return Stored(committed, decoded.rejected, decoded.reasons)

    def _commit_spans(self, spans: list[SpanRecord]) -> None:
        batch = self.writer.prepare(spans)
        self._commit(lambda conn: self.writer.write(conn, batch))

    def _commit_events(self, events: list[LogEvent]) -> None:
        self._commit(lambda conn: self.writer.write_events(conn, events))

    def _store(self, items: list[Any], places: list[str], out: Decoded | DecodedLogs,
               commit: Callable[[list[Any]], None]) -> int:
        """Commits `items` (spans or log events) and returns how many were. When their values are what fails (the
        store refuses them, or their rows cannot be built), writing them again would fail again: the batch is halved
        until the items at fault are found, and only those are rejected (in `out`)."""
        if not items:
            return 0
        try:
            commit(items)
            return len(items)
        except Exception as exc:
            if not _caused_by_data(exc):
                log.error("request of %d spans or log records not stored: %s", len(items), describe(exc))
                raise NotStored(type(exc).__name__) from None
            if len(items) > 1:
                half = len(items) // 2
                return (self._store(items[:half], places[:half], out, commit)
                        + self._store(items[half:], places[half:], out, commit))
            frame = traceback.extract_tb(exc.__traceback__)[-1]
            log.warning("%s rejected: %s (raised at %s:%d)", places[0], describe(exc), frame.filename, frame.lineno)
            out.reject(f"{places[0]}: the store cannot keep one of its values ({type(exc).__name__})")
            return 0

    def _commit(self, write: Callable[[Connection], None]) -> None:
        for attempt in range(5):
            try:
                with self.lock.held(), self.engine.begin() as conn:
                    if self.engine.dialect.name == "sqlite":
                        # Take SQLite's write lock now: a transaction that has read cannot write after another
                        # process's commit.
                        conn.exec_driver_sql("BEGIN IMMEDIATE")
                    write(conn)
            except OperationalError as exc:
                self.writer.rolled_back()
                if attempt == 4 or "locked" not in str(exc).lower():
                    raise
                time.sleep(0.2 * (attempt + 1))
            except BaseException:
                self.writer.rolled_back()
                raise
            else:
                self.writer.committed()
                return

    def close(self) -> None:
        self.lock.close()
        self.engine.dispose()


_worker: _Worker | None = None


def start(config: WorkerConfig) -> None:
    """Process initializer: open the store and tune the collector for what it allocates."""
    global _worker
    # The HTTP process stops the ingest processes when it stops: a Ctrl-C, which the terminal sends to the whole
    # process group, must not kill them in the middle of the requests it is finishing. (SIGTERM keeps its default:
    # it is how a broken pool's processes are ended.)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    threading.Thread(target=_exit_with_parent, name="exit-with-parent", daemon=True).start()
    _worker = _Worker(config)
    atexit.register(_worker.close)
    # Spans are acyclic (dicts, lists, strings), so the cyclic collector finds nothing in them; at its default
    # threshold it runs every 700 allocations and walks every span it has not yet promoted: a third of the CPU of
    # decoding and verifying. Objects from start-up are frozen out of its reach and it runs a hundred times less
    # often; the few cycles a request makes (exceptions) are still collected.
    gc.collect()
    gc.freeze()
    gc.set_threshold(70_000, 10, 10)


def _exit_with_parent() -> None:
    """Ends this process once the HTTP process is gone, however it ended: after a SIGKILL nothing else would (the
    process holds both ends of its task queue's pipe), and an orphan would keep the store open forever. Waits on the
    pipe multiprocessing keeps open to the parent, which closes when it dies; the wait holds no GIL."""
    parent = multiprocessing.parent_process()
    if parent is None:
        return
    parent.join()
    log.warning("the collector's HTTP process is gone: this ingest process stops")
    os._exit(1)


def ready() -> int:
    """A task that makes the pool start a process (and waits long enough that the next task needs another)."""
    time.sleep(0.05)
    return 0


def ingest(body: bytes, content_type: str, gzipped: bool, logs: bool = False) -> Stored:
    """Decode, verify and commit one request body (spans, or with `logs` log records). Raises PayloadError (400),
    BodyTooLarge (413) or NotStored."""
    if _worker is None:
        raise RuntimeError("worker.start was not called in this process")
    if logs:
        return _worker.ingest_logs(body, content_type, gzipped)
    return _worker.ingest(body, content_type, gzipped)


_PROGRAM_LIMIT = "54"  # PostgreSQL's SQLSTATE class for a limit a value went past (an index entry over 2,704 bytes)


def _caused_by_data(exc: Exception) -> bool:
    """Whether the values written are what failed: the driver says so (DataError, or PostgreSQL's "program limit
    exceeded", which psycopg raises as an OperationalError), a value could not be bound, or the error is no store's
    nor the system's (turning spans into rows raised, or the driver could not convert a value). Other store errors
    (connections, locks, the schema) are the store's, and worth a retry."""
    if isinstance(exc, DataError) or (isinstance(exc, StatementError) and not isinstance(exc, DBAPIError)):
        return True
    if isinstance(exc, DBAPIError) and str(getattr(exc.orig, "sqlstate", None) or "").startswith(_PROGRAM_LIMIT):
        return True
    return not isinstance(exc, (SQLAlchemyError, OSError, MemoryError))


def gunzip(body: bytes, limit: int) -> bytes:
    """Every member of a gzip body, in order (RFC 1952 allows several), within `limit` bytes decompressed."""
    members: list[bytes] = []
    size, rest = 0, body
    while True:
        inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
        try:
            out = inflater.decompress(rest, limit - size + 1)
        except zlib.error as exc:
            raise PayloadError(f"body is not valid gzip at byte {len(body) - len(rest)}: {exc}") from None
        size += len(out)
        if size > limit or inflater.unconsumed_tail:
            raise BodyTooLarge(f"decompressed body is over the limit of {limit} bytes")
        if not inflater.eof:
            raise PayloadError("gzip body is truncated")
        members.append(out)
        rest = inflater.unused_data
        if not rest:
            return members[0] if len(members) == 1 else b"".join(members)
        if not rest.startswith(_GZIP_MAGIC):
            raise PayloadError(f"{len(rest)} bytes after the gzip member that ends at byte {len(body) - len(rest)} "
                               "are not a gzip member")
