"""Findings: what miner agents (`tracemill mine-agent`) found that rules cannot label, consolidated by key, with the
harness change each suggests and its evidence, a link to each trace. A finding's examples may quote calls of any
domain: a viewer who does not see sensitive content sees them masked."""

from __future__ import annotations

import streamlit as st

from tracemill.miner.findings import StoredFinding, list_findings
from tracemill.ui import masking
from tracemill.ui.shell import PAGES, context

EVIDENCE_LINKS = 20  # traces a finding links to, the first of its evidence
TRACE_ID_CHARS = 32  # evidence is trace_id/span_id, a trace id or a span id (16 characters) alone


def render() -> None:
    ctx = context()
    st.title("Findings")
    expired = st.toggle("Show expired findings", key="findings_expired")
    found = list_findings(ctx.engine, ("open", "expired") if expired else ("open",))
    if not found:
        st.info("Nothing here yet: `tracemill mine-agent` investigates the store and records what rules cannot "
                "label as findings, listed here while they are seen again.")
        return
    st.dataframe([{"key": f.key, "status": f.status, "seen": f.seen,
                   "first seen (UTC)": f.first_seen.strftime("%Y-%m-%d %H:%M"),
                   "last seen (UTC)": f.last_seen.strftime("%Y-%m-%d %H:%M"), "hypothesis": f.hypothesis,
                   "suggested change": f.suggestion or "", "evidence": len(f.evidence)} for f in found],
                 hide_index=True, width="stretch")
    chosen = st.selectbox("Finding", found, format_func=lambda f: f"{f.key} ({f.seen}x)", key="finding")
    if chosen is not None:
        _show(chosen, masked=not ctx.who.sees_sensitive)


def _show(finding: StoredFinding, masked: bool) -> None:
    st.markdown(f"**Hypothesis.** {finding.hypothesis}")
    if finding.suggestion:
        st.markdown(f"**Suggested harness change.** {finding.suggestion}")
    traces = list(dict.fromkeys(t for item in finding.evidence if len(t := item.split("/", 1)[0]) == TRACE_ID_CHARS))
    st.markdown(f"**Evidence.** {len(finding.evidence)} span(s) or trace(s), in {len(traces)} trace(s)")
    for trace_id in traces[:EVIDENCE_LINKS]:
        if st.button(f"Open trace {trace_id[:12]}", key=f"finding_trace_{trace_id}", icon=":material/account_tree:"):
            st.switch_page(PAGES / "traces.py", query_params={"trace": trace_id})
    if finding.examples:
        st.markdown(f"**Labelled examples** ({len(finding.examples)})" + (" · masked" if masked else ""))
        st.json(masking.mask_value(finding.examples) if masked else finding.examples, expanded=False)
