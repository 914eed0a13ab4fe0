"""The `cycles` table: one row per iteration, written as it goes (each step it reaches, with its figures), so that a
cycle killed half-way is seen as such by the next one."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

from sqlalchemy import Connection, Engine, insert, select, update

from tracemill.store.queries import Committed
from tracemill.store.tables import CycleRow, DatasetRow, utcnow

T = CycleRow.__table__


class Step(StrEnum):
    MINE = "mine"
    DECIDE = "decide"
    TRAIN = "train"
    EVALUATE = "evaluate"
    DEPLOY = "deploy"
    DONE = "done"


class Status(StrEnum):
    RUNNING = "running"
    DONE = "done"
    INTERRUPTED = "interrupted"  # killed, or stopped by Ctrl-C
    FAILED = "failed"


@dataclass(frozen=True, slots=True)
class CycleRecord:
    """One row of `cycles` (see `tracemill.store.tables.CycleRow` for what each field holds)."""

    id: int
    started_at: datetime
    finished_at: datetime | None
    status: str
    step: str
    holder: str
    forced: bool
    since_call_id: int | None
    last_call_id: int | None
    new_calls: int
    new_failures: int
    dataset_id: int | None
    decision: str | None
    reason: str | None
    harness_rates: list[dict[str, Any]]
    top_modes: list[dict[str, Any]]
    model_id: int | None
    baseline: str | None
    figures: dict[str, Any]
    gate: dict[str, Any]
    deployed: bool
    deployment_id: int | None
    error: str | None

    def to_dict(self) -> dict[str, Any]:
        shown = asdict(self)
        for key in ("started_at", "finished_at"):
            shown[key] = shown[key].isoformat(timespec="seconds") if shown[key] else None
        return shown


_COLUMNS = tuple(T.c[f.name] for f in fields(CycleRecord))


def _record(row: Any) -> CycleRecord:
    values = row._asdict()
    for key in ("started_at", "finished_at"):
        if values[key] is not None and values[key].tzinfo is None:  # SQLite keeps no zone; every time is UTC
            values[key] = values[key].replace(tzinfo=UTC)
    return CycleRecord(**values)


def get(conn: Connection, cycle_id: int) -> CycleRecord:
    return _record(conn.execute(select(*_COLUMNS).where(T.c.id == cycle_id)).one())


def history(conn: Connection, limit: int | None = None) -> list[CycleRecord]:
    """The cycles, newest first."""
    statement = select(*_COLUMNS).order_by(T.c.id.desc())
    return [_record(r) for r in conn.execute(statement.limit(limit) if limit else statement)]


def start(engine: Engine, holder: str, forced: bool) -> int:
    with engine.begin() as conn:
        return int(conn.execute(insert(T).values(
            started_at=utcnow(), status=Status.RUNNING, step=Step.MINE, holder=holder, forced=forced, new_calls=0,
            new_failures=0, harness_rates=[], top_modes=[], figures={}, gate={}, deployed=False,
        ).returning(T.c.id)).scalar_one())


def write(engine_or_conn: Engine | Connection, cycle_id: int, **values: Any) -> None:
    """Set columns of the cycle's row (its own transaction, or within `conn`'s)."""
    statement = update(T).where(T.c.id == cycle_id).values(**values)
    if isinstance(engine_or_conn, Connection):
        engine_or_conn.execute(statement)
        return
    with engine_or_conn.begin() as conn:
        conn.execute(statement)


def finished(status: Status, **values: Any) -> dict[str, Any]:
    """The columns that end a cycle."""
    return {"status": status, "finished_at": utcnow(), **values}


def last_trained_read(conn: Connection) -> Committed | None:
    """What the newest cycle that trained had read: its newest call, and the newest execution its export saw (None
    where the export predates it): what the next one mines after (None: from the start). A cycle that decided not to
    train leaves its calls to the next one."""
    row = conn.execute(select(T.c.last_call_id, DatasetRow.card)
                       .select_from(T.outerjoin(DatasetRow, DatasetRow.id == T.c.dataset_id))
                       .where(T.c.status == Status.DONE, T.c.model_id.is_not(None))
                       .order_by(T.c.id.desc()).limit(1)).first()
    return None if row is None else Committed(row.last_call_id, (row.card or {}).get("last_execution_id"))


def abandon_running(engine: Engine) -> list[CycleRecord]:
    """Mark as interrupted every cycle still `running`: called with the lock held, so its process is gone."""
    with engine.begin() as conn:
        dead = [_record(r) for r in conn.execute(select(*_COLUMNS).where(T.c.status == Status.RUNNING))]
        for cycle in dead:
            conn.execute(update(T).where(T.c.id == cycle.id).values(**finished(
                Status.INTERRUPTED, error=f"its process ({cycle.holder}) ended at step {cycle.step} without "
                                          "finishing (killed?)")))
    return dead
