"""What a sidecar serves, as the `deployments` table records it: append-only, replayed to the state it describes.

    state = served(session)               # the active version, the canary (if any) and its share
    deploy(engine, "reviser-0003", actor="ana")              # make a version active (ends a running canary)
    deploy(engine, "reviser-0004", actor="ana", canary=10)   # send 10 % of conversations to a candidate
    rollback(engine, actor="ana")         # end the canary; else go back to the version active before this one

A version is a row of `models`, or `rules` (model_id None: the deterministic reviser alone). Rolling back walks the
history: each rollback undoes the newest deploy not undone yet, so two rollbacks after two deploys are back where the
history started (rules alone). Each row says who, when and why (the model's eval figures and a note). Every reader
of the table replays it here (the sidecar, `tracemill deployments`, the UI's Models page, which also deploys and rolls
back through these functions): a canary runs while the newest `canary` row is a `canary` (`end_canary` ends it).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Engine, func, select
from sqlalchemy.orm import Session

from tracemill.store import learning
from tracemill.store.tables import DeploymentRow, ModelRow

RULES = "rules"
_ALL = 1_000_000  # rows of history read to replay it


class DeployError(ValueError):
    """A deployment that cannot be made (an unknown version, nothing to roll back); the message says which."""


@dataclass(frozen=True, slots=True)
class Version:
    """A reviser version: a trained model, or the rules alone (`model_id` None)."""

    name: str
    model_id: int | None = None
    kind: str = ""  # lora | full
    path: str = ""
    base_model: str = ""
    config: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def of(cls, row: ModelRow | None) -> Version:
        if row is None:
            return cls(RULES)
        return cls(row.name, row.id, row.kind, row.path, row.base_model, dict(row.config or {}))


@dataclass(frozen=True, slots=True)
class Served:
    """The state the history describes. `deployment_id`: its newest row (None: nothing was ever deployed)."""

    active: Version
    canary: Version | None = None
    canary_percent: float | None = None
    deployment_id: int | None = None
    rollback_to: int | None = None  # the model_id a rollback of the active version returns to (None: rules)
    can_roll_back: bool = False


@dataclass(frozen=True, slots=True)
class HistoryRow:
    id: int
    created_at: str
    action: str
    role: str
    version: str
    canary_percent: float | None
    actor: str
    justification: Mapping[str, Any]

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "created_at": self.created_at, "action": self.action, "role": self.role,
                "version": self.version, "canary_percent": self.canary_percent, "actor": self.actor,
                "justification": dict(self.justification)}


def newest_id(session: Session) -> int | None:
    """The newest deployment's id: what a running sidecar polls to notice a change."""
    return session.execute(select(func.max(DeploymentRow.id))).scalar()


def _replay(rows: list[learning.Deployment]) -> tuple[list[int | None], learning.Deployment | None]:
    """(the stack of active model ids, oldest first, whose top is the newest active row's; the running canary's row).
    Each rollback row names the version it goes back to and undoes the newest deploy not undone yet."""
    stack: list[int | None] = [None]
    canary: learning.Deployment | None = None
    for row in rows:
        if row.role == "canary":
            canary = row if row.action == "canary" else None
        elif row.action == "rollback":
            if len(stack) > 1:
                stack.pop()
            stack[-1] = row.model_id
        else:
            stack.append(row.model_id)
    return stack, canary


def served(session: Session) -> Served:
    rows = list(reversed(learning.deployments(session.connection(), limit=_ALL)))
    if not rows:
        return Served(Version(RULES))
    stack, canary = _replay(rows)
    wanted = {m for m in (stack[-1], canary.model_id if canary else None) if m is not None}
    models = {m.id: m for m in session.execute(select(ModelRow).where(ModelRow.id.in_(wanted))).scalars()}
    running = Version.of(models.get(canary.model_id)) if canary and canary.model_id is not None else Version(RULES)
    return Served(Version.of(models.get(stack[-1])) if stack[-1] is not None else Version(RULES),
                  running if canary else None, canary.canary_percent if canary else None, rows[-1].id,
                  stack[-2] if len(stack) > 1 else None, len(stack) > 1)


