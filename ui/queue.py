"""The human review queue: which calls wait for a person (the configurable rules), filled by reading new calls in
batches; reservations so that two reviewers do not work on one call; and each reviewer's progress.

A call is queued when its domain is one of the review domains, when a rule matches its tool (server, name or
description), or when a revision of it took a step that guesses (a near-miss tool or parameter name, a default, a
dropped parameter, a model's rewrite; `Settings.review_low_confidence`): the sidecar's revision of it, read from the
sidecar's traced `revise` span, or the deterministic reviser's of a stored failed call. What the sidecar served is not
queued itself: the call the upstream sent is, with the sidecar's call as the proposal (so that a decision on it is a
`gold` reference for a broken call). A call is queued once (`review_queue.call_id` is unique)."""

from __future__ import annotations

import fnmatch
import hashlib
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from functools import cached_property

import orjson
from sqlalchemy import Connection, Engine, and_, delete, func, insert, or_, select, update
from sqlalchemy.exc import IntegrityError

from tracemill.repair import revise
from tracemill.serving.tracing import REVISER_MODEL, REVISION_OF, STEPS, VERSION
from tracemill.settings import LowConfidenceRule, ReviewRule, Settings
from tracemill.store import queries
from tracemill.store.engine import insert_ignoring_duplicates
from tracemill.store.tables import ReviewClaimRow, ReviewQueueRow, ReviewRow, ReviewScanRow, ToolCallRow, utcnow
from tracemill.tools import Tool

LOW_CONFIDENCE = "low_confidence"


@dataclass(frozen=True)
class QueueRules:
    domains: tuple[str, ...]
    rules: tuple[ReviewRule, ...]
    low_confidence: tuple[LowConfidenceRule, ...]

    @classmethod
    def from_settings(cls, settings: Settings) -> QueueRules:
        return cls(tuple(settings.review_domains), tuple(settings.review_rules),
                   tuple(settings.review_low_confidence))

    @cached_property
    def digest(self) -> str:
        body = {"domains": self.domains, "rules": [r.model_dump() for r in self.rules],
                "low_confidence": [r.model_dump() for r in self.low_confidence]}
        return hashlib.sha256(orjson.dumps(body, option=orjson.OPT_SORT_KEYS)).hexdigest()

    @cached_property
    def guessing_steps(self) -> frozenset[str]:
        """The steps that queue a stored failed call the deterministic reviser would fix."""
        return frozenset(s for r in self.low_confidence if r.source == "rules" for s in r.steps)

    def sidecar_guesses(self, version: str, steps: Sequence[str]) -> list[str]:
        """The steps of a sidecar revision by reviser `version` that a rule counts as guesses."""
        return sorted({s for r in self.low_confidence if r.source == "sidecar"
                       and any(fnmatch.fnmatchcase(version, v) for v in r.versions) for s in r.steps} & set(steps))

    @cached_property
    def _words(self) -> tuple[re.Pattern[str] | None, ...]:
        return tuple(re.compile(r"\b(?:" + "|".join(map(re.escape, r.words)) + r")\b", re.IGNORECASE)
                     if r.words else None for r in self.rules)

    def rule_for(self, name: str | None, tool: Tool | None) -> tuple[str, str] | None:
        """(domain, which rule) of the first rule that matches a call's tool, else None."""
        full = name or (tool.name if tool else "")
        server = full.rpartition(":")[0].strip().lower()
        for rule, words in zip(self.rules, self._words, strict=True):
            if server and server in (s.lower() for s in rule.servers):
                return rule.domain, f"server {server!r}"
            for pattern in rule.tools:
                if full and fnmatch.fnmatch(full.lower(), pattern.lower()):
                    return rule.domain, f"tool name matches {pattern!r}"
            if words is not None and tool is not None and (found := words.search(tool.description)):
                return rule.domain, f"description says {found.group(0)!r}"
        return None

    def reason(self, call: queries.StoredCall, index: dict[str, Tool] | None) -> tuple[str, str] | None:
        """Why `call` waits for review (reason, detail), or None. What the sidecar served waits for nobody: the
        call it revised does (`sidecar_items`)."""
        if (call.model or "").startswith(REVISER_MODEL):
            return None
        if call.domain in self.domains:
            return call.domain, f"domain {call.domain}"
        matched = self.rule_for(call.name, index.get(call.name) if index and call.name else None)
        if matched is not None:
            return matched
        if index and call.stage in ("parse", "tool_name", "schema"):
            revision = revise(call.raw, index)
            guessed = sorted({s.kind.value for s in revision.steps} & self.guessing_steps)
            if revision.ok and guessed:
                return LOW_CONFIDENCE, "revision guessed: " + ", ".join(guessed)
        return None


