"""A reviewer's decision on a queued call: approve it as it is, edit it (checked against the tool's schema before it
is saved) or reject it. Decisions go to `reviews`, append-only; the first decision on a call stands."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Engine, insert
from sqlalchemy.exc import IntegrityError

from tracemill.repair import revise
from tracemill.store import learning, queries
from tracemill.store.tables import ReviewRow, utcnow
from tracemill.tools import Tool
from tracemill.ui.access import Identity
from tracemill.ui.queue import release
from tracemill.verify import ToolCall, Verdict, parse_call, verify


class Decision(str, enum.Enum):
    APPROVE = "approve"
    REJECT = "reject"
    EDIT = "edit"


class InvalidEdit(ValueError):
    """The call a reviewer would approve does not pass the verifier; `verdict` says where."""

    def __init__(self, message: str, verdict: Verdict | None = None) -> None:
        super().__init__(message)
        self.verdict = verdict


class AlreadyDecided(Exception):
    """Someone decided on this call first; `review` is their decision, which stands."""

    def __init__(self, review: learning.Review) -> None:
        super().__init__(f"{review.reviewer} already decided on this call ({review.decision}, "
                         f"{review.created_at:%Y-%m-%d %H:%M} UTC); the first decision stands")
        self.review = review


@dataclass(frozen=True, slots=True)
class Subject:
    """What a reviewer sees of a call: the call as emitted, the tools it was offered, and the call to start from."""

    call: queries.StoredCall
    tools: dict[str, Tool] | None  # None: the span did not say which tools were offered
    emitted: ToolCall | None  # the call as the model emitted it, when it could be read
    proposal: dict[str, Any]  # {"name", "arguments"}: the emitted call when valid, else the sidecar's or the
    # deterministic reviser's, else as read

    @property
    def tool(self) -> Tool | None:
        return self.tools.get(self.proposal["name"]) if self.tools else None

    def before(self) -> dict[str, Any]:
        return self.emitted.to_dict() if self.emitted is not None else {"raw": self.call.raw}


def _as_emitted(call: queries.StoredCall) -> ToolCall | None:
    parsed = parse_call({"name": call.name, "arguments": call.arguments}) if call.parsed else None
    return parsed if isinstance(parsed, ToolCall) else None


def subject(engine: Engine, call_id: int, served_as: int | None = None) -> Subject | None:
    """What a reviewer sees of `call_id`. `served_as`: the call the sidecar served in its place, proposed when it
    passes the verifier against the tools `call_id` was offered."""
    with engine.connect() as conn:
        call = queries.call(conn, call_id)
        if call is None:
            return None
        found = queries.toolsets(conn, [call.toolset_id] if call.toolset_id is not None else [])
        served = queries.call(conn, served_as) if served_as is not None else None
    tools = {t.name: t for t in found[call.toolset_id]} if call.toolset_id in found else None
    emitted = _as_emitted(call)
    proposal = emitted.to_dict() if emitted is not None else {"name": call.name or "", "arguments": {}}
    if tools is not None and call.stage is not None:
        sidecar = _as_emitted(served) if served is not None else None
        if sidecar is not None and verify(sidecar, tools).ok:
            proposal = sidecar.to_dict()
        elif (revision := revise(call.raw, tools)).ok and len(revision.calls) == 1:
            proposal = revision.calls[0].to_dict()
    return Subject(call, tools, emitted, proposal)


def checked(item: Subject, approved: Any) -> ToolCall:
    """`approved` as a call that passes the verifier against the tools `item` was offered; InvalidEdit otherwise."""
    if item.tools is None:
        raise InvalidEdit("the tools this call was offered are not stored, so no call can be checked: reject it")
    call = parse_call(approved)
    if isinstance(call, Verdict):
        raise InvalidEdit(call.violations[0].message, call)
    verdict = verify(call, item.tools)
    if not verdict.ok:
        raise InvalidEdit("; ".join(f"{v.pointer or '/'}: {v.message}" for v in verdict.violations), verdict)
    return call


def decide(engine: Engine, who: Identity, item: Subject, decision: Decision, approved: Any = None,
           note: str | None = None) -> learning.Review:
    """Record `who`'s decision. approve/edit: `approved` is the call to keep (the proposal when None) and must pass the
    verifier; it is saved as `edit` when it differs from the call as emitted. NotAllowed for a role that does not
    decide, InvalidEdit for a call that does not pass, AlreadyDecided when someone decided first."""
    who.require_decide()
    after = None
    if decision is not Decision.REJECT:
        after = checked(item, item.proposal if approved is None else approved).to_dict()
        decision = Decision.APPROVE if item.emitted is not None and after == item.emitted.to_dict() else Decision.EDIT
    row = {"call_id": item.call.id, "reviewer": who.name, "decision": decision.value, "before": item.before(),
           "after": after, "note": (note or "").strip() or None, "created_at": utcnow()}
    try:
        with engine.begin() as conn:
            conn.execute(insert(ReviewRow), [row])
    except IntegrityError:
        with engine.connect() as conn:
            first = learning.review(conn, item.call.id)
        if first is None:
            raise
        raise AlreadyDecided(first) from None
    release(engine, item.call.id, who.name)
    with engine.connect() as conn:
        stored = learning.review(conn, item.call.id)
    assert stored is not None
    return stored