def find_model(session: Session, ref: str) -> ModelRow | None:
    """A model by id or by name; None for `rules`. Raises DeployError when there is no such model."""
    if ref == RULES:
        return None
    row = session.get(ModelRow, int(ref)) if ref.isdigit() else None
    row = row or session.execute(select(ModelRow).where(ModelRow.name == ref)).scalar()
    if row is None:
        names = list(session.execute(select(ModelRow.name).order_by(ModelRow.id.desc()).limit(5)).scalars())
        known = f"; newest models: {', '.join(names)}" if names else "; no model is registered yet (tracemill train)"
        raise DeployError(f"no model {ref!r} (give its id or name, or 'rules'){known}")
    return row


def _row(model: ModelRow | None, role: str, action: str, actor: str, why: Mapping[str, Any],
         percent: float | None = None) -> DeploymentRow:
    return DeploymentRow(model_id=model.id if model is not None else None, role=role, canary_percent=percent,
                         action=action, actor=actor, justification=dict(why))


def _justification(model: ModelRow | None, note: str | None, before: str) -> dict[str, Any]:
    why: dict[str, Any] = {"replaces": before}
    if model is not None:
        why["evaluation"] = model.evaluation
    if note:
        why["note"] = note
    return why


def deploy(engine: Engine, ref: str, actor: str, canary: float | None = None,
           note: str | None = None) -> list[DeploymentRow]:
    """Make a version active, or (with `canary`, a share in (0, 100]) its candidate for that share of conversations.
    Making a version active ends a running canary. Returns the rows written."""
    with Session(engine, expire_on_commit=False) as session, session.begin():
        return deploy_in(session, ref, actor, canary, note)


def deploy_in(session: Session, ref: str, actor: str, canary: float | None = None,
              note: str | None = None) -> list[DeploymentRow]:
    """`deploy` within the caller's transaction, so that what else it writes commits with the deployment or not at
    all (the cycle records its deployment this way)."""
    if canary is not None and not 0 < canary <= 100:
        raise DeployError(f"a canary's share must be over 0 and at most 100 percent, not {canary}")
    model = find_model(session, ref)
    state = served(session)
    name = model.name if model is not None else RULES
    if canary is not None:
        if state.active.name == name:
            raise DeployError(f"{name} is already active: a canary must be another version")
        rows = [_row(model, "canary", "canary", actor, _justification(model, note, state.active.name), canary)]
    else:
        if state.active.name == name and state.canary is None:
            raise DeployError(f"{name} is already active")
        rows = []
        if state.canary is not None:
            rows.append(_row(None, "canary", "end_canary", actor, {"replaced_by": name}))
        rows.append(_row(model, "active", "deploy", actor, _justification(model, note, state.active.name)))
    session.add_all(rows)
    session.flush()
    return rows


def rollback(engine: Engine, actor: str, note: str | None = None) -> DeploymentRow:
    """End a running canary; else go back to the version that was active before the current one."""
    with Session(engine, expire_on_commit=False) as session, session.begin():
        state = served(session)
        why: dict[str, Any] = {"note": note} if note else {}
        if state.canary is not None:
            row = _row(None, "canary", "end_canary", actor, {**why, "ended": state.canary.name, "by": "rollback"})
        elif state.can_roll_back:
            back = session.get(ModelRow, state.rollback_to) if state.rollback_to is not None else None
            row = _row(back, "active", "rollback", actor, {**why, "replaces": state.active.name})
        else:
            raise DeployError(f"nothing to roll back: {state.active.name} has served since the history began")
        session.add(row)
        return row


def history(session: Session, limit: int | None = None) -> list[HistoryRow]:
    """The deployments, newest first."""
    rows = learning.deployments(session.connection(), limit=limit or _ALL)
    ids = {r.model_id for r in rows if r.model_id is not None}
    names = {i: n for i, n in session.execute(select(ModelRow.id, ModelRow.name).where(ModelRow.id.in_(ids)))}
    return [HistoryRow(r.id, r.created_at.isoformat(timespec="seconds"), r.action, r.role,
                       "" if r.role == "canary" and r.action != "canary" else names.get(r.model_id, RULES),
                       r.canary_percent, r.actor, r.justification or {}) for r in rows]
