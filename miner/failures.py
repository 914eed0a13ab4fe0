"""Failure modes: failed tool calls clustered by tool, verifier stage and violation (`search_places · wrong_type ·
/arguments/radius`), with counts, share of calls, a trend per day and splits per model and harness version; and two
harness versions side by side with a test of whether a mode's rate changed. `tracemill failures` prints these; the
UI's "Failure modes" page calls the same functions.

    report = failure_report(engine, CallFilter(model="llama3.1-8b"))
    report.modes[0].label, report.modes[0].share        # 'search_places · wrong_type · /arguments/radius', 0.031
    compare_harness(engine, "prompt-v3", "prompt-v4")    # one HarnessComparison per mode, with its p-value

A call belongs to one mode: its verdict's first violation, or `execution · <error type>` for a call that passed the
verifier and failed when it ran. Days are UTC days of when the call was made (the span's start time).
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Iterator, Sequence
from collections.abc import Set as AbstractSet
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from datetime import UTC, date, datetime, timedelta
from typing import Any

from sqlalchemy import Connection, Engine, case, func, or_, select

from tracemill.rates import rate
from tracemill.store.queries import SIDECAR_SERVICE, CallFilter
from tracemill.store.tables import ToolCallRow as C

GROUP_FIELDS = ("tool", "stage", "kind", "pointer")
DAY_NS = 86_400 * 1_000_000_000
NONE = "(none)"


@dataclass(frozen=True, slots=True)
class FailureKey:
    """What a failed call got wrong. `tool` is the name the call gave (None when it could not be read)."""

    tool: str | None
    stage: str  # parse | tool_name | schema | execution
    kind: str  # the violation's kind (`wrong_type`, `invalid_json`, ...), or the execution's error type
    pointer: str  # JSON pointer into the call; "" for the whole call

    @property
    def failure_class(self) -> str:
        """`stage:kind`, the miner's `failure_class` column."""
        return f"{self.stage}:{self.kind}"

    def label(self, fields: Sequence[str] = GROUP_FIELDS) -> str:
        shown = {"tool": self.tool or NONE, "stage": self.stage, "kind": self.kind, "pointer": self.pointer or "/"}
        return " · ".join(shown[f] for f in fields)


def execution_error_kind(error: str | None) -> str:
    """The error type at the head of a stored execution error (`upstream_error: ...`), else `error`."""
    head = (error or "").partition(":")[0].strip()
    return head if head and len(head) <= 48 and " " not in head else "error"


def failure_key(name: str | None, stage: str | None, violations: Sequence[Any] | None,
                execution_status: str | None, execution_error: str | None) -> FailureKey | None:
    """The mode of one stored call; None for a call that did not fail."""
    if stage is not None:
        first = violations[0] if violations and isinstance(violations[0], dict) else {}
        return FailureKey(name, stage, str(first.get("kind") or "unknown"), str(first.get("pointer") or ""))
    if execution_status == "error":
        return FailureKey(name, "execution", execution_error_kind(execution_error), "")
    return None


@dataclass(frozen=True, slots=True)
class FailureMode:
    """One cluster of failed calls. `share` is of every call the filter selects; `by_day`, `by_model` and `by_harness`
    count this mode's calls (divide by the report's totals of the same key for a rate)."""

    key: FailureKey
    count: int
    share: float
    by_day: dict[str, int] = field(default_factory=dict)
    by_model: dict[str, int] = field(default_factory=dict)
    by_harness: dict[str, int] = field(default_factory=dict)
    fields: tuple[str, ...] = GROUP_FIELDS  # which parts of the key the clusters were made by

    @property
    def label(self) -> str:
        return self.key.label(self.fields)

    @property
    def tool(self) -> str | None:
        return self.key.tool

    @property
    def stage(self) -> str:
        return self.key.stage

    @property
    def kind(self) -> str:
        return self.key.kind

    @property
    def pointer(self) -> str:
        return self.key.pointer

    def to_dict(self) -> dict[str, Any]:
        return {"label": self.label, **{f: getattr(self.key, f) for f in self.fields}, "count": self.count,
                "share": self.share, "by_day": self.by_day, "by_model": self.by_model, "by_harness": self.by_harness}


