"""Models and deployments: trained reviser versions with their eval figures side by side and reward curves, what is
served now and its history; admins deploy, start a canary and roll back here."""

from __future__ import annotations

from typing import Any

import streamlit as st

from tracemill.store import learning
from tracemill.ui import deploy
from tracemill.ui.access import NotAllowed
from tracemill.ui.shell import Context, context


def _figures(models: list[learning.Model]) -> list[dict[str, Any]]:
    """Each model's numeric eval figures, one row per figure, the models as columns."""
    names = [m.name for m in models]
    table: dict[str, dict[str, Any]] = {}
    for m in models:
        for key, value in _flat(m.evaluation):
            table.setdefault(key, {"figure": key, **dict.fromkeys(names)})[m.name] = value
    return list(table.values())


def _flat(value: Any, prefix: str = "") -> list[tuple[str, float]]:
    if isinstance(value, bool):
        return []
    if isinstance(value, (int, float)):
        return [(prefix, float(value))]
    if isinstance(value, dict):
        return [item for k, v in value.items() for item in _flat(v, f"{prefix}.{k}" if prefix else str(k))]
    return []


def _curves(model: learning.Model) -> dict[str, list[float]]:
    """Series of numbers in the training metrics (reward per step and the like)."""
    return {k: v for k, v in model.metrics.items()
            if isinstance(v, list) and v and all(isinstance(x, (int, float)) for x in v)}


def _serving(ctx: Context, models: dict[int, learning.Model]) -> None:
    with ctx.engine.connect() as conn:
        now = learning.serving_now(conn)
        history = learning.deployments(conn)
    cols = st.columns(2)
    for col, role in zip(cols, ("active", "canary"), strict=True):
        d = now.get(role)
        shown = "not served" if d is None else (models[d.model_id].name if d.model_id in models else "rules only")
        col.metric(f"{role.capitalize()}" + (f" ({d.canary_percent:g} %)" if d and d.canary_percent else ""), shown,
                   help=f"since {d.created_at:%Y-%m-%d %H:%M} UTC, by {d.actor}" if d else None)
    if history:
        with st.expander("Deployment history", expanded=False):
            st.dataframe([{"when (UTC)": d.created_at.strftime("%Y-%m-%d %H:%M"), "action": d.action,
                           "role": d.role, "model": models[d.model_id].name if d.model_id in models else "rules",
                           "canary %": d.canary_percent, "by": d.actor} for d in history],
                         hide_index=True, width="stretch")


def _actions(ctx: Context, found: list[learning.Model]) -> None:
    st.subheader("Deploy")
    if not ctx.who.can_deploy:
        st.caption(f"Only admins deploy and roll back; you are a {ctx.who.role.value}.")
    choice = st.selectbox("Version", [None, *found], key="deploy_model",
                          format_func=lambda m: "rules reviser only" if m is None else m.name)
    canary = st.slider("Canary share of traffic (0: deploy to all)", 0, 50, 0, key="deploy_canary")
    cols = st.columns(3)
    try:
        if cols[0].button("Deploy" if not canary else f"Start canary at {canary} %", type="primary",
                          disabled=not ctx.who.can_deploy, key="deploy"):
            done = deploy.deploy(ctx.engine, ctx.who, choice, float(canary) if canary else None)
            st.success(f"{done.action}: {'rules' if choice is None else choice.name} ({done.role})")
        if cols[1].button("Roll back", disabled=not ctx.who.can_deploy, key="rollback"):
            done = deploy.rollback(ctx.engine, ctx.who)
            st.success(f"Rolled back (deployment #{done.id})")
        if cols[2].button("End canary", disabled=not ctx.who.can_deploy, key="end_canary"):
            deploy.end_canary(ctx.engine, ctx.who)
            st.success("Canary ended")
    except (NotAllowed, deploy.DeployError) as refused:
        st.error(f"Refused: {refused}")


def render() -> None:
    ctx = context()
    st.title("Models and deployments")
    with ctx.engine.connect() as conn:
        found = learning.models(conn)
    by_id = {m.id: m for m in found}
    _serving(ctx, by_id)
    if not found:
        st.info("No trained reviser yet: `tracemill train` registers each version here with its eval figures. "
                "Until then the sidecar serves the rules reviser.")
    else:
        st.subheader("Versions")
        st.dataframe([{"name": m.name, "base model": m.base_model, "kind": m.kind, "dataset": m.dataset_id,
                       "created (UTC)": m.created_at.strftime("%Y-%m-%d %H:%M"), "path": m.path} for m in found],
                     hide_index=True, width="stretch")
        figures = _figures(found[:6])
        if figures:
            st.markdown("**Eval figures side by side**")
            st.dataframe(figures, hide_index=True, width="stretch")
        curves = {m.name: _curves(m) for m in found[:6]}
        series = sorted({k for c in curves.values() for k in c})
        if series:
            picked = st.selectbox("Training curve", series, key="curve")
            st.line_chart({name: c[picked] for name, c in curves.items() if picked in c}, height=260)
    _actions(ctx, found)
