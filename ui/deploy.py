"""Deploy and roll back from the UI: `tracemill.serving.deployments` does the work (the same rows `tracemill deploy`
and `tracemill rollback` write, replayed the same way by the sidecar); this only checks that an admin asks."""

from __future__ import annotations

from sqlalchemy import Engine

from tracemill.serving import deployments
from tracemill.serving.deployments import DeployError
from tracemill.store.tables import DeploymentRow
from tracemill.ui.access import Identity

__all__ = ["DeployError", "deploy", "rollback"]


def deploy(engine: Engine, who: Identity, version: str, canary_percent: float | None = None,
           note: str | None = None) -> list[DeploymentRow]:
    """Serve `version` (a model's name, or `rules`) to all traffic, or to `canary_percent` of conversations as the
    canary. Returns the rows written."""
    who.require_deploy()
    return deployments.deploy(engine, version, who.name, canary_percent, note)


def rollback(engine: Engine, who: Identity, note: str | None = None) -> DeploymentRow:
    """End a running canary; else serve again the version active before the current one."""
    who.require_deploy()
    return deployments.rollback(engine, who.name, note)
