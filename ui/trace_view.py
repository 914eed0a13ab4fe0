"""One trace: its spans as a tree with timings, and for each tool call the raw output, the parsed call with its
violations pointed at, the tool's schema and any revision as a diff. Large attributes are read a page at a time; a
span's GenAI log events (where an instrumentation sends the messages) are shown with its own events."""

from __future__ import annotations

import html
from typing import Any

import streamlit as st

from tracemill.collector.joins import stored_events
from tracemill.repair import revise
from tracemill.spans import SpanRecord
from tracemill.store import queries
from tracemill.store.payloads import is_reference, read_payload
from tracemill.tools import Tool
from tracemill.ui import draw, masking
from tracemill.ui.queue import queued_reasons, sensitive_calls
from tracemill.ui.shell import Context

PAYLOAD_PAGE = 4000


def show_trace(ctx: Context, trace_id: str) -> None:
    with ctx.engine.connect() as conn:
        spans = queries.trace_spans(conn, trace_id, resolved=False)
        calls = queries.trace_calls(conn, [trace_id])[trace_id]
        tools = queries.toolsets(conn, {c.toolset_id for c in calls if c.toolset_id is not None})
        logged = stored_events(conn, {(trace_id, s.span_id) for s in spans})  # openai-v2 sends the messages so
    if not spans:
        st.warning(f"No trace {trace_id} in the store.")
        return
    reasons = queued_reasons(ctx.engine, [c.id for c in calls])
    masked = not ctx.who.sees_sensitive and bool(sensitive_calls(calls, ctx.rules, reasons))
    rows = draw.span_tree(spans)
    by_span: dict[str, list[queries.StoredCall]] = {}
    for call in calls:
        by_span.setdefault(call.span_id, []).append(call)
    failed_spans = {c.span_id for c in calls if c.failed}
    start = min(s.start_time_ns for s in spans)
    end = max(s.end_time_ns for s in spans)
    st.subheader(f"Trace {trace_id}")
    st.markdown(f'<div class="tm-kv">service <b>{html.escape(_service(spans))}</b></div>', unsafe_allow_html=True)
    cols = st.columns(4)
    cols[0].metric("Duration", f"{(end - start) / 1e9:.2f} s")
    cols[1].metric("Spans", len(spans))
    cols[2].metric("Tool calls", len(calls))
    cols[3].metric("Failed calls", sum(c.failed for c in calls))
    if masked:
        st.warning("This trace holds calls in a sensitive domain: their content is masked for viewers.")
    st.altair_chart(draw.waterfall(rows, failed_spans), width="stretch")
    labels = [f"{i + 1}. {r.label} · {(r.span.end_time_ns - r.span.start_time_ns) / 1e6:,.0f} ms"
              + (f" · {len(by_span[r.span.span_id])} call(s)" if r.span.span_id in by_span else "")
              + (" ✗" if r.span.span_id in failed_spans else "") for i, r in enumerate(rows)]
    first_failed = next((i for i, r in enumerate(rows) if r.span.span_id in failed_spans), None)
    first_call = next((i for i, r in enumerate(rows) if r.span.span_id in by_span), 0)
    chosen = st.selectbox("Span", range(len(rows)), format_func=lambda i: labels[i],
                          index=first_failed if first_failed is not None else first_call, key=f"span_{trace_id}")
    span = rows[chosen].span
    span_calls = by_span.get(span.span_id, [])
    executed = [c for c in calls if c.execution_span_id == span.span_id]
    log_events = logged.get((trace_id, span.span_id), [])
    tabs = st.tabs([f"Tool calls ({len(span_calls)})", "Attributes", f"Events ({len(span.events) + len(log_events)})"])
    with tabs[0]:
        if not span_calls and executed:
            st.caption("This span ran the call below.")
        if not span_calls and not executed:
            st.info("This span emitted no tool call.")
        for call in span_calls or executed:
            index = {t.name: t for t in tools[call.toolset_id]} if call.toolset_id in tools else None
            repaired_by = [c for c in calls if c.repairs_id == call.id]
            show_call(call, index, masked, repaired_by, reasons.get(call.id))
    with tabs[1]:
        _attributes(ctx, span, masked)
    with tabs[2]:
        if span.events:
            st.json(masking.mask_value(span.events) if masked else span.events, expanded=False)
        for event in log_events:
            st.markdown(f"**{html.escape(event.event_name)}** · log event")
            shown = {"attributes": event.attributes, "body": event.body}
            st.json(masking.mask_value(shown) if masked else shown, expanded=True)
        if not span.events and not log_events:
            st.caption("No events.")


