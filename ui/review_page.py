"""The review queue: calls in sensitive domains and revisions of low confidence, one at a time, each reserved for
the reviewer who has it open. Approve (Ctrl+Enter), reject (Ctrl+Shift+Enter) or skip (Ctrl+Shift+Space) without
the mouse; the editor holds the call to approve, checked against the tool's schema before it is saved."""

from __future__ import annotations

import html
import json
from datetime import timedelta

import streamlit as st

from tracemill.miner.conversation import stored_messages
from tracemill.reviser_prompt import conversation
from tracemill.store import learning, queries
from tracemill.ui import decide, draw, masking
from tracemill.ui.access import NotAllowed
from tracemill.ui.queue import claim, progress, queue_item, release, scan, served_as, waiting
from tracemill.ui.shell import PAGES, Context, context

CURRENT = "review.current"
SKIPPED = "review.skipped"
ALL = "all"


def _progress(ctx: Context) -> None:
    found = progress(ctx.engine)
    cols = st.columns(2 + len(found.by_reason))
    cols[0].metric("Waiting", f"{found.waiting:,}")
    cols[1].metric("Decided", f"{found.decided:,}", help="of the queued calls")
    for col, (reason, (queued, decided)) in zip(cols[2:], found.by_reason.items(), strict=True):
        col.metric(f"{reason.replace('_', ' ')} waiting", f"{queued - decided:,}", help=f"{decided:,} decided")
    if found.by_reviewer:
        with st.expander("Progress per reviewer", expanded=False):
            st.dataframe([{"reviewer": who, **counts, "total": sum(counts.values())}
                          for who, counts in sorted(found.by_reviewer.items())], hide_index=True, width="stretch")


def _pick(ctx: Context, reason: str | None) -> int | None:
    """The call this reviewer works on: the one they have open if still theirs and undecided, else the next free."""
    skipped: set[int] = st.session_state.setdefault(SKIPPED, set())
    current = st.session_state.get(CURRENT)
    for item in ([queue_item(ctx.engine, current)] if current else []) + waiting(ctx.engine, ctx.who.name, reason):
        if item is None or item.call_id in skipped and item.call_id != current:
            continue
        if (reason is not None and item.reason != reason) or _decided(ctx, item.call_id):
            continue
        if ctx.who.can_decide:
            held = claim(ctx.engine, item.call_id, ctx.who.name,
                         timedelta(seconds=ctx.settings.review_reservation_seconds))
            if held.reviewer != ctx.who.name:
                continue
        st.session_state[CURRENT] = item.call_id
        return item.call_id
    st.session_state.pop(CURRENT, None)
    return None


def _decided(ctx: Context, call_id: int) -> learning.Review | None:
    with ctx.engine.connect() as conn:
        return learning.review(conn, call_id)


def _context_lines(ctx: Context, call: queries.StoredCall, masked: bool) -> None:
    with ctx.engine.connect() as conn:
        turns = conversation(stored_messages(conn, call.trace_id, call.span_id), 600)
    if turns:
        with st.expander("Conversation before the call", expanded=not masked):
            for line in turns[-6:]:
                st.markdown(html.escape(masking.mask_text(line) if masked else line))


def render() -> None:
    ctx = context()
    st.title("Review queue")
    with st.spinner("Reading new calls…"):
        scanned = scan(ctx.engine, ctx.rules, budget_s=0.5)
    if scanned.remaining:
        st.caption(f"{scanned.remaining:,} newer calls are still to be read by the queue's rules; they are read a "
                   "little on every visit.")
    _progress(ctx)
    if not ctx.who.can_decide:
        st.info(f"You are signed in as a {ctx.who.role.value}: only reviewers and admins decide, and content in "
                "sensitive domains is masked for you.")
    reason = st.segmented_control("Show", [ALL, "medical", "legal", "low_confidence"], default=ALL,
                                  key="review_reason", format_func=lambda r: r.replace("_", " "))
    call_id = _pick(ctx, None if reason in (None, ALL) else reason)
    if call_id is None:
        st.success("Nothing waits for review here." if reason in (None, ALL) else "Nothing of this kind waits.")
        return
    queued = queue_item(ctx.engine, call_id)
    item = decide.subject(ctx.engine, call_id, served_as(queued.detail) if queued else None)
    if item is None or queued is None:
        st.error(f"Call {call_id} is not in the store.")
        return
    _show(ctx, item, queued.reason, queued.detail)