@dataclass(frozen=True, slots=True)
class FailureReport:
    """Every mode, most frequent first, with the call totals the shares and trends are of."""

    total_calls: int
    failed_calls: int
    modes: list[FailureMode]
    calls_by_day: dict[str, int]  # every day from the first call's to the last's, 0 where no call was made
    calls_by_model: dict[str, int]
    calls_by_harness: dict[str, int]
    filters: dict[str, Any]
    fields: tuple[str, ...] = GROUP_FIELDS

    def to_dict(self) -> dict[str, Any]:
        return {"total_calls": self.total_calls, "failed_calls": self.failed_calls,
                "failure_rate": rate(self.failed_calls, self.total_calls), "by": list(self.fields),
                "filters": self.filters, "calls_by_day": self.calls_by_day, "calls_by_model": self.calls_by_model,
                "calls_by_harness": self.calls_by_harness, "modes": [m.to_dict() for m in self.modes]}


def day_of(start_time_ns: int) -> str:
    return datetime.fromtimestamp(start_time_ns // DAY_NS * 86_400, UTC).date().isoformat()


_FAILED = or_(C.stage.is_not(None), C.execution_status == "error")
_DAY = C.start_time_ns // DAY_NS
_TOTALS = (C.harness_version, C.model, _DAY)  # the most varied first: SQLite's sort compares fewer columns
# Grouped apart from the totals: a GROUP BY sorts every row it reads (SQLite), and the failed ones are the fewer.
_FAILURE_GROUP = (C.name, C.stage, case((C.stage.is_not(None), C.violations[(0, "kind")].as_string())),
                  case((C.stage.is_not(None), C.violations[(0, "pointer")].as_string())),
                  case((C.stage.is_(None), C.execution_error)), _DAY, C.model, C.harness_version)


def _label(value: str | None) -> str:
    return NONE if value is None else value


@dataclass
class FailureCounts:
    """Every call `where` selects counted once by (day, model, harness version), and every failed one also by its
    full `FailureKey`: what any `FailureReport` of these calls is made from. `update` reads only what was stored since
    the last update, plus the newest `recount` ids again (a call's execution may be stored after the call, and turn
    it into an execution failure), in windows of ids, each read in its own short transaction where `update` is given
    an engine (the calls by day, model and harness version; the failed ones by key): a reader who keeps the counts
    (the UI, a miner agent's run) pays for new calls only."""

    where: CallFilter = field(default_factory=CallFilter)
    settled_id: int = 0  # calls up to this id are in `calls` and `failed` for good
    calls: Counter[tuple[str, str, str]] = field(default_factory=Counter)
    failed: Counter[tuple[FailureKey, str, str, str]] = field(default_factory=Counter)
    recent_calls: Counter[tuple[str, str, str]] = field(default_factory=Counter)  # the calls after `settled_id`
    recent_failed: Counter[tuple[FailureKey, str, str, str]] = field(default_factory=Counter)

    def update(self, source: Engine | Connection, window: int = 100_000, recount: int = 20_000) -> FailureCounts:
        """Counts brought up to the newest call. Given a connection, every window is read on it (in its transaction,
        under its deadline, if it has one); each window is kept as soon as it is counted, so that counting stopped
        half-way (a deadline) goes on from there at the next update."""
        with _connected(source) as conn:
            top = int(conn.execute(select(func.max(C.id))).scalar() or 0)
        low = max(self.settled_id, self.where.after_id or 0)
        settle_to = max(low, top - recount)
        self.recent_calls, self.recent_failed = Counter(), Counter()  # some may be settled now: counted anew below
        while low < settle_to:
            high = min(low + window, settle_to)
            self._count(source, low, high, self.calls, self.failed)
            self.settled_id = low = high
        for low in range(settle_to, top, window):
            self._count(source, low, min(low + window, top), self.recent_calls, self.recent_failed)
        return self

    def _count(self, source: Engine | Connection, low: int, high: int, calls: Counter[tuple[str, str, str]],
               failed: Counter[tuple[FailureKey, str, str, str]]) -> None:
        """The calls with ids in (low, high] added to `calls`, the failed ones to `failed`."""
        within = (C.id > low, C.id <= high, *replace(self.where, failed=None, after_id=None).conditions())
        with _connected(source) as conn:
            totals = conn.execute(select(*_TOTALS, func.count()).where(*within).group_by(*_TOTALS)).all()
            rows = conn.execute(select(*_FAILURE_GROUP, func.count()).where(*within, _FAILED)
                                .group_by(*_FAILURE_GROUP)).all()
        for harness, model, day, n in totals:
            calls[(day_of(int(day) * DAY_NS), _label(model), _label(harness))] += int(n)
        for name, stage, kind, pointer, error, day, model, harness, n in rows:
            key = (FailureKey(name, stage, kind or "unknown", pointer or "") if stage is not None
                   else FailureKey(name, "execution", execution_error_kind(error), ""))
            failed[(key, day_of(int(day) * DAY_NS), _label(model), _label(harness))] += int(n)

    def report(self, by: Sequence[str] = GROUP_FIELDS, limit: int | None = None,
               since_day: str | None = None) -> FailureReport:
        """The modes by the parts of the key named in `by` (any of `GROUP_FIELDS`, in that order), most frequent
        first; `limit`: the most frequent only; `since_day`: only calls made on that UTC day (ISO date) or later."""
        fields = tuple(f for f in GROUP_FIELDS if f in by)
        unknown = set(by) - set(GROUP_FIELDS)
        if unknown or not fields:
            raise ValueError(f"cluster by any of {', '.join(GROUP_FIELDS)}; got {', '.join(by) or 'nothing'}")
        calls_by_day: Counter[str] = Counter()
        calls_by_model: Counter[str] = Counter()
        calls_by_harness: Counter[str] = Counter()
        for (day, model, harness), n in (self.calls + self.recent_calls).items():
            if since_day is None or day >= since_day:
                calls_by_day[day] += n
                calls_by_model[model] += n
                calls_by_harness[harness] += n
        total = sum(calls_by_day.values())
        counts: Counter[FailureKey] = Counter()
        per_day: dict[FailureKey, Counter[str]] = defaultdict(Counter)
        per_model: dict[FailureKey, Counter[str]] = defaultdict(Counter)
        per_harness: dict[FailureKey, Counter[str]] = defaultdict(Counter)
        for (full, day, model, harness), n in (self.failed + self.recent_failed).items():
            if since_day is not None and day < since_day:
                continue
            key = FailureKey(*(getattr(full, f) if f in fields else ("" if f != "tool" else None)
                               for f in GROUP_FIELDS))
            counts[key] += n
            per_day[key][day] += n
            per_model[key][model] += n
            per_harness[key][harness] += n
        ranked = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0].label(fields)))
        modes = [FailureMode(key, n, n / total if total else 0.0, dict(sorted(per_day[key].items())),
                             dict(per_model[key].most_common()), dict(per_harness[key].most_common()), fields)
                 for key, n in (ranked[:limit] if limit is not None else ranked)]
        filters = self.where.to_dict() | ({"since_day": since_day} if since_day is not None else {})
        return FailureReport(total, sum(counts.values()), modes, _every_day(calls_by_day),
                             dict(calls_by_model.most_common()), dict(calls_by_harness.most_common()), filters, fields)


