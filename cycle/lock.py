"""A named lock in the store, so that two cycles never overlap, whichever process or machine starts them.

The lock is a row of `locks` held until `expires_at`; a thread renews it every third of its time to live while the
holder works. A holder that was killed stops renewing, so its lock expires instead of blocking forever; on the same
host a holder whose process is gone is known dead at once and its lock is taken over without waiting. Taking a lock
is one conditional write (an insert, or an update of an expired row), so two processes racing for it cannot both win,
on SQLite or PostgreSQL.
"""

from __future__ import annotations

import os
import socket
import threading
import uuid
from datetime import UTC, datetime, timedelta
from typing import Self

from sqlalchemy import Connection, Engine, delete, insert, select, update
from sqlalchemy.exc import IntegrityError, SQLAlchemyError

from tracemill.store.tables import LockRow

L = LockRow.__table__


class LockBusy(RuntimeError):
    """Another live process holds the lock; the message names it and until when."""


def _now() -> datetime:
    return datetime.now(UTC)


def _holder() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


def _dead_here(holder: str) -> bool:
    """The holder ran on this host and its process is gone."""
    host, _, rest = holder.partition(":")
    pid = rest.partition(":")[0]
    if host != socket.gethostname() or not pid.isdigit():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


class StoreLock:
    """`with StoreLock(engine, "cycle"):` holds the lock for the block, or raises LockBusy. `lost` turns true when
    the lock could not be renewed (it expired and another process took it): the holder must stop before writing."""

    def __init__(self, engine: Engine, name: str, ttl_s: float = 120.0) -> None:
        self.engine = engine
        self.name = name
        self.ttl = timedelta(seconds=ttl_s)
        self.holder = _holder()
        self.lost = threading.Event()
        self.took_over: str | None = None  # the dead or expired holder this one replaced
        self._stop = threading.Event()
        self._renewer: threading.Thread | None = None

    def acquire(self) -> None:
        now = _now()
        values = {"name": self.name, "holder": self.holder, "acquired_at": now, "expires_at": now + self.ttl}
        try:
            with self.engine.begin() as conn:
                conn.execute(insert(L).values(**values))
        except IntegrityError:
            self._take_over(values)
        self._renewer = threading.Thread(target=self._renew_loop, name=f"lock-{self.name}", daemon=True)
        self._renewer.start()

    def _take_over(self, values: dict[str, object]) -> None:
        with self.engine.begin() as conn:
            row = conn.execute(select(L).where(L.c.name == self.name)).first()
            if row is None:  # released in between
                conn.execute(insert(L).values(**values))
                return
            expired = _aware(row.expires_at) < values["acquired_at"]  # type: ignore[operator]
            if not (expired or _dead_here(row.holder)):
                raise LockBusy(f"another cycle holds the lock {self.name!r}: {row.holder} since "
                               f"{_aware(row.acquired_at):%Y-%m-%d %H:%M:%S} UTC (it expires at "
                               f"{_aware(row.expires_at):%H:%M:%S} UTC unless renewed)")
            still = [L.c.name == self.name, L.c.holder == row.holder]
            if not _dead_here(row.holder):  # expired when read: only while it is still expired (not renewed since)
                still.append(L.c.expires_at < values["acquired_at"])
            taken = conn.execute(update(L).where(*still).values(**values))
            if taken.rowcount != 1:
                raise LockBusy(f"another process took the lock {self.name!r} at the same moment")
            self.took_over = row.holder

    def renew(self, conn: Connection | None = None) -> bool:
        """Push `expires_at` on; False (and `lost` set) when this process no longer holds the lock. Pass `conn` to
        renew inside a transaction that must commit only while the lock is held."""
        statement = (update(L).where(L.c.name == self.name, L.c.holder == self.holder)
                     .values(expires_at=_now() + self.ttl))
        if conn is not None:
            held = conn.execute(statement).rowcount == 1
        else:
            with self.engine.begin() as own:
                held = own.execute(statement).rowcount == 1
        if not held:
            self.lost.set()
        return held

    def _renew_loop(self) -> None:
        while not self._stop.wait(self.ttl.total_seconds() / 3):
            try:
                if not self.renew():
                    return
            except SQLAlchemyError:  # a store that is briefly unreachable: try again on the next beat
                continue

    def release(self) -> None:
        self._stop.set()
        if self._renewer is not None:
            self._renewer.join()
        with self.engine.begin() as conn:
            conn.execute(delete(L).where(L.c.name == self.name, L.c.holder == self.holder))

    def __enter__(self) -> Self:
        self.acquire()
        return self

    def __exit__(self, *_: object) -> None:
        self.release()


def _aware(value: datetime) -> datetime:
    """SQLite gives back naive datetimes; every stored time is UTC."""
    return value if value.tzinfo else value.replace(tzinfo=UTC)
