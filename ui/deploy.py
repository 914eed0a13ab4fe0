"""Deploy and roll back from the UI: the same append-only `deployments` rows `tracemill deploy` and `rollback` write
(the newest row per role is what the sidecar serves). Only admins."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Engine, insert

from tracemill.store import learning
from tracemill.store.tables import DeploymentRow, utcnow
from tracemill.ui.access import Identity


class DeployError(ValueError):
    """A deployment that cannot be made as asked; the message says why."""


def _write(engine: Engine, who: Identity, model_id: int | None, role: str, action: str,
           justification: dict[str, Any], canary_percent: float | None = None) -> learning.Deployment:
    who.require_deploy()
    with engine.begin() as conn:
        conn.execute(insert(DeploymentRow), [{
            "model_id": model_id, "role": role, "canary_percent": canary_percent, "action": action,
            "actor": who.name, "justification": justification, "created_at": utcnow()}])
    with engine.connect() as conn:
        return learning.deployments(conn, limit=1)[0]


def deploy(engine: Engine, who: Identity, model: learning.Model | None, canary_percent: float | None = None
           ) -> learning.Deployment:
    """Serve `model` (None: the rules reviser alone) to all traffic, or to `canary_percent` of it as the canary.
    The model's eval figures are recorded as the justification."""
    if canary_percent is not None and not 0 < canary_percent < 100:
        raise DeployError(f"a canary takes between 0 and 100 % of traffic, not {canary_percent}")
    justification = {"evaluation": model.evaluation, "model": model.name} if model else {"model": "rules"}
    if canary_percent is None:
        return _write(engine, who, model.id if model else None, "active", "deploy", justification)
    return _write(engine, who, model.id if model else None, "canary", "canary", justification, canary_percent)


def rollback(engine: Engine, who: Identity) -> learning.Deployment:
    """Serve again what was active before the current active version."""
    with engine.connect() as conn:
        history = [d for d in learning.deployments(conn, limit=10_000) if d.role == "active"]
    if not history:
        raise DeployError("nothing has been deployed, so there is nothing to roll back")
    current = history[0].model_id
    previous = next((d for d in history[1:] if d.model_id != current), None)
    if previous is None:
        raise DeployError("no earlier version was active: nothing to roll back to")
    return _write(engine, who, previous.model_id, "active", "rollback",
                  {"from_model_id": current, "to_deployment": previous.id})


def end_canary(engine: Engine, who: Identity) -> learning.Deployment:
    with engine.connect() as conn:
        serving = learning.serving_now(conn)
    if "canary" not in serving:
        raise DeployError("no canary is being served")
    return _write(engine, who, serving["canary"].model_id, "canary", "end_canary", {})