def _every_day(counts: Counter[str]) -> dict[str, int]:
    """The counts by day (ISO dates), with the days between them that have none as 0: a trend drawn from them shows
    a gap as a gap."""
    if not counts:
        return {}
    first, last = date.fromisoformat(min(counts)), date.fromisoformat(max(counts))
    days = (first + timedelta(days=n) for n in range((last - first).days + 1))
    return {day.isoformat(): counts.get(day.isoformat(), 0) for day in days}


@contextmanager
def _connected(source: Engine | Connection) -> Iterator[Connection]:
    """`source` itself where it is a connection; else a connection of its own, for one short read."""
    if isinstance(source, Connection):
        yield source
        return
    with source.connect() as conn:
        yield conn


def failure_report(source: Engine | Connection, where: CallFilter = CallFilter(), *,
                   by: Sequence[str] = GROUP_FIELDS, limit: int | None = None) -> FailureReport:
    """Cluster the failed calls `where` selects by the parts of their key named in `by` (any of `GROUP_FIELDS`, in
    that order). `limit`: the most frequent modes only."""
    FailureCounts().report(by)  # a bad `by` is refused before the store is read
    return FailureCounts(replace(where, failed=None)).update(source).report(by, limit)


def failure_modes(source: Engine | Connection, where: CallFilter = CallFilter(), *,
                  by: Sequence[str] = GROUP_FIELDS, limit: int | None = None) -> list[FailureMode]:
    """The modes of `failure_report`, most frequent first."""
    return failure_report(source, where, by=by, limit=limit).modes


