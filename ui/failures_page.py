"""Failure modes: failed calls over time, by stage, tool, model and harness version — whether the last prompt or
tool-description change helped."""

from __future__ import annotations

from dataclasses import asdict

import streamlit as st

from tracemill.store import queries, traces
from tracemill.ui.shell import Context, context


@st.cache_data(ttl=120, show_spinner=False)
def _counts(store_key: str, _ctx: Context) -> tuple[list[queries.FailureCount], dict[str, int], dict[str, int]]:
    with _ctx.engine.connect() as conn:
        found = queries.failure_counts(conn)
        facets = traces.facets(conn)
    return found, facets.models, facets.harness_versions


def render() -> None:
    import pandas as pd

    ctx = context()
    st.title("Failure modes")
    found, calls_by_model, calls_by_harness = _counts(ctx.store_key, ctx)
    if not found:
        st.info("No failed tool call is stored yet." if calls_by_model else "Nothing here yet: no tool call is "
                "stored. Point an agent at the collector, or run `tracemill simulate`.")
        return
    data = pd.DataFrame([asdict(c) for c in found])
    total = sum(calls_by_model.values())
    failed = int(data["calls"].sum())
    cols = st.columns(4)
    cols[0].metric("Calls", f"{total:,}")
    cols[1].metric("Failed", f"{failed:,}", help=f"{failed / total:.1%} of calls" if total else None)
    cols[2].metric("Tools failing", f"{data['tool'].nunique():,}")
    cols[3].metric("Days", f"{data['day'].nunique():,}")
    st.subheader("Over time, by stage")
    st.bar_chart(data.pivot_table(index="day", columns="stage", values="calls", aggfunc="sum").fillna(0),
                 height=260)
    left, right = st.columns(2)
    with left:
        st.subheader("By harness version")
        by = data.groupby("harness_version", dropna=False)["calls"].sum()
        st.dataframe([{"harness version": h if isinstance(h, str) else "(none)", "failed": int(n),
                       "calls": calls_by_harness.get(h, 0),
                       "failure rate": n / calls_by_harness[h] if calls_by_harness.get(h) else None}
                      for h, n in by.items()], hide_index=True, width="stretch",
                     column_config={"failure rate": st.column_config.ProgressColumn(format="percent", max_value=1)})
    with right:
        st.subheader("By model")
        by = data.groupby("model", dropna=False)["calls"].sum()
        st.dataframe([{"model": m if isinstance(m, str) else "(none)", "failed": int(n),
                       "calls": calls_by_model.get(m, 0),
                       "failure rate": n / calls_by_model[m] if calls_by_model.get(m) else None}
                      for m, n in by.items()], hide_index=True, width="stretch",
                     column_config={"failure rate": st.column_config.ProgressColumn(format="percent", max_value=1)})
    st.subheader("Tools that fail most")
    tools = (data.groupby(["tool", "stage"], dropna=False)["calls"].sum().reset_index()
             .sort_values("calls", ascending=False).head(20))
    st.dataframe(tools, hide_index=True, width="stretch")
