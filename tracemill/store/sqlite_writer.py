"""What a SQLite store needs to take writes from several collector processes at once.

- `WriteLock`: writers take turns through an advisory lock on a file next to the database. SQLite's own lock is
  waited for by sleeping and polling (1, 2, 5 … 100 ms), so a process that finds it taken sleeps long after it was
  released; a blocked `flock` wakes as soon as the holder lets go, and waits without holding the GIL.
- `Checkpointer`: a thread that copies the WAL back into the database file. SQLite otherwise does this inside the
  commit that crosses its threshold, and that commit then waits for the copy and its fsyncs while holding the
  write lock. Writers open their connections with `PRAGMA wal_autocheckpoint=0` (`make_engine(..., writer=True)`).
"""

from __future__ import annotations

import logging
import os
import sqlite3
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

try:
    import fcntl
except ImportError:  # Windows: SQLite's own lock alone
    fcntl = None  # type: ignore[assignment]

from sqlalchemy.engine import make_url

log = logging.getLogger("tracemill.store")

_CATCH_UP_ROUNDS = 5


def database_path(url: str) -> Path | None:
    """The file of a SQLite store; None for other stores and in-memory SQLite."""
    parsed = make_url(url)
    if parsed.get_backend_name() != "sqlite":
        return None
    database = parsed.database
    if not database or database == ":memory:" or database.startswith("file:"):
        return None
    return Path(database).resolve()


class WriteLock:
    """A lock shared by every process writing to one SQLite file (held by one thread of a process at a time)."""

    def __init__(self, database: Path | None) -> None:
        self._threads = threading.Lock()
        self._fd: int | None = None
        if database is not None and fcntl is not None:
            self._fd = os.open(f"{database}-tracemill-write.lock", os.O_RDWR | os.O_CREAT, 0o644)

    @contextmanager
    def held(self) -> Iterator[None]:
        with self._threads:
            if self._fd is None:
                yield
                return
            fcntl.flock(self._fd, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(self._fd, fcntl.LOCK_UN)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


class Checkpointer(threading.Thread):
    """Copies the WAL into the database file, mostly while writers go on.

    Every `interval_s` it runs `PRAGMA wal_checkpoint(PASSIVE)` without the write lock: pages are copied and synced
    while the writers commit. A WAL only starts again from its beginning when a writer finds it wholly copied, which a
    busy writer never lets happen; so once the WAL holds `restart_bytes`, one checkpoint runs holding the write lock
    and the next commit starts the WAL afresh. Writers wait for that one, so it is left as little as possible to do:
    before taking the lock, the checkpointer copies and syncs again and again, until the commits made meanwhile come
    to under `tail_bytes`."""

    def __init__(self, database: Path, interval_s: float = 0.2, restart_bytes: int = 32 * 1024 * 1024,
                 tail_bytes: int = 1024 * 1024) -> None:
        super().__init__(name="tracemill-checkpoint", daemon=True)
        self.database = database
        self.lock = WriteLock(database)
        self.interval_s = interval_s
        self.restart_bytes = restart_bytes
        self.tail_bytes = tail_bytes
        self._stopping = threading.Event()

    def _restart(self, conn: sqlite3.Connection, frames: int, page_size: int) -> None:
        # SQLite syncs the database file only when a checkpoint reaches the end of the WAL, so under the lock it would
        # otherwise sync every page copied since the last restart: the files are synced here first.
        added = frames
        for _ in range(_CATCH_UP_ROUNDS):
            _sync(self.database)
            before, added_before = frames, added
            frames, copied = _checkpoint(conn)
            if copied != frames:
                return  # a reader still uses frames it cannot copy yet: the WAL cannot start again now
            added = frames - before
            if (added * page_size <= self.tail_bytes or added >= added_before
                    or frames * page_size >= 2 * self.restart_bytes):
                break  # little left; or the writers add as much as a round copies, or the WAL grows too long
        _sync(self.database)
        with self.lock.held():
            _checkpoint(conn)

    def stop(self) -> None:
        """Checkpoint once more (holding the write lock) and stop."""
        self._stopping.set()
        if self.is_alive():
            self.join()
        self.lock.close()

    def run(self) -> None:
        try:
            conn = sqlite3.connect(self.database, timeout=0, check_same_thread=False, isolation_level=None)
        except sqlite3.Error:
            log.exception("no WAL checkpoints: the WAL file grows until the collector restarts")
            return
        try:
            page_size = conn.execute("PRAGMA page_size").fetchone()[0]
            while not self._stopping.wait(self.interval_s):
                frames, copied = _checkpoint(conn)
                if frames * page_size >= self.restart_bytes and copied == frames:
                    self._restart(conn, frames, page_size)
            with self.lock.held():
                _checkpoint(conn)
        except (sqlite3.Error, OSError):
            log.exception("WAL checkpoints stopped: the WAL file grows until the collector restarts")
        finally:
            conn.close()


def _sync(database: Path) -> None:
    wal = Path(f"{database}-wal")
    try:
        fd = os.open(wal, os.O_RDONLY)
    except FileNotFoundError:  # the last connection to close deletes it
        pass
    else:
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    os.fsync(_kept_open(database))


_kept_fds: dict[tuple[int, int], int] = {}
_kept_fds_lock = threading.Lock()


def _kept_open(path: Path) -> int:
    """A descriptor of `path` that this process never closes. Closing any descriptor of a file drops every POSIX
    lock the process holds on it, SQLite's own included: a connection then looks closed to other processes, and the
    next one to close believes it is the last, checkpoints without locks and deletes the WAL that writers still use
    (https://sqlite.org/howtocorrupt.html, 2.2). SQLite locks the database file, never its WAL."""
    with _kept_fds_lock:
        stat = os.stat(path)
        fd = _kept_fds.get((stat.st_dev, stat.st_ino))
        if fd is None:
            fd = os.open(path, os.O_RDONLY)
            opened = os.fstat(fd)
            _kept_fds[(opened.st_dev, opened.st_ino)] = fd
        return fd


def _checkpoint(conn: sqlite3.Connection) -> tuple[int, int]:
    """Copies what it can; returns the frames in the WAL and how many of them are copied (0, 0 when another
    connection was checkpointing)."""
    try:
        _busy, frames, copied = conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
    except sqlite3.OperationalError as exc:
        log.debug("checkpoint skipped: %s", exc)
        return 0, 0
    return int(frames), int(copied)