# --- two harness versions side by side ------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class HarnessComparison:
    """One mode's rate under harness versions `a` and `b`, and a two-sided test of the difference
    (`two_proportion_test`: the z-test, or Fisher's exact test where counts are small). `significant` holds the
    p-value against `alpha` divided by the number of modes compared (Bonferroni)."""

    key: FailureKey
    a: str
    b: str
    count_a: int
    calls_a: int
    count_b: int
    calls_b: int
    z: float
    p_value: float
    significant: bool
    fields: tuple[str, ...] = GROUP_FIELDS

    @property
    def label(self) -> str:
        return self.key.label(self.fields)

    @property
    def rate_a(self) -> float | None:
        return rate(self.count_a, self.calls_a)

    @property
    def rate_b(self) -> float | None:
        return rate(self.count_b, self.calls_b)

    @property
    def change(self) -> str:
        if not self.significant:
            return "no significant change"
        return "rarer" if (self.rate_b or 0) < (self.rate_a or 0) else "more frequent"

    def to_dict(self) -> dict[str, Any]:
        return {"label": self.label, **{f: getattr(self.key, f) for f in self.fields}, "a": self.a, "b": self.b,
                "count_a": self.count_a, "calls_a": self.calls_a, "rate_a": self.rate_a, "count_b": self.count_b,
                "calls_b": self.calls_b, "rate_b": self.rate_b, "z": self.z, "p_value": self.p_value,
                "significant": self.significant, "change": self.change}


def two_proportion_test(x1: int, n1: int, x2: int, n2: int) -> tuple[float, float]:
    """(z, two-sided p-value) of the difference between x1/n1 and x2/n2: z of the pooled two-proportion z-test (its
    sign says which way), and its p-value where every expected count of the 2x2 table is 5 or more; below that the
    normal approximation claims too much (0 of 1,000 against 4 of 1,000: p 0.045), and the p-value is Fisher's exact
    test's (0.125). (0, 1) when either sample is empty or there is no variance to test."""
    if n1 == 0 or n2 == 0:
        return 0.0, 1.0
    pooled = (x1 + x2) / (n1 + n2)
    variance = pooled * (1 - pooled) * (1 / n1 + 1 / n2)
    if variance <= 0:
        return 0.0, 1.0
    z = (x2 / n2 - x1 / n1) / math.sqrt(variance)
    failed, total = x1 + x2, n1 + n2
    if min(n1, n2) * min(failed, total - failed) < 5 * total:  # the smallest expected count is under 5
        return z, fisher_exact(x1, n1, x2, n2)
    return z, math.erfc(abs(z) / math.sqrt(2))


