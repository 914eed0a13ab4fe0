"""The sidecar's Prometheus metrics (`GET /metrics`), one registry per app."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from tracemill.sdk import core
from tracemill.serving.plan import Plan
from tracemill.serving.revising import Revised

_LATENCY = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)


class _Spans(Collector):
    """What became of the spans the sidecar recorded (`tracemill.sdk.delivery`), read at each scrape: traces lost to a
    collector that refused them or to an overloaded export queue show here, not only in the log."""

    def collect(self) -> Iterator[Metric]:
        counts = core.delivery()
        if counts is None:  # not traced
            return
        yield CounterMetricFamily("tracemill_serve_spans_ended", "Spans recorded.", value=counts.ended)
        exported = CounterMetricFamily("tracemill_serve_spans_exported", "Spans sent to the collector, by whether "
                                       "it took them (sent) or the request failed (failed: lost).", labels=["result"])
        exported.add_metric(["sent"], counts.sent)
        exported.add_metric(["failed"], counts.failed)
        yield exported
        yield GaugeMetricFamily("tracemill_serve_spans_unsent", "Spans recorded and not exported: waiting in the "
                                "export queue (OTEL_BSP_MAX_QUEUE_SIZE, 2,048 by default), or dropped because it was "
                                "full (what stays above the queue's size, or above 0 when the sidecar is idle).",
                                value=counts.unsent)


class Metrics:
    def __init__(self, traced: bool = False) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        if traced:
            r.register(_Spans())
        self.requests = Counter("tracemill_serve_requests", "Requests answered, by route and status.",
                                ["route", "status"], registry=r)
        self.revisions = Counter("tracemill_serve_revisions", "Answers checked, by what the revision did "
                                 "(unchanged, revised, partial, refused) and the version that served.",
                                 ["outcome", "version"], registry=r)
        self.steps = Counter("tracemill_serve_revision_steps", "Revision steps taken, by kind.", ["kind"],
                             registry=r)
        self.reviser_errors = Counter("tracemill_serve_reviser_errors", "Model reviser failures (the rules' "
                                      "answer stood).", ["version"], registry=r)
        self.upstream_seconds = Histogram("tracemill_serve_upstream_seconds", "Time the upstream took.",
                                          buckets=_LATENCY, registry=r)
        self.revise_seconds = Histogram("tracemill_serve_revise_seconds", "Time spent checking and revising "
                                        "an answer.", buckets=_LATENCY, registry=r)
        self.serving = Gauge("tracemill_serve_version", "1 for each version served, by role and share.",
                             ["version", "role"], registry=r)

    def revised(self, revised: Revised, version: str) -> None:
        self.revisions.labels(revised.outcome, version).inc()
        for step in revised.steps:
            self.steps.labels(step.kind.value).inc()
        if revised.reviser_failed:
            self.reviser_errors.labels(version).inc()

    def plan(self, plan: Plan) -> None:
        self.serving.clear()
        self.serving.labels(plan.active.version, plan.active.role).set(
            100 - plan.canary_percent if plan.canary else 100)
        if plan.canary is not None:
            self.serving.labels(plan.canary.version, "canary").set(plan.canary_percent)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
