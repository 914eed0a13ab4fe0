"""The read side of the learning half of the store: reviewers' decisions, mined datasets, trained models and what is
deployed. (`tracemill.store.queries` reads the calls and traces.) Nothing here writes."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, fields
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, func, select

from tracemill.store.tables import DatasetRow, DeploymentRow, ModelRow, ReviewRow


@dataclass(frozen=True, slots=True)
class Review:
    """A decision on a call (see `tables.ReviewRow`): `after` is the approved call `{"name", "arguments"}`."""

    id: int
    call_id: int
    reviewer: str
    decision: str  # approve | reject | edit
    before: dict[str, Any] | None
    after: dict[str, Any] | None
    note: str | None
    created_at: datetime


@dataclass(frozen=True, slots=True)
class Dataset:
    id: int
    name: str
    path: str
    content_hash: str
    filters: dict[str, Any]
    last_call_id: int | None
    train_rows: int
    eval_rows: int
    card: dict[str, Any]
    created_at: datetime


@dataclass(frozen=True, slots=True)
class Model:
    id: int
    name: str
    base_model: str
    kind: str
    path: str
    dataset_id: int | None
    dataset_hash: str | None
    config: dict[str, Any]
    metrics: dict[str, Any]
    evaluation: dict[str, Any]
    created_at: datetime


@dataclass(frozen=True, slots=True)
class Deployment:
    id: int
    model_id: int | None
    role: str  # active | canary
    canary_percent: float | None
    action: str  # deploy | canary | rollback | end_canary
    actor: str
    justification: dict[str, Any]
    created_at: datetime


def _columns(record: type, table: type) -> tuple[Any, ...]:
    return tuple(getattr(table, f.name) for f in fields(record))


def reviews(conn: Connection, call_ids: Iterable[int] | None = None, limit: int | None = None) -> list[Review]:
    """Decisions, newest first; only on these calls when `call_ids` is given."""
    statement = select(*_columns(Review, ReviewRow)).order_by(ReviewRow.id.desc())
    if call_ids is not None:
        statement = statement.where(ReviewRow.call_id.in_(set(call_ids)))
    if limit is not None:
        statement = statement.limit(limit)
    return [Review(*row) for row in conn.execute(statement)]


def review(conn: Connection, call_id: int) -> Review | None:
    found = reviews(conn, [call_id])
    return found[0] if found else None


def decisions_by_reviewer(conn: Connection, since: datetime | None = None) -> dict[str, dict[str, int]]:
    """{reviewer: {decision: count}}, decisions made at or after `since` when given."""
    statement = select(ReviewRow.reviewer, ReviewRow.decision, func.count()).group_by(ReviewRow.reviewer,
                                                                                      ReviewRow.decision)
    if since is not None:
        statement = statement.where(ReviewRow.created_at >= since)
    found: dict[str, dict[str, int]] = {}
    for reviewer, decision, n in conn.execute(statement):
        found.setdefault(reviewer, {})[decision] = int(n)
    return found


def datasets(conn: Connection, limit: int = 200) -> list[Dataset]:
    """Exports, newest first."""
    rows = conn.execute(select(*_columns(Dataset, DatasetRow)).order_by(DatasetRow.id.desc()).limit(limit))
    return [Dataset(*row) for row in rows]


def models(conn: Connection, limit: int = 200) -> list[Model]:
    """Trained reviser versions, newest first."""
    rows = conn.execute(select(*_columns(Model, ModelRow)).order_by(ModelRow.id.desc()).limit(limit))
    return [Model(*row) for row in rows]


def deployments(conn: Connection, limit: int = 200) -> list[Deployment]:
    """Changes of what is served, newest first (the newest per role is what is served now)."""
    rows = conn.execute(select(*_columns(Deployment, DeploymentRow)).order_by(DeploymentRow.id.desc()).limit(limit))
    return [Deployment(*row) for row in rows]