def fisher_exact(x1: int, n1: int, x2: int, n2: int) -> float:
    """Two-sided p-value of Fisher's exact test on the 2x2 table (x1, n1 - x1; x2, n2 - x2): the probability, with
    the margins fixed, of every table no more likely than this one (as R's `fisher.test` and SciPy sum them)."""
    failed, total = x1 + x2, n1 + n2

    def log_p(k: int) -> float:  # the table with k of the failures in the first sample: hypergeometric
        return _log_choose(failed, k) + _log_choose(total - failed, n1 - k) - _log_choose(total, n1)

    observed = log_p(x1) + 1e-7  # tables as likely as this one, to rounding, count as no more likely
    p = sum(math.exp(lp) for k in range(max(0, n1 - (total - failed)), min(failed, n1) + 1)
            if (lp := log_p(k)) <= observed)
    return min(1.0, p)


def _log_choose(n: int, k: int) -> float:
    return math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1)


def sidecar_versions(source: Engine | Connection, versions: Sequence[str],
                     where: CallFilter = CallFilter()) -> set[str]:
    """Of these harness versions, those whose answers the reviser sidecar recorded (the agent named its version to
    it): such a version is rated on the sidecar's record, the model's answers as sent, since what the agent got behind
    the sidecar was revised and a better reviser would pass for a better harness. None where `where` names a service:
    its record is the one read."""
    if where.service is not None:
        return set()
    with _connected(source) as conn:
        return set(conn.execute(select(C.harness_version).distinct().where(
            C.harness_version.in_(versions), C.service_name == SIDECAR_SERVICE)).scalars())


def compare_harness(source: Engine | Connection, a: str, b: str, where: CallFilter = CallFilter(), *,
                    by: Sequence[str] = GROUP_FIELDS, alpha: float = 0.05,
                    behind: AbstractSet[str] | None = None) -> list[HarnessComparison]:
    """Every mode seen under harness version `a` or `b`, with its rate under each (of all the calls each version
    made that `where` selects) and whether it changed; the modes that changed most first. Unless `where` names a
    service, a version the reviser sidecar recorded is read from its record alone (`sidecar_versions`; `behind`:
    its answer, where the caller has it already)."""
    if behind is None:
        behind = sidecar_versions(source, (a, b), where)
    if not behind:
        return harness_changes(failure_report(source, replace(where, harness_version=None), by=by), a, b, alpha=alpha)
    first, second = (failure_report(source, replace(where, harness_version=v, service=(
        SIDECAR_SERVICE if v in behind else None)), by=by) for v in (a, b))
    return harness_changes(first, a, b, alpha=alpha, second=second)


def harness_changes(report: FailureReport, a: str, b: str, *, alpha: float = 0.05,
                    second: FailureReport | None = None) -> list[HarnessComparison]:
    """`compare_harness` on a report already read (its modes' `by_harness` splits), so that a page showing the report
    compares versions without reading the store again; `b` read from `second` where given (each version from its
    own record)."""
    first, second = report, second or report
    calls_a, calls_b = first.calls_by_harness.get(a, 0), second.calls_by_harness.get(b, 0)
    counts_a = {m.key: n for m in first.modes if (n := m.by_harness.get(a, 0))}
    counts_b = {m.key: n for m in second.modes if (n := m.by_harness.get(b, 0))}
    seen = sorted(counts_a.keys() | counts_b.keys(), key=lambda k: k.label(first.fields))
    found = []
    for key in seen:
        x1, x2 = counts_a.get(key, 0), counts_b.get(key, 0)
        z, p = two_proportion_test(x1, calls_a, x2, calls_b)
        found.append(HarnessComparison(key, a, b, x1, calls_a, x2, calls_b, z, p, p < alpha / max(1, len(seen)),
                                       first.fields))
    return sorted(found, key=lambda c: (c.p_value, -abs(c.z), c.label))