def _service(spans: list[SpanRecord]) -> str:
    return next((str(s.resource.get("service.name")) for s in spans if s.resource.get("service.name")), "—")


def show_call(call: queries.StoredCall, index: dict[str, Tool] | None, masked: bool,
              repaired_by: list[queries.StoredCall], queued: str | None) -> None:
    tool = index.get(call.name) if index and call.name else None
    badges = draw.verdict_badge(call) + draw.badge(call.domain or "no domain")
    if queued:
        badges += draw.badge(f"queued for review: {queued}", "warn")
    st.markdown(f"**{html.escape(call.name or '(no tool name)')}** &nbsp; {badges}", unsafe_allow_html=True)
    st.markdown(f'<div class="tm-kv">call #{call.id} · model <b>{html.escape(call.model or "—")}</b> · harness '
                f'<b>{html.escape(call.harness_version or "—")}</b> · execution '
                f'<b>{html.escape(call.execution_status or "not seen")}</b></div>', unsafe_allow_html=True)
    left, right = st.columns(2)
    with left:
        st.markdown("**Raw output**")
        st.code(masking.mask_text(call.raw) if masked else call.raw, language=None, wrap_lines=True)
    with right:
        st.markdown("**Parsed call**")
        parsed: Any = {"name": call.name, "arguments": call.arguments} if call.parsed else None
        if parsed is None:
            st.caption("The output could not be read as a call.")
        else:
            shown = masking.mask_value(parsed) if masked else parsed
            st.html(draw.pointed_json(shown, call.violations))
    if call.violations:
        st.markdown("**Verdict**")
        st.table([{"stage": v.get("stage"), "kind": v.get("kind"), "pointer": v.get("pointer") or "/",
                   "message": masking.MASK if masked else v.get("message")} for v in call.violations])
    if call.execution_error or call.execution_result:
        with st.expander("Execution"):
            text = call.execution_error or call.execution_result or ""
            st.code(masking.mask_text(text) if masked else text, language=None, wrap_lines=True)
    if tool is not None:
        with st.expander(f"Schema of {tool.name}"):
            st.caption(tool.description or "(no description)")
            st.json(dict(tool.input_schema), expanded=2)
    if index is not None and call.stage is not None and not masked:
        revision = revise(call.raw, index)
        if revision.changed and revision.calls:
            st.markdown("**Revision** (the deterministic reviser)" + ("" if revision.ok else " — still not valid"))
            after = [c.to_dict() for c in revision.calls]
            st.code(draw.diff(parsed if parsed is not None else call.raw, after[0] if len(after) == 1 else after),
                    language="diff")
            st.caption(" · ".join(f"{s.kind.value}: {s.reason}" for s in revision.steps))
    for later in repaired_by:
        st.markdown(f"**The agent's own repair** (call #{later.id})")
        if masked:
            st.caption(masking.MASK)
        else:
            st.code(draw.diff(parsed if parsed is not None else call.raw,
                                {"name": later.name, "arguments": later.arguments}, after_name="repaired"),
                    language="diff")
    st.divider()


def _attributes(ctx: Context, span: SpanRecord, masked: bool) -> None:
    st.markdown(f'<div class="tm-kv">span <b>{span.span_id}</b> · parent <b>{span.parent_span_id or "—"}</b> · '
                f'status <b>{span.status_code}</b> {html.escape(span.status_message)}</div>', unsafe_allow_html=True)
    small = {k: v for k, v in span.attributes.items() if not is_reference(v)}
    st.json(masking.mask_attributes(small) if masked else small, expanded=True)
    for key, ref in ((k, v) for k, v in span.attributes.items() if is_reference(v)):
        chars = int(ref.get("chars") or 0)
        with st.expander(f"{key} · {chars:,} characters"):
            if masked:
                st.caption(masking.mask_text("x" * chars))
                continue
            pages = max(1, -(-chars // PAYLOAD_PAGE))
            page = st.number_input(f"page of {pages}", 1, pages, 1, key=f"pg_{span.span_id}_{key}") if pages > 1 else 1
            with ctx.engine.connect() as conn:
                text = read_payload(conn, ref, (page - 1) * PAYLOAD_PAGE, PAYLOAD_PAGE)
            st.code(text, language="json" if text.lstrip().startswith(("{", "[")) else None, wrap_lines=True)
