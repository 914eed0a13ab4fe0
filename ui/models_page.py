"""Models and deployments: trained reviser versions with their eval figures side by side and reward curves, what is
served now and its history; admins deploy, start a canary and roll back here."""

from __future__ import annotations

from typing import Any

import streamlit as st
from sqlalchemy.orm import Session

from tracemill.serving import deployments
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


def _state(ctx: Context) -> tuple[deployments.Served, list[deployments.HistoryRow]]:
    with Session(ctx.engine) as session:
        return deployments.served(session), deployments.history(session, limit=200)


def _serving(state: deployments.Served, history: list[deployments.HistoryRow]) -> None:
    cols = st.columns(2)
    cols[0].metric("Active", state.active.name)
    cols[1].metric("Canary" + (f" ({state.canary_percent:g} %)" if state.canary_percent else ""),
                   state.canary.name if state.canary else "not served")
    if history:
        with st.expander("Deployment history", expanded=False):
            st.dataframe([{"when (UTC)": h.created_at.replace("T", " "), "action": h.action, "role": h.role,
                           "version": h.version, "canary %": h.canary_percent, "by": h.actor,
                           "note": h.justification.get("note")} for h in history],
                         hide_index=True, width="stretch")


def _actions(ctx: Context, found: list[learning.Model], state: deployments.Served) -> None:
    st.subheader("Deploy")
    if not ctx.who.can_deploy:
        st.caption(f"Only admins deploy and roll back; you are a {ctx.who.role.value}.")
    choice = st.selectbox("Version", [deployments.RULES, *(m.name for m in found)], key="deploy_model",
                          format_func=lambda name: "rules reviser only" if name == deployments.RULES else name)
    canary = st.slider("Canary share of traffic (0: deploy to all)", 0, 50, 0, key="deploy_canary")
    note = st.text_input("Note (why)", key="deploy_note")
    undo = "End canary" if state.canary is not None else "Roll back"
    cols = st.columns(2)
    try:
        if cols[0].button("Deploy" if not canary else f"Start canary at {canary} %", type="primary",
                          disabled=not ctx.who.can_deploy, key="deploy"):
            rows = deploy.deploy(ctx.engine, ctx.who, choice, float(canary) if canary else None, note or None)
            st.success(f"Deployment #{rows[-1].id}: {choice} {'canary' if canary else 'active'}")
        if cols[1].button(undo, disabled=not ctx.who.can_deploy or not (state.canary or state.can_roll_back),
                          key="rollback", help="ends a running canary; else serves the version active before"):
            row = deploy.rollback(ctx.engine, ctx.who, note or None)
            st.success(f"{undo}: deployment #{row.id}")
    except (NotAllowed, deploy.DeployError) as refused:
        st.error(f"Refused: {refused}")


def render() -> None:
    ctx = context()
    st.title("Models and deployments")
    with ctx.engine.connect() as conn:
        found = learning.models(conn)
    serving = st.container()  # drawn after the actions below, so that it shows what they changed
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
    _actions(ctx, found, _state(ctx)[0])
    with serving:
        _serving(*_state(ctx))