@dataclass(frozen=True, slots=True)
class ScanProgress:
    scanned_to: int  # the newest call id the rules have read
    newest: int  # the newest call id in the store
    queued: int  # calls this scan queued

    @property
    def remaining(self) -> int:
        return max(0, self.newest - self.scanned_to)


def scan(engine: Engine, rules: QueueRules, budget_s: float = 0.5, batch: int = 2000) -> ScanProgress:
    """Queue what the rules select among the calls they have not read yet, for up to `budget_s` seconds."""
    deadline = time.monotonic() + budget_s
    with engine.connect() as conn:
        last = conn.execute(select(ReviewScanRow.last_call_id).where(ReviewScanRow.rules == rules.digest)).scalar()
        newest = int(conn.execute(select(func.max(ToolCallRow.id))).scalar() or 0)
    last = int(last or 0)
    queued = 0
    indexes: dict[int, dict[str, Tool]] = {}
    while last < newest and time.monotonic() < deadline:
        with engine.connect() as conn:
            page = queries.calls(conn, queries.CallFilter(after_id=last), batch)
            wanted = {c.toolset_id for c in page if c.toolset_id is not None} - set(indexes)
            indexes.update({i: {t.name: t for t in tools} for i, tools in queries.toolsets(conn, wanted).items()})
        if not page:
            break
        found: dict[int, tuple[str, str]] = {}
        for call in page:
            reason = rules.reason(call, indexes.get(call.toolset_id) if call.toolset_id is not None else None)
            if reason is not None:
                found[call.id] = reason
        served = [c for c in page if (c.model or "").startswith(REVISER_MODEL)]
        if served:
            with engine.connect() as conn:
                found.update(sidecar_items(conn, served, rules))  # the sidecar's own proposal beats the rules'
        rows = [{"call_id": i, "reason": r, "detail": d, "queued_at": utcnow()} for i, (r, d) in found.items()]
        last = page[-1].id
        with engine.begin() as conn:
            if rows:
                ids = [r["call_id"] for r in rows]
                known = set(conn.execute(select(ReviewQueueRow.call_id).where(ReviewQueueRow.call_id.in_(ids)))
                            .scalars())
                conn.execute(insert_ignoring_duplicates(ReviewQueueRow.__table__, engine.dialect.name), rows)
                queued += len(set(ids) - known)
            _advance(conn, rules.digest, last)
    return ScanProgress(last, newest, queued)


_SERVED_AS = re.compile(r"served as call #(\d+)")


