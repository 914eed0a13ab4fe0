"""Traces: filter, page through the newest first, open one."""

from __future__ import annotations

from datetime import timedelta

import streamlit as st

from tracemill.store import queries, traces
from tracemill.store.queries import CallFilter
from tracemill.store.tables import utcnow
from tracemill.store.traces import TraceFilter
from tracemill.ui.shell import Context, choice, context, facets
from tracemill.ui.trace_view import show_trace

RANGES = {"last hour": timedelta(hours=1), "last 24 hours": timedelta(days=1), "last 7 days": timedelta(days=7),
          "last 30 days": timedelta(days=30), "all time": None}
PAGE = 50


def _filters(ctx: Context) -> TraceFilter:
    found = facets(ctx)
    top = st.columns([1.1, 1, 1, 1, 1.4])
    with top[0]:
        span = st.selectbox("Received", list(RANGES), index=len(RANGES) - 1, key="f_range")
    with top[1]:
        service = choice("Service", list(found.services), "f_service")
    with top[2]:
        model = choice("Model", sorted(found.models), "f_model")
    with top[3]:
        harness = choice("Harness version", sorted(found.harness_versions), "f_harness")
    with top[4]:
        tool = choice("Tool", sorted(found.tools), "f_tool")
    bottom = st.columns([1.1, 1, 3.4])
    with bottom[0]:
        stage = choice("Verdict", list(queries.STAGES), "f_stage")
    with bottom[1]:
        domain = choice("Domain", sorted(found.domains), "f_domain")
    with bottom[2]:
        text = st.text_input("Search", placeholder="a trace id, or words in a tool call's output or tool name",
                             key="f_text")
    since = utcnow() - RANGES[span] if RANGES[span] is not None else None
    return TraceFilter(CallFilter(model=model, harness_version=harness, tool=tool, domain=domain, stage=stage),
                       service=service, since=since, text=text.strip() or None)


def _listing(ctx: Context, f: TraceFilter) -> list[traces.TraceSummary]:
    key = repr(f)
    if st.session_state.get("list_key") != key:
        st.session_state.list_key, st.session_state.list_pages = key, [None]
    pages: list[int | None] = st.session_state.list_pages
    with ctx.engine.connect() as conn:
        page = traces.traces(conn, f, before=pages[-1], limit=PAGE)
    if page.searched_to is not None:
        st.caption(f"Searched back to {page.searched_to:%Y-%m-%d %H:%M:%S} UTC: older traces may match too.")
    rows = [{"received (UTC)": t.received_at.strftime("%Y-%m-%d %H:%M:%S"), "trace": t.trace_id[:12],
             "root": t.root or "(root not received)", "service": t.service or "",
             "model": ", ".join(t.models), "calls": t.calls, "failed": t.failed_calls,
             "ms": round((t.end_time_ns - t.start_time_ns) / 1e6), "spans": t.spans, "domain": ", ".join(t.domains)}
            for t in page.traces]
    if not rows:
        st.info("No traces here yet." if f == TraceFilter() else "No trace matches these filters.")
        return []
    st.dataframe(rows, hide_index=True, width="stretch", height=min(38 + 35 * len(rows), 420),
                 column_config={"failed": st.column_config.NumberColumn(format="%d ✗"),
                                "ms": st.column_config.NumberColumn("duration ms", format="%d")})
    left, right, _ = st.columns([1, 1, 6])
    with left:
        if st.button("◀ Newer", disabled=len(pages) == 1, key="newer"):
            pages.pop()
            st.rerun()
    with right:
        if st.button("Older ▶", disabled=page.before is None, key="older"):
            pages.append(page.before)
            st.rerun()
    return page.traces


def render() -> None:
    ctx = context()
    st.title("Traces")
    f = _filters(ctx)
    try:
        listed = _listing(ctx, f)
    except queries.FilterError as exc:
        st.error(str(exc))
        return
    wanted = st.query_params.get("trace")
    options = [t.trace_id for t in listed]
    if wanted and wanted not in options:
        options.insert(0, wanted)
    if not options:
        return
    if wanted and st.session_state.get("trace_applied") != wanted:  # a link to a trace (?trace=ID) opens it
        st.session_state.open_trace = st.session_state.trace_applied = wanted
    labels = {t.trace_id: f"{t.trace_id[:12]} · {t.root or 'trace'} · {t.calls} calls, {t.failed_calls} failed"
              for t in listed}
    chosen = st.selectbox("Open trace", options, index=None, format_func=lambda t: labels.get(t, t),
                          placeholder="Choose a trace to open", key="open_trace")
    if chosen:
        st.query_params["trace"] = st.session_state.trace_applied = chosen
        st.divider()
        show_trace(ctx, chosen)
