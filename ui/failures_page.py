"""Failure modes: the miner's clusters (`tracemill.miner.failures`, what `tracemill failures` prints) as charts over
time, by tool, model and harness version, and two harness versions side by side: whether the last prompt or
tool-description change helped."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import streamlit as st

from tracemill.miner.failures import GROUP_FIELDS, NONE, FailureCounts, FailureReport, harness_changes, sidecar_versions
from tracemill.rates import percent
from tracemill.store.queries import SIDECAR_SERVICE, CallFilter
from tracemill.store.tables import utcnow
from tracemill.ui.shell import Context, choice, context, facets, kept

SHOWN = 8  # modes drawn in the charts (the table lists every one)
CLUSTERS = {"tool · stage · kind · pointer": GROUP_FIELDS, "tool · stage · kind": ("tool", "stage", "kind"),
            "stage · kind": ("stage", "kind")}
PERIODS = {"all time": None, "last 30 days": 30, "last 7 days": 7, "last day": 1}


def _report(ctx: Context, fields: tuple[str, ...], since: str | None, service: str | None,
            harness_version: str | None = None) -> FailureReport:
    """The report of the calls of `service` (None: every service's) and `harness_version` (None: every version's)
    made on day `since` or later, from counts kept between reruns."""
    held = kept(ctx.store_key, f"failure counts of service {service}, harness version {harness_version}")
    with held.lock, st.spinner("Counting new calls…"):
        counts = held.value or FailureCounts(CallFilter(service=service, harness_version=harness_version))
        held.value = counts = counts.update(ctx.engine)
        return counts.report(fields, since_day=since)


def _rates(report: FailureReport, split: str, totals: dict[str, int]) -> Any:
    """The top modes' failure rates per value of `split` (`by_day`, `by_model`, `by_harness`): one column a mode; a
    day without calls has no rate (a gap in the line)."""
    import pandas as pd

    rows = {m.label: {k: getattr(m, split).get(k, 0) / n if n else None for k, n in totals.items()}
            for m in report.modes[:SHOWN]}
    return pd.DataFrame(rows, dtype=float)


def render() -> None:
    import pandas as pd

    ctx = context()
    st.title("Failure modes")
    left, middle, right = st.columns([2, 1, 1])
    cluster = left.selectbox("Cluster by", list(CLUSTERS), key="failures_by")
    # behind the reviser sidecar each answer is stored twice: as the model sent it (the sidecar's service) and as the
    # agent got it (the agent's)
    services = list(facets(ctx).services)
    with middle:
        service = choice("Service", services, "failures_service")
    period = right.selectbox("Calls made", list(PERIODS), key="failures_period")
    days = PERIODS[period]
    since = (utcnow() - timedelta(days=days)).date().isoformat() if days is not None else None
    report = _report(ctx, CLUSTERS[cluster], since, service)
    if not report.total_calls:
        st.info("Nothing here yet: no tool call is stored" + ("" if PERIODS[period] is None else " for this period")
                + ". Point an agent at the collector, or run `tracemill simulate`.")
        return
    cols = st.columns(4)
    cols[0].metric("Calls", f"{report.total_calls:,}")
    cols[1].metric("Failed", f"{report.failed_calls:,}", help=f"{percent(report.failed_calls / report.total_calls)}"
                   " of calls")
    cols[2].metric("Failure modes", f"{len(report.modes):,}")
    cols[3].metric("Days", f"{len(report.calls_by_day):,}")
    mixed = service is None and SIDECAR_SERVICE in services and len(services) > 1
    if mixed:
        st.caption(f"Behind the reviser sidecar an answer is counted here twice: as the model sent it (service "
                   f"{SIDECAR_SERVICE}) and as the agent got it. Pick a service to read one record; harness versions "
                   "compare on the sidecar's, the model's answers as sent.")
    if not report.modes:
        st.success("No stored call failed.")
        return
    st.caption(f"Rates are of every call made (on that day, by that model, under that harness version); the charts "
               f"show the {min(SHOWN, len(report.modes))} most frequent modes.")
    st.subheader("Over time")
    by_day = _rates(report, "by_day", report.calls_by_day)
    if len(by_day) > 2:
        st.line_chart(by_day, height=280, y_label="failure rate")
    else:  # a line needs more days than this
        st.bar_chart(by_day, height=280, y_label="failure rate", stack=False)
    st.subheader("By harness version")
    st.bar_chart(_rates(report, "by_harness", report.calls_by_harness), height=280, y_label="failure rate",
                 stack=False)
    _compare(ctx, report, since, mixed)
    left, right = st.columns(2)
    with left:
        st.subheader("By model")
        st.bar_chart(_rates(report, "by_model", report.calls_by_model), height=280, y_label="failure rate",
                     stack=False)
    with right:
        st.subheader("By tool")
        if "tool" in report.fields:
            tools = pd.DataFrame([{"tool": m.tool or NONE, "stage": m.stage, "failed": m.count} for m in report.modes])
            top = tools.groupby("tool")["failed"].sum().nlargest(12).index
            st.bar_chart(tools[tools["tool"].isin(top)], x="tool", y="failed", color="stage", height=280,
                         horizontal=True, sort="-failed")
        else:
            st.caption("Cluster by tool to see which tools fail.")
    st.subheader("Every mode")
    st.dataframe([{"mode": m.label, "failed": m.count, "share of calls": m.share,
                   "models": ", ".join(m.by_model), "harness versions": ", ".join(m.by_harness)}
                  for m in report.modes], hide_index=True, width="stretch",
                 column_config={"share of calls": st.column_config.NumberColumn(format="percent")})


def _compare(ctx: Context, report: FailureReport, since: str | None, mixed: bool) -> None:
    """Two harness versions side by side. Where the report holds the reviser sidecar's record beside the agent's
    (`mixed`), a version the sidecar recorded is read from its record alone, as `tracemill failures --compare` and
    `tracemill cycle` read it."""
    versions = [v for v in sorted(report.calls_by_harness) if v != NONE]
    if len(versions) < 2:
        st.caption("One harness version so far: a second one is compared with it here.")
        return
    left, right = st.columns(2)
    a = left.selectbox("Compare harness version", versions, index=len(versions) - 2, key="failures_a")
    b = right.selectbox("with", versions, index=len(versions) - 1, key="failures_b")
    if a == b:
        return
    behind = sidecar_versions(ctx.engine, (a, b)) if mixed else set()
    if behind:
        first, second = (_report(ctx, report.fields, since, SIDECAR_SERVICE if v in behind else None, v)
                         for v in (a, b))
        rows = harness_changes(first, a, b, second=second)
    else:
        rows = harness_changes(report, a, b)
    changed = [r for r in rows if r.significant]
    st.markdown(f"**{a} → {b}**: {len(changed)} of {len(rows)} modes changed significantly "
                f"(two-proportion z-test, Fisher's exact test where counts are small; Bonferroni over the modes).")
    if behind:
        st.caption(f"{' and '.join(sorted(behind))} read from the reviser sidecar's record alone (the model's answers "
                   "as sent), as `tracemill failures --compare` and the cycle read them.")
    st.dataframe([{"mode": r.label, f"{a} rate": r.rate_a, f"{b} rate": r.rate_b, "p-value": r.p_value,
                   "change": r.change} for r in rows], hide_index=True, width="stretch",
                 column_config={f"{a} rate": st.column_config.NumberColumn(format="percent"),
                                f"{b} rate": st.column_config.NumberColumn(format="percent"),
                                "p-value": st.column_config.NumberColumn(format="%.2g")})
