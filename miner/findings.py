"""Findings of miner agents (`findings` table), consolidated rather than appended: a finding seen again under the same
key is merged into its row (evidence and examples joined, `seen` counted, `last_seen` moved, an expired one reopened),
and a finding not seen for a while expires."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Engine, insert, select, update

from tracemill.store.tables import FindingRow, utcnow

_TABLE = FindingRow.__table__
MAX_EVIDENCE = 50
MAX_EXAMPLES = 20


@dataclass(frozen=True, slots=True)
class Finding:
    key: str
    hypothesis: str
    evidence: list[str]  # span ids, trace ids or trace_id/span_id
    suggestion: str | None = None  # the harness change to make: a prompt, a tool description
    examples: list[Any] = field(default_factory=list)  # labelled examples


def finding_key(text: str) -> str:
    """A key as findings are merged by: lower case, words joined by hyphens, at most 64 characters."""
    key = re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")[:64].strip("-")
    if not key:
        raise ValueError("a finding needs a key of letters or digits")
    return key


def _joined(old: list[Any], new: list[Any], cap: int) -> list[Any]:
    out = list(old)
    for item in new:
        if item not in out:
            out.append(item)
    return out[-cap:]


def record(engine: Engine, finding: Finding, now: datetime | None = None) -> tuple[int, bool]:
    """Store or merge a finding; (its id, whether it was merged into an existing one)."""
    now = now or utcnow()
    key = finding_key(finding.key)
    with engine.begin() as conn:
        row = conn.execute(select(_TABLE).where(_TABLE.c.key == key)).first()
        if row is None:
            found = conn.execute(insert(FindingRow).values(
                key=key, hypothesis=finding.hypothesis, evidence=finding.evidence[:MAX_EVIDENCE],
                suggestion=finding.suggestion, examples=finding.examples[:MAX_EXAMPLES], status="open", seen=1,
                first_seen=now, last_seen=now).returning(FindingRow.id)).scalar_one()
            return int(found), False
        conn.execute(update(FindingRow).where(FindingRow.id == row.id).values(
            hypothesis=finding.hypothesis, suggestion=finding.suggestion or row.suggestion,
            evidence=_joined(row.evidence or [], finding.evidence, MAX_EVIDENCE),
            examples=_joined(row.examples or [], finding.examples, MAX_EXAMPLES),
            status="open", seen=row.seen + 1, last_seen=now))
        return int(row.id), True


def expire(engine: Engine, after: timedelta, now: datetime | None = None) -> int:
    """Mark open findings not seen within `after` as expired; how many."""
    cutoff = (now or utcnow()) - after
    with engine.begin() as conn:
        done = conn.execute(update(FindingRow).where(FindingRow.status == "open", FindingRow.last_seen < cutoff)
                            .values(status="expired"))
    return int(done.rowcount or 0)


@dataclass(frozen=True, slots=True)
class StoredFinding:
    key: str
    hypothesis: str
    evidence: list[str]
    suggestion: str | None
    examples: list[Any]
    status: str  # open | expired
    seen: int
    first_seen: datetime
    last_seen: datetime

    def to_dict(self) -> dict[str, Any]:
        return {"key": self.key, "hypothesis": self.hypothesis, "evidence": self.evidence,
                "suggestion": self.suggestion, "examples": self.examples, "seen": self.seen}


def list_findings(engine: Engine, statuses: tuple[str, ...] = ("open",)) -> list[StoredFinding]:
    """The findings of these statuses, the most seen first."""
    with engine.connect() as conn:
        rows = conn.execute(select(_TABLE).where(_TABLE.c.status.in_(statuses))
                            .order_by(_TABLE.c.seen.desc(), _TABLE.c.key)).all()
    return [StoredFinding(r.key, r.hypothesis, list(r.evidence or []), r.suggestion, list(r.examples or []), r.status,
                          r.seen, r.first_seen, r.last_seen) for r in rows]