def sidecar_items(conn: Connection, served: Sequence[queries.StoredCall], rules: QueueRules
                  ) -> dict[int, tuple[str, str]]:
    """{call id: (reason, detail)} for the calls the upstream sent that the sidecar revised with a step a
    low-confidence rule counts as a guess. `served` are calls of the sidecar's `revise` spans; each span names the
    span it revised (`tracemill.serving.revision_of`, and a link that holds its trace)."""
    by_span: dict[tuple[str, str], list[queries.StoredCall]] = {}
    for c in served:
        by_span.setdefault((c.trace_id, c.span_id), []).append(c)
    found: dict[int, tuple[str, str]] = {}
    for (trace_id, span_id), calls in by_span.items():
        span = queries.span(conn, trace_id, span_id, resolved=False)
        if span is None:
            continue
        version = str(span.attributes.get(VERSION) or (calls[0].model or "").removeprefix(REVISER_MODEL))
        steps = span.attributes.get(STEPS)
        guessed = rules.sidecar_guesses(version, [str(s) for s in steps] if isinstance(steps, list) else [])
        of = span.attributes.get(REVISION_OF)
        link = next((k for k in span.links if isinstance(k, dict) and k.get("span_id") == of), None)
        if not guessed or link is None:
            continue
        by_index = {c.call_index: c for c in calls}
        sent_trace = str(link.get("trace_id"))
        for sent in queries.trace_calls(conn, [sent_trace])[sent_trace]:
            if sent.span_id == of and sent.failed:
                proposal = by_index.get(sent.call_index, calls[0])
                detail = f"the sidecar's reviser {version} revised it with {', '.join(guessed)}"
                found[sent.id] = (LOW_CONFIDENCE, f"{detail}; served as call #{proposal.id}")
    return found


def served_as(detail: str) -> int | None:
    """The sidecar's call a queued call was served as (from the detail `sidecar_items` wrote), else None."""
    found = _SERVED_AS.search(detail)
    return int(found.group(1)) if found else None


def _advance(conn: Connection, digest: str, last: int) -> None:
    moved = conn.execute(update(ReviewScanRow).where(ReviewScanRow.rules == digest, ReviewScanRow.last_call_id < last)
                         .values(last_call_id=last, scanned_at=utcnow())).rowcount
    if not moved and conn.execute(select(ReviewScanRow.rules).where(ReviewScanRow.rules == digest)).first() is None:
        conn.execute(insert_ignoring_duplicates(ReviewScanRow.__table__, conn.dialect.name),
                     [{"rules": digest, "last_call_id": last, "scanned_at": utcnow()}])


@dataclass(frozen=True, slots=True)
class QueueItem:
    call_id: int
    reason: str
    detail: str
    queued_at: datetime


def _undecided_and_free(reviewer: str, now: datetime):  # type: ignore[no-untyped-def]
    claimed_by_other = select(ReviewClaimRow.call_id).where(ReviewClaimRow.call_id == ReviewQueueRow.call_id,
                                                            ReviewClaimRow.expires_at > now,
                                                            ReviewClaimRow.reviewer != reviewer)
    decided = select(ReviewRow.id).where(ReviewRow.call_id == ReviewQueueRow.call_id)
    return and_(~decided.exists(), ~claimed_by_other.exists())


def waiting(engine: Engine, reviewer: str, reason: str | None = None, limit: int = 50) -> list[QueueItem]:
    """Undecided items nobody else has reserved, oldest first; `reviewer`'s own reservations come first."""
    now = utcnow()
    mine = select(ReviewClaimRow.call_id).where(ReviewClaimRow.call_id == ReviewQueueRow.call_id,
                                                ReviewClaimRow.reviewer == reviewer, ReviewClaimRow.expires_at > now)
    statement = (select(ReviewQueueRow.call_id, ReviewQueueRow.reason, ReviewQueueRow.detail, ReviewQueueRow.queued_at)
                 .where(_undecided_and_free(reviewer, now))
                 .order_by(mine.exists().desc(), ReviewQueueRow.id).limit(limit))
    if reason is not None:
        statement = statement.where(ReviewQueueRow.reason == reason)
    with engine.connect() as conn:
        return [QueueItem(*row) for row in conn.execute(statement)]


def queue_item(engine: Engine, call_id: int) -> QueueItem | None:
    with engine.connect() as conn:
        row = conn.execute(select(ReviewQueueRow.call_id, ReviewQueueRow.reason, ReviewQueueRow.detail,
                                  ReviewQueueRow.queued_at).where(ReviewQueueRow.call_id == call_id)).first()
    return QueueItem(*row) if row is not None else None


@dataclass(frozen=True, slots=True)
class Claim:
    call_id: int
    reviewer: str
    expires_at: datetime

    @property
    def held(self) -> bool:
        return self.expires_at > utcnow()


