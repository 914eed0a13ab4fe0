"""Datasets: every `tracemill mine` export, with its card."""

from __future__ import annotations

import streamlit as st

from tracemill.store import learning
from tracemill.ui.shell import context


def render() -> None:
    ctx = context()
    st.title("Datasets")
    with ctx.engine.connect() as conn:
        found = learning.datasets(conn)
    if not found:
        st.info("Nothing here yet: `tracemill mine --out DIR` exports the mined calls as a dataset, and each export "
                "is listed here.")
        return
    st.dataframe([{"id": d.id, "name": d.name, "created (UTC)": d.created_at.strftime("%Y-%m-%d %H:%M"),
                   "train rows": d.train_rows, "eval rows": d.eval_rows, "newest call": d.last_call_id,
                   "filters": ", ".join(f"{k}={v}" for k, v in d.filters.items()) or "none",
                   "hash": d.content_hash[:12], "path": d.path} for d in found], hide_index=True, width="stretch")
    chosen = st.selectbox("Dataset", found, format_func=lambda d: f"#{d.id} {d.name}", key="dataset")
    if chosen is None:
        return
    card = chosen.card
    counts = {k: v for k, v in card.items() if isinstance(v, dict) and v and all(isinstance(n, int)
                                                                               for n in v.values())}
    if counts:
        cols = st.columns(min(3, len(counts)))
        for i, (what, by) in enumerate(counts.items()):
            with cols[i % len(cols)]:
                st.markdown(f"**{what.replace('_', ' ')}**")
                st.bar_chart({"rows": by}, horizontal=True, height=max(140, 28 * len(by)))
    with st.expander("The card (dataset.json)"):
        st.json(card, expanded=1)