def _show(ctx: Context, item: decide.Subject, reason: str, detail: str) -> None:
    call, masked = item.call, not ctx.who.sees_sensitive
    st.markdown(f"### {html.escape(call.name or '(no tool name)')} &nbsp; {draw.verdict_badge(call)}"
                f"{draw.badge(reason.replace('_', ' '), 'warn')}", unsafe_allow_html=True)
    st.markdown(f'<div class="tm-kv">call #{call.id} · queued because {html.escape(detail)} · model '
                f'<b>{html.escape(call.model or "—")}</b> · harness <b>{html.escape(call.harness_version or "—")}'
                f'</b> · trace <b>{call.trace_id[:12]}</b></div>', unsafe_allow_html=True)
    if st.button("Open the trace", key="open_trace_from_review", icon=":material/account_tree:"):
        st.switch_page(PAGES / "traces.py", query_params={"trace": call.trace_id})
    _context_lines(ctx, call, masked)
    left, right = st.columns(2)
    with left:
        st.markdown("**Raw output**")
        st.code(masking.mask_text(call.raw) if masked else call.raw, language=None, wrap_lines=True)
        if call.parsed:
            st.markdown("**As emitted, with the verdict**")
            emitted = {"name": call.name, "arguments": call.arguments}
            st.html(draw.pointed_json(masking.mask_value(emitted) if masked else emitted, call.violations))
        if item.tool is not None:
            with st.expander(f"Schema of {item.tool.name}"):
                st.caption(item.tool.description or "(no description)")
                st.json(dict(item.tool.input_schema), expanded=2)
    with right:
        _decision_form(ctx, item, masked)


def _decision_form(ctx: Context, item: decide.Subject, masked: bool) -> None:
    proposal = masking.mask_value(item.proposal) if masked else item.proposal
    with st.form(f"decide_{item.call.id}", enter_to_submit=False, border=True):
        st.markdown("**The call to approve** — edit it if it is wrong")
        text = st.text_area("Call", draw.pretty(proposal), height=300, key=f"edit_{item.call.id}",
                            label_visibility="collapsed", disabled=masked)
        note = st.text_input("Note (optional)", key=f"note_{item.call.id}", disabled=masked)
        # Shown to every role: a viewer's attempt is refused by `decide`, which checks the role itself.
        approve = st.form_submit_button("Approve", type="primary", shortcut="Ctrl+Enter", width="stretch",
                                        key=f"approve_{item.call.id}")
        reject = st.form_submit_button("Reject", shortcut="Ctrl+Shift+Enter", width="stretch",
                                       key=f"reject_{item.call.id}")
        skip = st.form_submit_button("Skip", shortcut="Ctrl+Shift+Space", width="stretch",
                                     key=f"skip_{item.call.id}")
    if skip:
        st.session_state.setdefault(SKIPPED, set()).add(item.call.id)
        if ctx.who.can_decide:
            release(ctx.engine, item.call.id, ctx.who.name)
        st.session_state.pop(CURRENT, None)
        st.rerun()
    if not (approve or reject):
        return
    try:
        if reject:
            stored = decide.decide(ctx.engine, ctx.who, item, decide.Decision.REJECT, note=note)
        else:
            try:
                edited = json.loads(text)
            except ValueError as exc:
                st.error(f"The call is not JSON: {exc}")
                return
            stored = decide.decide(ctx.engine, ctx.who, item, decide.Decision.APPROVE, edited, note)
    except NotAllowed as refused:
        st.error(f"Refused: {refused}")
        return
    except decide.InvalidEdit as invalid:
        st.error(f"Not saved: the call does not pass the verifier — {invalid}")
        return
    except decide.AlreadyDecided as taken:
        st.warning(str(taken))
        st.session_state.pop(CURRENT, None)
        return
    st.session_state.pop(CURRENT, None)
    st.toast(f"Saved: {stored.decision} on call #{stored.call_id}")
    st.rerun()