def claim(engine: Engine, call_id: int, reviewer: str, hold: timedelta) -> Claim:
    """Reserve `call_id` for `reviewer` (or extend their reservation). Returns the claim that holds: someone else's
    when they reserved it first and their reservation has not run out."""
    now = utcnow()
    with engine.begin() as conn:
        taken = conn.execute(update(ReviewClaimRow).where(
            ReviewClaimRow.call_id == call_id,
            or_(ReviewClaimRow.reviewer == reviewer, ReviewClaimRow.expires_at <= now),
        ).values(reviewer=reviewer, expires_at=now + hold)).rowcount
    if not taken:
        try:
            with engine.begin() as conn:
                conn.execute(insert(ReviewClaimRow), [{"call_id": call_id, "reviewer": reviewer,
                                                       "expires_at": now + hold}])
        except IntegrityError:
            pass  # reserved by someone else meanwhile: read whose it is
    found = current_claim(engine, call_id)
    assert found is not None
    return found


def current_claim(engine: Engine, call_id: int) -> Claim | None:
    with engine.connect() as conn:
        row = conn.execute(select(ReviewClaimRow.call_id, ReviewClaimRow.reviewer, ReviewClaimRow.expires_at)
                           .where(ReviewClaimRow.call_id == call_id)).first()
    if row is None:
        return None
    expires = row.expires_at if row.expires_at.tzinfo else row.expires_at.replace(tzinfo=utcnow().tzinfo)
    return Claim(row.call_id, row.reviewer, expires)


def release(engine: Engine, call_id: int, reviewer: str) -> None:
    with engine.begin() as conn:
        conn.execute(delete(ReviewClaimRow).where(ReviewClaimRow.call_id == call_id,
                                                  ReviewClaimRow.reviewer == reviewer))


@dataclass(frozen=True, slots=True)
class Progress:
    queued: int
    decided: int
    by_reviewer: dict[str, dict[str, int]]  # {reviewer: {decision: count}} on queued calls
    by_reason: dict[str, tuple[int, int]]  # {reason: (queued, decided)}

    @property
    def waiting(self) -> int:
        return self.queued - self.decided


def progress(engine: Engine) -> Progress:
    with engine.connect() as conn:
        rows = conn.execute(select(ReviewQueueRow.reason, ReviewRow.reviewer, ReviewRow.decision, func.count())
                            .outerjoin(ReviewRow, ReviewRow.call_id == ReviewQueueRow.call_id)
                            .group_by(ReviewQueueRow.reason, ReviewRow.reviewer, ReviewRow.decision)).all()
    by_reviewer: dict[str, dict[str, int]] = {}
    by_reason: dict[str, list[int]] = {}
    for reason, reviewer, decision, n in rows:
        counts = by_reason.setdefault(reason, [0, 0])
        counts[0] += int(n)
        if reviewer is not None:
            counts[1] += int(n)
            by_reviewer.setdefault(reviewer, {})[decision] = int(n)
    queued = sum(c[0] for c in by_reason.values())
    decided = sum(c[1] for c in by_reason.values())
    return Progress(queued, decided, by_reviewer, {r: (c[0], c[1]) for r, c in sorted(by_reason.items())})


def sensitive_calls(calls: Sequence[queries.StoredCall], rules: QueueRules, reasons: dict[int, str]) -> set[int]:
    """Which of these calls hold sensitive content (masked for viewers): in a review domain, queued for a domain, or
    on a tool a rule names (`reasons`: `queued_reasons` of the calls)."""
    return {c.id for c in calls
            if c.domain in rules.domains or reasons.get(c.id, LOW_CONFIDENCE) != LOW_CONFIDENCE
            or rules.rule_for(c.name, None) is not None}


def queued_reasons(engine: Engine, call_ids: Sequence[int]) -> dict[int, str]:
    if not call_ids:
        return {}
    with engine.connect() as conn:
        rows = conn.execute(select(ReviewQueueRow.call_id, ReviewQueueRow.reason)
                            .where(ReviewQueueRow.call_id.in_(set(call_ids))))
        return {int(call_id): reason for call_id, reason in rows}
