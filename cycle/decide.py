"""Whether a cycle trains: enough new failed calls, and harness tuning no longer paying (the failure rate per harness
version of the model's answers as sent, in the order the versions first appear, no longer falls over the newest
versions: a fall counts when it is at least the tolerance and significant, by the pooled two-proportion test
`tracemill failures --compare` uses). While it still pays, the failure modes of the newest version say what to fix in
the harness first."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from itertools import pairwise
from typing import Any

from sqlalchemy import Connection, Engine, func, select

from tracemill.cycle.settings import Decision
from tracemill.miner.failures import failure_modes, two_proportion_test
from tracemill.rates import percent
from tracemill.store.queries import SIDECAR_SERVICE, CallFilter
from tracemill.store.tables import ToolCallRow

C = ToolCallRow.__table__.c
TRAIN, HARNESS, WAIT = "train", "harness", "wait"


@dataclass(frozen=True, slots=True)
class HarnessRate:
    version: str
    calls: int
    failed: int
    service: str | None = None  # the service whose calls were counted (the reviser sidecar's); None: every service

    @property
    def rate(self) -> float:
        return self.failed / self.calls if self.calls else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "rate": self.rate}


def harness_rates(conn: Connection) -> list[HarnessRate]:
    """Every harness version's calls and failed calls, in the order the versions first appear in the store: the
    model's answers as sent. Where the reviser sidecar recorded a version's answers (the agent named its version to
    it), only its record counts: what the agent got behind it was revised, and a better reviser deployed would pass
    for a better harness."""
    failed = CallFilter(failed=True).conditions()
    sidecar = func.coalesce(C.service_name == SIDECAR_SERVICE, False).label("sidecar")
    counts = select(C.harness_version, sidecar, func.min(C.id).label("first"), func.count().label("calls"),
                    func.count().filter(*failed).label("failed")).where(C.harness_version.is_not(None))
    first: dict[str, int] = {}
    counted: dict[str, HarnessRate] = {}
    for row in conn.execute(counts.group_by(C.harness_version, sidecar)).all():
        version = row.harness_version
        first[version] = min(first.get(version, row.first), row.first)
        if bool(row.sidecar):
            counted[version] = HarnessRate(version, row.calls, row.failed, SIDECAR_SERVICE)
        else:
            counted.setdefault(version, HarnessRate(version, row.calls, row.failed))
    return [counted[v] for v in sorted(counted, key=first.__getitem__)]


@dataclass(frozen=True, slots=True)
class TrainDecision:
    decision: str  # train | harness | wait
    reason: str
    rates: list[HarnessRate] = field(default_factory=list)
    top_modes: list[dict[str, Any]] = field(default_factory=list)  # of the newest harness version, when it may pay


def _shown(rates: list[HarnessRate]) -> str:
    return ", ".join(f"{r.version} {percent(r.rate)}" + (" as sent, behind the sidecar" if r.service else "")
                     for r in rates)


def harness_verdict(rates: list[HarnessRate], settings: Decision) -> tuple[bool, str]:
    """(tuning still pays, why, with the rates)."""
    if not rates:
        return False, ("no stored call names its harness version (the SDK's harness_version): harness tuning cannot be "
                       "judged, so the new failures decide")
    window = rates[-settings.plateau_window:]
    if len(window) < settings.plateau_window:
        return True, (f"{len(rates)} harness version(s) seen ({_shown(rates) or 'none'}): harness tuning has not yet "
                      f"been shown to stop paying over {settings.plateau_window} versions")
    falls = [(a, b, p) for a, b in pairwise(window)
             if a.rate - b.rate >= settings.plateau_tolerance
             and (p := two_proportion_test(a.failed, a.calls, b.failed, b.calls)[1]) < settings.alpha]
    if falls:
        a, b, p = falls[-1]
        return True, (f"harness tuning still pays: the failure rate fell from {percent(a.rate)} ({a.version}) to "
                      f"{percent(b.rate)} ({b.version}), p = {p:.3g}, over the last {settings.plateau_window} "
                      f"versions ({_shown(window)})")
    return False, (f"harness tuning stopped paying: over the last {settings.plateau_window} versions no version's "
                   f"failure rate fell by {percent(settings.plateau_tolerance)} or more with p < {settings.alpha} "
                   f"({_shown(window)})")


def decide(engine: Engine, new_failures: int, settings: Decision, force: bool = False, held_out_rows: int = 0,
           held_out_needed: int = 0) -> TrainDecision:
    """`held_out_rows`: the eval rows mined, of which the gate needs `held_out_needed`. Short of them, a model trained
    now would be refused without being measured, and the calls it read would be spent: the cycle waits instead, and
    the next one reads them again with what came since."""
    with engine.connect() as conn:
        rates = harness_rates(conn)
    pays, why = harness_verdict(rates, settings)
    enough = new_failures >= settings.min_new_failures
    failures = (f"{new_failures} new failed call(s) since the last cycle that trained "
                f"({'enough' if enough else 'fewer than'} {settings.min_new_failures} needed)")
    top: list[dict[str, Any]] = []
    if pays and rates:
        newest = rates[-1]
        modes = failure_modes(engine, CallFilter(harness_version=newest.version, service=newest.service),
                              limit=settings.top_modes)
        top = [{"label": m.label, "count": m.count, "share": m.share} for m in modes]
    if force:
        return TrainDecision(TRAIN, f"forced (--force); {why}; {failures}", rates, top)
    if pays:
        return TrainDecision(HARNESS, f"{why}; fix the top failure modes in the harness first; {failures}", rates, top)
    if not enough:
        return TrainDecision(WAIT, f"{why}; {failures}: waiting for more", rates)
    if held_out_rows < held_out_needed:
        return TrainDecision(WAIT, f"{why}; {failures}; {held_out_rows} held-out row(s) mined, fewer than the "
                             f"{held_out_needed} the gate needs (min_held_out_cases): waiting for more", rates)
    return TrainDecision(TRAIN, f"{why}; {failures}", rates)
