"""Several writers on one SQLite file: they take turns through the write lock, and the WAL stays bounded while they
write without pause (SQLite alone would let it grow: it only starts a WAL afresh once it has been wholly copied)."""

from __future__ import annotations

import multiprocessing
import os
import sqlite3
import threading
import time
from pathlib import Path

from tracemill.store.sqlite_writer import Checkpointer, WriteLock

ROW = "x" * 2000


def _open(path: Path) -> sqlite3.Connection:
    conn = sqlite3.connect(path, timeout=60, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA wal_autocheckpoint=0")
    conn.execute("PRAGMA journal_size_limit=0")
    return conn


def _write(path: Path, writer: int, commits: int) -> None:
    conn = _open(path)
    lock = WriteLock(path)
    for n in range(commits):
        time.sleep(0.002)  # a collector's writer prepares its next batch between commits
        with lock.held():
            conn.execute("BEGIN IMMEDIATE")
            conn.executemany("INSERT INTO t VALUES (?, ?, ?)", [(writer, n, ROW) for _ in range(200)])
            conn.execute("COMMIT")
    lock.close()
    conn.close()


def test_writers_in_two_processes_take_turns_and_the_wal_stays_bounded(tmp_path: Path) -> None:
    path = tmp_path / "store.db"
    _open(path).execute("CREATE TABLE t (writer INTEGER, n INTEGER, body TEXT)")
    checkpointer = Checkpointer(path, interval_s=0.02, restart_bytes=2 * 1024 * 1024)
    checkpointer.start()
    wal = Path(f"{path}-wal")
    largest = 0
    writers = [multiprocessing.get_context("spawn").Process(target=_write, args=(path, w, 150)) for w in range(2)]
    for p in writers:
        p.start()
    while any(p.is_alive() for p in writers):
        largest = max(largest, wal.stat().st_size if wal.exists() else 0)
        time.sleep(0.005)
    checkpointer.stop()
    assert [p.exitcode for p in writers] == [0, 0]

    store = sqlite3.connect(path)
    assert store.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
    rows = store.execute("SELECT writer, COUNT(*) FROM t GROUP BY writer ORDER BY writer").fetchall()
    assert rows == [(0, 150 * 200), (1, 150 * 200)]
    written = 2 * 150 * 200 * len(ROW)
    assert largest < 24 * 1024 * 1024 < written, f"WAL reached {largest} bytes for {written} bytes written"


def test_a_writer_closing_while_the_checkpointer_runs_knows_it_is_not_the_last(tmp_path: Path) -> None:
    """The last connection to close checkpoints without locks and deletes the WAL; the checkpointer's connection,
    open throughout, must keep any other from thinking it is the last, also after the checkpoints that restart the
    WAL (each syncs the database file)."""
    path = tmp_path / "store.db"
    _open(path).execute("CREATE TABLE t (writer INTEGER, n INTEGER, body TEXT)")
    checkpointer = Checkpointer(path, interval_s=0.01, restart_bytes=512 * 1024)
    checkpointer.start()
    writer = multiprocessing.get_context("spawn").Process(target=_write, args=(path, 0, 20))
    writer.start()
    writer.join()
    wal_left = Path(f"{path}-wal").exists()
    checkpointer.stop()
    assert writer.exitcode == 0
    assert wal_left, "the writer deleted the WAL on closing: it found no other connection open"
    assert sqlite3.connect(path).execute("SELECT COUNT(*) FROM t").fetchone() == (20 * 200,)


def test_the_lock_is_held_by_one_thread_at_a_time(tmp_path: Path) -> None:
    lock = WriteLock(tmp_path / "store.db")
    inside, most = 0, 0
    guard = threading.Lock()

    def work() -> None:
        nonlocal inside, most
        for _ in range(200):
            with lock.held():
                with guard:
                    inside += 1
                    most = max(most, inside)
                os.sched_yield()
                with guard:
                    inside -= 1

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    lock.close()
    assert most == 1
